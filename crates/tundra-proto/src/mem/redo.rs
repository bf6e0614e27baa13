//! The in-memory service's redo side: a toy stream per volume, test support for the protocol
//! and the client. It keeps the protocol's rules (fencing by epoch, gaps, watermarks that only
//! advance, leases that hold the minimum reader LSN back) but never decodes a record: batches
//! are kept as they came, and the page versions a read serves are put in by the test
//! ([`super::MemService::put_page_version`]). Applying is instant unless a test holds it back.

use std::collections::{BTreeMap, HashMap};

use crate::redo::{AppendOutcome, BatchLsns, LeaseRenewal, PageLsns, ReadAt, ReaderLease, RedoAppend, RedoStatus};
use crate::service::ServiceError;
use crate::types::VolumeInfo;

/// How long a lease lasts without renewal. The toy has no clock: tests expire leases by hand.
pub const LEASE_MS: u64 = 30_000;

/// A batch as the stream accepted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendedBatch {
    pub writer_epoch: u64,
    pub prev_lsn: u64,
    pub end_lsn: u64,
    pub record_count: u32,
    pub records: Vec<u8>,
}

#[derive(Default)]
pub(super) struct Redo {
    streams: HashMap<u32, Stream>,
    leases: HashMap<u64, Lease>,
    next_lease: u64,
    /// A reader further than this behind the durable LSN loses its lease.
    pub(super) max_lag: Option<u64>,
}

#[derive(Default)]
struct Stream {
    epoch: u64,
    durable_lsn: u64,
    /// Applying stops here when a test says so; otherwise it follows the durable LSN at once.
    complete_cap: Option<u64>,
    lsn_min: u64,
    /// How far a test asked history to be folded away; leases hold it back.
    fold_target: u64,
    batches: Vec<AppendedBatch>,
    /// Page versions by page, then by LSN.
    versions: HashMap<u64, BTreeMap<u64, Vec<u8>>>,
}

impl Stream {
    fn complete_lsn(&self) -> u64 {
        self.complete_cap.map_or(self.durable_lsn, |cap| cap.min(self.durable_lsn))
    }

    fn status(&self) -> RedoStatus {
        RedoStatus {
            writer_epoch: self.epoch,
            durable_lsn: self.durable_lsn,
            complete_lsn: self.complete_lsn(),
            lsn_min: self.lsn_min,
        }
    }

    /// The page as of `served_lsn`: its newest version at or below it, or zeros at LSN 0.
    fn version(&self, info: &VolumeInfo, page: u64, served_lsn: u64, out: &mut Vec<u8>) -> u64 {
        let newest = self.versions.get(&page).and_then(|versions| versions.range(..=served_lsn).next_back());
        match newest {
            Some((&lsn, data)) => {
                out.extend_from_slice(data);
                lsn
            }
            None => {
                out.resize(out.len() + info.page_size as usize, 0);
                0
            }
        }
    }
}

struct Lease {
    volume: u32,
    reader_id: u64,
    apply_lsn: u64,
}

impl Redo {
    fn stream(&mut self, volume: u32) -> &mut Stream {
        self.streams.entry(volume).or_default()
    }

    pub(super) fn drop_volume(&mut self, volume: u32) {
        self.streams.remove(&volume);
        let gone: Vec<u64> =
            self.leases.iter().filter(|(_, lease)| lease.volume == volume).map(|(&id, _)| id).collect();
        for id in gone {
            self.leases.remove(&id);
        }
    }

    pub(super) fn append(&mut self, append: &RedoAppend<'_>) -> AppendOutcome {
        let stream = self.stream(append.volume);
        if append.writer_epoch < stream.epoch {
            return AppendOutcome::Fenced { epoch: stream.epoch };
        }
        // A higher epoch fences the old writer from the moment it is seen, even if this batch
        // itself has a gap.
        stream.epoch = append.writer_epoch;
        if append.prev_lsn != stream.durable_lsn {
            return AppendOutcome::Gap { expected_prev_lsn: stream.durable_lsn };
        }
        stream.batches.push(AppendedBatch {
            writer_epoch: append.writer_epoch,
            prev_lsn: append.prev_lsn,
            end_lsn: append.end_lsn,
            record_count: append.record_count,
            records: append.records.to_vec(),
        });
        stream.durable_lsn = append.end_lsn;
        self.settle(append.volume);
        AppendOutcome::Ok { durable_lsn: append.end_lsn }
    }

    pub(super) fn status(&mut self, volume: u32) -> RedoStatus {
        self.stream(volume).status()
    }

    pub(super) fn batches(&self, volume: u32) -> Vec<AppendedBatch> {
        self.streams.get(&volume).map(|stream| stream.batches.clone()).unwrap_or_default()
    }

