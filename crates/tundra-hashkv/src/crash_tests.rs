//! The crash test: power fails at a random block write of the drive's media (tundra-device's
//! fault-injecting wrapper under the emulated drive), the drive and the store are reopened, and
//! every key must hold its last acknowledged value, or a value an operation cut short by the
//! crash was writing. Several client threads write at once, so group commit, the sections'
//! batches, checkpoints, log wrap-around and the overflow store are all cut at random points.
//! A second test injects the bug the oracle guards against (the open drops the newest replayed
//! record) and shows the oracle failing.

use std::cell::Cell;
use std::sync::Arc;

use parking_lot::Mutex;
use tundra_device::csd::CsdDevice;
use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_env::Rng;

use crate::tests::{drive_options, quiet, small_options};
use crate::{HashKv, HashKvConfig};

thread_local! {
    static DROP_NEWEST_REPLAYED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the open should drop the newest record it replays: the injected bug. Thread-local,
/// so that only the test that sets it sees it.
pub(crate) fn drop_newest_replayed() -> bool {
    DROP_NEWEST_REPLAYED.with(Cell::get)
}

const KEYS: u64 = 120;
const CLIENTS: u64 = 3;

fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

/// What the model knows of one key: its acknowledged value, and the values of operations that
/// failed (the crash cut them short), any of which the store may hold instead.
#[derive(Default, Clone)]
struct KeyModel {
    acknowledged: Option<Vec<u8>>,
    possible: Vec<Option<Vec<u8>>>,
}

type Media = Arc<FaultyDevice<MemDevice>>;

fn open(media: &Media, round: u64) -> HashKv {
    let drive = CsdDevice::open(media.clone(), quiet()).unwrap_or_else(|e| panic!("round {round}: the drive: {e}"));
    HashKv::open(Arc::new(drive), HashKvConfig { sections: 2 })
        .unwrap_or_else(|e| panic!("round {round}: the store: {e}"))
}

/// Checks every key against the model, then takes what the store holds as acknowledged.
fn check(store: &HashKv, model: &mut [KeyModel], round: u64, crash: u64) {
    for (i, entry) in model.iter_mut().enumerate() {
        let got = store.get(&key(i as u64)).unwrap_or_else(|e| panic!("round {round} crash {crash}: key {i}: {e}"));
        let allowed = got == entry.acknowledged || entry.possible.contains(&got);
        assert!(
            allowed,
            "round {round} crash {crash}: key {i} holds {:?} bytes, acknowledged {:?}",
            got.as_ref().map(Vec::len),
            entry.acknowledged.as_ref().map(Vec::len)
        );
        *entry = KeyModel { acknowledged: got, possible: Vec::new() };
    }
    store.check_invariants().unwrap_or_else(|p| panic!("round {round} crash {crash}: {p}"));
}

/// How far the rounds reached, so the test can tell that they cut what they mean to.
#[derive(Default)]
struct Reach {
    struck: u64,
    max_overflow_records: u64,
    max_checkpoint_block: u64,
}

/// Runs `rounds` rounds of three crashes each; panics on the first key that breaks the oracle.
/// Returns how many client operations the crashes cut short, and how far the rounds reached.
fn crash_rounds(rounds: u64) -> Reach {
    let mut rng = Rng::new(17);
    let mut reach = Reach::default();
    for round in 0..rounds {
        // 4 buckets for 120 keys of 200 to 500 bytes: buckets spill into the overflow store,
        // and a 4-block log ring wraps many times a round.
        let options = crate::HashKvOptions { wal_blocks: 4, ..small_options(4) };
        let drive_options = drive_options(&options, 2 << 20);
        let blocks = drive_options.geometry().unwrap().total_bytes() / 4096;
        let media: Media = Arc::new(FaultyDevice::new(MemDevice::new(blocks), round));
        let drive = CsdDevice::format(media.clone(), &drive_options, quiet()).unwrap();
        HashKv::format(&drive, &options).unwrap();
        drop(drive);
        let mut model = vec![KeyModel::default(); KEYS as usize];
        for crash in 0..3 {
            let store = open(&media, round);
            check(&store, &mut model, round, crash);
            let stats = store.stats().unwrap();
            reach.max_overflow_records = reach.max_overflow_records.max(stats.overflow_records);
            reach.max_checkpoint_block = reach.max_checkpoint_block.max(stats.checkpoint_block);
            media.crash_after(rng.below(150));
            let shared = Mutex::new(&mut model);
            let mut seeds: Vec<u64> = (0..CLIENTS).map(|_| rng.next_u64()).collect();
            std::thread::scope(|scope| {
                let handles: Vec<_> = seeds
                    .drain(..)
                    .enumerate()
                    .map(|(client, seed)| {
                        let (store, shared) = (&store, &shared);
                        scope.spawn(move || client_ops(store, shared, client as u64, seed))
                    })
                    .collect();
                for handle in handles {
                    reach.struck += handle.join().expect("a client panicked");
                }
            });
            drop(store);
            media.recover().unwrap();
        }
    }
    reach
}

/// One client: puts and deletes on its own keys until an operation fails. Returns 1 if one
/// failed (the crash struck while it ran), 0 if all 40 succeeded.
fn client_ops(store: &HashKv, model: &Mutex<&mut Vec<KeyModel>>, client: u64, seed: u64) -> u64 {
    let mut rng = Rng::new(seed);
    for _ in 0..40 {
        let i = rng.below(KEYS / CLIENTS) * CLIENTS + client;
        let value = (!rng.chance(0.1)).then(|| {
            let mut v = vec![0u8; 200 + rng.below(300) as usize];
            rng.fill(&mut v[..100]);
            v
        });
        let result = match &value {
            Some(v) => store.put(&key(i), v),
            None => store.delete(&key(i)),
        };
        let mut model = model.lock();
        let entry = &mut model[i as usize];
        match result {
            Ok(()) => *entry = KeyModel { acknowledged: value, possible: Vec::new() },
            Err(_) => {
                entry.possible.push(value);
                return 1;
            }
        }
    }
    0
}

#[test]
fn crash_points_lose_no_acknowledged_put() {
    let rounds = std::env::var("TUNDRA_HASHKV_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let reach = crash_rounds(rounds);
    let struck = reach.struck;
    assert!(struck > rounds, "power should often fail under running clients: {struck} in {rounds} rounds");
    assert!(reach.max_overflow_records > 5, "buckets should spill: {}", reach.max_overflow_records);
    assert!(reach.max_checkpoint_block > 3 * 4, "the log ring should wrap: {}", reach.max_checkpoint_block);
}

/// The oracle above catches a lost acknowledged PUT: with the open dropping the newest record
/// it replays, the same rounds fail.
#[test]
fn the_crash_oracle_fails_when_the_replay_drops_a_put() {
    DROP_NEWEST_REPLAYED.with(|flag| flag.set(true));
    let verdict = std::panic::catch_unwind(|| crash_rounds(40));
    DROP_NEWEST_REPLAYED.with(|flag| flag.set(false));
    assert!(verdict.is_err(), "the crash oracle missed a dropped acknowledged PUT");
}
