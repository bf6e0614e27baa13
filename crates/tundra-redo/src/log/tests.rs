//! The redo log's tests without crashes: round trips across reopens and laps of the ring,
//! group commit from many threads, every refusal changing nothing, a full ring and its
//! truncation, reads back, the fence across restarts and a damaged superblock copy. The crash
//! and damage tests are in `crash_tests.rs`.

use std::sync::Arc;

use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_env::Rng;
use tundra_store::ids::{Lsn, VolumeId};

use super::*;
use crate::codec::tests::random_batch;
use crate::{Payload, RedoRecord};

pub(super) const VOLUME: VolumeId = VolumeId(3);
pub(super) const PAGE: u32 = 8192;

pub(super) fn geometry(log_blocks: u64) -> LogGeometry {
    LogGeometry { volume: VOLUME, page_size: PAGE, log_blocks }
}

/// A formatted log on a memory device, opened.
pub(super) fn fresh(log_blocks: u64) -> (Arc<MemDevice>, RedoLog) {
    let device = Arc::new(MemDevice::new(geometry(log_blocks).total_blocks()));
    RedoLog::format(device.as_ref(), geometry(log_blocks)).unwrap();
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.durable_lsn, recovered.batches), (Lsn(0), 0));
    (device, log)
}

/// Every durable batch after `lsn`, read back.
pub(super) fn read_all(log: &RedoLog, lsn: Lsn) -> Vec<RedoBatch> {
    log.read_after(lsn).unwrap().collect::<Result<Vec<_>>>().unwrap()
}

/// What `read_after(lsn)` must give, from the batches acknowledged in order: those ending
/// after `lsn` that claim any LSN, with their records after `lsn`.
pub(super) fn expected_after(acknowledged: &[RedoBatch], lsn: Lsn) -> Vec<RedoBatch> {
    acknowledged
        .iter()
        .filter(|b| b.end_lsn > lsn && b.end_lsn > b.prev_lsn)
        .map(|b| RedoBatch { records: b.records.iter().filter(|r| r.lsn > lsn).cloned().collect(), ..b.clone() })
        .collect()
}

/// The device's blocks, to compare before and after a refusal.
pub(super) fn blocks_of(device: &dyn BlockDevice) -> Vec<u8> {
    let mut bytes = vec![0u8; device.block_count() as usize * BLOCK_SIZE];
    device.read(Lba(0), &mut bytes).unwrap();
    bytes
}

fn small_batch(prev: Lsn, epoch: u64) -> RedoBatch {
    let record = RedoRecord {
        lsn: Lsn(prev.0 + 1),
        page: prev.0 % 7,
        payload: Payload::Ranges(vec![(100, vec![prev.0 as u8; 8])]),
    };
    RedoBatch {
        volume: VOLUME,
        epoch: WriterEpoch(epoch),
        prev_lsn: prev,
        end_lsn: Lsn(prev.0 + 1),
        records: vec![record],
    }
}

#[test]
fn batches_round_trip_across_reopens_and_laps_of_the_ring() {
    let mut rng = Rng::new(tundra_env::seed_from_env(11));
    let (device, mut log) = fresh(24);
    let mut acknowledged: Vec<RedoBatch> = Vec::new();
    let mut durable = Lsn(0);
    for round in 0..400u64 {
        let batch = random_batch(&mut rng, VOLUME, WriterEpoch(1 + round / 100), durable, 5, PAGE);
        match log.append(&batch) {
            Ok(AppendOutcome::Ok { durable_lsn }) => {
                assert_eq!(durable_lsn, batch.end_lsn);
                durable = durable_lsn;
                acknowledged.push(batch);
            }
            Err(e) if e.kind() == ErrorKind::Full => {
                // Everything but the newest few batches is persisted elsewhere by now.
                let keep = acknowledged.len().saturating_sub(1 + rng.below(3) as usize);
                let through = acknowledged.get(keep.saturating_sub(1)).map_or(Lsn(0), |b| b.end_lsn);
                log.truncate_through(through).unwrap();
            }
            other => panic!("round {round}: {other:?}"),
        }
        if round % 37 == 0 {
            let (reopened, recovered) = RedoLog::open(device.clone()).unwrap();
            assert_eq!(recovered.durable_lsn, durable, "round {round}");
            assert_eq!(recovered.start_lsn, log.start_lsn());
            log = reopened;
        }
        let start = log.start_lsn();
        assert_eq!(read_all(&log, start), expected_after(&acknowledged, start), "round {round}");
        // A read from the middle of a batch leaves out the records at or before its LSN.
        if let Some(middle) = acknowledged.iter().rev().find(|b| b.records.len() > 1 && b.end_lsn > start) {
            let lsn = middle.records[0].lsn;
            assert_eq!(read_all(&log, lsn), expected_after(&acknowledged, lsn));
        }
    }
    let laps = log.committer.lock().durable_end.position().0 / log.geometry.log_blocks;
    assert!(laps >= 4, "the ring went round {laps} times");
}