    pub(super) fn put_version(&mut self, volume: u32, page: u64, lsn: u64, data: Vec<u8>) {
        self.stream(volume).versions.entry(page).or_default().insert(lsn, data);
    }

    pub(super) fn hold_complete(&mut self, volume: u32, cap: Option<u64>) {
        self.stream(volume).complete_cap = cap;
    }

    pub(super) fn fold_history(&mut self, volume: u32, lsn: u64) {
        let stream = self.stream(volume);
        stream.fold_target = stream.fold_target.max(lsn);
        self.settle(volume);
    }

    pub(super) fn expire(&mut self, lease_id: u64) {
        if let Some(lease) = self.leases.remove(&lease_id) {
            self.settle(lease.volume);
        }
    }

    pub(super) fn lease_count(&self, volume: u32) -> usize {
        self.leases.values().filter(|lease| lease.volume == volume).count()
    }

    /// The lease is held on the volume, or a refusal telling the reader to register again.
    fn check_lease(&self, volume: u32, lease_id: u64) -> Result<(), ServiceError> {
        if self.leases.get(&lease_id).is_some_and(|lease| lease.volume == volume) {
            return Ok(());
        }
        let lsn_min = self.streams.get(&volume).map_or(0, |stream| stream.lsn_min);
        Err(ServiceError::lease_lost(
            lsn_min,
            format!("lease {lease_id} is not held on volume {volume}: register again"),
        ))
    }

    /// The LSN a read of `pages` is served as of, or why it cannot be served. Below the minimum
    /// reader LSN only pages unchanged since the LSN asked for are served: their version there
    /// is their newest.
    fn served_lsn(&self, volume: u32, pages: &[u64], at: ReadAt) -> Result<u64, ServiceError> {
        if let Some(id) = at.lease {
            self.check_lease(volume, id)?;
        }
        // A volume no batch has reached yet has a stream at LSN 0.
        let empty = Stream::default();
        let stream = self.streams.get(&volume).unwrap_or(&empty);
        let complete = stream.complete_lsn();
        if at.not_modified_since > complete {
            return Err(ServiceError::not_yet(
                complete,
                format!("redo is complete up to LSN {complete}, not {}", at.not_modified_since),
            ));
        }
        let served = at.request_lsn.min(complete);
        let changed_since = |page: &u64| {
            stream.versions.get(page).is_some_and(|versions| versions.range(served + 1..=complete).next().is_some())
        };
        if served < stream.lsn_min && pages.iter().any(changed_since) {
            return Err(ServiceError::too_old(
                stream.lsn_min,
                format!("LSN {served} is below the minimum reader LSN {} and the page changed since", stream.lsn_min),
            ));
        }
        Ok(served)
    }

