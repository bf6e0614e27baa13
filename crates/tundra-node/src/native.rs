//! The node behind the native page protocol (docs/protocol.md).

use std::sync::Arc;

use tundra_proto::{HeavyResult, Server, Service, ServiceError, Status, VolumeInfo, VolumeSpec};
use tundra_store::ids::VolumeId;
use tundra_store::volume::VolumeMode;

use crate::{Error, Node, VolumeRef, WriteMode};

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
}
