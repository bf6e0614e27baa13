//! Tests of the emulated drive: the conformance and crash suites, a model-based random test that
//! drives garbage collection and TRIM, and the drive's own promises (drive full changes nothing,
//! zeros cost nothing, misdirected writes are caught).

use std::sync::Arc;

use proptest::prelude::*;
use tundra_env::Rng;

use super::*;

use crate::Lba;
use crate::conformance::{self, Crashable, Model, block_content};
use crate::fault::{Fault, FaultyDevice};
use crate::mem::MemDevice;

const SEGMENT: u64 = 64 * 1024;

fn options(logical_blocks: u64, physical_bytes: u64) -> FormatOptions {
    FormatOptions { segment_bytes: SEGMENT, ..FormatOptions::new(logical_blocks * 4096, physical_bytes) }
}

fn media_for(options: &FormatOptions) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096))
}

fn quiet() -> CsdConfig {
    CsdConfig { background: false, ..CsdConfig::default() }
}

fn new_drive(logical_blocks: u64, physical_bytes: u64, config: CsdConfig) -> CsdDevice {
    let options = options(logical_blocks, physical_bytes);
    CsdDevice::format(media_for(&options), &options, config).unwrap()
}

#[test]
fn conformance_inline_and_background() {
    conformance::run_all(&|blocks| Box::new(new_drive(blocks, 1 << 20, CsdConfig::default())));
}

#[test]
fn conformance_deferred_without_background() {
    let config = CsdConfig { compression: CompressionMode::Deferred, ..quiet() };
    conformance::run_all(&|blocks| Box::new(new_drive(blocks, 1 << 20, config)));
}

#[test]
fn conformance_compression_off() {
    let config = CsdConfig { compression: CompressionMode::Off, ..quiet() };
    conformance::run_all(&|blocks| Box::new(new_drive(blocks, 2 << 20, config)));
}

#[test]
fn conformance_cost_benefit_small_physical() {
    // Physical space for a fraction of the logical space: the random test runs GC constantly.
    let config = CsdConfig { gc_policy: GcPolicy::CostBenefit, ..quiet() };
    conformance::run_all(&|blocks| Box::new(new_drive(blocks, 640 * 1024, config)));
}

/// The drive over a fault-injecting memory device, reopened from what the media kept.
struct Harness {
    media: Arc<FaultyDevice<MemDevice>>,
    drive: Option<CsdDevice>,
    config: CsdConfig,
}

impl Harness {
    fn new(logical_blocks: u64, physical_bytes: u64, seed: u64, config: CsdConfig) -> Harness {
        let options = options(logical_blocks, physical_bytes);
        let blocks = options.geometry().unwrap().total_bytes() / 4096;
        let media = Arc::new(FaultyDevice::new(MemDevice::new(blocks), seed));
        let drive = CsdDevice::format(media.clone(), &options, config).unwrap();
        Harness { media, drive: Some(drive), config }
    }
}

impl Crashable for Harness {
    fn device(&self) -> &dyn BlockDevice {
        self.drive.as_ref().expect("open")
    }

    fn arm_crash(&mut self, media_writes: u64) {
        self.media.crash_after(media_writes);
    }

    fn crash_and_recover(&mut self) {
        self.media.crash();
        self.drive = None;
        self.media.recover().unwrap();
        let drive = CsdDevice::open(self.media.clone(), self.config).unwrap();
        drive.check_invariants();
        self.drive = Some(drive);
    }
}