    pub(super) fn read(
        &mut self,
        info: &VolumeInfo,
        page: u64,
        at: ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<PageLsns, ServiceError> {
        let served_lsn = self.served_lsn(info.id, &[page], at)?;
        let page_lsn = self.stream(info.id).version(info, page, served_lsn, out);
        Ok(PageLsns { served_lsn, page_lsn })
    }

    pub(super) fn read_many(
        &mut self,
        info: &VolumeInfo,
        pages: &[u64],
        at: ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<BatchLsns, ServiceError> {
        let served_lsn = self.served_lsn(info.id, pages, at)?;
        let stream = self.stream(info.id);
        let page_lsns = pages.iter().map(|&page| stream.version(info, page, served_lsn, out)).collect();
        Ok(BatchLsns { served_lsn, page_lsns })
    }

    pub(super) fn register(
        &mut self,
        volume: u32,
        reader_id: u64,
        start_lsn: u64,
    ) -> Result<ReaderLease, ServiceError> {
        let lsn_min = self.stream(volume).lsn_min;
        if start_lsn < lsn_min {
            return Err(ServiceError::too_old(
                lsn_min,
                format!("a reader cannot start at LSN {start_lsn}, below the minimum reader LSN {lsn_min}"),
            ));
        }
        // A reader that registers again (restarted) replaces its old lease.
        let old: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.volume == volume && lease.reader_id == reader_id)
            .map(|(&id, _)| id)
            .collect();
        for id in old {
            self.leases.remove(&id);
        }
        self.next_lease += 1;
        let lease_id = self.next_lease;
        self.leases.insert(lease_id, Lease { volume, reader_id, apply_lsn: start_lsn });
        Ok(ReaderLease { lease_id, granted_lsn: start_lsn, valid_for_ms: LEASE_MS })
    }

    pub(super) fn renew(&mut self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal, ServiceError> {
        self.check_lease(volume, lease_id)?;
        let lease = self.leases.get_mut(&lease_id).expect("checked above");
        if apply_lsn < lease.apply_lsn {
            return Err(ServiceError::invalid(format!(
                "the apply LSN went back from {} to {apply_lsn}",
                lease.apply_lsn
            )));
        }
        lease.apply_lsn = apply_lsn;
        self.settle(volume);
        let lsn_min = self.stream(volume).lsn_min;
        if !self.leases.contains_key(&lease_id) {
            return Err(ServiceError::lease_lost(
                lsn_min,
                format!("the reader at LSN {apply_lsn} lags too far behind: resync at or above LSN {lsn_min}"),
            ));
        }
        Ok(LeaseRenewal { valid_for_ms: LEASE_MS, lsn_min })
    }

    pub(super) fn release(&mut self, volume: u32, lease_id: u64) {
        if self.check_lease(volume, lease_id).is_ok() {
            self.leases.remove(&lease_id);
            self.settle(volume);
        }
    }

    /// Revokes the leases that lag too far, then moves the volume's minimum reader LSN as far
    /// as the fold target, the durable LSN and the remaining leases allow. It never goes back.
    fn settle(&mut self, volume: u32) {
        let durable = self.stream(volume).durable_lsn;
        if let Some(lag) = self.max_lag {
            let floor = durable.saturating_sub(lag);
            let lagging: Vec<u64> = self
                .leases
                .iter()
                .filter(|(_, lease)| lease.volume == volume && lease.apply_lsn < floor)
                .map(|(&id, _)| id)
                .collect();
            for id in lagging {
                self.leases.remove(&id);
            }
        }
        let readers = self.leases.values().filter(|lease| lease.volume == volume).map(|lease| lease.apply_lsn).min();
        let stream = self.stream(volume);
        let target = stream.fold_target.min(durable).min(readers.unwrap_or(u64::MAX));
        stream.lsn_min = stream.lsn_min.max(target);
    }
}

#[cfg(test)]
mod tests {
    use crate::codes::Status;
    use crate::mem::MemService;
    use crate::redo::{AppendOutcome, ReadAt, RedoAppend};
    use crate::service::Service;
    use crate::types::{VolumeMode, VolumeSpec};

    const PAGE: usize = 8192;

    fn service() -> (MemService, u32) {
        let service = MemService::new();
        let spec = VolumeSpec {
            name: "db".into(),
            size_bytes: 16 * PAGE as u64,
            page_size: PAGE as u32,
            mode: VolumeMode::Normal,
        };
        let id = service.volume_create(spec).unwrap().id;
        (service, id)
    }

    fn append(volume: u32, epoch: u64, prev_lsn: u64, end_lsn: u64) -> RedoAppend<'static> {
        RedoAppend { volume, writer_epoch: epoch, prev_lsn, end_lsn, record_count: 1, records: b"r" }
    }

    fn at(request_lsn: u64) -> ReadAt {
        ReadAt { request_lsn, not_modified_since: 0, lease: None }
    }

    #[test]
    fn appends_are_fenced_by_epoch_and_refused_across_gaps() {
        let (service, volume) = service();
        assert_eq!(service.append_redo(&append(volume, 1, 0, 10)).unwrap(), AppendOutcome::Ok { durable_lsn: 10 });
        assert_eq!(
            service.append_redo(&append(volume, 1, 5, 20)).unwrap(),
            AppendOutcome::Gap { expected_prev_lsn: 10 }
        );
        assert_eq!(service.append_redo(&append(volume, 2, 10, 20)).unwrap(), AppendOutcome::Ok { durable_lsn: 20 });
        assert_eq!(service.append_redo(&append(volume, 1, 20, 30)).unwrap(), AppendOutcome::Fenced { epoch: 2 });
        let status = service.redo_status(volume).unwrap();
        assert_eq!((status.writer_epoch, status.durable_lsn, status.complete_lsn), (2, 20, 20));
        assert_eq!(service.appended_batches(volume).len(), 2);
        assert_eq!(service.append_redo(&append(99, 1, 0, 1)).unwrap_err().code, Status::NotFound);
    }

    #[test]
    fn reads_are_served_at_the_lsn_asked_for_within_the_watermarks() {
        let (service, volume) = service();
        service.append_redo(&append(volume, 1, 0, 30)).unwrap();
        service.put_page_version(volume, 3, 10, vec![1; PAGE]);
        service.put_page_version(volume, 3, 20, vec![2; PAGE]);
        let mut out = Vec::new();
        let lsns = service.get_page_at_lsn(volume, 3, at(15), &mut out).unwrap();
        assert_eq!((lsns.served_lsn, lsns.page_lsn, out[0]), (15, 10, 1));
        out.clear();
        let lsns = service.get_page_at_lsn(volume, 3, at(u64::MAX), &mut out).unwrap();
        assert_eq!((lsns.served_lsn, lsns.page_lsn, out[0]), (30, 20, 2));
        out.clear();
        let lsns = service.get_page_at_lsn(volume, 4, at(5), &mut out).unwrap();
        assert_eq!((lsns.page_lsn, out.len()), (0, PAGE), "a page no record touched reads as zeros");

        service.hold_complete(volume, Some(25));
        let waiting = ReadAt { request_lsn: 30, not_modified_since: 28, lease: None };
        let error = service.get_page_at_lsn(volume, 3, waiting, &mut Vec::new()).unwrap_err();
        assert_eq!((error.code, error.lsn), (Status::NotYet, Some(25)));
        service.fold_history(volume, 12);
        let error = service.get_page_at_lsn(volume, 3, at(11), &mut Vec::new()).unwrap_err();
        assert_eq!((error.code, error.lsn), (Status::TooOld, Some(12)));
        let unchanged = service.get_page_at_lsn(volume, 4, at(11), &mut Vec::new()).unwrap();
        assert_eq!(unchanged.served_lsn, 11, "below LSN_min a page unchanged since is still served");
        let error = service.get_pages_at_lsn(volume, &[4, 3], at(11), &mut Vec::new()).unwrap_err();
        assert_eq!(error.code, Status::TooOld, "one changed page refuses the whole vectored read");
        let mut out = Vec::new();
        let lsns = service.get_pages_at_lsn(volume, &[3, 4, 3], at(22), &mut out).unwrap();
        assert_eq!((lsns.served_lsn, lsns.page_lsns), (22, vec![20, 0, 20]));
        assert_eq!(out.len(), 3 * PAGE);
        let error = service.get_pages_at_lsn(volume, &[3, 16], at(22), &mut Vec::new()).unwrap_err();
        assert_eq!(error.code, Status::Invalid, "all or nothing: one page past the end refuses the read");
    }

    #[test]
    fn leases_hold_the_minimum_reader_lsn_and_lagging_readers_lose_theirs() {
        let (service, volume) = service();
        service.append_redo(&append(volume, 1, 0, 100)).unwrap();
        let slow = service.register_reader(volume, 1, 40).unwrap();
        let fast = service.register_reader(volume, 2, 90).unwrap();
        assert_eq!(service.lease_count(volume), 2);
        service.fold_history(volume, 100);
        assert_eq!(service.redo_status(volume).unwrap().lsn_min, 40, "the slowest reader holds history");
        let renewal = service.renew_reader(volume, slow.lease_id, 60).unwrap();
        assert_eq!(renewal.lsn_min, 60);
        assert_eq!(
            service.renew_reader(volume, slow.lease_id, 50).unwrap_err().code,
            Status::Invalid,
            "apply LSNs never go back"
        );
        let error = service.register_reader(volume, 3, 59).unwrap_err();
        assert_eq!((error.code, error.lsn), (Status::TooOld, Some(60)));

        service.set_max_reader_lag(Some(60));
        service.append_redo(&append(volume, 1, 100, 150)).unwrap();
        let error = service.renew_reader(volume, slow.lease_id, 70).unwrap_err();
        assert_eq!((error.code, error.lsn), (Status::LeaseLost, Some(90)), "{error}");
        let leased = ReadAt { lease: Some(slow.lease_id), ..at(95) };
        assert_eq!(service.get_page_at_lsn(volume, 0, leased, &mut Vec::new()).unwrap_err().code, Status::LeaseLost);

        service.expire_lease(fast.lease_id);
        assert_eq!(service.renew_reader(volume, fast.lease_id, 120).unwrap_err().code, Status::LeaseLost);
        service.release_reader(volume, fast.lease_id).unwrap();
        assert_eq!(service.lease_count(volume), 0);
        assert_eq!(service.redo_status(volume).unwrap().lsn_min, 100, "the fold target, no reader left");
    }

    #[test]
    fn a_reader_that_registers_again_replaces_its_lease() {
        let (service, volume) = service();
        service.append_redo(&append(volume, 1, 0, 10)).unwrap();
        let first = service.register_reader(volume, 7, 5).unwrap();
        let second = service.register_reader(volume, 7, 8).unwrap();
        assert_ne!(first.lease_id, second.lease_id);
        assert_eq!(service.lease_count(volume), 1);
        assert_eq!(service.renew_reader(volume, first.lease_id, 9).unwrap_err().code, Status::LeaseLost);
        assert_eq!(service.renew_reader(volume, second.lease_id, 9).unwrap().lsn_min, 0);
    }
}
