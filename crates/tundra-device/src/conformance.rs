//! The conformance suite every [`BlockDevice`] passes, and the crash suite every device that can
//! lose power in a test passes.
//!
//! Implementations call [`run_all`] with a constructor from their own tests; a device that can be
//! crashed and recovered also implements [`Crashable`] and runs [`crash_rounds`]. Each check
//! compares the device against a plain map of what was written: the model.

use std::collections::HashMap;
use std::sync::Arc;
use tundra_env::Rng;

use crate::{BLOCK_SIZE, BlockDevice, ErrorKind, Lba};

/// One block of test content. `tag` makes every write distinct; the kind varies the
/// compressibility: all zeros, highly compressible text, half random, fully random.
pub fn block_content(tag: u64, kind: u64) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut rng = Rng::new(tag);
    match kind % 4 {
        0 => {}
        1 => {
            let line = format!("row {tag:>12} | status=shipped | carrier=UA | origin=EWR | ");
            for (i, b) in block.iter_mut().enumerate() {
                *b = line.as_bytes()[i % line.len()];
            }
        }
        2 => rng.fill(&mut block[..BLOCK_SIZE / 2]),
        _ => rng.fill(&mut block),
    }
    // Stamp the tag at the start so no two writes carry the same bytes (unless all zero).
    if !kind.is_multiple_of(4) {
        block[..8].copy_from_slice(&tag.to_le_bytes());
    }
    block
}

/// Runs every conformance check, each on a fresh device made by `make(block_count)`.
pub fn run_all(make: &dyn Fn(u64) -> Box<dyn BlockDevice>) {
    fresh_device_reads_zeros(make(64).as_ref());
    round_trip_single_and_multi(make(64).as_ref());
    overwrite_and_trim(make(64).as_ref());
    bad_requests_change_nothing(make(64).as_ref());
    usage_follows_writes_and_trims(make(64).as_ref());
    concurrent_writers(Arc::from(make(256)));
    random_ops_match_model(make(128).as_ref(), 7, 600);
    read_many_matches_reads(make(128).as_ref(), 11);
}

fn read_blocks(dev: &dyn BlockDevice, lba: u64, count: usize) -> Vec<u8> {
    let mut buf = vec![0xA5u8; count * BLOCK_SIZE];
    dev.read(Lba(lba), &mut buf).expect("read");
    buf
}

/// [`BlockDevice::read_many`] of ranges in any order, of blocks written in any order, in
/// memory aligned to blocks and not, some never written, more of them than a device keeps in
/// flight at once: each range reads exactly what `read` reads; a range past the end is
/// refused.
pub fn read_many_matches_reads(dev: &dyn BlockDevice, seed: u64) {
    let mut rng = Rng::new(seed);
    let blocks = dev.block_count();
    // Every other block written, in a shuffled order.
    let mut order: Vec<u64> = (0..blocks).filter(|b| b % 2 == 0).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for &lba in &order {
        dev.write(Lba(lba), &block_content(1000 + lba, lba % 3)).unwrap();
    }
    for round in 0..20u64 {
        let count = 1 + rng.below(if round % 4 == 3 { 70 } else { 8 }) as usize;
        let ranges: Vec<(u64, usize)> = (0..count)
            .map(|_| {
                let len = 1 + rng.below(4) as usize;
                (rng.below(blocks - len as u64 + 1), len)
            })
            .collect();
        // Aligned buffers for some ranges, unaligned ones (one byte into a vector) for others.
        let mut aligned: Vec<crate::buf::BlockBuf> = Vec::new();
        let mut unaligned: Vec<Vec<u8>> = Vec::new();
        for (k, &(_, len)) in ranges.iter().enumerate() {
            if k % 3 == 2 {
                unaligned.push(vec![0xA5; len * BLOCK_SIZE + 1]);
            } else {
                aligned.push(crate::buf::BlockBuf::zeroed(len * BLOCK_SIZE));
            }
        }
        let (mut a, mut u) = (aligned.iter_mut(), unaligned.iter_mut());
        let mut reads: Vec<(Lba, &mut [u8])> = ranges
            .iter()
            .enumerate()
            .map(|(k, &(lba, _))| {
                let buf: &mut [u8] = if k % 3 == 2 { &mut u.next().unwrap()[1..] } else { a.next().unwrap() };
                (Lba(lba), buf)
            })
            .collect();
        dev.read_many(&mut reads).unwrap();
        for ((lba, got), &(_, len)) in reads.iter().zip(&ranges) {
            assert!(
                **got == read_blocks(dev, lba.0, len)[..],
                "round {round}: blocks {}..{} read together",
                lba.0,
                lba.0 + len as u64
            );
        }
    }
    let mut past = vec![0u8; 2 * BLOCK_SIZE];
    let mut first = vec![0u8; BLOCK_SIZE];
    let mut reads: Vec<(Lba, &mut [u8])> = vec![(Lba(0), &mut first), (Lba(blocks - 1), &mut past)];
    assert!(dev.read_many(&mut reads).is_err(), "a range past the end was read");
}