/// At least 10,000 crash points in the default run. Each round crashes the drive's media after a
/// random number of block writes (often in the middle of a flush, a segment seal, a garbage
/// collection or a checkpoint), recovers, and checks that no flushed write was lost.
#[test]
fn ten_thousand_crash_points() {
    let rounds = std::env::var("TUNDRA_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_500);
    let mut struck = 0;
    for seed in std::env::var("TUNDRA_SEEDS")
        .map(|s| s.split(",").map(|x| x.parse::<u64>().unwrap()).collect::<Vec<_>>())
        .unwrap_or(vec![0, 1, 2, 3])
    {
        let config = CsdConfig {
            gc_policy: if seed % 2 == 0 { GcPolicy::Greedy } else { GcPolicy::CostBenefit },
            compression: if seed == 3 { CompressionMode::Deferred } else { CompressionMode::Inline },
            background: false,
            checkpoint_interval_segments: 4,
        };
        // 48 logical blocks over about 150 KiB of physical space: GC runs all the time.
        let mut harness = Harness::new(48, 150 * 1024, 100 + seed, config);
        struck += conformance::crash_rounds(&mut harness, 100 + seed, rounds, 10);
    }
    let total = 4 * rounds;
    assert!(total >= 10_000 || std::env::var("TUNDRA_CRASH_ROUNDS").is_ok());
    assert!(struck * 8 > total, "crashes should often strike mid-operation: {struck} of {total}");
}

#[derive(Clone, Debug)]
enum Op {
    Write { lba: u64, count: u64, kind: u64 },
    Trim { lba: u64, count: u64 },
    Flush,
    Collect,
    Checkpoint,
    Reopen,
}

fn op_strategy(blocks: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..blocks, 1..6u64, 0..4u64).prop_map(move |(lba, count, kind)| Op::Write { lba, count: count.min(blocks - lba), kind }),
        2 => (0..blocks, 1..20u64).prop_map(move |(lba, count)| Op::Trim { lba, count: count.min(blocks - lba) }),
        1 => Just(Op::Flush),
        1 => Just(Op::Collect),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The drive against a map of blocks, through writes of every compressibility, trims,
    /// garbage collection, checkpoints and clean reopens.
    #[test]
    fn drive_matches_model(ops in proptest::collection::vec(op_strategy(64), 1..120), deferred in any::<bool>()) {
        let compression = if deferred { CompressionMode::Deferred } else { CompressionMode::Inline };
        let config = CsdConfig { compression, ..quiet() };
        let options = options(64, 160 * 1024);
        let media = media_for(&options);
        let mut drive = Some(CsdDevice::format(media.clone(), &options, config).unwrap());
        let mut model = Model::new(64);
        for (tag, op) in ops.into_iter().enumerate() {
            let dev = drive.as_ref().unwrap();
            match op {
                Op::Write { lba, count, kind } => {
                    let data: Vec<u8> = (0..count).flat_map(|i| block_content(tag as u64 * 8 + i, kind + i)).collect();
                    dev.write(Lba(lba), &data).unwrap();
                    model.write(lba, &data);
                }
                Op::Trim { lba, count } => {
                    dev.trim(Lba(lba), count).unwrap();
                    model.trim(lba, count);
                }
                Op::Flush => dev.flush().unwrap(),
                Op::Collect => { dev.collect_garbage(4).unwrap(); }
                Op::Checkpoint => dev.checkpoint().unwrap(),
                Op::Reopen => {
                    drive.take().unwrap().close().unwrap();
                    drive = Some(CsdDevice::open(media.clone(), config).unwrap());
                }
            }
            let dev = drive.as_ref().unwrap();
            dev.check_invariants();
            let mut image = vec![0u8; 64 * 4096];
            dev.read(Lba(0), &mut image).unwrap();
            prop_assert!(image == model.expected(0, 64));
        }
    }
}

#[test]
fn zero_blocks_cost_nothing() {
    let drive = new_drive(256, 1 << 20, quiet());
    drive.write(Lba(0), &vec![0u8; 256 * 4096]).unwrap();
    let stats = drive.stats();
    assert_eq!(stats.mapped_bytes, 0);
    assert_eq!(stats.physical_used_bytes, 0);
    // One trim record for the whole run of zeros, nothing per block.
    assert!(stats.counters.media_appended_bytes <= 64 * 8, "{stats:?}");
}