/// A memory device whose flush waits (at most 20 ms) until two more batches were submitted
/// since it began, or all were: a device flush takes long enough for writers to queue up
/// behind it. The wait paces the test; nothing it checks depends on how long it lasts.
struct PacedFlush {
    inner: MemDevice,
    submitted: std::sync::atomic::AtomicU64,
    total: u64,
    flushes: std::sync::atomic::AtomicU64,
}

impl BlockDevice for PacedFlush {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, lba: Lba, buf: &mut [u8]) -> tundra_device::Result<()> {
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: Lba, data: &[u8]) -> tundra_device::Result<()> {
        self.inner.write(lba, data)
    }
    fn trim(&self, lba: Lba, block_count: u64) -> tundra_device::Result<()> {
        self.inner.trim(lba, block_count)
    }
    fn flush(&self) -> tundra_device::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let seen = self.submitted.load(SeqCst);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(20);
        while self.submitted.load(SeqCst) < (seen + 2).min(self.total) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        self.flushes.fetch_add(1, SeqCst);
        self.inner.flush()
    }
    fn usage(&self) -> tundra_device::Usage {
        self.inner.usage()
    }
}

/// Many threads submit in LSN order (a sequencer hands out `prev_lsn`) and wait each for its
/// own batch: every acknowledged batch is there after a reopen, with fewer flushes than batches.
#[test]
fn group_commit_from_many_threads_shares_flushes() {
    use std::sync::atomic::Ordering::SeqCst;
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 40;
    let batches = THREADS * PER_THREAD;
    let device = Arc::new(PacedFlush {
        inner: MemDevice::new(geometry(1024).total_blocks()),
        submitted: 0.into(),
        total: batches,
        flushes: 0.into(),
    });
    RedoLog::format(device.as_ref(), geometry(1024)).unwrap();
    let (log, _) = RedoLog::open(device.clone()).unwrap();
    let flushes_before = device.flushes.load(SeqCst);
    let sequencer = parking_lot::Mutex::new((Lsn(0), Rng::new(tundra_env::seed_from_env(12))));
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..PER_THREAD {
                    let ticket = {
                        let mut s = sequencer.lock();
                        let (prev, rng) = &mut *s;
                        let batch = random_batch(rng, VOLUME, WriterEpoch(1), *prev, 3, PAGE);
                        let Submitted::Accepted(ticket) = log.submit(&batch).unwrap() else {
                            panic!("a batch in sequence refused")
                        };
                        device.submitted.fetch_add(1, SeqCst);
                        *prev = batch.end_lsn;
                        ticket
                    };
                    let durable = log.wait(ticket).unwrap();
                    assert!(durable >= ticket.end_lsn());
                }
            });
        }
    });
    let flushes = device.flushes.load(SeqCst) - flushes_before;
    eprintln!("{flushes} flushes for {batches} batches");
    assert!(flushes < batches, "{flushes} flushes for {batches} batches");
    let appended = read_all(&log, Lsn(0));
    drop(log);
    let (log, recovered) = RedoLog::open(device).unwrap();
    assert_eq!(recovered.batches as u64, batches);
    assert_eq!(read_all(&log, Lsn(0)), appended);
    for pair in appended.windows(2) {
        assert_eq!(pair[1].prev_lsn, pair[0].end_lsn);
    }
}

