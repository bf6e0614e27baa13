//! A cluster node behind the native protocol and NBD: requests on replicated volumes go
//! through [`ClusterNode`]'s page I/O (to the chunks' leaders), everything else to the node
//! as it is served alone (`tundra_node::native`, `tundra_node::nbd`). A replicated volume's
//! redo stream, reads at an LSN and reader leases go to its redo group's leader
//! ([`crate::redo`]). A replicated volume's resize grows it on every node ([`crate::resize`]),
//! and its sizes are the size this node serves. Operations not built for replicated volumes
//! yet (heavy compression) are refused with a message that says so, never done on one replica alone.

use std::sync::Arc;

use tundra_nbd::{Export, ExportError, Exports};
use tundra_node::VolumeRef;
use tundra_node::native::NodeService;
use tundra_node::nbd::NodeExports;
use tundra_proto::{
    AppendOutcome, BatchLsns, HeavyResult, LeaseRenewal, PageLsns, ReadAt, ReaderLease, RedoAppend, RedoStatus,
    Service, ServiceError, VolumeInfo, VolumeSpec,
};
use tundra_store::ids::VolumeId;

use crate::cluster::ClusterNode;
use crate::messages::Refusal;
use crate::redo::{RedoCall, RedoEntry, RedoReply};

/// The native protocol's service of a cluster node.
pub struct ClusterService {
    cluster: Arc<ClusterNode>,
    local: NodeService,
}

impl ClusterService {
    pub fn new(cluster: Arc<ClusterNode>) -> ClusterService {
        let local = NodeService(cluster.node.clone());
        ClusterService { cluster, local }
    }

    /// The volume if it is replicated, None if it is this node's alone.
    fn replicated(&self, volume: u32) -> Result<Option<VolumeRef>, ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return Ok(None);
        }
        self.cluster.refuse_deleting(volume).map_err(service_error)?;
        self.cluster.node.volume(VolumeId(volume)).map(Some).map_err(|e| ServiceError::not_found(e.message()))
    }

    /// A volume's description with the size this node serves (a replicated volume's store is
    /// larger than that between a resize's phases, resize.rs).
    fn served(&self, mut info: VolumeInfo) -> VolumeInfo {
        if let Some(served) = self.cluster.served_bytes(info.id) {
            info.size_bytes = served;
        }
        info
    }
}

fn service_error(refusal: Refusal) -> ServiceError {
    match refusal {
        Refusal::Invalid(why) => ServiceError::invalid(why),
        Refusal::NotLeader { .. } => ServiceError::io("the chunk's leader moved while the request ran"),
        Refusal::Unavailable(why) => ServiceError::io(why),
    }
}

impl Service for ClusterService {
    fn volume_lookup(&self, name: &str) -> Result<VolumeInfo, ServiceError> {
        self.local.volume_lookup(name).map(|info| self.served(info))
    }

    fn volume_create(&self, spec: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        self.local.volume_create(spec)
    }

