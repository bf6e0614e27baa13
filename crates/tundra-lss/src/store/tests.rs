//! The store's tests: elements through puts, deletes, collections and reopens against a map,
//! refusals that change nothing, damage on the device, and the store agreeing with the model.

use std::collections::BTreeMap;
use std::sync::Arc;

use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice, Lba};
use tundra_env::Rng;

use super::*;
use crate::drive_run::run_on_drive;
use crate::model::run_model;
use crate::policy::Mode;
use crate::workload::Scale;

fn small_geometry() -> LogGeometry {
    LogGeometry::new(2048, 4, 16).unwrap()
}

fn trim_policy() -> Policy {
    Policy { trim_batch_sectors: 2, ..Policy::trim_assisted(1.2, 2.5) }
}

fn new_store(policy: Policy) -> (Arc<MemDevice>, Lss) {
    let device = Arc::new(MemDevice::new(DATA_START_LBA + small_geometry().total_sectors()));
    let store = Lss::format(device.clone(), small_geometry(), policy).unwrap();
    (device, store)
}

fn key(n: u64) -> Vec<u8> {
    format!("key{n}").into_bytes()
}

#[test]
fn elements_round_trip_through_overwrites_deletes_and_reopens() {
    let (device, mut store) = new_store(Policy::current_practice(1.2));
    store.put(b"a", b"first").unwrap();
    store.put(b"b", &[9; 2000]).unwrap();
    store.put(b"a", b"second").unwrap();
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"second"[..]));
    assert!(store.delete(b"b").unwrap());
    assert!(!store.delete(b"b").unwrap(), "deleting an absent key writes nothing");
    assert_eq!(store.get(b"b").unwrap(), None);
    assert_eq!(store.len(), 1);
    store.flush().unwrap();
    store.check_invariants();
    drop(store);
    let store = Lss::open(device, Policy::current_practice(1.2)).unwrap();
    store.check_invariants();
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"second"[..]));
    assert_eq!(store.get(b"b").unwrap(), None);
    assert_eq!(store.keys(), vec![b"a".to_vec()]);
}

/// Random puts and deletes under both policies, with collections, trims and reopens, checked
/// against a map after every step; deleted keys stay deleted and their tombstones go away.
#[test]
fn a_random_workload_matches_a_map_under_both_policies() {
    for policy in [Policy::current_practice(1.2), trim_policy()] {
        let (device, mut store) = new_store(policy);
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut rng = Rng::new(3);
        // Collections, zeroed and trimmed sectors, summed over the store's openings.
        let mut work = (0, 0, 0);
        for step in 0..3000u64 {
            let k = rng.below(40);
            if rng.chance(0.2) {
                assert_eq!(store.delete(&key(k)).unwrap(), model.remove(&k).is_some());
            } else {
                let len = rng.below(store.max_value_bytes(5) as u64) as usize;
                let value = rng.bytes(len);
                store.put(&key(k), &value).unwrap();
                model.insert(k, value);
            }
            if step % 500 == 499 {
                let core = store.stats().core;
                work.0 += core.segments_collected;
                work.1 += core.zeroed_sectors;
                work.2 += core.trimmed_sectors;
                store.flush().unwrap();
                store = Lss::open(device.clone(), policy).unwrap();
            }
            store.check_invariants();
            let k = rng.below(40);
            assert_eq!(store.get(&key(k)).unwrap(), model.get(&k).cloned(), "{:?} step {step} key {k}", policy.mode);
        }
        assert_eq!(store.len(), model.len() as u64);
        assert!(work.0 > 20, "{:?}: {work:?}", policy.mode);
        if policy.mode == Mode::TrimAssisted {
            assert!(work.1 > 0 && work.2 > 0, "{work:?}");
        }
        assert!(store.index.len() < 40 + 5, "tombstones nothing older needs are dropped");
    }
}

