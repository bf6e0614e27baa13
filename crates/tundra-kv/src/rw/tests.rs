//! The RW node on local storage: atomic transactions, commits durable when they return,
//! recovery after a restart, fencing, a commit whose fate is unknown, a bounded pool, and the
//! redo a transaction produces.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tundra_env::Env;
use tundra_redo::{AppendOutcome, LeaseId, ReaderId, RedoBatch};
use tundra_store::ids::{Lsn, VolumeId};

use super::*;
use crate::storage::{LocalConfig, LocalStorage, ReaderLease, RedoStatus, Renewal, ServedPage};

const VOLUME: VolumeId = VolumeId(1);

fn local(page_count: u64) -> Arc<LocalStorage> {
    let storage = LocalStorage::new(Env::simulated(9), LocalConfig::default());
    storage.create_volume(VOLUME, VolumeGeometry { page_size: PAGE_SIZE, page_count }).unwrap();
    Arc::new(storage)
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

#[test]
fn a_commit_is_atomic_durable_and_seen_only_once_committed() {
    let storage = local(256);
    let mut rw = RwNode::open(storage.clone(), VOLUME, RwConfig::default()).unwrap();
    let formatted = rw.committed_lsn();
    assert!(formatted > Lsn(0), "opening an empty volume commits the empty database");
    let mut txn = rw.begin().unwrap();
    txn.put(b"a", b"1").unwrap();
    txn.put(b"b", b"2").unwrap();
    assert_eq!(txn.get(b"a").unwrap().as_deref(), Some(&b"1"[..]), "a transaction reads its own writes");
    let error = txn.put(&[0; MAX_KEY_BYTES + 1], b"x").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    let lsn = txn.commit().unwrap();
    assert!(lsn > formatted);
    assert_eq!(storage.redo_status(VOLUME).unwrap().durable_lsn, lsn, "durable when commit returns");
    assert_eq!(rw.scan(b"", 10).unwrap(), vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"2".to_vec())]);
    // A transaction dropped without commit leaves nothing.
    let mut txn = rw.begin().unwrap();
    txn.put(b"c", b"3").unwrap();
    drop(txn);
    assert_eq!(rw.get(b"c").unwrap(), None);
    // A transaction that changes no byte commits without a batch.
    let mut txn = rw.begin().unwrap();
    txn.put(b"a", b"1").unwrap();
    assert!(!txn.delete(b"zz").unwrap());
    assert_eq!(txn.commit().unwrap(), lsn);
}

#[test]
fn a_restarted_writer_recovers_everything_committed_and_fences_the_old_one() {
    let storage = local(512);
    let mut old = RwNode::open(storage.clone(), VOLUME, RwConfig { pool_pages: 16 }).unwrap();
    for chunk in 0..20u32 {
        let mut txn = old.begin().unwrap();
        for i in chunk * 50..(chunk + 1) * 50 {
            txn.put(&key(i), &[i as u8; 100]).unwrap();
        }
        txn.commit().unwrap();
    }
    let (old_epoch, old_lsn) = (old.epoch(), old.committed_lsn());
    let mut pending = old.begin().unwrap();
    pending.put(b"late", b"never").unwrap();
    let mut new = RwNode::open(storage.clone(), VOLUME, RwConfig { pool_pages: 16 }).unwrap();
    assert_eq!(new.epoch().0, old_epoch.0 + 1);
    assert_eq!(new.committed_lsn(), old_lsn);
    let error = pending.commit().unwrap_err();
    assert!(matches!(error.kind(), ErrorKind::Fenced { .. }), "{error}");
    assert_eq!(old.get(b"a").unwrap_err().kind(), ErrorKind::Closed, "a fenced writer stops");
    let rows = new.scan(b"", usize::MAX).unwrap();
    assert_eq!(rows.len(), 1000);
    assert!(rows.iter().enumerate().all(|(i, (k, v))| *k == key(i as u32) && v == &vec![i as u8; 100]));
    assert_eq!(new.get(b"late").unwrap(), None);
    assert!(new.pool_len() <= 16);
    assert!(new.stats().page_reads > 0, "the new node read its pages from storage");
}

