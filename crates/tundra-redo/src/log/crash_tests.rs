//! The redo log under crashes and damage. Power fails at every block write of a workload, and at
//! random writes over many rounds, with torn multi-block writes: after each recovery every
//! acknowledged batch is there, the one batch in flight is there whole or not at all, nothing
//! else is, and the fence is the highest epoch among them. One flipped bit in any written block
//! is recovered exactly or refused naming the block. Each oracle is shown to catch the bug it
//! guards against. `TUNDRA_CRASH_ROUNDS` scales the random rounds (default 1000).

use std::sync::Arc;

use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_env::Rng;
use tundra_store::ids::Lsn;

use super::recovery::{self, set_damage_ends_log, set_drop_newest_batch};
use super::tests::{PAGE, VOLUME, expected_after, geometry, read_all};
use super::*;
use crate::codec::tests::random_batch;

const RING: u64 = 16;
const OPS_PER_SESSION: u64 = 100;

/// The writer of a crash round and what it was told: the model the recovered log must match.
struct Writer {
    rng: Rng,
    epoch: u64,
    /// Every batch acknowledged since the format, in order (truncated ones included).
    acknowledged: Vec<RedoBatch>,
    /// The batch whose append a power failure interrupted: it may or may not have landed.
    in_flight: Option<RedoBatch>,
    /// The start LSN after the last truncation that returned: recovery starts there or later.
    truncated: Lsn,
}

impl Writer {
    fn new(seed: u64) -> Writer {
        Writer { rng: Rng::new(seed), epoch: 1, acknowledged: Vec::new(), in_flight: None, truncated: Lsn(0) }
    }

    fn durable(&self) -> Lsn {
        self.acknowledged.last().map_or(Lsn(0), |b| b.end_lsn)
    }

    /// Appends, truncates now and then and when the ring is full, and sometimes takes a
    /// higher epoch, until `ops` are done or the power fails (returns true then).
    fn run(&mut self, log: &RedoLog, ops: u64) -> bool {
        for _ in 0..ops {
            if self.rng.chance(0.1) {
                let through = self.rng.range(self.truncated.0..self.durable().0 + 1);
                if !self.truncate(log, Lsn(through)) {
                    return true;
                }
                continue;
            }
            if self.rng.chance(0.05) {
                self.epoch += 1;
            }
            let prev = self.durable();
            let batch = random_batch(&mut self.rng, VOLUME, WriterEpoch(self.epoch), prev, 4, PAGE);
            match log.append(&batch) {
                Ok(AppendOutcome::Ok { durable_lsn }) => {
                    assert_eq!(durable_lsn, batch.end_lsn);
                    self.acknowledged.push(batch);
                }
                Ok(other) => panic!("a batch in sequence answered {other:?}"),
                Err(e) if e.kind() == ErrorKind::Full => {
                    if !self.truncate(log, self.durable()) {
                        return true;
                    }
                }
                Err(_) => {
                    self.in_flight = Some(batch);
                    return true;
                }
            }
        }
        false
    }

    fn truncate(&mut self, log: &RedoLog, through: Lsn) -> bool {
        match log.truncate_through(through) {
            Ok(()) => {
                self.truncated = log.start_lsn();
                true
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Closed, "{e}");
                false
            }
        }
    }

    /// The oracle, after a recovery; takes the batch in flight as acknowledged if it landed.
    fn check(&mut self, log: &RedoLog, recovered: &Recovered, context: &str) {
        let start = recovered.start_lsn;
        assert!(start >= self.truncated, "{context}: start LSN {start} before {}", self.truncated);
        let got = read_all(log, start);
        let landed = if got == expected_after(&self.acknowledged, start) {
            false
        } else {
            let Some(batch) = self.in_flight.clone() else {
                panic!("{context}: the log holds {} batches after {start}, not the acknowledged ones", got.len())
            };
            let mut with = self.acknowledged.clone();
            with.push(batch);
            assert!(
                got == expected_after(&with, start),
                "{context}: the log is neither the acknowledged batches nor those and the one in flight"
            );
            true
        };
        if landed {
            self.acknowledged.push(self.in_flight.take().expect("landed"));
        }
        self.in_flight = None;
        assert!(start <= self.durable(), "{context}: start LSN {start} past the durable {}", self.durable());
        assert_eq!(recovered.durable_lsn, self.durable(), "{context}: durable LSN");
        let fence = self.acknowledged.iter().map(|b| b.epoch).max().unwrap_or_default();
        assert_eq!(recovered.fence, fence, "{context}: the fence");
        self.truncated = start;
        self.epoch = self.epoch.max(fence.0);
    }
}