    fn volume_create_replicated(&self, spec: VolumeSpec, replicas: u8) -> Result<VolumeInfo, ServiceError> {
        if spec.mode != tundra_proto::VolumeMode::Normal {
            return Err(ServiceError::invalid("a replicated volume is compressed (mode normal)"));
        }
        let id = self
            .cluster
            .create_replicated(&spec.name, spec.size_bytes, spec.page_size, replicas)
            .map_err(service_error)?;
        let volume = self.cluster.node.volume(VolumeId(id)).map_err(|e| ServiceError::internal(e.message()))?;
        self.local.volume_lookup(&volume.volume.name)
    }

    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        self.local.volume_list().map(|list| list.into_iter().map(|info| self.served(info)).collect())
    }

    /// A replicated volume grows on every node (resize.rs); a local one here.
    fn volume_resize(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, ServiceError> {
        let info = self.local.volume_lookup(name)?;
        if self.cluster.is_replicated(info.id) {
            self.cluster.resize_replicated(info.id, size_bytes).map_err(service_error)?;
            return self.volume_lookup(name);
        }
        self.local.volume_resize(name, size_bytes)
    }

    fn volume_delete(&self, name: &str) -> Result<(), ServiceError> {
        let info = self.local.volume_lookup(name)?;
        if self.cluster.is_replicated(info.id) {
            return self.cluster.delete_replicated(info.id).map_err(service_error);
        }
        self.local.volume_delete(name)
    }

    fn read_page(&self, volume: u32, page: u64, out: &mut Vec<u8>) -> Result<(), ServiceError> {
        let Some(v) = self.replicated(volume)? else { return self.local.read_page(volume, page, out) };
        out.resize(v.page_size(), 0);
        let offset =
            page.checked_mul(v.page_size() as u64).ok_or_else(|| ServiceError::invalid("page past the end"))?;
        self.cluster.read_bytes(&v, offset, out).map_err(service_error)
    }

    fn write_page(
        &self,
        volume: u32,
        page: u64,
        mode: tundra_proto::WriteMode,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        let Some(v) = self.replicated(volume)? else { return self.local.write_page(volume, page, mode, data) };
        if data.len() != v.page_size() {
            return Err(ServiceError::invalid(format!(
                "a page of {} bytes for {}-byte pages",
                data.len(),
                v.page_size()
            )));
        }
        let offset =
            page.checked_mul(v.page_size() as u64).ok_or_else(|| ServiceError::invalid("page past the end"))?;
        self.cluster.write_bytes(&v, offset, data).map_err(service_error)
    }

    fn trim(&self, volume: u32, first: u64, count: u64) -> Result<(), ServiceError> {
        let Some(v) = self.replicated(volume)? else { return self.local.trim(volume, first, count) };
        let size = v.page_size() as u64;
        let (offset, len) = first
            .checked_mul(size)
            .zip(count.checked_mul(size))
            .ok_or_else(|| ServiceError::invalid("pages past the end"))?;
        self.cluster.zero_bytes(&v, offset, len).map_err(service_error)
    }

    /// A replicated volume's writes are durable on a majority when answered: nothing to do.
    fn flush(&self, volume: Option<u32>) -> Result<(), ServiceError> {
        match volume {
            Some(id) if self.replicated(id)?.is_some() => Ok(()),
            other => self.local.flush(other),
        }
    }

    /// A replicated volume's pages are compressed by each chunk's leader and stored by every
    /// replica (io.rs); a local one's here.
    fn heavy_compress(&self, volume: u32, first: u64, count: u64) -> Result<HeavyResult, ServiceError> {
        let Some(v) = self.replicated(volume)? else { return self.local.heavy_compress(volume, first, count) };
        let done = self.cluster.heavy_compress(&v, first, count).map_err(service_error)?;
        Ok(HeavyResult {
            pages: done.pages,
            segments: done.segments,
            bytes_before: done.bytes_before,
            bytes_after: done.bytes_after,
        })
    }

    /// The node's stats; the whole node's also carry `cluster`, the status of every node and
    /// chunk (`tundra cluster status` reads it).
    fn stats(&self, volume: Option<u32>) -> Result<String, ServiceError> {
        let local = self.local.stats(volume)?;
        if volume.is_some() {
            return Ok(local);
        }
        let mut json: serde_json::Value =
            serde_json::from_str(&local).map_err(|e| ServiceError::internal(e.to_string()))?;
        let status = serde_json::to_value(self.cluster.status()).map_err(|e| ServiceError::internal(e.to_string()))?;
        if let Some(object) = json.as_object_mut() {
            object.insert("cluster".into(), status);
        }
        Ok(json.to_string())
    }

    fn cluster_admin(&self, request: &str) -> Result<String, ServiceError> {
        self.cluster.admin(request).map_err(service_error)
    }

    fn append_redo(&self, append: &RedoAppend<'_>) -> Result<AppendOutcome, ServiceError> {
        if !self.cluster.is_replicated(append.volume) {
            return self.local.append_redo(append);
        }
        let entry = RedoEntry {
            volume: append.volume,
            epoch: append.writer_epoch,
            prev_lsn: append.prev_lsn,
            end_lsn: append.end_lsn,
            record_count: append.record_count,
            records: append.records.to_vec(),
        };
        match self.cluster.redo_request(append.volume, RedoCall::Append(entry))? {
            RedoReply::Appended { code: 0, value } => Ok(AppendOutcome::Ok { durable_lsn: value }),
            RedoReply::Appended { code: 1, value } => Ok(AppendOutcome::Gap { expected_prev_lsn: value }),
            RedoReply::Appended { code: 2, value } => Ok(AppendOutcome::Fenced { epoch: value }),
            other => Err(mismatch(&other)),
        }
    }

    fn redo_status(&self, volume: u32) -> Result<RedoStatus, ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return self.local.redo_status(volume);
        }
        match self.cluster.redo_request(volume, RedoCall::Status)? {
            RedoReply::Status { writer_epoch, durable_lsn, complete_lsn, lsn_min } => {
                Ok(RedoStatus { writer_epoch, durable_lsn, complete_lsn, lsn_min })
            }
            other => Err(mismatch(&other)),
        }
    }

    fn get_page_at_lsn(&self, volume: u32, page: u64, at: ReadAt, out: &mut Vec<u8>) -> Result<PageLsns, ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return self.local.get_page_at_lsn(volume, page, at, out);
        }
        let lsns = self.get_pages_at_lsn(volume, &[page], at, out)?;
        match lsns.page_lsns.as_slice() {
            [page_lsn] => Ok(PageLsns { served_lsn: lsns.served_lsn, page_lsn: *page_lsn }),
            _ => Err(ServiceError::internal("the redo leader served another number of pages")),
        }
    }

    fn get_pages_at_lsn(
        &self,
        volume: u32,
        pages: &[u64],
        at: ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<BatchLsns, ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return self.local.get_pages_at_lsn(volume, pages, at, out);
        }
        let call = RedoCall::Read {
            pages: pages.to_vec(),
            request_lsn: at.request_lsn,
            not_modified_since: at.not_modified_since,
            lease: at.lease,
        };
        match self.cluster.redo_request(volume, call)? {
            RedoReply::Pages { served_lsn, page_lsns, data } if page_lsns.len() == pages.len() => {
                *out = data;
                Ok(BatchLsns { served_lsn, page_lsns })
            }
            other => Err(mismatch(&other)),
        }
    }

    fn register_reader(&self, volume: u32, reader_id: u64, start_lsn: u64) -> Result<ReaderLease, ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return self.local.register_reader(volume, reader_id, start_lsn);
        }
        match self.cluster.redo_request(volume, RedoCall::Register { reader: reader_id, start_lsn })? {
            RedoReply::Lease { lease_id, granted_lsn, valid_for_ms } => {
                Ok(ReaderLease { lease_id, granted_lsn, valid_for_ms })
            }
            other => Err(mismatch(&other)),
        }
    }

    fn renew_reader(&self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal, ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return self.local.renew_reader(volume, lease_id, apply_lsn);
        }
        match self.cluster.redo_request(volume, RedoCall::Renew { lease: lease_id, apply_lsn })? {
            RedoReply::Renewed { valid_for_ms, lsn_min } => Ok(LeaseRenewal { valid_for_ms, lsn_min }),
            other => Err(mismatch(&other)),
        }
    }

    fn release_reader(&self, volume: u32, lease_id: u64) -> Result<(), ServiceError> {
        if !self.cluster.is_replicated(volume) {
            return self.local.release_reader(volume, lease_id);
        }
        match self.cluster.redo_request(volume, RedoCall::Release { lease: lease_id })? {
            RedoReply::Released => Ok(()),
            other => Err(mismatch(&other)),
        }
    }
}