#[test]
fn the_pool_stays_bounded_and_evicted_pages_read_back_as_committed() {
    let storage = local(1024);
    let mut rw = RwNode::open(storage, VOLUME, RwConfig { pool_pages: 8 }).unwrap();
    for i in 0..2_000u32 {
        let mut txn = rw.begin().unwrap();
        txn.put(&key(i * 7919 % 2_000), &i.to_le_bytes().repeat(20)).unwrap();
        txn.commit().unwrap();
        assert!(rw.pool_len() <= 8);
    }
    let rows = rw.scan(b"", usize::MAX).unwrap();
    assert_eq!(rows.len(), 2_000);
    let stats = rw.stats();
    assert!(stats.page_reads > 100, "{stats:?}");
    assert!(stats.records > stats.image_records && stats.image_records > 0, "{stats:?}");
    // Single-key commits are mostly a small range record: far less redo than a page each.
    assert!(stats.redo_bytes / stats.commits < PAGE_SIZE as u64 / 2, "{stats:?}");
}

#[test]
fn a_volume_out_of_pages_refuses_the_transaction_and_nothing_of_it_commits() {
    let storage = local(4);
    let mut rw = RwNode::open(storage, VOLUME, RwConfig::default()).unwrap();
    let mut txn = rw.begin().unwrap();
    let error = (0..1_000u32).find_map(|i| txn.put(&key(i), &[0; MAX_VALUE_BYTES]).err()).unwrap();
    assert_eq!(error.kind(), ErrorKind::Full, "{error}");
    let refused = txn.commit().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Invalid, "{refused}");
    assert_eq!(rw.scan(b"", usize::MAX).unwrap(), Vec::new());
}

/// Local storage whose next append fails as a lost connection would, after or before the
/// batch became durable.
struct Flaky {
    inner: Arc<LocalStorage>,
    fail_after_append: AtomicBool,
}

impl PageStorage for Flaky {
    fn geometry(&self, volume: VolumeId) -> Result<VolumeGeometry> {
        self.inner.geometry(volume)
    }
    fn append_redo(&self, batch: &RedoBatch) -> Result<AppendOutcome> {
        let outcome = self.inner.append_redo(batch)?;
        if self.fail_after_append.swap(false, Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Unavailable, "the connection broke before the answer"));
        }
        Ok(outcome)
    }
    fn get_page(&self, volume: VolumeId, page: u64, at: ReadAt) -> Result<ServedPage> {
        self.inner.get_page(volume, page, at)
    }
    fn register_reader(&self, volume: VolumeId, reader: ReaderId, start_lsn: Lsn) -> Result<ReaderLease> {
        self.inner.register_reader(volume, reader, start_lsn)
    }
    fn renew_reader(&self, volume: VolumeId, lease: LeaseId, apply_lsn: Lsn) -> Result<Renewal> {
        self.inner.renew_reader(volume, lease, apply_lsn)
    }
    fn release_reader(&self, volume: VolumeId, lease: LeaseId) -> Result<()> {
        self.inner.release_reader(volume, lease)
    }
    fn redo_status(&self, volume: VolumeId) -> Result<RedoStatus> {
        self.inner.redo_status(volume)
    }
}

#[test]
fn a_commit_of_unknown_fate_stops_the_writer_and_a_new_one_finds_the_truth() {
    let flaky = Arc::new(Flaky { inner: local(64), fail_after_append: AtomicBool::new(false) });
    let mut rw = RwNode::open(flaky.clone(), VOLUME, RwConfig::default()).unwrap();
    let mut txn = rw.begin().unwrap();
    txn.put(b"k", b"v").unwrap();
    flaky.fail_after_append.store(true, Ordering::SeqCst);
    let error = txn.commit().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert_eq!(rw.begin().err().map(|e| e.kind()), Some(ErrorKind::Closed));
    // The batch did become durable: the next writer sees it.
    let mut next = RwNode::open(flaky, VOLUME, RwConfig::default()).unwrap();
    assert_eq!(next.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
}
