//! What the server serves: the [`Export`] trait (one block device), the [`Exports`] trait (the
//! named set a client chooses from) and [`ExportMap`], a plain map implementing it.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::ExportError;

/// One exported block device (a volume). Offsets and lengths are bytes.
///
/// The server validates every request before it reaches the export: the range lies inside the
/// size the client was given at negotiation, the length is not zero, and reads, writes and
/// write-zeroes are at most [`MAX_REQUEST_BYTES`](crate::MAX_REQUEST_BYTES). Offsets need not be
/// aligned. Several connections call one export at once, so a flush must cover the writes of
/// every connection (the server advertises `NBD_FLAG_CAN_MULTI_CONN`).
pub trait Export: Send + Sync {
    /// Size in bytes, read when a client selects the export.
    fn size(&self) -> u64;

    /// Preferred I/O size advertised in `NBD_INFO_BLOCK_SIZE` (the volume's page size, 8192 or
    /// 16384). The server rounds it to a power of two between 512 and 32 MiB. The minimum block
    /// size advertised is 1 (unaligned I/O is accepted), the maximum 32 MiB.
    fn preferred_block_size(&self) -> u32;

    /// Fills all of `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;

    /// Writes `data` at `offset`; with `fua`, durably before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;

    /// Makes every write completed before the call durable.
    fn flush(&self) -> Result<(), ExportError>;

    /// The client no longer needs the range; its contents are unspecified until written again.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError>;

    /// The range must read as zeros. `may_trim`: the client allows the range to be deallocated
    /// (`NBD_CMD_FLAG_NO_HOLE` absent).
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> Result<(), ExportError>;
}

/// The set of exports the server offers, looked up per connection by name.
pub trait Exports: Send + Sync {
    /// The export called `name` (never the empty name: the server resolves that through
    /// [`default_name`](Exports::default_name) first).
    fn lookup(&self, name: &str) -> Option<Arc<dyn Export>>;

    /// Names and descriptions, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<(String, String)>;

    /// The export a client gets when it asks for the empty name, if any.
    fn default_name(&self) -> Option<String>;
}

/// Exports held in a map that may change while the server runs: an export added is offered to
/// the next client that asks, one removed stays served to the connections already using it.
#[derive(Default)]
pub struct ExportMap {
    inner: RwLock<MapInner>,
}

#[derive(Default)]
struct MapInner {
    exports: BTreeMap<String, (String, Arc<dyn Export>)>,
    default_name: Option<String>,
}

impl ExportMap {
    pub fn new() -> ExportMap {
        ExportMap::default()
    }

    /// Adds or replaces the export `name`. Names are strings of at most 4096 bytes.
    pub fn insert(&self, name: impl Into<String>, description: impl Into<String>, export: Arc<dyn Export>) {
        let name = name.into();
        assert!(!name.is_empty(), "the empty name is the default export: use set_default");
        assert!(name.len() <= crate::proto::MAX_STRING_LEN, "export name longer than 4096 bytes");
        self.inner.write().exports.insert(name, (description.into(), export));
    }

    /// Removes the export `name`; returns whether it was there.
    pub fn remove(&self, name: &str) -> bool {
        let mut inner = self.inner.write();
        if inner.default_name.as_deref() == Some(name) {
            inner.default_name = None;
        }
        inner.exports.remove(name).is_some()
    }

    /// Makes `name` the default export (the one the empty name selects), or clears it.
    pub fn set_default(&self, name: Option<&str>) {
        self.inner.write().default_name = name.map(str::to_owned);
    }
}

impl Exports for ExportMap {
    fn lookup(&self, name: &str) -> Option<Arc<dyn Export>> {
        self.inner.read().exports.get(name).map(|(_, export)| Arc::clone(export))
    }

    fn list(&self) -> Vec<(String, String)> {
        let inner = self.inner.read();
        inner.exports.iter().map(|(name, (description, _))| (name.clone(), description.clone())).collect()
    }

    fn default_name(&self) -> Option<String> {
        self.inner.read().default_name.clone()
    }
}
