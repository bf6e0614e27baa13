//! A fault-injecting wrapper for tests: power loss at any chosen point, torn, dropped and
//! misdirected writes, and I/O errors on demand.
//!
//! [`FaultyDevice`] passes reads and writes to an inner device, which holds the *written* image:
//! what a reader sees now. For every block changed since the last flush it also remembers the
//! *durable* content (what the media kept as of that flush) and every version written since.
//! Power loss ([`FaultyDevice::crash`], or [`FaultyDevice::crash_after`] a number of block writes)
//! makes every later request fail with [`ErrorKind::Closed`](crate::ErrorKind::Closed). Recovery
//! ([`FaultyDevice::recover`]) then leaves each such block holding its durable content or one of
//! the versions written after it, chosen at random from the seed: unflushed writes may be lost
//! or kept in any combination, flushed ones are always kept. A write of several blocks that power
//! loss interrupts is torn at a block boundary. One block is the unit of atomicity: this wrapper
//! never tears inside a block, matching the assumption the format document states for the media.

use std::collections::BTreeMap;
use std::ops::Range;

use parking_lot::Mutex;
use tundra_env::Rng;

use crate::{BLOCK_SIZE, BlockDevice, Error, Lba, Result, Usage, check_io, check_range};

/// A fault that stays armed until cleared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reads touching these blocks fail with an I/O error.
    ReadError(Range<u64>),
    /// Writes and trims touching these blocks fail with an I/O error, changing nothing.
    WriteError(Range<u64>),
    /// Writes to these blocks report success but are lost.
    DropWrite(Range<u64>),
    /// Writes to these blocks land `offset` blocks away (wrapping around the device).
    Misdirect { blocks: Range<u64>, offset: u64 },
    /// Flushes fail with an I/O error: the caller must assume that the writes since the last
    /// good flush may be lost, as when a real device fails a cache flush.
    FlushError,
}

/// Counters a test can read to aim a crash or check that faults fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Read calls, however many blocks each asked for.
    pub reads: u64,
    pub block_writes: u64,
    pub flushes: u64,
    pub crashes: u64,
    pub faults_fired: u64,
}

struct Unflushed {
    /// Content as of the last flush; `None` reads as zeros.
    durable: Option<Vec<u8>>,
    /// Versions written since, oldest first; `None` is a trim.
    versions: Vec<Option<Vec<u8>>>,
}

struct State {
    unflushed: BTreeMap<u64, Unflushed>,
    writes_until_crash: Option<u64>,
    crashed: bool,
    faults: Vec<Fault>,
    rng: Rng,
    stats: FaultStats,
}

pub struct FaultyDevice<D> {
    inner: D,
    state: Mutex<State>,
}