pub fn fresh_device_reads_zeros(dev: &dyn BlockDevice) {
    let all = read_blocks(dev, 0, dev.block_count() as usize);
    assert!(all.iter().all(|&b| b == 0), "a fresh device must read zeros");
}

pub fn round_trip_single_and_multi(dev: &dyn BlockDevice) {
    let one = block_content(1, 1);
    dev.write(Lba(3), &one).unwrap();
    assert_eq!(read_blocks(dev, 3, 1), one);

    let many: Vec<u8> = (0..8).flat_map(|i| block_content(100 + i, i)).collect();
    dev.write(Lba(10), &many).unwrap();
    assert_eq!(read_blocks(dev, 10, 8), many);
    // A read that straddles written and unwritten blocks.
    let straddle = read_blocks(dev, 8, 4);
    assert!(straddle[..2 * BLOCK_SIZE].iter().all(|&b| b == 0));
    assert_eq!(&straddle[2 * BLOCK_SIZE..], &many[..2 * BLOCK_SIZE]);
    // The last block of the device.
    let last = dev.block_count() - 1;
    dev.write(Lba(last), &block_content(7, 3)).unwrap();
    assert_eq!(read_blocks(dev, last, 1), block_content(7, 3));
    dev.flush().unwrap();
    assert_eq!(read_blocks(dev, 10, 8), many);
}

pub fn overwrite_and_trim(dev: &dyn BlockDevice) {
    for version in 0..5u64 {
        dev.write(Lba(5), &block_content(version, version + 1)).unwrap();
        assert_eq!(read_blocks(dev, 5, 1), block_content(version, version + 1));
    }
    let run: Vec<u8> = (0..6).flat_map(|i| block_content(50 + i, 1 + i % 3)).collect();
    dev.write(Lba(20), &run).unwrap();
    dev.trim(Lba(22), 2).unwrap();
    let after = read_blocks(dev, 20, 6);
    assert_eq!(&after[..2 * BLOCK_SIZE], &run[..2 * BLOCK_SIZE]);
    assert!(after[2 * BLOCK_SIZE..4 * BLOCK_SIZE].iter().all(|&b| b == 0));
    assert_eq!(&after[4 * BLOCK_SIZE..], &run[4 * BLOCK_SIZE..]);
    // Trimming what was never written is fine; writing after a trim works.
    dev.trim(Lba(40), 10).unwrap();
    dev.write(Lba(22), &block_content(9, 2)).unwrap();
    assert_eq!(read_blocks(dev, 22, 1), block_content(9, 2));
    dev.flush().unwrap();
}

pub fn bad_requests_change_nothing(dev: &dyn BlockDevice) {
    let n = dev.block_count();
    let data = block_content(3, 1);
    dev.write(Lba(0), &data).unwrap();
    let expect_invalid = |result: crate::Result<()>, what: &str| match result {
        Err(e) if e.kind() == ErrorKind::Invalid => {}
        other => panic!("{what}: expected an invalid-request error, got {other:?}"),
    };
    expect_invalid(dev.write(Lba(n), &data), "write past the end");
    expect_invalid(dev.write(Lba(n - 1), &[data.clone(), data.clone()].concat()), "write across the end");
    expect_invalid(dev.write(Lba(0), &data[..100]), "short write");
    expect_invalid(dev.write(Lba(0), &[]), "empty write");
    expect_invalid(dev.write(Lba(u64::MAX), &data), "write at u64::MAX");
    let mut buf = vec![0u8; BLOCK_SIZE + 1];
    expect_invalid(dev.read(Lba(0), &mut buf), "unaligned read");
    let mut buf = vec![0u8; BLOCK_SIZE];
    expect_invalid(dev.read(Lba(n), &mut buf), "read past the end");
    expect_invalid(dev.trim(Lba(n - 1), 2), "trim across the end");
    expect_invalid(dev.trim(Lba(u64::MAX), u64::MAX), "trim overflowing");
    assert_eq!(read_blocks(dev, 0, 1), data, "a bad request changed block 0");
    assert!(read_blocks(dev, n - 1, 1).iter().all(|&b| b == 0), "a bad request wrote the last block");
}

