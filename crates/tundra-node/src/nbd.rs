//! The node's volumes as NBD exports: one export per volume, named after it, looked up at each
//! connection, so volumes created while the node runs are served at once.

use std::sync::Arc;

use tundra_nbd::{Export, ExportError, Exports};

use crate::{Error, Node, VolumeRef};

/// Every volume of the node.
pub struct NodeExports(pub Arc<Node>);

impl Exports for NodeExports {
    fn lookup(&self, name: &str) -> Option<Arc<dyn Export>> {
        let volume = self.0.volume_by_name(name).ok()?;
        Some(Arc::new(VolumeExport { node: self.0.clone(), volume }))
    }

    fn list(&self) -> Vec<(String, String)> {
        self.0
            .volumes()
            .into_iter()
            .map(|v| {
                let what = match v.volume.mode {
                    tundra_store::volume::VolumeMode::Normal => "compressed",
                    tundra_store::volume::VolumeMode::None => "uncompressed",
                };
                (v.volume.name.clone(), format!("Tundra volume, {what}, {}-byte pages", v.volume.page_size))
            })
            .collect()
    }

    /// The only volume, when there is exactly one.
    fn default_name(&self) -> Option<String> {
        let volumes = self.0.volumes();
        (volumes.len() == 1).then(|| volumes[0].volume.name.clone())
    }
}

/// One volume through NBD. Its size is the one negotiated: a volume grown while a client is
/// connected shows its new size on the client's next connection.
pub struct VolumeExport {
    node: Arc<Node>,
    volume: VolumeRef,
}

fn nbd_error(e: Error) -> ExportError {
    match e {
        Error::Invalid(m) | Error::NotFound(m) | Error::Exists(m) => ExportError::invalid(m),
        Error::NoSpace(m) => ExportError::no_space(m),
        Error::Corrupted(m) | Error::Io(m) => ExportError::io(m),
        Error::Closed(m) => ExportError::shutdown(m),
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.volume.volume.size_bytes
    }

    fn preferred_block_size(&self) -> u32 {
        self.volume.volume.page_size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.node.read_bytes(&self.volume, offset, buf).map_err(nbd_error)
    }

    /// Writes are durable when they return, so FUA asks for nothing more.
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.node.write_bytes(&self.volume, offset, data).map_err(nbd_error)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.node.flush(Some(&self.volume)).map_err(nbd_error)
    }

    /// Whole pages are dropped; the pieces of pages at either end are zeroed, so a trimmed range
    /// always reads as zeros.
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.node.zero_bytes(&self.volume, offset, len).map_err(nbd_error)
    }

    /// Whole pages are dropped even when the client asks for no hole: a dropped page reads as
    /// zeros and the node never fails a later write of it for lack of a reservation it could
    /// have had.
    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool, _fua: bool) -> Result<(), ExportError> {
        self.node.zero_bytes(&self.volume, offset, len).map_err(nbd_error)
    }
}