impl<D: BlockDevice> FaultyDevice<D> {
    /// Wraps `inner`, whose current content counts as durable. `seed` drives every random choice.
    pub fn new(inner: D, seed: u64) -> FaultyDevice<D> {
        let state = State {
            unflushed: BTreeMap::new(),
            writes_until_crash: None,
            crashed: false,
            faults: Vec::new(),
            rng: Rng::new(seed),
            stats: FaultStats::default(),
        };
        FaultyDevice { inner, state: Mutex::new(state) }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Power fails once `block_writes` more blocks have been written; the write in progress at
    /// that moment is torn there.
    pub fn crash_after(&self, block_writes: u64) {
        self.state.lock().writes_until_crash = Some(block_writes);
    }

    /// Power fails now.
    pub fn crash(&self) {
        let mut state = self.state.lock();
        if !state.crashed {
            state.crashed = true;
            state.stats.crashes += 1;
        }
    }

    pub fn is_crashed(&self) -> bool {
        self.state.lock().crashed
    }

    /// Restores power: every block changed since the last flush keeps its durable content or one
    /// of its later versions, at random. Power fails first if it has not.
    pub fn recover(&self) -> Result<()> {
        self.crash();
        let mut state = self.state.lock();
        let unflushed = std::mem::take(&mut state.unflushed);
        for (lba, block) in unflushed {
            let mut kept = block.durable;
            for version in block.versions {
                if state.rng.chance(0.5) {
                    kept = version;
                }
            }
            match kept {
                Some(data) => self.inner.write(Lba(lba), &data)?,
                None => self.inner.trim(Lba(lba), 1)?,
            }
        }
        self.inner.flush()?;
        state.crashed = false;
        state.writes_until_crash = None;
        Ok(())
    }

    pub fn inject(&self, fault: Fault) {
        self.state.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    pub fn stats(&self) -> FaultStats {
        self.state.lock().stats
    }

    fn check_power(state: &State) -> Result<()> {
        if state.crashed { Err(Error::closed("power lost (fault injection)")) } else { Ok(()) }
    }

    /// Remembers the durable content of `lba` before its first change since the last flush.
    fn note_change(&self, state: &mut State, lba: u64, version: Option<Vec<u8>>) -> Result<()> {
        let entry = match state.unflushed.entry(lba) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(slot) => {
                let mut durable = vec![0u8; BLOCK_SIZE];
                self.inner.read(Lba(lba), &mut durable)?;
                let durable = if crate::is_zero(&durable) { None } else { Some(durable) };
                slot.insert(Unflushed { durable, versions: Vec::new() })
            }
        };
        entry.versions.push(version);
        Ok(())
    }

    fn write_block(&self, state: &mut State, lba: u64, block: &[u8]) -> Result<()> {
        let touches = |range: &Range<u64>| range.contains(&lba);
        if state.faults.iter().any(|f| matches!(f, Fault::DropWrite(r) if touches(r))) {
            state.stats.faults_fired += 1;
            return Ok(());
        }
        let mut target = lba;
        for fault in &state.faults {
            if let Fault::Misdirect { blocks, offset } = fault
                && blocks.contains(&lba)
            {
                target = (lba + offset) % self.inner.block_count();
            }
        }
        if target != lba {
            state.stats.faults_fired += 1;
        }
        self.note_change(state, target, Some(block.to_vec()))?;
        self.inner.write(Lba(target), block)
    }

    fn fail_if_faulty(state: &mut State, write: bool, lba: u64, count: u64) -> Result<()> {
        let span = lba..lba + count;
        let overlaps = |r: &Range<u64>| r.start < span.end && span.start < r.end;
        let hit = state.faults.iter().any(|f| match f {
            Fault::ReadError(r) => !write && overlaps(r),
            Fault::WriteError(r) => write && overlaps(r),
            _ => false,
        });
        if hit {
            state.stats.faults_fired += 1;
            let what = if write { "write" } else { "read" };
            return Err(Error::io(
                format!("injected {what} error at blocks {lba}..+{count}"),
                std::io::Error::other("fault injection"),
            ));
        }
        Ok(())
    }
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()> {
        let count = check_io(self.block_count(), lba, buf.len())?;
        let mut state = self.state.lock();
        Self::check_power(&state)?;
        Self::fail_if_faulty(&mut state, false, lba.0, count)?;
        state.stats.reads += 1;
        self.inner.read(lba, buf)
    }

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        let count = check_io(self.block_count(), lba, data.len())?;
        let mut state = self.state.lock();
        Self::check_power(&state)?;
        Self::fail_if_faulty(&mut state, true, lba.0, count)?;
        for (i, block) in data.chunks_exact(BLOCK_SIZE).enumerate() {
            if let Some(left) = state.writes_until_crash {
                if left == 0 {
                    state.crashed = true;
                    state.stats.crashes += 1;
                    return Err(Error::closed(format!("power lost during a write, after {i} of {count} blocks")));
                }
                state.writes_until_crash = Some(left - 1);
            }
            state.stats.block_writes += 1;
            self.write_block(&mut state, lba.0 + i as u64, block)?;
        }
        Ok(())
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        check_range(self.block_count(), lba, block_count)?;
        let mut state = self.state.lock();
        Self::check_power(&state)?;
        Self::fail_if_faulty(&mut state, true, lba.0, block_count)?;
        for key in lba.0..lba.0 + block_count {
            self.note_change(&mut state, key, None)?;
        }
        self.inner.trim(lba, block_count)
    }

    fn flush(&self) -> Result<()> {
        let mut state = self.state.lock();
        Self::check_power(&state)?;
        if state.faults.contains(&Fault::FlushError) {
            state.stats.faults_fired += 1;
            return Err(Error::io("injected flush error", std::io::Error::other("fault injection")));
        }
        self.inner.flush()?;
        state.unflushed.clear();
        state.stats.flushes += 1;
        Ok(())
    }

    fn usage(&self) -> Usage {
        self.inner.usage()
    }
}