pub fn usage_follows_writes_and_trims(dev: &dyn BlockDevice) {
    let before = dev.usage();
    assert_eq!(before.logical_capacity_bytes, dev.block_count() * BLOCK_SIZE as u64);
    assert_eq!(before.mapped_bytes, 0, "a fresh device maps nothing");
    let data: Vec<u8> = (0..16).flat_map(|i| block_content(200 + i, 1 + i % 3)).collect();
    dev.write(Lba(0), &data).unwrap();
    dev.flush().unwrap();
    let written = dev.usage();
    assert!(written.mapped_bytes >= 16 * BLOCK_SIZE as u64, "{written:?}");
    assert!(written.physical_used_bytes > 0, "{written:?}");
    dev.trim(Lba(0), 16).unwrap();
    dev.flush().unwrap();
    let trimmed = dev.usage();
    assert_eq!(trimmed.mapped_bytes, 0, "trimming everything unmaps everything: {trimmed:?}");
}

pub fn concurrent_writers(dev: Arc<dyn BlockDevice>) {
    let threads = 4u64;
    let per_thread = dev.block_count() / threads;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let dev = dev.clone();
            scope.spawn(move || {
                for round in 0..3u64 {
                    for i in 0..per_thread {
                        let lba = t * per_thread + i;
                        dev.write(Lba(lba), &block_content(lba * 10 + round, 1 + lba % 3)).unwrap();
                    }
                }
                for i in 0..per_thread {
                    let lba = t * per_thread + i;
                    assert_eq!(read_blocks(dev.as_ref(), lba, 1), block_content(lba * 10 + 2, 1 + lba % 3));
                }
            });
        }
    });
    dev.flush().unwrap();
}

/// Random writes, trims, flushes and reads, checked against the model after every read.
pub fn random_ops_match_model(dev: &dyn BlockDevice, seed: u64, ops: usize) {
    let mut model = Model::new(dev.block_count());
    let mut rng = Rng::new(seed);
    for op in 0..ops {
        random_op(dev, &mut model, &mut rng, op as u64);
        if rng.chance(0.10) {
            let lba = rng.below(dev.block_count());
            let count = 1 + rng.below((dev.block_count() - lba).min(8));
            let got = read_blocks(dev, lba, count as usize);
            assert_eq!(got, model.expected(lba, count), "seed {seed} op {op}: read of {lba}+{count}");
        }
    }
    let all = read_blocks(dev, 0, dev.block_count() as usize);
    assert_eq!(all, model.expected(0, dev.block_count()), "seed {seed}: final image");
}

/// What a device should hold: block contents by address; absent blocks are zero.
pub struct Model {
    block_count: u64,
    blocks: HashMap<u64, Vec<u8>>,
}

impl Model {
    pub fn new(block_count: u64) -> Model {
        Model { block_count, blocks: HashMap::new() }
    }

    pub fn write(&mut self, lba: u64, data: &[u8]) {
        for (i, block) in data.chunks_exact(BLOCK_SIZE).enumerate() {
            self.blocks.insert(lba + i as u64, block.to_vec());
        }
    }

    pub fn trim(&mut self, lba: u64, count: u64) {
        for key in lba..lba + count {
            self.blocks.remove(&key);
        }
    }

    pub fn block(&self, lba: u64) -> Vec<u8> {
        self.blocks.get(&lba).cloned().unwrap_or_else(|| vec![0; BLOCK_SIZE])
    }

    pub fn expected(&self, lba: u64, count: u64) -> Vec<u8> {
        (lba..lba + count).flat_map(|key| self.block(key)).collect()
    }

    pub fn block_count(&self) -> u64 {
        self.block_count
    }
}

/// One random mutation applied to both the device and the model.
fn random_op(dev: &dyn BlockDevice, model: &mut Model, rng: &mut Rng, tag: u64) {
    let n = dev.block_count();
    match rng.below(10) {
        0..=6 => {
            let lba = rng.below(n);
            let count = 1 + rng.below((n - lba).min(8));
            let kind = rng.below(4);
            let data: Vec<u8> = (0..count).flat_map(|i| block_content(tag * 64 + i, kind + i)).collect();
            dev.write(Lba(lba), &data).unwrap();
            model.write(lba, &data);
        }
        7 | 8 => {
            let lba = rng.below(n);
            let count = 1 + rng.below((n - lba).min(16));
            dev.trim(Lba(lba), count).unwrap();
            model.trim(lba, count);
        }
        _ => dev.flush().unwrap(),
    }
}

