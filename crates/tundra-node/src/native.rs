//! The node behind the native page protocol (docs/protocol.md).

use std::sync::Arc;

use tundra_proto::{
    AppendOutcome, BatchLsns, HeavyResult, LeaseRenewal, PageLsns, ReadAt, ReaderLease, RedoAppend, RedoStatus, Server,
    Service, ServiceError, Status, VolumeInfo, VolumeSpec,
};
use tundra_store::ids::VolumeId;
use tundra_store::volume::VolumeMode;

use crate::{Error, Node, RedoRefusal, VolumeRef, WriteMode};

/// Serves `node` on `addr` until the returned server is shut down.
pub fn start(addr: &str, node: Arc<Node>) -> std::io::Result<Server> {
    start_with(addr, node, tundra_proto::ServerConfig::default())
}

/// [`start`] with the limits of the node's `[limits]` configuration.
pub fn start_with(addr: &str, node: Arc<Node>, config: tundra_proto::ServerConfig) -> std::io::Result<Server> {
    Server::start_with(addr, Arc::new(NodeService(node)), config)
}

/// The node as a protocol service.
pub struct NodeService(pub Arc<Node>);

fn service_error(e: Error) -> ServiceError {
    let code = match &e {
        Error::Invalid(_) => Status::Invalid,
        Error::NotFound(_) => Status::NotFound,
        Error::Exists(_) => Status::Exists,
        Error::NoSpace(_) => Status::NoSpace,
        Error::Corrupted(_) => Status::Corrupted,
        Error::Io(_) => Status::Io,
        Error::Closed(_) => Status::ShuttingDown,
        Error::Busy(_) => Status::Busy,
    };
    ServiceError::new(code, e.message())
}

/// A request on a volume deleted while it ran answers NOT_FOUND, as a request naming the
/// deleted volume's id does (ids are never reused): the client looks the volume up again.
fn on_volume<T>(volume: &VolumeRef, result: crate::Result<T>) -> Result<T, ServiceError> {
    result.map_err(|e| match e {
        Error::Closed(m) if !volume.is_live() => ServiceError::new(Status::NotFound, m),
        e => service_error(e),
    })
}

fn info(v: &VolumeRef) -> VolumeInfo {
    VolumeInfo {
        id: v.volume.id.0,
        name: v.volume.name.clone(),
        size_bytes: v.volume.size_bytes,
        page_size: v.volume.page_size,
        mode: match v.volume.mode {
            VolumeMode::Normal => tundra_proto::VolumeMode::Normal,
            VolumeMode::None => tundra_proto::VolumeMode::None,
        },
    }
}

impl NodeService {
    fn volume(&self, id: u32) -> Result<VolumeRef, ServiceError> {
        self.0.volume(VolumeId(id)).map_err(service_error)
    }

    /// The stream's writer epoch and durable LSN: what a replicated stream's leader checks a
    /// batch against before proposing it, without [`Node::redo_status`]'s device queries.
    pub fn redo_position(&self, volume: u32) -> Result<(u64, u64), ServiceError> {
        let volume = self.volume(volume)?;
        on_volume(&volume, self.0.redo_position(&volume))
    }
}

/// A redo refusal as the status a reader acts on.
fn refusal_error(volume: &VolumeRef, refusal: RedoRefusal) -> ServiceError {
    match refusal {
        RedoRefusal::TooOld { lsn_min, message } => ServiceError::too_old(lsn_min.0, message),
        RedoRefusal::NotYet { complete_lsn } => ServiceError::not_yet(
            complete_lsn.0,
            format!("redo of volume {:?} is complete only through LSN {complete_lsn}", volume.volume.name),
        ),
        RedoRefusal::LeaseLost { lsn_min, message } => ServiceError::lease_lost(lsn_min.0, message),
        RedoRefusal::Error(error) => on_volume(volume, Err::<(), _>(error)).expect_err("an error stays one"),
    }
}

impl Service for NodeService {
    fn volume_lookup(&self, name: &str) -> Result<VolumeInfo, ServiceError> {
        self.0.volume_by_name(name).map(|v| info(&v)).map_err(service_error)
    }

