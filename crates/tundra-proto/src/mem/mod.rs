//! `MemService`: a [`Service`] that keeps volumes and pages in memory, for tests of the protocol,
//! the client and the command line. It checks arguments the way the store does (page sizes of
//! 8 or 16 KiB, sizes a non-zero multiple of the page size, names of 1 to 64 bytes, whole-page
//! writes), so that error paths can be tested without a node.
//!
//! It compresses nothing. Heavy compression only counts: every stored page in the range moves
//! into segments of 16 pages and is said to shrink to a quarter. Its redo streams are a toy
//! (`redo.rs`): batches are kept undecoded and the page versions reads serve are put in by tests.

mod redo;

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use crate::redo::{AppendOutcome, BatchLsns, LeaseRenewal, PageLsns, ReadAt, ReaderLease, RedoAppend, RedoStatus};
use crate::service::{Service, ServiceError};
use crate::types::{HeavyResult, VolumeInfo, VolumeSpec, WriteMode};

pub use redo::{AppendedBatch, LEASE_MS};

/// Longest volume name, as in the store.
pub const MAX_NAME_BYTES: usize = 64;
/// Pages per heavy segment in the pretend heavy compression.
const PAGES_PER_SEGMENT: u64 = 16;

/// Volumes and pages in memory. See the module documentation.
#[derive(Default)]
pub struct MemService {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u32,
    /// By name.
    volumes: BTreeMap<String, VolumeInfo>,
    pages: HashMap<(u32, u64), StoredPage>,
    /// Pages the service may hold at once; `None` for no limit.
    capacity_pages: Option<usize>,
    /// Returned by the next call, whatever it is.
    injected: Option<ServiceError>,
    flushes: u64,
    redo: redo::Redo,
}

struct StoredPage {
    data: Vec<u8>,
    mode: WriteMode,
}

impl MemService {
    pub fn new() -> MemService {
        MemService::default()
    }

    /// A service that answers `NO_SPACE` once it holds `pages` pages.
    pub fn with_capacity_pages(pages: usize) -> MemService {
        let service = MemService::new();
        service.state.lock().capacity_pages = Some(pages);
        service
    }

    /// Makes the next call, whichever it is, fail with `error`.
    pub fn fail_next(&self, error: ServiceError) {
        self.state.lock().injected = Some(error);
    }

    /// How many pages are stored, over all volumes.
    pub fn stored_pages(&self) -> usize {
        self.state.lock().pages.len()
    }

    /// The write mode the page was last written with, if it is stored.
    pub fn write_mode(&self, volume: u32, page: u64) -> Option<WriteMode> {
        self.state.lock().pages.get(&(volume, page)).map(|stored| stored.mode)
    }

    /// How many flushes were answered.
    pub fn flush_count(&self) -> u64 {
        self.state.lock().flushes
    }

    /// The batches the volume's redo stream accepted, in order.
    pub fn appended_batches(&self, volume: u32) -> Vec<AppendedBatch> {
        self.state.lock().redo.batches(volume)
    }

    /// Makes `data` the page's content from `lsn` on, for reads at an LSN: the toy stream does
    /// not decode records, so tests say what applying them gives.
    pub fn put_page_version(&self, volume: u32, page: u64, lsn: u64, data: Vec<u8>) {
        self.state.lock().redo.put_version(volume, page, lsn, data);
    }

    /// Holds the volume's complete LSN at `cap` (`None`: it follows the durable LSN at once).
    pub fn hold_complete(&self, volume: u32, cap: Option<u64>) {
        self.state.lock().redo.hold_complete(volume, cap);
    }

    /// Lets the volume's minimum reader LSN advance to `lsn`, as far as leases and the durable
    /// LSN allow: history below it is gone, as if folded into images.
    pub fn fold_history(&self, volume: u32, lsn: u64) {
        self.state.lock().redo.fold_history(volume, lsn);
    }