#[test]
fn an_oversized_element_is_refused_and_changes_nothing() {
    let (device, mut store) = new_store(trim_policy());
    store.put(b"k", b"v").unwrap();
    let before = (store.stats().core, store.stats().io, device.snapshot());
    let error = store.put(b"k", &vec![1; store.max_value_bytes(1) + 1]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.message().contains("at most 2015 value bytes"), "{error}");
    let error = store.put(&[7; MAX_KEY_BYTES + 1], b"v").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert_eq!(store.delete(&[7; MAX_KEY_BYTES + 1]).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!((store.stats().core, store.stats().io, device.snapshot()), before);
    assert_eq!(store.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    store.put(b"k", &vec![1; store.max_value_bytes(1)]).unwrap();
}

#[test]
fn a_full_store_refuses_new_keys_changing_nothing_and_still_deletes() {
    let (device, mut store) = new_store(Policy::current_practice(1.2));
    let limit = store.core.live_limit();
    for k in 0..limit {
        store.put(&key(k), b"value").unwrap();
    }
    store.flush().unwrap();
    let before = (store.stats().core, device.snapshot());
    let error = store.put(b"one more", b"value").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Full);
    assert!(error.message().contains("holds 86 elements"), "{error}");
    assert_eq!((store.stats().core, device.snapshot()), before);
    // Overwrites and deletes still work, and a delete makes room at once, its tombstone taking
    // a slot of the room kept for them.
    store.put(&key(0), b"again").unwrap();
    assert!(store.delete(&key(1)).unwrap());
    store.put(b"one more", b"value").unwrap();
    store.check_invariants();
}

#[test]
fn a_drive_short_of_physical_space_refuses_puts_changing_nothing() {
    let geometry = LogGeometry::new(2048, 16, 64).unwrap();
    let logical = (DATA_START_LBA + geometry.total_sectors()) * BLOCK_SIZE_BYTES;
    let options = FormatOptions { segment_bytes: 64 << 10, ..FormatOptions::new(logical, 1 << 20) };
    let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / BLOCK_SIZE_BYTES));
    let config = CsdConfig { background: false, ..CsdConfig::default() };
    let drive = Arc::new(CsdDevice::format(media, &options, config).unwrap());
    let mut store = Lss::format(drive.clone(), geometry, Policy::current_practice(1.2)).unwrap();
    let mut rng = Rng::new(1);
    let mut written = 0;
    let error = loop {
        match store.put(&key(written), &rng.bytes(2000)) {
            Ok(()) => written += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(error.kind(), ErrorKind::Full);
    assert!(error.message().contains("physical space"), "{error}");
    assert!(written > 100, "the drive held {written} elements");
    let before = store.stats().core;
    assert_eq!(store.put(b"another", &rng.bytes(2000)).unwrap_err().kind(), ErrorKind::Full);
    assert_eq!(store.stats().core, before);
    store.flush().unwrap();
    let store = Lss::open(drive, Policy::current_practice(1.2)).unwrap();
    assert_eq!(store.len(), written);
    store.check_invariants();
}

#[test]
fn damage_on_the_device_is_refused_naming_the_slot() {
    let (device, mut store) = new_store(Policy::current_practice(1.2));
    for k in 0..4 {
        store.put(&key(k), b"value").unwrap();
    }
    store.flush().unwrap();
    let mut sector = vec![0u8; 4096];
    device.read(Lba(DATA_START_LBA), &mut sector).unwrap();
    sector[40] ^= 1;
    device.write(Lba(DATA_START_LBA), &sector).unwrap();
    let error = store.get(&key(0)).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupted);
    assert!(error.message().contains("element slot 0"), "{error}");
    let error = Lss::open(device.clone(), Policy::current_practice(1.2)).err().expect("damage refuses the open");
    assert_eq!(error.kind(), ErrorKind::Corrupted);
    device.write(Lba(0), &[0u8; 4096]).unwrap();
    let error = Lss::open(device, Policy::current_practice(1.2)).err().expect("no superblock");
    assert_eq!(error.kind(), ErrorKind::Invalid);
}

/// The store on the emulated drive takes exactly the model's decisions, so its write
/// amplification is the model's, and its physical space by the drive's accounting is within
/// 5% of the model's count.
#[test]
fn the_store_on_the_drive_agrees_with_the_model() {
    for policy in [Policy::current_practice(1.2), Policy::trim_assisted(1.2, 2.5)] {
        let config = Scale::Tiny.run(policy, 11);
        let model = run_model(&config).unwrap();
        let drive = run_on_drive(&config).unwrap();
        assert_eq!(drive.figures.user_bytes, model.user_bytes);
        assert_eq!(drive.figures.gc_bytes, model.gc_bytes);
        assert_eq!(drive.figures.trim_bytes, model.trim_bytes);
        assert_eq!(drive.slot_figures.physical_amplification_average, model.physical_amplification_average);
        let off = drive.figures.physical_amplification_average / model.physical_amplification_average - 1.0;
        assert!(off.abs() < 0.05, "{:?}: drive {:?} model {model:?}", policy.mode, drive.figures);
        assert_eq!(drive.verified_elements, config.elements());
    }
}