    fn volume_create(&self, spec: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        let mode = match spec.mode {
            tundra_proto::VolumeMode::Normal => VolumeMode::Normal,
            tundra_proto::VolumeMode::None => VolumeMode::None,
        };
        self.0.volume_create(&spec.name, spec.size_bytes, spec.page_size, mode).map(|v| info(&v)).map_err(service_error)
    }

    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        Ok(self.0.volumes().iter().map(info).collect())
    }

    fn volume_resize(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, ServiceError> {
        self.0.volume_resize(name, size_bytes).map(|v| info(&v)).map_err(service_error)
    }

    fn volume_delete(&self, name: &str) -> Result<(), ServiceError> {
        self.0.volume_delete(name).map_err(service_error)
    }

    fn read_page(&self, volume: u32, page: u64, out: &mut Vec<u8>) -> Result<(), ServiceError> {
        let volume = self.volume(volume)?;
        out.resize(volume.page_size(), 0);
        on_volume(&volume, self.0.read_page(&volume, page, out))
    }

    fn write_page(
        &self,
        volume: u32,
        page: u64,
        mode: tundra_proto::WriteMode,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        let volume = self.volume(volume)?;
        let mode = match mode {
            tundra_proto::WriteMode::Auto => WriteMode::Auto { update_fraction: None },
            tundra_proto::WriteMode::Lz4 => WriteMode::Lz4,
            tundra_proto::WriteMode::Zstd => WriteMode::Zstd,
            tundra_proto::WriteMode::None => WriteMode::None,
        };
        on_volume(&volume, self.0.write_page(&volume, page, mode, data))
    }

    fn trim(&self, volume: u32, first: u64, count: u64) -> Result<(), ServiceError> {
        let volume = self.volume(volume)?;
        on_volume(&volume, self.0.trim_pages(&volume, first, count))
    }

    fn flush(&self, volume: Option<u32>) -> Result<(), ServiceError> {
        match volume.map(|id| self.volume(id)).transpose()? {
            Some(volume) => on_volume(&volume, self.0.flush(Some(&volume))),
            None => self.0.flush(None).map_err(service_error),
        }
    }

    fn heavy_compress(&self, volume: u32, first: u64, count: u64) -> Result<HeavyResult, ServiceError> {
        let volume = self.volume(volume)?;
        let r = on_volume(&volume, self.0.heavy_compress(&volume, first, count))?;
        Ok(HeavyResult {
            pages: r.pages,
            segments: r.segments,
            bytes_before: r.bytes_before,
            bytes_after: r.bytes_after,
        })
    }

    /// The node's stats as JSON (docs/cli.md, `tundra stats --json`); with a volume, that
    /// volume's entry only.
    fn stats(&self, volume: Option<u32>) -> Result<String, ServiceError> {
        let stats = self.0.stats();
        let json = match volume {
            None => serde_json::to_string(&stats),
            Some(id) => {
                self.volume(id)?;
                match stats.volumes.iter().find(|v| v.id == id) {
                    Some(v) => serde_json::to_string(v),
                    None => return Err(ServiceError::not_found(format!("no volume with id {id}"))),
                }
            }
        };
        json.map_err(|e| ServiceError::new(Status::Internal, e.to_string()))
    }

    fn append_redo(&self, append: &RedoAppend<'_>) -> Result<AppendOutcome, ServiceError> {
        let volume = self.volume(append.volume)?;
        let outcome = self.0.append_redo(
            &volume,
            append.writer_epoch,
            append.prev_lsn,
            append.end_lsn,
            append.record_count,
            append.records,
        );
        Ok(match on_volume(&volume, outcome)? {
            tundra_redo::AppendOutcome::Ok { durable_lsn } => AppendOutcome::Ok { durable_lsn: durable_lsn.0 },
            tundra_redo::AppendOutcome::Gap { expected_prev_lsn } => {
                AppendOutcome::Gap { expected_prev_lsn: expected_prev_lsn.0 }
            }
            tundra_redo::AppendOutcome::Fenced { epoch } => AppendOutcome::Fenced { epoch: epoch.0 },
        })
    }

    fn redo_status(&self, volume: u32) -> Result<RedoStatus, ServiceError> {
        let volume = self.volume(volume)?;
        let marks = on_volume(&volume, self.0.redo_status(&volume))?;
        Ok(RedoStatus {
            writer_epoch: marks.writer_epoch,
            durable_lsn: marks.durable_lsn,
            complete_lsn: marks.complete_lsn,
            lsn_min: marks.lsn_min,
        })
    }

    fn get_page_at_lsn(&self, volume: u32, page: u64, at: ReadAt, out: &mut Vec<u8>) -> Result<PageLsns, ServiceError> {
        let volume = self.volume(volume)?;
        out.resize(volume.page_size(), 0);
        let served = self
            .0
            .read_page_at(&volume, page, at.request_lsn, at.not_modified_since, out)
            .map_err(|refusal| refusal_error(&volume, refusal))?;
        Ok(PageLsns { served_lsn: served.served_lsn.0, page_lsn: served.page_lsn.0 })
    }

    fn get_pages_at_lsn(
        &self,
        volume: u32,
        pages: &[u64],
        at: ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<BatchLsns, ServiceError> {
        let volume = self.volume(volume)?;
        let page_size = volume.page_size();
        out.resize(pages.len() * page_size, 0);
        // Every page at one LSN: the first page's read point, then the rest at exactly it.
        let mut served_lsn = None;
        let mut page_lsns = Vec::with_capacity(pages.len());
        for (i, &page) in pages.iter().enumerate() {
            let request = served_lsn.unwrap_or(at.request_lsn);
            let served = self
                .0
                .read_page_at(
                    &volume,
                    page,
                    request,
                    at.not_modified_since,
                    &mut out[i * page_size..(i + 1) * page_size],
                )
                .map_err(|refusal| refusal_error(&volume, refusal))?;
            served_lsn.get_or_insert(served.served_lsn.0);
            page_lsns.push(served.page_lsn.0);
        }
        Ok(BatchLsns { served_lsn: served_lsn.unwrap_or(at.request_lsn), page_lsns })
    }

    fn register_reader(&self, volume: u32, reader_id: u64, start_lsn: u64) -> Result<ReaderLease, ServiceError> {
        let volume = self.volume(volume)?;
        let grant =
            self.0.register_reader(&volume, reader_id, start_lsn).map_err(|refusal| refusal_error(&volume, refusal))?;
        Ok(ReaderLease {
            lease_id: grant.lease_id,
            granted_lsn: grant.granted_lsn.0,
            valid_for_ms: grant.valid_for.as_millis() as u64,
        })
    }

    fn renew_reader(&self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal, ServiceError> {
        let volume = self.volume(volume)?;
        let grant =
            self.0.renew_reader(&volume, lease_id, apply_lsn).map_err(|refusal| refusal_error(&volume, refusal))?;
        Ok(LeaseRenewal { valid_for_ms: grant.valid_for.as_millis() as u64, lsn_min: grant.lsn_min.0 })
    }

    fn release_reader(&self, volume: u32, lease_id: u64) -> Result<(), ServiceError> {
        let volume = self.volume(volume)?;
        on_volume(&volume, self.0.release_reader(&volume, lease_id)).map(|_| ())
    }
}
