//! Local storage as a compute node sees it: appends and their outcomes, reads at an LSN
//! through folding, leases holding history, ingest that trails the durable LSN, and the
//! served-page check every node applies.

use std::sync::Arc;

use tundra_env::Env;
use tundra_redo::{AppendOutcome, LeaseId, Payload, ReaderId, RedoBatch, RedoRecord, WriterEpoch};
use tundra_store::ids::{Lsn, VolumeId};

use super::*;
use crate::ErrorKind;

const VOLUME: VolumeId = VolumeId(3);
const PAGE: usize = 8192;

fn storage(config: LocalConfig) -> LocalStorage {
    let storage = LocalStorage::new(Env::simulated(5), config);
    storage.create_volume(VOLUME, VolumeGeometry { page_size: PAGE, page_count: 16 }).unwrap();
    storage
}

/// A batch after `prev` writing `fill` at byte 0 of each page, one LSN per record.
fn batch(epoch: u64, prev: u64, pages: &[(u64, u8)]) -> RedoBatch {
    let records: Vec<RedoRecord> = pages
        .iter()
        .enumerate()
        .map(|(i, &(page, fill))| RedoRecord {
            lsn: Lsn(prev + 1 + i as u64),
            page,
            payload: Payload::Ranges(vec![(0, vec![fill])]),
        })
        .collect();
    let end = Lsn(prev + pages.len() as u64);
    RedoBatch { volume: VOLUME, epoch: WriterEpoch(epoch), prev_lsn: Lsn(prev), end_lsn: end, records }
}

fn at(request: u64, nms: u64) -> ReadAt {
    ReadAt { request_lsn: Lsn(request), not_modified_since: Lsn(nms), lease: None }
}

fn first_byte(storage: &LocalStorage, page: u64, read: ReadAt) -> Result<(u8, Lsn, Lsn), crate::Error> {
    let served = storage.get_page(VOLUME, page, read)?;
    check_served(&served, read, PAGE, page)?;
    Ok((served.data[0], served.served_lsn, served.page_lsn))
}

#[test]
fn appends_answer_ok_gap_and_fenced_and_bad_batches_change_nothing() {
    let storage = storage(LocalConfig::default());
    assert_eq!(storage.append_redo(&batch(1, 0, &[(1, 10)])).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(1) });
    assert_eq!(
        storage.append_redo(&batch(1, 0, &[(1, 11)])).unwrap(),
        AppendOutcome::Gap { expected_prev_lsn: Lsn(1) }
    );
    assert_eq!(storage.append_redo(&batch(2, 1, &[(2, 20)])).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(2) });
    assert_eq!(storage.append_redo(&batch(1, 2, &[(2, 21)])).unwrap(), AppendOutcome::Fenced { epoch: WriterEpoch(2) });
    let outside = storage.append_redo(&batch(2, 2, &[(16, 1)])).unwrap_err();
    assert_eq!(outside.kind(), ErrorKind::Invalid, "{outside}");
    let status = storage.redo_status(VOLUME).unwrap();
    assert_eq!((status.writer_epoch, status.durable_lsn, status.complete_lsn), (WriterEpoch(2), Lsn(2), Lsn(2)));
}

#[test]
fn without_readers_history_is_folded_and_only_unchanged_pages_read_old() {
    let storage = storage(LocalConfig::default());
    storage.append_redo(&batch(1, 0, &[(1, 10), (2, 20)])).unwrap();
    storage.append_redo(&batch(1, 2, &[(1, 11)])).unwrap();
    assert_eq!(first_byte(&storage, 1, at(3, 3)).unwrap(), (11, Lsn(3), Lsn(3)));
    // Page 1 changed after LSN 2, and nothing holds LSN 2: that version is gone.
    let error = first_byte(&storage, 1, at(2, 0)).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TooOld { lsn_min: Lsn(3) }, "{error}");
    // Page 2 did not change after LSN 2, so a read there is still served.
    assert_eq!(first_byte(&storage, 2, at(2, 0)).unwrap(), (20, Lsn(2), Lsn(2)));
    // A page never written reads as zeros with page LSN 0.
    assert_eq!(first_byte(&storage, 9, at(3, 0)).unwrap(), (0, Lsn(3), Lsn(0)));
    assert!(storage.stats(VOLUME).unwrap().pages_folded >= 2);
}