/// A device that a test can crash: power fails after a chosen number of media writes, and the
/// device is then reopened from what its media kept.
pub trait Crashable {
    fn device(&self) -> &dyn BlockDevice;
    /// Lets `media_writes` more block writes reach the media, then fails every I/O as power loss.
    fn arm_crash(&mut self, media_writes: u64);
    /// Loses power now if it has not yet, then reopens and recovers the device.
    fn crash_and_recover(&mut self);
}

/// Rounds of: random operations, a crash at a random media write, recovery, and a check that
/// every block holds either its last flushed content or something written after that flush.
/// Returns the number of crashes that struck in the middle of an operation.
pub fn crash_rounds(target: &mut dyn Crashable, seed: u64, rounds: usize, ops_per_round: u64) -> usize {
    let n = target.device().block_count();
    let mut rng = Rng::new(seed);
    // durable[lba]: content as of the last completed flush; pending[lba]: writes since then.
    let mut durable = Model::new(n);
    let mut pending: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
    let mut struck_mid_operation = 0;
    let mut tag = seed << 32;
    let trace: Option<u64> = std::env::var("TUNDRA_TRACE_LBA").ok().and_then(|v| v.parse().ok());
    for round in 0..rounds {
        target.arm_crash(rng.below(ops_per_round * 3));
        for _ in 0..ops_per_round {
            tag += 1;
            let dev = target.device();
            let lba = rng.below(n);
            let result = match rng.below(10) {
                0..=6 => {
                    let count = 1 + rng.below((n - lba).min(4));
                    let kind = rng.below(4);
                    let data: Vec<u8> = (0..count).flat_map(|i| block_content(tag * 8 + i, kind + i)).collect();
                    if trace.is_some_and(|t| (lba..lba + count).contains(&t)) {
                        eprintln!("round {round}: write {lba}+{count} first tag {:?}", &data[..8]);
                    }
                    // Record the write as possible before issuing it: a crash may keep it.
                    for (i, block) in data.chunks_exact(BLOCK_SIZE).enumerate() {
                        pending.entry(lba + i as u64).or_default().push(block.to_vec());
                    }
                    dev.write(Lba(lba), &data)
                }
                7 | 8 => {
                    let count = 1 + rng.below((n - lba).min(8));
                    if trace.is_some_and(|t| (lba..lba + count).contains(&t)) {
                        eprintln!("round {round}: trim {lba}+{count}");
                    }
                    for key in lba..lba + count {
                        pending.entry(key).or_default().push(vec![0; BLOCK_SIZE]);
                    }
                    dev.trim(Lba(lba), count)
                }
                _ => dev.flush().map(|()| {
                    for (key, versions) in pending.drain() {
                        let last = versions.last().expect("a pending write");
                        durable.write(key, last);
                    }
                }),
            };
            if trace.is_some() {
                eprintln!("round {round}: op result {result:?}");
            }
            if let Err(error) = result {
                assert!(
                    matches!(error.kind(), ErrorKind::Closed | ErrorKind::Io),
                    "seed {seed} round {round}: unexpected error {error}"
                );
                struck_mid_operation += 1;
                break;
            }
        }
        target.crash_and_recover();
        let dev = target.device();
        let image = read_blocks(dev, 0, n as usize);
        for lba in 0..n {
            let got = &image[lba as usize * BLOCK_SIZE..][..BLOCK_SIZE];
            let flushed = durable.block(lba);
            let allowed = got == flushed.as_slice()
                || pending.get(&lba).is_some_and(|versions| versions.iter().any(|v| v == got));
            if !allowed {
                let describe = |data: &[u8]| format!("tag {:?}", &data[..8]);
                let versions: Vec<String> =
                    pending.get(&lba).map(|v| v.iter().map(|d| describe(d)).collect()).unwrap_or_default();
                panic!(
                    "seed {seed} round {round}: LBA {lba} lost its flushed content or holds data never written: \
                     got {}, flushed {}, written since {versions:?}",
                    describe(got),
                    describe(&flushed)
                );
            }
        }
        // What recovery shows is the new durable state.
        dev.flush().expect("flush after recovery");
        pending.clear();
        for lba in 0..n {
            durable.write(lba, &image[lba as usize * BLOCK_SIZE..][..BLOCK_SIZE]);
        }
    }
    struck_mid_operation
}