/// The redo leader answered another kind than the call asks for.
fn mismatch(reply: &RedoReply) -> ServiceError {
    ServiceError::internal(format!("the redo leader answered {reply:?}"))
}

/// A cluster node's NBD exports: every volume, replicated ones through the cluster.
pub struct ClusterExports {
    cluster: Arc<ClusterNode>,
    local: NodeExports,
}

impl ClusterExports {
    pub fn new(cluster: Arc<ClusterNode>) -> ClusterExports {
        let local = NodeExports(cluster.node.clone());
        ClusterExports { cluster, local }
    }
}

impl Exports for ClusterExports {
    fn lookup(&self, name: &str) -> Option<Arc<dyn Export>> {
        let volume = self.cluster.node.volume_by_name(name).ok()?;
        if !self.cluster.is_replicated(volume.volume.id.0) {
            return self.local.lookup(name);
        }
        Some(Arc::new(ReplicatedExport { cluster: self.cluster.clone(), volume }))
    }

    fn list(&self) -> Vec<(String, String)> {
        self.local.list()
    }

    fn default_name(&self) -> Option<String> {
        self.local.default_name()
    }
}

/// A replicated volume through NBD: every write is durable on a majority when answered, so a
/// flush or FUA has nothing left to do.
struct ReplicatedExport {
    cluster: Arc<ClusterNode>,
    volume: VolumeRef,
}

fn export_error(refusal: Refusal) -> ExportError {
    match refusal {
        Refusal::Invalid(why) => ExportError::invalid(why),
        other => ExportError::io(format!("{other:?}")),
    }
}

impl Export for ReplicatedExport {
    /// The size this node serves (the catalog's, resize.rs), read when a client connects.
    fn size(&self) -> u64 {
        self.cluster.served_bytes(self.volume.volume.id.0).unwrap_or(self.volume.volume.size_bytes)
    }

    fn preferred_block_size(&self) -> u32 {
        self.volume.volume.page_size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.cluster.read_bytes(&self.volume, offset, buf).map_err(export_error)
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.cluster.write_bytes(&self.volume, offset, data).map_err(export_error)
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.cluster.zero_bytes(&self.volume, offset, len).map_err(export_error)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool, _fua: bool) -> Result<(), ExportError> {
        self.cluster.zero_bytes(&self.volume, offset, len).map_err(export_error)
    }
}
