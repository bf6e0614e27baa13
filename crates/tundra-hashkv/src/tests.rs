//! Tests of the store's promises: values round-trip through the table, the overflow store and a
//! reopen; bad input and a full drive are refused with a clear error and change nothing;
//! damaged blocks are errors, never wrong data; unused logical space costs no physical space.

use std::collections::BTreeMap;
use std::sync::Arc;

use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_env::Rng;

use crate::{ErrorKind, HashKv, HashKvConfig, HashKvOptions};

pub(crate) const SEGMENT_BYTES: u64 = 64 * 1024;

pub(crate) fn small_options(table_blocks: u64) -> HashKvOptions {
    HashKvOptions { table_blocks, wal_blocks: 64, overflow_blocks: 256, hash_seed: 3 }
}

pub(crate) fn drive_options(options: &HashKvOptions, physical_bytes: u64) -> FormatOptions {
    FormatOptions {
        segment_bytes: SEGMENT_BYTES,
        ..FormatOptions::new(options.logical_blocks() * 4096, physical_bytes)
    }
}

pub(crate) fn quiet() -> CsdConfig {
    CsdConfig { background: false, ..CsdConfig::default() }
}

fn new_store(options: &HashKvOptions, physical_bytes: u64) -> (Arc<MemDevice>, HashKv) {
    let drive_options = drive_options(options, physical_bytes);
    let media = Arc::new(MemDevice::new(drive_options.geometry().unwrap().total_bytes() / 4096));
    let drive = CsdDevice::format(media.clone(), &drive_options, quiet()).unwrap();
    HashKv::format(&drive, options).unwrap();
    let store = HashKv::open(Arc::new(drive), HashKvConfig { sections: 3 }).unwrap();
    (media, store)
}

fn reopen(media: &Arc<MemDevice>) -> HashKv {
    let drive = CsdDevice::open(media.clone(), quiet()).unwrap();
    HashKv::open(Arc::new(drive), HashKvConfig { sections: 2 }).unwrap()
}

fn key(i: u64) -> Vec<u8> {
    [i.to_be_bytes(), (i ^ 0xabcd).to_le_bytes()].concat()
}

/// A value of `len` bytes, half random and half zeros, as the load generator makes them.
fn value(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut value = vec![0u8; len];
    rng.fill(&mut value[..len / 2]);
    value
}

fn check_all(store: &HashKv, model: &BTreeMap<u64, Option<Vec<u8>>>) {
    for (i, expected) in model {
        assert_eq!(&store.get(&key(*i)).unwrap(), expected, "key {i}");
    }
}

#[test]
fn values_round_trip_through_buckets_overflow_and_reopens() {
    // 24 buckets for 300 records of about 400 bytes: about 12 a bucket where 9 fit, so many
    // spill into the overflow store.
    let options = small_options(24);
    let (media, store) = new_store(&options, 4 << 20);
    let mut rng = Rng::new(11);
    let mut model = BTreeMap::new();
    for step in 0..1500u64 {
        let i = rng.below(300);
        if rng.chance(0.1) {
            store.delete(&key(i)).unwrap();
            model.insert(i, None);
        } else {
            let len = 300 + rng.below(200) as usize;
            let v = value(&mut rng, len);
            store.put(&key(i), &v).unwrap();
            model.insert(i, Some(v));
        }
        if step % 500 == 0 {
            check_all(&store, &model);
        }
    }
    check_all(&store, &model);
    store.check_invariants().unwrap();
    assert!(store.stats().unwrap().overflow_records > 20, "the small table must spill");
    // Dropped without closing: the open replays whatever the checkpoint had not covered.
    drop(store);
    let store = reopen(&media);
    check_all(&store, &model);
    store.check_invariants().unwrap();
    store.close().unwrap();
    let store = reopen(&media);
    check_all(&store, &model);
    let stats = store.stats().unwrap();
    assert_eq!(stats.checkpoint_block, stats.tail_block, "a closed store replays nothing");
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let (_media, store) = new_store(&small_options(64), 2 << 20);
    store.put(b"present", b"v").unwrap();
    store.drain().unwrap();
    let before = store.drive().stats();
    let cases: [(&[u8], usize); 3] = [(b"", 10), (&[7u8; 17], 10), (b"key", crate::MAX_VALUE_BYTES + 1)];
    for (k, value_len) in cases {
        let err = store.put(k, &vec![1u8; value_len]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
        assert!(err.to_string().contains("bytes"), "the message says what is wrong: {err}");
    }
    assert_eq!(store.delete(&[0u8; 20]).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(store.get(b"").unwrap_err().kind(), ErrorKind::Invalid);
    let after = store.drive().stats();
    assert_eq!(before.counters, after.counters, "nothing reached the drive");
    assert_eq!(store.get(b"present").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(store.get(b"key").unwrap(), None);
}

#[test]
fn a_full_drive_is_a_clear_error_and_changes_nothing() {
    let options = small_options(4096);
    // About 2 MiB of physical space for records of 1 KiB random bytes: it fills.
    let (media, store) = new_store(&options, 2 << 20);
    let mut rng = Rng::new(5);
    let mut model = BTreeMap::new();
    let mut refused = None;
    for i in 0..10_000u64 {
        let v = rng.bytes(1000);
        match store.put(&key(i), &v) {
            Ok(()) => {
                model.insert(i, Some(v));
            }
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Full, "{err}");
                assert!(err.to_string().contains("physical bytes"), "{err}");
                refused = Some(i);
                break;
            }
        }
    }
    let mut refused = refused.expect("the drive must fill");
    assert!(model.len() > 500, "the drive holds a useful amount first: {}", model.len());
    // With nothing in flight the reserve for unapplied records shrinks: fill up to the
    // refusal again, one applied PUT at a time.
    loop {
        store.drain().unwrap();
        let v = rng.bytes(1000);
        match store.put(&key(refused), &v) {
            Ok(()) => {
                model.insert(refused, Some(v));
                refused += 1;
            }
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Full, "{err}");
                break;
            }
        }
    }
    let before = store.drive().stats();
    assert_eq!(store.put(&key(refused), &rng.bytes(1000)).unwrap_err().kind(), ErrorKind::Full);
    assert_eq!(store.drive().stats().counters, before.counters, "a refused PUT writes nothing");
    assert_eq!(store.get(&key(refused)).unwrap(), None);
    check_all(&store, &model);
    // Deleting makes room again.
    for i in 0..200 {
        // Every unapplied record holds room on the nearly full drive: a loaded machine's
        // writers can fall 34 deletes behind, and the next is then refused. Keep few in flight.
        if i % 16 == 0 {
            store.drain().unwrap();
        }
        store.delete(&key(i)).unwrap();
        model.insert(i, None);
    }
    store.drain().unwrap();
    store.put(&key(refused), b"small").unwrap();
    model.insert(refused, Some(b"small".to_vec()));
    store.close().unwrap();
    check_all(&reopen(&media), &model);
}

