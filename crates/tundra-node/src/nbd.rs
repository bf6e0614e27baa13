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
        Error::Corrupted(m) | Error::Io(m) | Error::Busy(m) => ExportError::io(m),
        Error::Closed(m) => ExportError::shutdown(m),
    }
}

impl VolumeExport {
    /// Reports a failure the operator must see (damaged data, a failing device) on the node's
    /// log, then turns it into the client's errno.
    fn fail(&self, what: &str, offset: u64, len: u64, e: Error) -> ExportError {
        if matches!(e, Error::Corrupted(_) | Error::Io(_)) {
            eprintln!("tundra: NBD {what} of volume {:?} at {offset}+{len} failed: {e}", self.volume.volume.name);
        }
        nbd_error(e)
    }

    /// FUA: the write is durable before it is acknowledged.
    fn fua(&self, fua: bool, what: &str, offset: u64, len: u64) -> Result<(), ExportError> {
        if fua { self.node.flush(Some(&self.volume)).map_err(|e| self.fail(what, offset, len, e)) } else { Ok(()) }
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
        self.node.read_bytes(&self.volume, offset, buf).map_err(|e| self.fail("read", offset, buf.len() as u64, e))
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        let len = data.len() as u64;
        self.node.write_bytes(&self.volume, offset, data).map_err(|e| self.fail("write", offset, len, e))?;
        self.fua(fua, "write", offset, len)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.node.flush(Some(&self.volume)).map_err(|e| self.fail("flush", 0, 0, e))
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.node.zero_bytes(&self.volume, offset, len).map_err(|e| self.fail("trim", offset, len, e))?;
        self.fua(fua, "trim", offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _may_trim: bool, fua: bool) -> Result<(), ExportError> {
        self.node.zero_bytes(&self.volume, offset, len).map_err(|e| self.fail("write-zeroes", offset, len, e))?;
        self.fua(fua, "write-zeroes", offset, len)
    }
}