/// A faulty device is itself crashable: power fails after the chosen block writes, and
/// recovery keeps what the media kept.
impl<D: BlockDevice> crate::conformance::Crashable for FaultyDevice<D> {
    fn device(&self) -> &dyn BlockDevice {
        self
    }

    fn arm_crash(&mut self, media_writes: u64) {
        self.crash_after(media_writes);
    }

    fn crash_and_recover(&mut self) {
        self.recover().expect("the wrapped device recovers");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{self, block_content};
    use crate::mem::MemDevice;

    #[test]
    fn conformance_suite() {
        conformance::run_all(&|blocks| Box::new(FaultyDevice::new(MemDevice::new(blocks), 1)));
    }

    #[test]
    fn crash_suite_on_memory() {
        let mut harness = FaultyDevice::new(MemDevice::new(32), 9);
        let struck = conformance::crash_rounds(&mut harness, 9, 300, 12);
        assert!(struck > 50, "crashes should often strike mid-operation, struck {struck}");
    }

    #[test]
    fn crash_suite_on_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = crate::file::FileDevice::create(dir.path().join("media.img"), 32 * 4096).unwrap();
        let mut harness = FaultyDevice::new(file, 11);
        let struck = conformance::crash_rounds(&mut harness, 11, 200, 12);
        assert!(struck > 20, "crashes should often strike mid-operation, struck {struck}");
    }

    #[test]
    fn flushed_writes_survive_and_unflushed_may_not() {
        let dev = FaultyDevice::new(MemDevice::new(8), 3);
        dev.write(Lba(0), &block_content(1, 1)).unwrap();
        dev.flush().unwrap();
        let mut lost = 0;
        for round in 0..40 {
            dev.write(Lba(0), &block_content(100 + round, 1)).unwrap();
            dev.recover().unwrap();
            let mut buf = vec![0u8; BLOCK_SIZE];
            dev.read(Lba(0), &mut buf).unwrap();
            if buf == block_content(1, 1) {
                lost += 1;
            } else {
                assert_eq!(buf, block_content(100 + round, 1));
                // Keep the flushed baseline for the next round.
                dev.write(Lba(0), &block_content(1, 1)).unwrap();
                dev.flush().unwrap();
            }
        }
        assert!(lost > 5 && lost < 35, "unflushed writes should be lost about half the time: {lost}");
    }

    #[test]
    fn crash_tears_multi_block_write() {
        let dev = FaultyDevice::new(MemDevice::new(8), 5);
        dev.crash_after(2);
        let data: Vec<u8> = (0..4).flat_map(|i| block_content(i + 1, 1)).collect();
        let err = dev.write(Lba(0), &data).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Closed);
        assert_eq!(dev.read(Lba(0), &mut [0u8; BLOCK_SIZE]).unwrap_err().kind(), crate::ErrorKind::Closed);
        dev.recover().unwrap();
        let mut buf = vec![0u8; 4 * BLOCK_SIZE];
        dev.read(Lba(0), &mut buf).unwrap();
        assert!(buf[2 * BLOCK_SIZE..].iter().all(|&b| b == 0), "blocks after the tear never reached the media");
    }

    #[test]
    fn injected_faults_fire() {
        let dev = FaultyDevice::new(MemDevice::new(16), 5);
        dev.inject(Fault::ReadError(2..3));
        assert_eq!(dev.read(Lba(2), &mut [0u8; BLOCK_SIZE]).unwrap_err().kind(), crate::ErrorKind::Io);
        dev.inject(Fault::WriteError(4..5));
        assert!(dev.write(Lba(4), &block_content(1, 1)).is_err());
        dev.inject(Fault::DropWrite(6..7));
        dev.write(Lba(6), &block_content(2, 1)).unwrap();
        let mut buf = vec![0u8; BLOCK_SIZE];
        dev.read(Lba(6), &mut buf).unwrap();
        assert!(crate::is_zero(&buf), "a dropped write must not reach the media");
        dev.inject(Fault::Misdirect { blocks: 8..9, offset: 2 });
        dev.write(Lba(8), &block_content(3, 1)).unwrap();
        dev.read(Lba(10), &mut buf).unwrap();
        assert_eq!(buf, block_content(3, 1));
        dev.clear_faults();
        dev.read(Lba(2), &mut buf).unwrap();
        assert_eq!(dev.stats().faults_fired, 4);
    }
}