#[test]
fn a_lease_holds_its_readers_history_until_released() {
    let storage = storage(LocalConfig::default());
    storage.append_redo(&batch(1, 0, &[(1, 10)])).unwrap();
    let lease = storage.register_reader(VOLUME, ReaderId(1), Lsn(1)).unwrap();
    assert_eq!(lease.granted_lsn, Lsn(1));
    storage.append_redo(&batch(1, 1, &[(1, 11)])).unwrap();
    storage.append_redo(&batch(1, 2, &[(1, 12)])).unwrap();
    assert_eq!(first_byte(&storage, 1, at(1, 1)).unwrap(), (10, Lsn(1), Lsn(1)));
    assert_eq!(first_byte(&storage, 1, at(2, 2)).unwrap(), (11, Lsn(2), Lsn(2)));
    assert_eq!(storage.renew_reader(VOLUME, lease.id, Lsn(2)).unwrap().lsn_min, Lsn(2));
    assert!(first_byte(&storage, 1, at(1, 1)).is_err(), "LSN 1 is below the lease now");
    let refused = storage.register_reader(VOLUME, ReaderId(2), Lsn(1)).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::TooOld { lsn_min: Lsn(2) });
    storage.release_reader(VOLUME, lease.id).unwrap();
    assert_eq!(storage.redo_status(VOLUME).unwrap().lsn_min, Lsn(3));
    let lost = storage.renew_reader(VOLUME, lease.id, Lsn(3)).unwrap_err();
    assert!(matches!(lost.kind(), ErrorKind::LeaseLost { .. }), "{lost}");
    let unknown = storage.renew_reader(VOLUME, LeaseId(99), Lsn(3)).unwrap_err();
    assert!(matches!(unknown.kind(), ErrorKind::LeaseLost { .. }), "{unknown}");
}

#[test]
fn a_read_served_below_its_lsn_is_allowed_by_its_promise() {
    let storage = storage(LocalConfig { ingest_lag_batches: 2, ..LocalConfig::default() });
    for (prev, fill) in [(0, 1), (1, 2), (2, 3), (3, 4)] {
        storage.append_redo(&batch(1, prev, &[(prev % 2 + 1, fill)])).unwrap();
    }
    assert_eq!(storage.redo_status(VOLUME).unwrap().complete_lsn, Lsn(2));
    // Page 2 last changed at LSN 2: a read at 4 promising no change since 2 is served at 2.
    assert_eq!(first_byte(&storage, 2, at(4, 2)).unwrap(), (2, Lsn(2), Lsn(2)));
    // Page 1 changed at 3: the read waits for ingest and is served at 4.
    assert_eq!(first_byte(&storage, 1, at(4, 3)).unwrap(), (3, Lsn(4), Lsn(3)));
    assert_eq!(storage.stats(VOLUME).unwrap().not_yet_waits, 1);
    let bad = storage.get_page(VOLUME, 1, at(0, 0)).unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::Invalid);
}

#[test]
fn a_served_page_outside_what_the_read_allowed_is_refused() {
    let read = at(10, 5);
    let page = |served: u64, page_lsn: u64, len: usize| ServedPage {
        served_lsn: Lsn(served),
        page_lsn: Lsn(page_lsn),
        data: vec![0; len],
    };
    check_served(&page(7, 6, PAGE), read, PAGE, 1).unwrap();
    for bad in [page(4, 1, PAGE), page(11, 1, PAGE), page(7, 8, PAGE), page(7, 6, PAGE - 1)] {
        let error = check_served(&bad, read, PAGE, 1).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupted);
    }
}

#[test]
fn the_log_is_truncated_once_its_records_are_in_images() {
    let storage = Arc::new(storage(LocalConfig { log_blocks: 8, ..LocalConfig::default() }));
    let mut prev = 0;
    for round in 0..400u64 {
        let records: Vec<(u64, u8)> = (0..8).map(|i| ((round + i) % 16, round as u8)).collect();
        storage.append_redo(&batch(1, prev, &records)).unwrap();
        prev += 8;
    }
    assert!(storage.stats(VOLUME).unwrap().truncations > 0);
}