/// One writer passing batch after batch without waiting between them: the first wait writes
/// them all in one group with one flush, and the later tickets are durable already.
#[test]
fn submitted_batches_share_one_group_commit() {
    let device = Arc::new(FaultyDevice::new(MemDevice::new(geometry(64).total_blocks()), 1));
    RedoLog::format(device.as_ref(), geometry(64)).unwrap();
    let (log, _) = RedoLog::open(device.clone()).unwrap();
    let flushes = device.stats().flushes;
    let tickets: Vec<Ticket> = (0..5)
        .map(|i| match log.submit(&small_batch(Lsn(i), 1)).unwrap() {
            Submitted::Accepted(ticket) => ticket,
            Submitted::Refused(outcome) => panic!("{outcome:?}"),
        })
        .collect();
    assert_eq!(log.durable_lsn(), Lsn(0), "nothing is durable before a wait");
    assert_eq!(log.wait(tickets[0]).unwrap(), Lsn(5));
    for ticket in &tickets[1..] {
        assert_eq!(log.wait(*ticket).unwrap(), Lsn(5));
    }
    assert_eq!(device.stats().flushes - flushes, 1);
}

/// `sync` makes every submitted batch durable in one group (the deferred appends of a
/// replicated stream), writes nothing when nothing is pending, and a reopen without it finds
/// only what was synced.
#[test]
fn sync_makes_submitted_batches_durable_and_nothing_else_is() {
    let device = Arc::new(FaultyDevice::new(MemDevice::new(geometry(64).total_blocks()), 1));
    RedoLog::format(device.as_ref(), geometry(64)).unwrap();
    let (log, _) = RedoLog::open(device.clone()).unwrap();
    let flushes = device.stats().flushes;
    assert_eq!(log.sync().unwrap(), Lsn(0));
    assert_eq!(device.stats().flushes, flushes, "a sync with nothing pending wrote");
    for i in 0..3 {
        assert!(matches!(log.submit(&small_batch(Lsn(i), 1)).unwrap(), Submitted::Accepted(_)));
    }
    assert_eq!(log.sync().unwrap(), Lsn(3));
    assert_eq!(device.stats().flushes - flushes, 1);
    assert_eq!(log.sync().unwrap(), Lsn(3));
    assert_eq!(device.stats().flushes - flushes, 1, "a second sync wrote again");
    // Two more submitted and never synced: a crash (the log dropped, reopened) loses them.
    for i in 3..5 {
        assert!(matches!(log.submit(&small_batch(Lsn(i), 1)).unwrap(), Submitted::Accepted(_)));
    }
    drop(log);
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.durable_lsn, recovered.batches), (Lsn(3), 3));
    // The lost batches are taken again where they were.
    assert_eq!(log.append(&small_batch(Lsn(3), 1)).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(4) });
}

/// Gap, Fenced, Invalid and Full refusals write nothing and move nothing: the device's bytes
/// and the log's LSNs are as before, and the batch the writer should have sent is accepted.
#[test]
fn refusals_change_nothing() {
    let (device, log) = fresh(8);
    assert_eq!(log.append(&small_batch(Lsn(0), 5)).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(1) });
    let before = blocks_of(device.as_ref());
    let state = |log: &RedoLog| (log.durable_lsn(), log.fence(), log.usage_blocks(), log.start_lsn());
    let was = state(&log);
    let mut outside = small_batch(Lsn(1), 5);
    outside.records[0].lsn = Lsn(9);
    let mut backwards = small_batch(Lsn(1), 5);
    backwards.end_lsn = Lsn(0);
    backwards.records.clear();
    let mut past_page = small_batch(Lsn(1), 5);
    past_page.records[0].payload = Payload::Ranges(vec![(PAGE - 4, vec![0; 8])]);
    let mut other_volume = small_batch(Lsn(1), 5);
    other_volume.volume = VolumeId(4);
    let invalid = [outside, backwards, past_page, other_volume];
    for batch in &invalid {
        let error = log.append(batch).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    }
    assert_eq!(log.append(&small_batch(Lsn(0), 5)).unwrap(), AppendOutcome::Gap { expected_prev_lsn: Lsn(1) });
    assert_eq!(log.append(&small_batch(Lsn(7), 5)).unwrap(), AppendOutcome::Gap { expected_prev_lsn: Lsn(1) });
    assert_eq!(log.append(&small_batch(Lsn(1), 4)).unwrap(), AppendOutcome::Fenced { epoch: WriterEpoch(5) });
    // A stale writer is fenced even when its prev_lsn is wrong too.
    assert_eq!(log.append(&small_batch(Lsn(0), 4)).unwrap(), AppendOutcome::Fenced { epoch: WriterEpoch(5) });
    let huge = RedoBatch {
        records: (0..5)
            .map(|i| RedoRecord { lsn: Lsn(2 + i), page: i, payload: Payload::Image(vec![1; PAGE as usize]) })
            .collect(),
        end_lsn: Lsn(6),
        ..small_batch(Lsn(1), 5)
    };
    assert_eq!(log.append(&huge).unwrap_err().kind(), ErrorKind::Invalid, "larger than the whole ring");
    assert_eq!(blocks_of(device.as_ref()), before);
    assert_eq!(state(&log), was);
    // A higher epoch takes the stream over, and the old writer is fenced from then on.
    assert_eq!(log.append(&small_batch(Lsn(1), 6)).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(2) });
    assert_eq!(log.append(&small_batch(Lsn(2), 5)).unwrap(), AppendOutcome::Fenced { epoch: WriterEpoch(6) });
    assert_eq!(read_all(&log, Lsn(0)), [small_batch(Lsn(0), 5), small_batch(Lsn(1), 6)]);
}