    /// Ends a lease as if it had timed out.
    pub fn expire_lease(&self, lease_id: u64) {
        self.state.lock().redo.expire(lease_id);
    }

    /// A reader further than `lag` behind the durable LSN loses its lease.
    pub fn set_max_reader_lag(&self, lag: Option<u64>) {
        self.state.lock().redo.max_lag = lag;
    }

    /// Live leases on the volume.
    pub fn lease_count(&self, volume: u32) -> usize {
        self.state.lock().redo.lease_count(volume)
    }

    /// Takes the lock, and fails if an error was injected.
    fn enter(&self) -> Result<parking_lot::MutexGuard<'_, State>, ServiceError> {
        let mut state = self.state.lock();
        match state.injected.take() {
            Some(error) => Err(error),
            None => Ok(state),
        }
    }
}

impl State {
    fn by_id(&self, volume: u32) -> Result<&VolumeInfo, ServiceError> {
        self.volumes
            .values()
            .find(|info| info.id == volume)
            .ok_or_else(|| ServiceError::not_found(format!("no volume has id {volume}")))
    }

    fn by_name(&self, name: &str) -> Result<&VolumeInfo, ServiceError> {
        self.volumes.get(name).ok_or_else(|| ServiceError::not_found(format!("no volume is named {name:?}")))
    }

    /// Checks that pages `first..first + count` lie inside the volume.
    fn check_range(&self, volume: u32, first: u64, count: u64) -> Result<&VolumeInfo, ServiceError> {
        let info = self.by_id(volume)?;
        let end = first.checked_add(count);
        if end.is_none_or(|end| end > info.page_count()) {
            return Err(ServiceError::invalid(format!(
                "pages {first}..+{count} are past the end of volume {:?} ({} pages)",
                info.name,
                info.page_count()
            )));
        }
        Ok(info)
    }

    fn drop_pages(&mut self, volume: u32, keep: impl Fn(u64) -> bool) {
        self.pages.retain(|&(v, page), _| v != volume || keep(page));
    }
}

fn check_size(size_bytes: u64, page_size: u32) -> Result<(), ServiceError> {
    if page_size != 8192 && page_size != 16384 {
        return Err(ServiceError::invalid(format!("page size {page_size}: pages are 8 KiB or 16 KiB")));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(page_size)) {
        return Err(ServiceError::invalid(format!(
            "volume size {size_bytes} is not a non-zero multiple of the page size"
        )));
    }
    Ok(())
}

impl Service for MemService {
    fn volume_lookup(&self, name: &str) -> Result<VolumeInfo, ServiceError> {
        self.enter()?.by_name(name).cloned()
    }