#[test]
fn damaged_blocks_are_errors_never_wrong_data() {
    let options = small_options(64);
    let (media, store) = new_store(&options, 2 << 20);
    store.put(b"alpha", &[5u8; 400]).unwrap();
    store.close().unwrap();
    let drive = Arc::new(CsdDevice::open(media.clone(), quiet()).unwrap());
    let layout = crate::layout::Layout::new(drive.block_count(), 64, 256, 64, 3).unwrap();
    let lba = layout.lba_of(&crate::Key::new(b"alpha").unwrap());
    let mut block = vec![0u8; BLOCK_SIZE];
    drive.read(lba, &mut block).unwrap();
    block[100] ^= 0x40;
    drive.write(lba, &block).unwrap();
    let store = HashKv::open(drive.clone(), HashKvConfig::default()).unwrap();
    let err = store.get(b"alpha").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupted, "{err}");
    assert!(err.to_string().contains(&lba.to_string()), "the error names the block: {err}");
    drop(store);
    // A damaged superblock copy is used around; both damaged is refused.
    drive.write(Lba(0), &vec![0x55u8; BLOCK_SIZE]).unwrap();
    drop(HashKv::open(drive.clone(), HashKvConfig::default()).unwrap());
    drive.write(Lba(0), &vec![0x55u8; 2 * BLOCK_SIZE]).unwrap();
    let err = HashKv::open(drive, HashKvConfig::default()).err().expect("no superblock verifies");
    assert_eq!(err.kind(), ErrorKind::Corrupted, "{err}");
}

#[test]
fn a_store_larger_than_its_drive_is_refused() {
    let options = small_options(64);
    let drive_options = drive_options(&options, 1 << 20);
    let media = Arc::new(MemDevice::new(drive_options.geometry().unwrap().total_bytes() / 4096));
    let drive = CsdDevice::format(media, &drive_options, quiet()).unwrap();
    let err = HashKv::format(&drive, &small_options(65)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let err = HashKv::open(Arc::new(drive), HashKvConfig::default()).err().expect("never formatted");
    assert!(err.to_string().contains("format"), "{err}");
}

/// Seed 001 §3.3.2: the logical space the hashing wastes costs no physical space. A table at
/// four records a bucket maps a little over a kilobyte of records per 4 KiB block; the drive
/// stores about what the records compress to.
#[test]
fn sparse_buckets_cost_only_their_records_physically() {
    let keys = 4000u64;
    let options = HashKvOptions { wal_blocks: 64, overflow_blocks: 256, ..HashKvOptions::for_keys(keys) };
    let (_media, store) = new_store(&options, 8 << 20);
    let mut rng = Rng::new(2);
    for i in 0..keys {
        store.put(&key(i), &value(&mut rng, 400)).unwrap();
    }
    store.close_for_test();
    let stats = store.drive().stats();
    let record_bytes = keys * (3 + 16 + 400);
    assert!(stats.mapped_bytes > 2 * record_bytes, "the table is sparse: {} mapped", stats.mapped_bytes);
    // Half of each value is random and the keys are random: about 60% of the record bytes.
    let ratio = stats.physical_used_bytes as f64 / record_bytes as f64;
    assert!(ratio < 0.75, "physical {} for {record_bytes} bytes of records", stats.physical_used_bytes);
    assert!(store.stats().unwrap().overflow_records < keys / 100, "overflow stays below 1%");
}

impl HashKv {
    /// Drains and checkpoints, keeping the store open for inspection.
    fn close_for_test(&self) {
        self.drain().unwrap();
        self.checkpoint().unwrap();
    }
}