#[test]
fn a_range_reports_its_own_blocks_only() {
    let drive = new_drive(256, 1 << 20, quiet());
    // A mostly empty block, as a log slot with a few records is, and a full one elsewhere.
    let mut sparse = vec![0u8; 4096];
    sparse[..100].copy_from_slice(&[7u8; 100]);
    drive.write(Lba(10), &sparse).unwrap();
    drive.write(Lba(200), &block_content(5, 1)).unwrap();
    let range = drive.range_usage(Lba(0), 100).unwrap();
    assert_eq!(range.mapped_bytes, 4096);
    assert!(range.physical_bytes > 0 && range.physical_bytes < 512, "{range:?}");
    let whole = drive.range_usage(Lba(0), 256).unwrap();
    assert_eq!(whole.mapped_bytes, drive.stats().mapped_bytes);
    assert_eq!(whole.physical_bytes, drive.stats().physical_used_bytes);
    assert_eq!(drive.mapped_bytes_in(Lba(100), 100), Some(0));
    assert_eq!(drive.physical_bytes_in(Lba(0), 100), Some(range.physical_bytes));
    assert_eq!(drive.physical_bytes_in(Lba(0), 256), Some(drive.stats().physical_used_bytes));
    assert!(drive.range_usage(Lba(200), 57).is_err(), "a range past the end is refused");
}