/// A round: power fails after `first_crash` block writes, then at random writes, `sessions`
/// times; the oracle checks every recovery. Returns how many appends or truncations a crash
/// interrupted.
fn crash_round(seed: u64, first_crash: Option<u64>, sessions: u64) -> u64 {
    let media = Arc::new(FaultyDevice::new(MemDevice::new(geometry(RING).total_blocks()), seed));
    RedoLog::format(media.as_ref(), geometry(RING)).unwrap();
    let mut writer = Writer::new(seed);
    let mut crash_rng = Rng::new(seed ^ 0x5eed);
    let mut interrupted = 0;
    for session in 0..sessions {
        let context = format!("seed {seed}, session {session}");
        let (log, recovered) = RedoLog::open(media.clone()).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
        writer.check(&log, &recovered, &context);
        let at = if session == 0 { first_crash } else { Some(crash_rng.below(8 * RING)) };
        if let Some(at) = at {
            media.crash_after(at);
        }
        interrupted += u64::from(writer.run(&log, OPS_PER_SESSION));
        drop(log);
        media.recover().unwrap();
    }
    let (log, recovered) = RedoLog::open(media.clone()).unwrap();
    writer.check(&log, &recovered, &format!("seed {seed}, last recovery"));
    interrupted
}

/// Power fails at each block write of one workload in turn (and, in each of those runs, twice
/// more at random): no acknowledged batch is ever lost.
#[test]
fn a_crash_at_every_block_write_loses_no_acknowledged_batch() {
    let seed = tundra_env::seed_from_env(21);
    let media = FaultyDevice::new(MemDevice::new(geometry(RING).total_blocks()), seed);
    RedoLog::format(&media, geometry(RING)).unwrap();
    let media = Arc::new(media);
    let (log, _) = RedoLog::open(media.clone()).unwrap();
    let before = media.stats().block_writes;
    assert!(!Writer::new(seed).run(&log, OPS_PER_SESSION));
    let writes = media.stats().block_writes - before;
    assert!(writes > 2 * RING, "the workload goes round the ring: {writes} block writes");
    let mut interrupted = 0;
    for at in 0..writes {
        interrupted += crash_round(seed, Some(at), 3);
    }
    eprintln!("{writes} crash points, {interrupted} appends or truncations interrupted");
    assert!(interrupted >= writes, "crashes interrupt the workload: {interrupted}");
}

fn random_rounds(rounds: u64) -> u64 {
    let seed = tundra_env::seed_from_env(22);
    (0..rounds).map(|round| crash_round(seed.wrapping_add(round * 7919), None, 4)).sum()
}