/// A full ring refuses with `Full` and changes nothing; once the batches are truncated, appends
/// go on, across a reopen too.
#[test]
fn a_full_ring_refuses_until_truncated() {
    let (device, log) = fresh(4);
    let mut prev = Lsn(0);
    let image =
        |lsn: u64| RedoRecord { lsn: Lsn(lsn), page: lsn, payload: Payload::Image(vec![lsn as u8; PAGE as usize]) };
    let batch = |prev: Lsn| RedoBatch { records: vec![image(prev.0 + 1)], ..small_batch(prev, 1) };
    let full = loop {
        match log.append(&batch(prev)) {
            Ok(AppendOutcome::Ok { durable_lsn }) => prev = durable_lsn,
            Err(error) => break error,
            Ok(other) => panic!("{other:?}"),
        }
    };
    assert_eq!(full.kind(), ErrorKind::Full, "{full}");
    assert!(prev.0 >= 1, "at least one page image fits four blocks");
    let before = blocks_of(device.as_ref());
    assert_eq!(log.append(&batch(prev)).unwrap_err().kind(), ErrorKind::Full);
    assert_eq!((blocks_of(device.as_ref()), log.durable_lsn()), (before, prev));
    assert_eq!(log.truncate_through(Lsn(prev.0 + 1)).unwrap_err().kind(), ErrorKind::Invalid, "past the durable LSN");
    log.truncate_through(prev).unwrap();
    assert_eq!(log.read_after(Lsn(0)).err().map(|e| e.kind()), Some(ErrorKind::Invalid), "truncated records");
    assert!(read_all(&log, prev).is_empty());
    // Each truncation frees what the batch before needed: round and round the ring.
    for _ in 0..6 {
        log.truncate_through(prev).unwrap();
        let Ok(AppendOutcome::Ok { durable_lsn }) = log.append(&batch(prev)) else { panic!("after truncation") };
        prev = durable_lsn;
    }
    drop(log);
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.durable_lsn, recovered.batches), (prev, 1));
    assert_eq!(read_all(&log, recovered.start_lsn).len(), 1);
    // Truncating everything leaves an empty log that remembers where the stream ends.
    log.truncate_through(prev).unwrap();
    drop(log);
    let (log, recovered) = RedoLog::open(device).unwrap();
    assert_eq!((recovered.start_lsn, recovered.durable_lsn, recovered.batches), (prev, prev, 0));
    assert_eq!(log.append(&small_batch(Lsn(0), 1)).unwrap(), AppendOutcome::Gap { expected_prev_lsn: prev });
    assert!(matches!(log.append(&batch(prev)).unwrap(), AppendOutcome::Ok { .. }));
}

/// The fence survives restarts: from the batches in the log, and from the superblock once the
/// batch that raised it is truncated.
#[test]
fn the_fence_survives_restarts_and_truncation() {
    let (device, log) = fresh(8);
    log.append(&small_batch(Lsn(0), 2)).unwrap();
    log.append(&small_batch(Lsn(1), 9)).unwrap();
    drop(log);
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!(recovered.fence, WriterEpoch(9));
    assert_eq!(log.append(&small_batch(Lsn(2), 8)).unwrap(), AppendOutcome::Fenced { epoch: WriterEpoch(9) });
    log.truncate_through(Lsn(2)).unwrap();
    drop(log);
    let (log, recovered) = RedoLog::open(device).unwrap();
    assert_eq!((recovered.fence, recovered.batches), (WriterEpoch(9), 0));
    assert_eq!(log.append(&small_batch(Lsn(2), 8)).unwrap(), AppendOutcome::Fenced { epoch: WriterEpoch(9) });
    assert!(matches!(log.append(&small_batch(Lsn(2), 9)).unwrap(), AppendOutcome::Ok { .. }));
}