#[test]
fn drive_full_changes_nothing() {
    let drive = new_drive(1024, 256 * 1024, quiet());
    let mut written = 0u64;
    let error = loop {
        let data = block_content(written + 1, 3);
        match drive.write(Lba(written), &data) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(error.kind(), crate::ErrorKind::DriveFull, "{error}");
    let capacity = drive.stats().physical_capacity_bytes;
    assert_eq!(written, capacity / 4112, "raw records of 4112 bytes fill {capacity} bytes");
    let before = drive.stats();
    // A multi-block write that does not fit changes nothing, not even its first blocks.
    let big: Vec<u8> = (0..8).flat_map(|i| block_content(9000 + i, 3)).collect();
    assert_eq!(drive.write(Lba(500), &big).unwrap_err().kind(), crate::ErrorKind::DriveFull);
    let mut buf = vec![0u8; 8 * 4096];
    drive.read(Lba(500), &mut buf).unwrap();
    assert!(crate::is_zero(&buf));
    assert_eq!(drive.stats().mapped_bytes, before.mapped_bytes);
    // Overwriting in place still works on a full drive, and trimming makes room again.
    drive.write(Lba(0), &block_content(77, 3)).unwrap();
    drive.trim(Lba(0), 16).unwrap();
    drive.write(Lba(500), &big).unwrap();
    drive.check_invariants();
}

#[test]
fn trim_everything_and_collect_returns_physical_space() {
    let drive = new_drive(2048, 8 << 20, quiet());
    let data: Vec<u8> = (0..2048).flat_map(|i| block_content(i + 1, 1 + i % 3)).collect();
    drive.write(Lba(0), &data).unwrap();
    drive.flush().unwrap();
    let full = drive.stats();
    assert!(full.physical_used_bytes > 0 && full.compression_ratio() > 1.2, "{full:?}");
    drive.trim(Lba(0), 2048).unwrap();
    drive.checkpoint().unwrap();
    drive.collect_garbage(usize::MAX).unwrap();
    let empty = drive.stats();
    assert_eq!(empty.physical_used_bytes, 0);
    assert!(empty.physical_allocated_bytes <= 2 * empty.segment_bytes, "{empty:?}");
}

#[test]
fn deferred_compression_catches_up() {
    let config = CsdConfig { compression: CompressionMode::Deferred, ..quiet() };
    let drive = new_drive(512, 4 << 20, config);
    let data: Vec<u8> = (0..512).flat_map(|i| block_content(i + 1, 1)).collect();
    drive.write(Lba(0), &data).unwrap();
    let raw = drive.stats();
    assert_eq!(raw.physical_used_bytes, 512 * 4096);
    assert_eq!(raw.deferred_pending_blocks, 512);
    drive.drain_deferred().unwrap();
    let compressed = drive.stats();
    assert!(compressed.physical_used_bytes * 4 < raw.physical_used_bytes, "{compressed:?}");
    assert_eq!(compressed.counters.deferred_compressed_blocks, 512);
    let mut back = vec![0u8; 512 * 4096];
    drive.read(Lba(0), &mut back).unwrap();
    assert_eq!(back, data);
}

/// The deferred queue lives in memory: a drive closed (or crashed) before its pass caught up
/// queues its raw blocks again when it opens, so none stays raw for good.
#[test]
fn deferred_blocks_left_raw_at_close_are_queued_again_at_open() {
    let config = CsdConfig { compression: CompressionMode::Deferred, ..quiet() };
    let options = options(512, 4 << 20);
    let media = media_for(&options);
    let drive = CsdDevice::format(media.clone(), &options, config).unwrap();
    let data: Vec<u8> = (0..256).flat_map(|i| block_content(i + 1, 1)).collect();
    drive.write(Lba(0), &data).unwrap();
    drive.close().unwrap();
    let drive = CsdDevice::open(media.clone(), config).unwrap();
    let raw = drive.stats();
    assert_eq!(raw.deferred_pending_blocks, 256, "{raw:?}");
    drive.drain_deferred().unwrap();
    let compressed = drive.stats();
    assert!(compressed.physical_used_bytes * 4 < raw.physical_used_bytes, "{compressed:?}");
    let mut back = vec![0u8; 256 * 4096];
    drive.read(Lba(0), &mut back).unwrap();
    assert_eq!(back, data);
    drive.close().unwrap();
    // Opened inline, nothing is queued; opened deferred again, only blocks still raw are.
    let inline = CsdConfig { compression: CompressionMode::Inline, ..quiet() };
    assert_eq!(CsdDevice::open(media.clone(), inline).unwrap().stats().deferred_pending_blocks, 0);
    assert_eq!(CsdDevice::open(media, config).unwrap().stats().deferred_pending_blocks, 0);
}

/// With compression off, physical usage is exactly the blocks written (zeros included); the
/// setting belongs to the opened drive, not to the media: blocks written compressed stay
/// readable and compressed after a reopen with compression off, and the other way round.
#[test]
fn compression_off_stores_blocks_as_written_and_reads_either_kind() {
    let off = CsdConfig { compression: CompressionMode::Off, ..quiet() };
    let options = options(1024, 8 << 20);
    let media = media_for(&options);
    // Highly compressible text, then a run of zeros.
    let text: Vec<u8> = (0..256).flat_map(|i| block_content(i + 1, 1)).collect();
    let zeros = vec![0u8; 16 * 4096];
    let drive = CsdDevice::format(media.clone(), &options, off).unwrap();
    drive.write(Lba(0), &text).unwrap();
    drive.write(Lba(256), &zeros).unwrap();
    let stats = drive.stats();
    assert_eq!(stats.mapped_bytes, (256 + 16) * 4096, "{stats:?}");
    assert_eq!(stats.physical_used_bytes, stats.mapped_bytes, "nothing compressed: {stats:?}");
    drive.check_invariants();
    drive.close().unwrap();

    // Reopened compressing: the raw blocks read back, new writes compress.
    let drive = CsdDevice::open(media.clone(), quiet()).unwrap();
    let mut back = vec![0u8; 272 * 4096];
    drive.read(Lba(0), &mut back).unwrap();
    assert!(back[..text.len()] == text[..] && crate::is_zero(&back[text.len()..]));
    let more: Vec<u8> = (0..256).flat_map(|i| block_content(i + 1000, 1)).collect();
    drive.write(Lba(512), &more).unwrap();
    let compressed_part = drive.stats().physical_used_bytes - stats.physical_used_bytes;
    assert!(compressed_part * 4 < 256 * 4096, "inline compression is on again: {compressed_part}");
    drive.close().unwrap();

    // Reopened with compression off: the compressed blocks read back and stay compressed,
    // through garbage collection too.
    let drive = CsdDevice::open(media, off).unwrap();
    let before = drive.stats().physical_used_bytes;
    drive.trim(Lba(0), 128).unwrap();
    drive.checkpoint().unwrap();
    drive.collect_garbage(usize::MAX).unwrap();
    let after = drive.stats();
    assert_eq!(after.physical_used_bytes, before - 128 * 4096, "{after:?}");
    let mut back = vec![0u8; 256 * 4096];
    drive.read(Lba(512), &mut back).unwrap();
    assert!(back == more);
    drive.read(Lba(128), &mut back[..128 * 4096]).unwrap();
    assert!(back[..128 * 4096] == text[128 * 4096..]);
    drive.check_invariants();
}

#[test]
fn misdirected_media_writes_are_caught_not_returned() {
    let options = options(256, 2 << 20);
    let blocks = options.geometry().unwrap().total_bytes() / 4096;
    let media = Arc::new(FaultyDevice::new(MemDevice::new(blocks), 5));
    let drive = CsdDevice::format(media.clone(), &options, quiet()).unwrap();
    let area = options.geometry().unwrap().segment_area_offset() / 4096;
    // Media writes to the first segment land in the second: the first keeps stale content.
    media.inject(Fault::Misdirect { blocks: area..area + 16, offset: 16 });
    let mut rng = Rng::new(1);
    let mut model = Model::new(256);
    for tag in 0..400u64 {
        let lba = rng.below(256);
        let data = block_content(tag + 1, 1 + tag % 3);
        drive.write(Lba(lba), &data).unwrap();
        model.write(lba, &data);
    }
    drive.flush().unwrap();
    let (mut good, mut caught) = (0, 0);
    for lba in 0..256 {
        let mut buf = vec![0u8; 4096];
        match drive.read(Lba(lba), &mut buf) {
            Ok(()) => {
                assert_eq!(buf, model.block(lba), "LBA {lba}: wrong data returned");
                good += 1;
            }
            Err(e) => {
                assert_eq!(e.kind(), crate::ErrorKind::Corrupted);
                caught += 1;
            }
        }
    }
    assert!(good > 0 && caught > 0, "good {good} caught {caught}");
}

#[test]
fn reopen_after_clean_close_scans_nothing_and_keeps_data() {
    let options = options(512, 2 << 20);
    let media = media_for(&options);
    let drive = CsdDevice::format(media.clone(), &options, CsdConfig::default()).unwrap();
    let data: Vec<u8> = (0..512).flat_map(|i| block_content(i + 1, i % 4)).collect();
    drive.write(Lba(0), &data).unwrap();
    drive.close().unwrap();
    let drive = CsdDevice::open(media, CsdConfig::default()).unwrap();
    let mut back = vec![0u8; 512 * 4096];
    drive.read(Lba(0), &mut back).unwrap();
    assert_eq!(back, data);
    drive.check_invariants();
}

#[test]
fn not_a_drive_and_bad_geometry_are_clear_errors() {
    let media: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1024));
    let error = CsdDevice::open(media.clone(), quiet()).err().unwrap();
    assert!(error.message().contains("not a formatted"), "{error}");
    let too_big = FormatOptions::new(1 << 30, 1 << 30);
    assert_eq!(CsdDevice::format(media, &too_big, quiet()).err().unwrap().kind(), crate::ErrorKind::Invalid);
    assert!(FormatOptions::new(4097, 1 << 20).geometry().is_err());
}

