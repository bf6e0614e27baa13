//! Crash tests: power fails at a random block write of the device (tundra-device's
//! `FaultyDevice`, under the store directly or under the emulated drive the store runs on),
//! while puts, deletes and flushes run with collections and virtual data trims under both
//! policies. After each crash the store reopens and every key must hold its last acknowledged
//! value (acknowledged by a flush that returned) or one an operation after that flush wrote:
//! nothing acknowledged is lost by garbage collection or by a trim. Each bug the oracle guards
//! against has a twin test that injects it and expects the oracle to fail.

use std::collections::BTreeMap;
use std::sync::Arc;

use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice};
use tundra_env::Rng;

use super::maintain::bugs;
use super::*;

const KEYS: u64 = 30;
const STEPS: u64 = 160;

fn rounds() -> u64 {
    std::env::var("TUNDRA_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(240)
}

#[test]
fn crash_points_lose_no_acknowledged_element() {
    let work = crash_rounds(rounds(), 1);
    eprintln!("{work:?}");
    assert!(work.struck > rounds(), "power should often fail inside an operation: {work:?}");
    assert!(work.collected > rounds(), "collections should run in most rounds: {work:?}");
    assert!(work.cleared > rounds(), "trims should run in most trim-assisted rounds: {work:?}");
}

/// With garbage collection dropping some live elements instead of moving them, the same rounds
/// fail: the oracle sees an acknowledged element missing.
#[test]
fn the_crash_oracle_fails_when_collection_loses_elements() {
    bugs::set_gc_loses_elements(true);
    let verdict = std::panic::catch_unwind(|| crash_rounds(rounds(), 1));
    bugs::set_gc_loses_elements(false);
    assert_oracle_failed(verdict, "elements lost by garbage collection");
}

/// With dead versions cleared before their replacements are durable, a crash can leave
/// neither: the oracle sees it.
#[test]
fn the_crash_oracle_fails_when_trims_run_before_the_flush() {
    bugs::set_trim_before_flush(true);
    let verdict = std::panic::catch_unwind(|| crash_rounds(rounds(), 1));
    bugs::set_trim_before_flush(false);
    assert_oracle_failed(verdict, "a trim that ran before its flush");
}

/// The rounds failed, and on the oracle's check rather than anything else.
fn assert_oracle_failed(verdict: std::thread::Result<Work>, bug: &str) {
    let Err(panic) = verdict else { panic!("the crash oracle missed {bug}") };
    let message = panic.downcast_ref::<String>().map_or("", |m| m.as_str());
    assert!(message.contains("acknowledged"), "with {bug}, the rounds failed elsewhere: {message}");
}

fn key(n: u64) -> Vec<u8> {
    format!("key{n}").into_bytes()
}

/// The value of write `tag` of key `k`: the tag, then bytes of its own.
fn value(k: u64, tag: u64) -> Vec<u8> {
    let mut value = Rng::new(k ^ tag << 8).bytes(100 + (tag % 1500) as usize);
    value[..8].copy_from_slice(&tag.to_le_bytes());
    value
}

fn tag_of(value: &[u8]) -> u64 {
    u64::from_le_bytes(value[..8].try_into().expect("every value starts with its tag"))
}

/// A device to crash, and how the store sees it: directly, or through the emulated drive.
struct Rig {
    faulty: Arc<FaultyDevice<MemDevice>>,
    drive_options: Option<FormatOptions>,
}

impl Rig {
    fn new(round: u64, geometry: LogGeometry) -> Rig {
        let store_blocks = DATA_START_LBA + geometry.total_sectors();
        if round.is_multiple_of(3) {
            let bytes = store_blocks * BLOCK_SIZE_BYTES;
            let options = FormatOptions { segment_bytes: 64 << 10, ..FormatOptions::new(bytes, bytes) };
            let media_blocks = options.geometry().unwrap().total_bytes() / BLOCK_SIZE_BYTES;
            let faulty = Arc::new(FaultyDevice::new(MemDevice::new(media_blocks), round));
            CsdDevice::format(faulty.clone(), &options, Rig::drive_config()).unwrap().close().unwrap();
            Rig { faulty, drive_options: Some(options) }
        } else {
            Rig { faulty: Arc::new(FaultyDevice::new(MemDevice::new(store_blocks), round)), drive_options: None }
        }
    }

    fn drive_config() -> CsdConfig {
        CsdConfig { background: false, ..CsdConfig::default() }
    }

    /// The device the store runs on, opened (the drive recovering) after a crash.
    fn device(&self) -> Arc<dyn BlockDevice> {
        match self.drive_options {
            Some(_) => Arc::new(CsdDevice::open(self.faulty.clone(), Rig::drive_config()).unwrap()),
            None => self.faulty.clone(),
        }
    }
}

/// What the rounds did: operations power loss cut short, segments collected, sectors zeroed or
/// trimmed.
#[derive(Debug, Default)]
struct Work {
    struck: u64,
    collected: u64,
    cleared: u64,
}

/// Runs `rounds` rounds of crashes; panics on the first key that breaks the oracle.
fn crash_rounds(rounds: u64, seed: u64) -> Work {
    let mut rng = Rng::new(seed);
    let mut work = Work::default();
    let geometry = LogGeometry::new(2048, 4, 16).unwrap();
    for round in 0..rounds {
        let policy = if round % 2 == 0 {
            Policy::current_practice(1.2 + 0.1 * (round % 3) as f64)
        } else {
            Policy { trim_batch_sectors: 1 + (round % 4) as usize, ..Policy::trim_assisted(1.2, 2.5) }
        };
        let rig = Rig::new(round, geometry);
        Lss::format(rig.device(), geometry, policy).unwrap();
        let mut acknowledged: BTreeMap<u64, u64> = BTreeMap::new();
        // Since the last flush that returned: per key, the tags written (0 for a delete).
        let mut in_flight: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for crash in 0..4u64 {
            let mut store = Lss::open(rig.device(), policy)
                .unwrap_or_else(|e| panic!("round {round} crash {crash}: reopening: {e}"));
            store.check_invariants();
            for k in 0..KEYS {
                let got = store.get(&key(k)).unwrap().map_or(0, |v| tag_of(&v));
                let possible = in_flight.get(&k).is_some_and(|tags| tags.contains(&got));
                let expected = acknowledged.get(&k).copied().unwrap_or(0);
                assert!(
                    got == expected || possible,
                    "round {round} crash {crash} ({:?}): key {k} holds write {got}, acknowledged {expected}, \
                     in flight {:?}",
                    policy.mode,
                    in_flight.get(&k)
                );
                acknowledged.insert(k, got);
            }
            in_flight.clear();
            rig.faulty.crash_after(rng.below(STEPS * 2));
            for step in 0..STEPS {
                let k = rng.below(KEYS);
                let tag = round * 1_000_000 + crash * 1_000 + step + 1;
                let result = if rng.chance(0.1) {
                    store.flush().map(|()| {
                        for (k, tags) in std::mem::take(&mut in_flight) {
                            acknowledged.insert(k, *tags.last().expect("a write in flight"));
                        }
                    })
                } else if rng.chance(0.15) {
                    in_flight.entry(k).or_default().push(0);
                    store.delete(&key(k)).map(|_| ())
                } else {
                    in_flight.entry(k).or_default().push(tag);
                    store.put(&key(k), &value(k, tag))
                };
                if result.is_err() {
                    work.struck += 1;
                    break;
                }
                store.check_invariants();
            }
            let done = store.stats().core;
            work.collected += done.segments_collected;
            work.cleared += done.zeroed_sectors + done.trimmed_sectors;
            drop(store);
            rig.faulty.crash();
            rig.faulty.recover().unwrap();
        }
    }
    work
}