    fn volume_create(&self, spec: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        let mut state = self.enter()?;
        if spec.name.is_empty() || spec.name.len() > MAX_NAME_BYTES {
            return Err(ServiceError::invalid(format!("volume names are 1 to {MAX_NAME_BYTES} bytes")));
        }
        check_size(spec.size_bytes, spec.page_size)?;
        if state.volumes.contains_key(&spec.name) {
            return Err(ServiceError::exists(format!("a volume named {:?} exists", spec.name)));
        }
        state.next_id += 1;
        let info = VolumeInfo {
            id: state.next_id,
            name: spec.name,
            size_bytes: spec.size_bytes,
            page_size: spec.page_size,
            mode: spec.mode,
        };
        state.volumes.insert(info.name.clone(), info.clone());
        Ok(info)
    }

    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        Ok(self.enter()?.volumes.values().cloned().collect())
    }

    fn volume_resize(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, ServiceError> {
        let mut state = self.enter()?;
        let info = state.by_name(name)?;
        check_size(size_bytes, info.page_size)?;
        if size_bytes < info.size_bytes {
            return Err(ServiceError::invalid("volumes only grow"));
        }
        let info = state.volumes.get_mut(name).expect("looked up above");
        info.size_bytes = size_bytes;
        Ok(info.clone())
    }

    fn volume_delete(&self, name: &str) -> Result<(), ServiceError> {
        let mut state = self.enter()?;
        let id = state.by_name(name)?.id;
        state.volumes.remove(name);
        state.drop_pages(id, |_| false);
        state.redo.drop_volume(id);
        Ok(())
    }

    fn read_page(&self, volume: u32, page: u64, out: &mut Vec<u8>) -> Result<(), ServiceError> {
        let state = self.enter()?;
        let info = state.check_range(volume, page, 1)?;
        match state.pages.get(&(volume, page)) {
            Some(stored) => out.extend_from_slice(&stored.data),
            None => out.resize(info.page_size as usize, 0),
        }
        Ok(())
    }

    fn write_page(&self, volume: u32, page: u64, mode: WriteMode, data: &[u8]) -> Result<(), ServiceError> {
        let mut state = self.enter()?;
        let info = state.check_range(volume, page, 1)?;
        if data.len() != info.page_size as usize {
            return Err(ServiceError::invalid(format!(
                "a write of {} bytes to a volume of {}-byte pages",
                data.len(),
                info.page_size
            )));
        }
        let full = state.capacity_pages.is_some_and(|limit| state.pages.len() >= limit);
        if full && !state.pages.contains_key(&(volume, page)) {
            return Err(ServiceError::no_space("the in-memory service is full"));
        }
        state.pages.insert((volume, page), StoredPage { data: data.to_vec(), mode });
        Ok(())
    }

    fn trim(&self, volume: u32, first: u64, count: u64) -> Result<(), ServiceError> {
        let mut state = self.enter()?;
        state.check_range(volume, first, count)?;
        state.drop_pages(volume, |page| page < first || page >= first + count);
        Ok(())
    }

    fn flush(&self, volume: Option<u32>) -> Result<(), ServiceError> {
        let mut state = self.enter()?;
        if let Some(volume) = volume {
            state.by_id(volume)?;
        }
        state.flushes += 1;
        Ok(())
    }

    fn heavy_compress(&self, volume: u32, first: u64, count: u64) -> Result<HeavyResult, ServiceError> {
        let state = self.enter()?;
        let info = state.check_range(volume, first, count)?;
        let pages =
            state.pages.keys().filter(|&&(v, page)| v == volume && page >= first && page - first < count).count()
                as u64;
        let bytes_before = pages * u64::from(info.page_size);
        Ok(HeavyResult {
            pages,
            segments: pages.div_ceil(PAGES_PER_SEGMENT),
            bytes_before,
            bytes_after: bytes_before / 4,
        })
    }

    fn stats(&self, volume: Option<u32>) -> Result<String, ServiceError> {
        let state = self.enter()?;
        let value = match volume {
            Some(volume) => {
                let info = state.by_id(volume)?;
                let pages = state.pages.keys().filter(|&&(v, _)| v == volume).count();
                serde_json::json!({ "volume": info.id, "name": info.name, "pages": pages })
            }
            None => serde_json::json!({
                "volumes": state.volumes.len(),
                "pages": state.pages.len(),
                "flushes": state.flushes,
            }),
        };
        Ok(value.to_string())
    }

    fn append_redo(&self, append: &RedoAppend<'_>) -> Result<AppendOutcome, ServiceError> {
        let mut state = self.enter()?;
        state.by_id(append.volume)?;
        Ok(state.redo.append(append))
    }

    fn redo_status(&self, volume: u32) -> Result<RedoStatus, ServiceError> {
        let mut state = self.enter()?;
        state.by_id(volume)?;
        Ok(state.redo.status(volume))
    }

    fn get_page_at_lsn(&self, volume: u32, page: u64, at: ReadAt, out: &mut Vec<u8>) -> Result<PageLsns, ServiceError> {
        let mut state = self.enter()?;
        let info = state.check_range(volume, page, 1)?.clone();
        state.redo.read(&info, page, at, out)
    }

    fn get_pages_at_lsn(
        &self,
        volume: u32,
        pages: &[u64],
        at: ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<BatchLsns, ServiceError> {
        let mut state = self.enter()?;
        let info = state.by_id(volume)?.clone();
        for &page in pages {
            state.check_range(volume, page, 1)?;
        }
        state.redo.read_many(&info, pages, at, out)
    }

    fn register_reader(&self, volume: u32, reader_id: u64, start_lsn: u64) -> Result<ReaderLease, ServiceError> {
        let mut state = self.enter()?;
        state.by_id(volume)?;
        state.redo.register(volume, reader_id, start_lsn)
    }

    fn renew_reader(&self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal, ServiceError> {
        let mut state = self.enter()?;
        state.by_id(volume)?;
        state.redo.renew(volume, lease_id, apply_lsn)
    }

    fn release_reader(&self, volume: u32, lease_id: u64) -> Result<(), ServiceError> {
        let mut state = self.enter()?;
        state.by_id(volume)?;
        state.redo.release(volume, lease_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::Status;
    use crate::types::VolumeMode;

    fn spec(name: &str, size_bytes: u64, page_size: u32) -> VolumeSpec {
        VolumeSpec { name: name.into(), size_bytes, page_size, mode: VolumeMode::Normal }
    }

    #[test]
    fn checks_like_the_store() {
        let service = MemService::new();
        let code = |result: Result<VolumeInfo, ServiceError>| result.unwrap_err().code;
        assert_eq!(code(service.volume_create(spec("a", 1 << 20, 4096))), Status::Invalid);
        assert_eq!(code(service.volume_create(spec("a", 8192 * 3 + 1, 8192))), Status::Invalid);
        assert_eq!(code(service.volume_create(spec("", 8192, 8192))), Status::Invalid);
        let info = service.volume_create(spec("a", 8192 * 4, 8192)).unwrap();
        assert_eq!(code(service.volume_create(spec("a", 8192, 8192))), Status::Exists);
        assert_eq!(service.write_page(info.id, 4, WriteMode::Auto, &[0; 8192]).unwrap_err().code, Status::Invalid);
        assert_eq!(service.write_page(info.id, 0, WriteMode::Auto, &[0; 100]).unwrap_err().code, Status::Invalid);
        assert_eq!(service.write_page(99, 0, WriteMode::Auto, &[0; 8192]).unwrap_err().code, Status::NotFound);
        assert_eq!(service.trim(info.id, 3, u64::MAX).unwrap_err().code, Status::Invalid);
    }

    #[test]
    fn pages_read_back_and_trim_to_zeros() {
        let service = MemService::new();
        let info = service.volume_create(spec("a", 8192 * 4, 8192)).unwrap();
        service.write_page(info.id, 1, WriteMode::Lz4, &[7; 8192]).unwrap();
        let mut out = Vec::new();
        service.read_page(info.id, 1, &mut out).unwrap();
        assert_eq!(out, vec![7; 8192]);
        assert_eq!(service.write_mode(info.id, 1), Some(WriteMode::Lz4));
        service.trim(info.id, 0, 2).unwrap();
        out.clear();
        service.read_page(info.id, 1, &mut out).unwrap();
        assert_eq!(out, vec![0; 8192]);
    }

    #[test]
    fn capacity_and_injected_errors() {
        let service = MemService::with_capacity_pages(1);
        let info = service.volume_create(spec("a", 8192 * 4, 8192)).unwrap();
        service.write_page(info.id, 0, WriteMode::Auto, &[1; 8192]).unwrap();
        service.write_page(info.id, 0, WriteMode::Auto, &[2; 8192]).unwrap();
        assert_eq!(service.write_page(info.id, 1, WriteMode::Auto, &[1; 8192]).unwrap_err().code, Status::NoSpace);
        service.fail_next(ServiceError::corrupted("bad block"));
        assert_eq!(service.volume_list().unwrap_err().code, Status::Corrupted);
        assert_eq!(service.volume_list().unwrap().len(), 1);
    }
}