/// A damaged superblock copy is recovered from the other and said so; the log is intact.
#[test]
fn a_damaged_superblock_copy_falls_back_to_the_other() {
    let (device, log) = fresh(8);
    for i in 0..5 {
        log.append(&small_batch(Lsn(i), 1)).unwrap();
    }
    log.truncate_through(Lsn(2)).unwrap();
    let expected = read_all(&log, Lsn(2));
    let session = log.session;
    drop(log);
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(Lba(1), &mut block).unwrap();
    block[70] ^= 4;
    device.write(Lba(1), &block).unwrap();
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.start_lsn, recovered.durable_lsn), (Lsn(2), Lsn(5)));
    assert!(recovered.notes.iter().any(|n| n.contains("copy at LBA 1 is damaged")), "{:?}", recovered.notes);
    assert_eq!(log.session, Session(session.0 + 2), "a lost copy may have been one session newer");
    assert_eq!(read_all(&log, Lsn(2)), expected);
    // Both copies were rewritten at the open.
    drop(log);
    let (_, recovered) = RedoLog::open(device).unwrap();
    assert!(recovered.notes.is_empty());
}

#[test]
fn a_damaged_block_is_an_error_when_read_back() {
    let (device, log) = fresh(8);
    for i in 0..3 {
        log.append(&small_batch(Lsn(i), 1)).unwrap();
    }
    let lba = log.geometry.lba(Position(0));
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(lba, &mut block).unwrap();
    block[300] ^= 1;
    device.write(lba, &block).unwrap();
    let error = log.read_after(Lsn(0)).unwrap().next().unwrap().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupted);
    assert!(error.message().contains(&format!("position 0 ({lba})")), "{error}");
}

#[test]
fn format_and_open_refuse_what_is_not_a_log() {
    let device = Arc::new(MemDevice::new(16));
    for bad in
        [LogGeometry { page_size: 3000, ..geometry(8) }, LogGeometry { log_blocks: 1, ..geometry(8) }, geometry(15)]
    {
        assert_eq!(RedoLog::format(device.as_ref(), bad).unwrap_err().kind(), ErrorKind::Invalid, "{bad:?}");
    }
    let error = RedoLog::open(device.clone()).err().unwrap();
    assert!(error.message().contains("no valid redo log superblock"), "{error}");
    RedoLog::format(device.as_ref(), geometry(8)).unwrap();
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(Lba(0), &mut block).unwrap();
    block[8] = 2;
    let crc = crc32c::crc32c(&block[..BLOCK_SIZE - 4]);
    block[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    device.write(Lba(0), &block).unwrap();
    let error = RedoLog::open(device).err().unwrap();
    assert!(error.message().contains("format version 2; this build reads version 1"), "{error}");
}

/// A log laid at a start LSN (a stream copied from another replica): the first batch must
/// follow that LSN, the stream reads back from it across a reopen, and an empty batch carries
/// the writer's epoch alone.
#[test]
fn a_log_formatted_at_a_start_lsn_takes_batches_from_there() {
    let device = Arc::new(MemDevice::new(geometry(16).total_blocks()));
    RedoLog::format_at(device.as_ref(), geometry(16), Lsn(40)).unwrap();
    let (log, recovered) = RedoLog::open(device.clone()).unwrap();
    assert_eq!((recovered.start_lsn, recovered.durable_lsn, recovered.batches), (Lsn(40), Lsn(40), 0));
    assert_eq!(log.append(&small_batch(Lsn(0), 1)).unwrap(), AppendOutcome::Gap { expected_prev_lsn: Lsn(40) });
    let first = small_batch(Lsn(40), 1);
    log.append(&first).unwrap();
    let epoch_only =
        RedoBatch { volume: VOLUME, epoch: WriterEpoch(5), prev_lsn: Lsn(41), end_lsn: Lsn(41), records: vec![] };
    log.append(&epoch_only).unwrap();
    drop(log);
    let (log, recovered) = RedoLog::open(device).unwrap();
    assert_eq!((recovered.start_lsn, recovered.durable_lsn, recovered.fence), (Lsn(40), Lsn(41), WriterEpoch(5)));
    assert_eq!(read_all(&log, Lsn(40)), vec![first]);
    assert!(log.read_after(Lsn(39)).is_err(), "records before the start are not there");
}