#[test]
fn map_costs_seven_bytes_per_lba() {
    let drive = new_drive(10_000, 1 << 20, quiet());
    assert_eq!(drive.stats().map_memory_bytes, 70_000);
    assert!(drive.stats().map_bytes_per_lba() <= 8.0);
}

/// Writers, readers, trims and the background collector at once, on a drive whose physical space
/// is a fraction of its logical space: every read must return what its thread last wrote.
#[test]
fn garbage_collection_runs_concurrently_with_io() {
    let config = CsdConfig { gc_policy: GcPolicy::CostBenefit, ..CsdConfig::default() };
    let drive = Arc::new(new_drive(512, 1 << 20, config));
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let drive = drive.clone();
            scope.spawn(move || {
                let first = thread * 128;
                let mut model = Model::new(128);
                let mut rng = Rng::new(thread);
                for op in 0..3000u64 {
                    let lba = rng.below(128);
                    match rng.below(10) {
                        0 => {
                            drive.trim(Lba(first + lba), 1).unwrap();
                            model.trim(lba, 1);
                        }
                        1..=6 => {
                            let data = block_content(thread << 32 | op, 1 + op % 3);
                            drive.write(Lba(first + lba), &data).unwrap();
                            model.write(lba, &data);
                        }
                        _ => {
                            let mut buf = vec![0u8; 4096];
                            drive.read(Lba(first + lba), &mut buf).unwrap();
                            assert_eq!(buf, model.block(lba), "thread {thread} op {op} LBA {lba}");
                        }
                    }
                }
            });
        }
    });
    let stats = drive.stats();
    assert!(stats.counters.gc_segments_collected > 10, "the collector should have run: {stats:?}");
    drive.check_invariants();
}