#[test]
fn crashes_at_random_writes_lose_no_acknowledged_batch() {
    let rounds = std::env::var("TUNDRA_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let interrupted = random_rounds(rounds);
    eprintln!("{rounds} rounds, {interrupted} appends or truncations interrupted");
    assert!(interrupted > rounds, "power should often fail inside an append: {interrupted}");
}

/// The crash oracle catches the rollback it guards against: with recovery dropping the newest
/// batch it found, the same rounds fail.
#[test]
fn the_crash_oracle_fails_when_recovery_drops_the_newest_batch() {
    set_drop_newest_batch(true);
    let verdict = std::panic::catch_unwind(|| random_rounds(20));
    set_drop_newest_batch(false);
    assert!(verdict.is_err(), "the crash oracle missed a dropped acknowledged batch");
}

/// A batch spanning many blocks whose group write power tears is in the log whole or not at all.
#[test]
fn a_torn_multi_block_batch_never_replays_partly() {
    let image = |lsn: u64| crate::RedoRecord {
        lsn: Lsn(lsn),
        page: lsn,
        payload: crate::Payload::Image(vec![lsn as u8; PAGE as usize]),
    };
    let small = RedoBatch { volume: VOLUME, epoch: WriterEpoch(1), prev_lsn: Lsn(0), end_lsn: Lsn(1), records: vec![] };
    let big = RedoBatch { prev_lsn: Lsn(1), end_lsn: Lsn(5), records: (2..6).map(image).collect(), ..small.clone() };
    let (mut whole, mut none) = (0, 0);
    // The batch takes nine blocks: crashes up to the ninth write tear it, later ones do not.
    for at in 0..12 {
        for seed in 0..4 {
            let media = Arc::new(FaultyDevice::new(MemDevice::new(geometry(RING).total_blocks()), seed));
            RedoLog::format(media.as_ref(), geometry(RING)).unwrap();
            let (log, _) = RedoLog::open(media.clone()).unwrap();
            log.append(&small).unwrap();
            media.crash_after(at);
            let acknowledged = log.append(&big).is_ok();
            drop(log);
            media.recover().unwrap();
            let (log, recovered) = RedoLog::open(media.clone()).unwrap();
            let got = read_all(&log, Lsn(0));
            if got == [small.clone(), big.clone()] {
                whole += 1;
            } else {
                assert!(!acknowledged, "crash after {at}: an acknowledged batch is gone");
                assert_eq!(got, std::slice::from_ref(&small), "crash after {at}, seed {seed}");
                assert_eq!(recovered.durable_lsn, Lsn(1));
                none += 1;
            }
        }
    }
    assert!(whole > 0 && none > 0, "{whole} whole, {none} absent");
}

/// A log whose written blocks cover the cases: two sessions, batches spanning blocks, a ring
/// gone round more than once, truncated blocks and a partly filled last block.
fn two_sessions() -> Arc<MemDevice> {
    let device = Arc::new(MemDevice::new(geometry(12).total_blocks()));
    RedoLog::format(device.as_ref(), geometry(12)).unwrap();
    let mut rng = Rng::new(31);
    let mut prev = Lsn(0);
    for session in 0..2 {
        let (log, _) = RedoLog::open(device.clone()).unwrap();
        for i in 0..14 {
            let batch = random_batch(&mut rng, VOLUME, WriterEpoch(1 + session), prev, 3, PAGE);
            match log.append(&batch) {
                Ok(AppendOutcome::Ok { durable_lsn }) => prev = durable_lsn,
                Err(e) if e.kind() == ErrorKind::Full => log.truncate_through(prev).unwrap(),
                other => panic!("{other:?}"),
            }
            if i == 9 {
                log.truncate_through(Lsn(prev.0 / 2)).unwrap();
            }
        }
    }
    device
}

/// What an inspection found, in the terms a flip must not change.
type Found = (Vec<BatchEntry>, Lsn, WriterEpoch, Lsn);

fn found(device: &dyn BlockDevice) -> Result<Found> {
    let found = recovery::inspect(device)?;
    Ok((found.entries.into_iter().collect(), found.durable_lsn, found.fence, found.superblock.start_lsn))
}

/// Recovered exactly (false), or refused as damage naming `lba` (true); anything else is a
/// silent change.
fn recovers_or_refuses(device: &dyn BlockDevice, expected: &Found, lba: Lba) -> std::result::Result<bool, String> {
    match found(device) {
        Ok(got) if got == *expected => Ok(false),
        Ok(got) => Err(format!(
            "silent rollback: {} of {} batches, durable LSN {} of {}",
            got.0.len(),
            expected.0.len(),
            got.1,
            expected.1
        )),
        Err(e) if e.kind() == ErrorKind::Corrupted && e.message().contains(&format!("({lba})")) => Ok(true),
        Err(e) => Err(format!("an error that does not name {lba}: {e}")),
    }
}

fn flip(device: &dyn BlockDevice, lba: Lba, byte: usize, bit: u32) {
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(lba, &mut block).unwrap();
    block[byte] ^= 1 << bit;
    device.write(lba, &block).unwrap();
}

#[test]
fn every_bit_flip_is_recovered_exactly_or_refused_naming_the_block() {
    let device = two_sessions();
    let expected = found(device.as_ref()).unwrap();
    assert!(expected.0.len() >= 3, "{} batches", expected.0.len());
    let (mut recovered, mut refused) = (0u64, 0u64);
    let mut block = vec![0u8; BLOCK_SIZE];
    for lba in (0..device.block_count()).map(Lba) {
        device.read(lba, &mut block).unwrap();
        if block.iter().all(|&b| b == 0) {
            continue;
        }
        for byte in 0..BLOCK_SIZE {
            for bit in 0..8 {
                flip(device.as_ref(), lba, byte, bit);
                let verdict = recovers_or_refuses(device.as_ref(), &expected, lba);
                flip(device.as_ref(), lba, byte, bit);
                if verdict.unwrap_or_else(|e| panic!("{lba}, byte {byte}, bit {bit}: {e}")) {
                    refused += 1;
                } else {
                    recovered += 1;
                }
            }
        }
    }
    eprintln!("{recovered} flips recovered exactly, {refused} refused");
    // The superblock copies' flips are recovered from the other copy; the log's are refused.
    assert!(recovered >= 2 * 8 * 4096 && refused > 8 * 4096, "{recovered} recovered, {refused} refused");
}

/// The flip oracle catches the bug it guards against: with recovery taking damage for the end
/// of the log, a flipped bit in the first retained block silently drops acknowledged batches.
#[test]
fn the_flip_oracle_fails_when_damage_ends_the_log() {
    let device = two_sessions();
    let expected = found(device.as_ref()).unwrap();
    let first = recovery::inspect(device.as_ref()).unwrap().superblock.start.position();
    let lba = geometry(12).lba(first);
    flip(device.as_ref(), lba, 2000, 3);
    assert!(recovers_or_refuses(device.as_ref(), &expected, lba).is_ok());
    set_damage_ends_log(true);
    let verdict = recovers_or_refuses(device.as_ref(), &expected, lba);
    set_damage_ends_log(false);
    assert!(verdict.is_err_and(|e| e.contains("silent rollback")), "the injected bug went unnoticed");
}

/// A crash can leave a block of an unacknowledged group that holds whole frames beyond the end
/// of the log: here a group that filled the partly filled block and began the next, of which
/// only the next landed. Recovery ends the log before it, and it stays out when a later session
/// truncates everything and the retained start lands on it, before writing anything there.
#[test]
fn a_block_left_beyond_the_end_never_joins_the_log_later() {
    let device = Arc::new(MemDevice::new(geometry(8).total_blocks()));
    RedoLog::format(device.as_ref(), geometry(8)).unwrap();
    let (log, _) = RedoLog::open(device.clone()).unwrap();
    let record = |lsn: u64, len: usize| crate::RedoRecord {
        lsn: Lsn(lsn),
        page: 1,
        payload: crate::Payload::Ranges(vec![(0, vec![7; len])]),
    };
    let batch = |prev: u64, end: u64, records| RedoBatch {
        volume: VOLUME,
        epoch: WriterEpoch(1),
        prev_lsn: Lsn(prev),
        end_lsn: Lsn(end),
        records,
    };
    // The first batch's frame leaves room for exactly ten empty batches in block 0.
    let first = batch(0, 1, vec![record(1, 4048 - 10 * 44 - 73)]);
    log.append(&first).unwrap();
    let block_0 = geometry(8).lba(Position(0));
    let mut before = vec![0u8; BLOCK_SIZE];
    device.read(block_0, &mut before).unwrap();
    for _ in 0..10 {
        assert!(matches!(log.submit(&batch(1, 1, vec![])).unwrap(), Submitted::Accepted(_)));
    }
    let Submitted::Accepted(ticket) = log.submit(&batch(1, 2, vec![record(2, 10)])).unwrap() else { panic!() };
    log.wait(ticket).unwrap();
    assert_eq!(log.committer.lock().durable_end.position(), Position(1), "the group filled block 0");
    drop(log);
    // The rewrite of block 0 is lost; block 1, with a whole frame that continues the log's
    // LSNs, landed.
    device.write(block_0, &before).unwrap();
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.durable_lsn, recovered.batches), (Lsn(1), 1));
    log.truncate_through(Lsn(1)).unwrap();
    drop(log);
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.start_lsn, recovered.durable_lsn, recovered.batches), (Lsn(1), Lsn(1), 0));
    assert!(read_all(&log, Lsn(1)).is_empty());
}
