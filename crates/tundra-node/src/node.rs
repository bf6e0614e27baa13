//! The node's state and the vocabulary of its entry points: [`Node`] itself (the two stores,
//! a page path per device and page size, the volume table, the write-back cache), the
//! [`VolumeRef`] every request is bound to, which [`Device`] a volume lives on and how a page
//! write asks to be compressed ([`WriteMode`]). The entry points themselves live beside it, one
//! concern per module: open.rs builds a node, pages_io.rs and bytes.rs serve I/O, flush.rs makes
//! writes durable, background.rs and check.rs look after the stores, stats.rs reports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tundra_codec::PageSize;
use tundra_device::BlockDevice;
use tundra_device::csd::CsdDevice;
use tundra_store::ids::{Lsn, VolumeId};
use tundra_store::pages::Pages;
use tundra_store::store::Store;

use crate::admin::DeletedListener;
use crate::histogram::Histogram;
use crate::layout::Layout;
use crate::writeback::WriteBack;

/// How a page write asks to be compressed. Under `[compression] software = "auto"` it gets
/// what it asks; any other setting decides for every page of a mode normal volume.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WriteMode {
    /// Algorithm 1. `update_fraction` is the caller's estimate of how much of the page changed
    /// since its last write (from its redo volume); None: unknown.
    Auto {
        update_fraction: Option<f64>,
    },
    Lz4,
    Zstd,
    /// Stored raw (the none mode).
    None,
}

/// Which device a volume lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The compressing drive (mode normal).
    Drive,
    /// The fast device, never compressed (mode none).
    Fast,
}

/// A volume and the page path that serves it, bound to the volume's identity: once the volume
/// is deleted, every request made with this reference fails (admin.rs).
#[derive(Clone)]
pub struct VolumeRef {
    pub volume: tundra_store::volume::Volume,
    pub device: Device,
    pub(crate) pages: Arc<Pages>,
    pub(crate) latency: Arc<VolumeLatency>,
    /// Cleared when the volume is deleted.
    pub(crate) live: Arc<AtomicBool>,
}

impl VolumeRef {
    pub fn page_size(&self) -> usize {
        self.volume.page_size as usize
    }

    /// The page path that serves the volume: a replicated volume's chunk groups apply their
    /// commands through it.
    pub fn pages(&self) -> &Arc<Pages> {
        &self.pages
    }
}

/// Latency histograms of one volume.
#[derive(Default)]
pub struct VolumeLatency {
    pub page_read: Histogram,
    pub page_write: Histogram,
    pub flush: Histogram,
}

/// The node.
pub struct Node {
    pub(crate) data_dir: PathBuf,
    pub(crate) layout: Layout,
    pub(crate) drive: Arc<CsdDevice>,
    pub(crate) fast_device: Arc<dyn BlockDevice>,
    pub(crate) data: Arc<Store>,
    pub(crate) fast: Arc<Store>,
    /// Page paths per (device, page size).
    pub(crate) paths: BTreeMap<(Device, u32), Arc<Pages>>,
    pub(crate) volumes: RwLock<BTreeMap<VolumeId, VolumeRef>>,
    /// Each volume's latency histograms and liveness flag, kept across table rebuilds.
    pub(crate) tracked: Mutex<BTreeMap<VolumeId, Tracked>>,
    pub(crate) deleted_listeners: Mutex<Vec<DeletedListener>>,
    /// Whether volumes may promise more than each device's space (`overcommit` in [drive] and
    /// [fast]).
    pub(crate) overcommit: Overcommit,
    /// The data directory's lock, held while the node runs; none for a node built on devices
    /// that no directory holds.
    pub(crate) _lock: Option<std::fs::File>,
    /// The next LSN to give a write, above every LSN stored. Until volumes have redo streams the
    /// node numbers writes itself, in the order it stores them.
    pub(crate) version: AtomicU64,
    /// Volume create, resize and delete one at a time.
    pub(crate) admin: Mutex<()>,
    /// Block-device writes not yet flushed (writeback.rs).
    pub(crate) writeback: WriteBack,
    pub(crate) writeback_enabled: bool,
    pub(crate) configuration: Configuration,
    /// When the node started, by its clock.
    pub started: std::time::Duration,
    /// The environment's clock: latencies and uptime are measured on it.
    pub clock: std::sync::Arc<dyn tundra_env::Clock>,
    /// Threads a flush of the write-back cache writes with (see `Environment::flush_writers`).
    pub flush_writers: usize,
    /// Volumes' redo streams on the fast device (redo/).
    pub(crate) redo: crate::redo::Redo,
    /// Pages the background pass compares again per call once the host is idle
    /// (`[compression] rechoose_pages_per_second`; the pass runs about once a second).
    pub(crate) rechoose_pages: usize,
    /// The CPU utilisation at or below which that pass runs.
    pub(crate) rechoose_idle_below: f64,
    /// Volumes mounted as files (mount.rs), by file, for the statistics.
    pub(crate) mounts: Mutex<BTreeMap<PathBuf, crate::mount::Registered>>,
    /// Tells the volumes that a cluster serves (replicated: written through their chunks' Raft
    /// groups, never through this node's store directly); none on a node alone.
    pub(crate) cluster_volumes: RwLock<Option<ClusterVolumes>>,
}

/// Answers whether a volume (by id) is one a cluster serves: see [`Node::set_cluster_volumes`].
pub type ClusterVolumes = Box<dyn Fn(VolumeId) -> bool + Send + Sync>;

/// A volume's latency histograms and liveness flag.
pub(crate) type Tracked = (Arc<VolumeLatency>, Arc<AtomicBool>);

#[derive(Clone, Copy, Debug)]
pub(crate) struct Overcommit {
    pub drive: bool,
    pub fast: bool,
}

/// Which layers compress: the node's configuration as `tundra stats` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Configuration {
    /// `[compression] software`: "auto", "lz4", "zstd" or "off".
    pub software_compression: &'static str,
    /// `[drive] compression`: "on" or "off".
    pub drive_compression: &'static str,
    /// Whether the drive compresses off the writer's path, on its own thread (`[drive]
    /// deferred`); false when it compresses inline or not at all.
    pub drive_deferred: bool,
}

/// The page sizes a volume may have: each has a page path on each device.
pub(crate) const PAGE_SIZES: [PageSize; 2] = [PageSize::Kib8, PageSize::Kib16];

impl Node {
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Whether volumes on the drive may promise more than its space (`overcommit` in [drive]).
    pub fn drive_overcommit(&self) -> bool {
        self.overcommit.drive
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Which layers compress, as configured at start.
    pub fn configuration(&self) -> Configuration {
        self.configuration
    }

    pub(crate) fn store(&self, device: Device) -> &Arc<Store> {
        match device {
            Device::Drive => &self.data,
            Device::Fast => &self.fast,
        }
    }

    /// The page path of the compressing drive for pages of `page_size` bytes, if the node has
    /// one (8 and 16 KiB).
    pub fn drive_pages(&self, page_size: u32) -> Option<Arc<Pages>> {
        self.paths.get(&(Device::Drive, page_size)).cloned()
    }

    /// The LSN for the next write the node stores.
    pub(crate) fn next_lsn(&self) -> Lsn {
        Lsn(self.version.fetch_add(1, Ordering::Relaxed))
    }
}