#[test]
fn a_failed_flush_stops_the_drive_until_reopened() {
    let options = options(64, 1 << 20);
    let blocks = options.geometry().unwrap().total_bytes() / 4096;
    let media = Arc::new(FaultyDevice::new(MemDevice::new(blocks), 8));
    let drive = CsdDevice::format(media.clone(), &options, quiet()).unwrap();
    drive.write(Lba(1), &block_content(1, 1)).unwrap();
    media.inject(Fault::FlushError);
    assert_eq!(drive.flush().unwrap_err().kind(), crate::ErrorKind::Io);
    media.clear_faults();
    // The writes the failed flush covered may be gone; no later flush may call them durable.
    assert_eq!(drive.flush().unwrap_err().kind(), crate::ErrorKind::Closed);
    assert_eq!(drive.write(Lba(2), &block_content(2, 1)).unwrap_err().kind(), crate::ErrorKind::Closed);
    drop(drive);
    let drive = CsdDevice::open(media, quiet()).unwrap();
    drive.check_invariants();
}

#[test]
fn a_checkpoint_pointing_outside_the_segments_is_corruption_not_a_panic() {
    let options = options(64, 1 << 20);
    let media = media_for(&options);
    let drive = CsdDevice::format(media.clone(), &options, quiet()).unwrap();
    drive.write(Lba(0), &block_content(1, 1)).unwrap();
    drive.close().unwrap();
    // Rewrite the current checkpoint with LBA 0 pointing past the last segment, checksums valid.
    let g = options.geometry().unwrap();
    let mut superblocks = vec![0u8; 8192];
    media.read(Lba(0), &mut superblocks).unwrap();
    let sb = [&superblocks[..4096], &superblocks[4096..]]
        .into_iter()
        .filter_map(|b| layout::Superblock::decode(b).unwrap())
        .max_by_key(|s| s.generation)
        .unwrap();
    let slot_lba = g.checkpoint_offset(sb.checkpoint_slot) / 4096;
    let mut slot = vec![0u8; (g.checkpoint_blocks() * 4096) as usize];
    media.read(Lba(slot_lba), &mut slot).unwrap();
    let mut header = layout::CheckpointHeader::decode(&slot[..4096]).unwrap();
    let outside = g.total_bytes() / 16 + 100;
    // Payload units field 0 (one unit), flags: mapped.
    let word = outside | 1u64 << 48;
    slot[4096..4096 + 7].copy_from_slice(&word.to_le_bytes()[..7]);
    header.map_crc = crc32c::crc32c(&slot[4096..4096 + 64 * 7]);
    slot[..4096].copy_from_slice(&header.encode());
    media.write(Lba(slot_lba), &slot).unwrap();
    let error = CsdDevice::open(media, quiet()).err().expect("a corrupt checkpoint must not open");
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted, "{error}");
}
