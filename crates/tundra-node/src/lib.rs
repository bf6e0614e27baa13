//! The Tundra node (seed 000 §3.2): one machine's volumes on the page store, for the native page
//! protocol, NBD and the command line.
//!
//! A node owns a data directory holding two files: the emulated compressing drive's media
//! (`drive.img`), where the page store keeps compressed pages, and the fast device (`fast.img`),
//! cut into three slices: the store's journal, and a second store, never compressed, for volumes
//! of mode none, the place for redo/WAL (seed 000 §3.3.1, Opt#1). `layout.toml` records the sizes
//! chosen when the directory was set up, so every later start finds the same geometry.
//!
//! Volumes are addressed in pages ([`Node::read_page`], [`Node::write_page`]) by cloud-native
//! engines, and in bytes ([`Node::read_bytes`], [`Node::write_bytes`]) by block-device clients:
//! an aligned whole page goes through Algorithm 1, an unaligned piece is merged into its page
//! and stored raw (the none mode of seed 000 §3.2.3), and compressed again later by a
//! background pass once it can be.
//!
//! Two settings choose the layers that compress, as seed 000 §5.3 (Figure 13) compares them:
//! `[compression] software` (Algorithm 1, one algorithm for every page, or none; decided in
//! [`Pages`] for every write path and the background pass) and `[drive] compression` (the drive
//! compresses its 4 KiB blocks or stores them as written). [`Node::configuration`] reports both.
//!
//! A page-protocol write is durable when it returns (the store's journal commits it). A
//! block-device write goes to the write-back cache (writeback.rs, on by default) and is durable
//! at the client's next flush or FUA, as on a disk with a volatile cache; `cache.write_back =
//! "0"` makes every block-device write durable on return.

mod admin;
pub mod config;
pub mod histogram;
mod layout;
pub mod metrics;
pub mod native;
pub mod nbd;
pub mod repair;
mod writeback;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tundra_codec::{Algorithm, DecompressCost, PageCodec, PageSize, Selector, calibration_pages};
use tundra_device::csd::{CsdConfig, CsdDevice};
use tundra_device::file::FileDevice;
use tundra_device::slice::SliceDevice;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice, Lba};
use tundra_store::ids::{Lsn, VolumeId};
use tundra_store::pages::{CheckReport, CpuLoad, Pages};
use tundra_store::store::{Store, TrimPolicy};
use tundra_store::volume::VolumeMode;

pub use admin::DeletedListener;
pub use config::{Config, DriveCompression};
use histogram::{Histogram, LatencySummary};
pub use layout::Layout;
pub use tundra_store::pages::SoftwareCompression;
use writeback::{Content, Snapshot, WriteBack};

/// What went wrong, in the classes the protocols report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    NoSpace(String),
    #[error("damaged data: {0}")]
    Corrupted(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("{0}")]
    Closed(String),
}

impl Error {
    /// The message without its class, for a protocol that sends the class as a status.
    pub fn message(&self) -> &str {
        match self {
            Error::Invalid(m)
            | Error::NotFound(m)
            | Error::Exists(m)
            | Error::NoSpace(m)
            | Error::Corrupted(m)
            | Error::Io(m)
            | Error::Closed(m) => m,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<tundra_store::Error> for Error {
    fn from(e: tundra_store::Error) -> Error {
        use tundra_store::ErrorKind as K;
        // The protocols name the class (INVALID, NO_SPACE ...): the message is the store's
        // words alone, with the device's reason where there is one, so nothing is said twice.
        let mut message = e.message().to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            // A device error restates the store's message with its own class: only what it
            // adds (the system's reason underneath) is kept.
            let text = c.to_string();
            if !text.contains(message.as_str()) {
                message = format!("{message}: {text}");
            }
            cause = c.source();
        }
        match e.kind() {
            K::Invalid => Error::Invalid(message),
            K::Full => Error::NoSpace(message),
            K::Corrupted => Error::Corrupted(message),
            K::Io => Error::Io(message),
            K::Closed => Error::Closed(message),
            _ => Error::Io(message),
        }
    }
}

impl From<tundra_device::Error> for Error {
    fn from(e: tundra_device::Error) -> Error {
        tundra_store::Error::from(e).into()
    }
}

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
    pages: Arc<Pages>,
    latency: Arc<VolumeLatency>,
    /// Cleared when the volume is deleted.
    live: Arc<AtomicBool>,
}

impl VolumeRef {
    pub fn page_size(&self) -> usize {
        self.volume.page_size as usize
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
    data_dir: PathBuf,
    layout: Layout,
    drive: Arc<CsdDevice>,
    fast_device: Arc<dyn BlockDevice>,
    data: Arc<Store>,
    fast: Arc<Store>,
    /// Page paths per (device, page size).
    paths: BTreeMap<(Device, u32), Arc<Pages>>,
    volumes: RwLock<BTreeMap<VolumeId, VolumeRef>>,
    /// Each volume's latency histograms and liveness flag, kept across table rebuilds.
    tracked: Mutex<BTreeMap<VolumeId, Tracked>>,
    deleted_listeners: Mutex<Vec<DeletedListener>>,
    /// Whether volumes may promise more than each device's space (`overcommit` in [drive] and
    /// [fast]).
    overcommit: Overcommit,
    /// The data directory's lock, held while the node runs.
    _lock: std::fs::File,
    /// The next LSN to give a write, above every LSN stored. Until volumes have redo streams the
    /// node numbers writes itself, in the order it stores them.
    version: AtomicU64,
    /// Volume create, resize and delete one at a time.
    admin: Mutex<()>,
    /// Block-device writes not yet flushed (writeback.rs).
    writeback: WriteBack,
    writeback_enabled: bool,
    configuration: Configuration,
    pub started: Instant,
}

/// A volume's latency histograms and liveness flag.
type Tracked = (Arc<VolumeLatency>, Arc<AtomicBool>);

#[derive(Clone, Copy, Debug)]
struct Overcommit {
    drive: bool,
    fast: bool,
}

/// Which layers compress: the node's configuration as `tundra stats` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Configuration {
    /// `[compression] software`: "auto", "lz4", "zstd" or "off".
    pub software_compression: &'static str,
    /// `[drive] compression`: "on" or "off".
    pub drive_compression: &'static str,
}

/// Pages a flush writes to the store at once: their journal records share group commits.
const FLUSH_WORKERS: usize = 4;
/// Pages of one chunk a flush stores with one journal commit.
const FLUSH_BATCH_PAGES: usize = 64;

const PAGE_SIZES: [PageSize; 2] = [PageSize::Kib8, PageSize::Kib16];

impl Node {
    /// Opens the node on `config.data_dir`, setting the directory up on first use. `progress`
    /// hears what is happening (sizes chosen, recovery, damage recovered from). Damage in a
    /// store's journal that would lose acknowledged writes is a `Corrupted` error naming it.
    pub fn open(config: &Config, progress: &mut dyn FnMut(&str)) -> Result<Node> {
        Node::open_with(config, progress, false)
    }

    /// [`Node::open`]; with `accept_loss` (`tundra repair --accept-loss`), a damaged journal
    /// log is truncated at the damage instead, and [`Node::recovery`] says what was dropped.
    pub fn open_with(config: &Config, progress: &mut dyn FnMut(&str), accept_loss: bool) -> Result<Node> {
        config.validate()?;
        let dir = config.data_dir.clone();
        let (layout, fresh, lock) = layout::open_or_create(&dir, config, progress)?;
        let drive_media = FileDevice::open(dir.join(layout::DRIVE_FILE))?;
        let csd_config = CsdConfig { compression: config.drive.compression.mode(), ..CsdConfig::default() };
        let drive = Arc::new(if fresh {
            CsdDevice::format(Arc::new(drive_media), &layout.drive_format(), csd_config)?
        } else {
            CsdDevice::open(Arc::new(drive_media), csd_config)?
        });
        for note in drive.recovery_notes() {
            progress(&format!("the emulated drive in {}: {note}", layout::DRIVE_FILE));
        }
        let fast_device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(dir.join(layout::FAST_FILE))?);
        let slices = layout.fast_slices();
        let data_journal: Arc<dyn BlockDevice> =
            Arc::new(SliceDevice::new(fast_device.clone(), Lba(slices.data_journal.0), slices.data_journal.1)?);
        let fast_journal: Arc<dyn BlockDevice> =
            Arc::new(SliceDevice::new(fast_device.clone(), Lba(slices.fast_journal.0), slices.fast_journal.1)?);
        let fast_data: Arc<dyn BlockDevice> =
            Arc::new(SliceDevice::new(fast_device.clone(), Lba(slices.fast_data.0), slices.fast_data.1)?);
        if fresh {
            tundra_store::journal::Journal::format(data_journal.as_ref(), layout.data_journal_geometry())?;
            tundra_store::journal::Journal::format(fast_journal.as_ref(), layout.fast_journal_geometry())?;
            layout::commit(&dir, &layout)?;
        }
        progress("recovering the page store");
        let [data_place, fast_place] = repair::journal_places(&slices);
        let data = Arc::new(repair::open_store(drive.clone(), data_journal, data_place, accept_loss, progress)?);
        // The fast device does not compress: a trim there only gives space back to the
        // filesystem holding fast.img, at a cost per rewritten page, so freed blocks are
        // reused untrimmed (trimmed at open, at a check and when a volume is deleted).
        let fast = repair::open_store(fast_data, fast_journal, fast_place, accept_loss, progress)?;
        let fast = Arc::new(fast.with_trim_policy(TrimPolicy::Deferred));

        let codec = PageCodec::default();
        let mut paths = BTreeMap::new();
        for page_size in PAGE_SIZES {
            let samples = calibration_pages(page_size);
            let refs: Vec<&[u8]> = samples.iter().map(|p| p.as_slice()).collect();
            let cost = DecompressCost::calibrate(&codec, &refs).map_err(|e| Error::Io(e.to_string()))?;
            for (device, store) in [(Device::Drive, &data), (Device::Fast, &fast)] {
                let selector = Selector::new(config.compression.selector(), codec, cost)
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                let cpu = match tundra_codec::CpuSampler::new() {
                    Ok(sampler) => CpuLoad::Sampled(Mutex::new(sampler)),
                    Err(_) => CpuLoad::Fixed(0.0),
                };
                let pages = Pages::new(store.clone(), page_size, selector, codec, cpu)?
                    .with_software_compression(config.compression.software);
                pages.set_cache_pages(config.cache.pages);
                paths.insert((device, page_size.bytes() as u32), Arc::new(pages));
            }
        }
        let write_back_bytes = config.cache.write_back_bytes()?;
        let max_version = data.entries().iter().chain(fast.entries().iter()).map(|(_, _, e)| e.lsn.0).max();
        let node = Node {
            data_dir: dir,
            layout,
            drive,
            fast_device,
            data,
            fast,
            paths,
            volumes: RwLock::new(BTreeMap::new()),
            tracked: Mutex::new(BTreeMap::new()),
            deleted_listeners: Mutex::new(Vec::new()),
            overcommit: Overcommit { drive: config.drive.overcommit, fast: config.fast.overcommit },
            _lock: lock,
            version: AtomicU64::new(max_version.unwrap_or(0) + 1),
            admin: Mutex::new(()),
            writeback: WriteBack::new(write_back_bytes),
            writeback_enabled: write_back_bytes > 0,
            configuration: Configuration {
                software_compression: config.compression.software.name(),
                drive_compression: config.drive.compression.name(),
            },
            started: Instant::now(),
        };
        node.refresh_volumes();
        Ok(node)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Which layers compress, as configured at start.
    pub fn configuration(&self) -> Configuration {
        self.configuration
    }

    fn store(&self, device: Device) -> &Arc<Store> {
        match device {
            Device::Drive => &self.data,
            Device::Fast => &self.fast,
        }
    }

    /// Reads page `index` of a volume into `out` (exactly one page; zeros if never written).
    /// A page written by a block-device client and not yet flushed is read from the write-back
    /// cache.
    pub fn read_page(&self, volume: &VolumeRef, index: u64, out: &mut [u8]) -> Result<()> {
        volume.check_live()?;
        check_len(volume, out.len())?;
        self.read_within(volume, index, 0, out)
    }

    /// Reads `out.len()` bytes from byte `within` of page `index`: only those bytes are copied,
    /// from the write-back cache or from the page cache's copy.
    fn read_within(&self, volume: &VolumeRef, index: u64, within: usize, out: &mut [u8]) -> Result<()> {
        let started = Instant::now();
        let (chunk, page) = volume.volume.locate(index)?;
        let range = within..within + out.len();
        match self.writeback.get((volume.volume.id, index)) {
            Some(Content::Page(content)) => out.copy_from_slice(&content[range]),
            Some(Content::Trimmed) => out.fill(0),
            None => match volume.pages.read_page_shared(chunk, page)? {
                Some(content) => out.copy_from_slice(&content[range]),
                None => out.fill(0),
            },
        }
        volume.latency.page_read.observe(started.elapsed());
        Ok(())
    }

    /// Writes page `index` of a volume, durably (the page protocol: the engine chose the mode).
    pub fn write_page(&self, volume: &VolumeRef, index: u64, mode: WriteMode, content: &[u8]) -> Result<()> {
        let started = Instant::now();
        check_len(volume, content.len())?;
        volume.volume.locate(index)?;
        let _no_flush = self.writeback.direct();
        // An older cached version must never overwrite this one later.
        let mut shard = self.writeback.lock((volume.volume.id, index));
        volume.check_live()?;
        shard.remove();
        self.store_page(volume, index, mode, content)?;
        drop(shard);
        volume.latency.page_write.observe(started.elapsed());
        Ok(())
    }

    /// The LSN for the next write the node stores.
    fn next_lsn(&self) -> Lsn {
        Lsn(self.version.fetch_add(1, Ordering::Relaxed))
    }

    /// Compresses and stores one page: durable when it returns.
    fn store_page(&self, volume: &VolumeRef, index: u64, mode: WriteMode, content: &[u8]) -> Result<()> {
        let (chunk, page) = volume.volume.locate(index)?;
        let lsn = self.next_lsn();
        let mode = if volume.volume.mode == VolumeMode::None { WriteMode::None } else { mode };
        match mode {
            WriteMode::Auto { update_fraction } => {
                volume.pages.write_page(chunk, page, content, lsn, update_fraction)?;
            }
            WriteMode::Lz4 => volume.pages.write_page_with(chunk, page, content, lsn, Some(Algorithm::Lz4))?,
            WriteMode::Zstd => volume.pages.write_page_with(chunk, page, content, lsn, Some(Algorithm::Zstd))?,
            WriteMode::None => volume.pages.write_page_with(chunk, page, content, lsn, None)?,
        }
        Ok(())
    }

    /// Removes `count` pages from `first`: they read as zeros and their blocks are freed.
    pub fn trim_pages(&self, volume: &VolumeRef, first: u64, count: u64) -> Result<()> {
        volume.check_live()?;
        check_range(volume, first, count)?;
        let _no_flush = self.writeback.direct();
        for index in first..first + count {
            let (chunk, page) = volume.volume.locate(index)?;
            let mut shard = self.writeback.lock((volume.volume.id, index));
            shard.remove();
            volume.pages.trim_page(chunk, page)?;
        }
        Ok(())
    }

    /// Heavy compression of `count` pages from `first` (seed 000 §3.2.3), chunk by chunk.
    pub fn heavy_compress(
        &self,
        volume: &VolumeRef,
        first: u64,
        count: u64,
    ) -> Result<tundra_store::pages::HeavyReport> {
        volume.check_live()?;
        check_range(volume, first, count)?;
        if volume.volume.mode == VolumeMode::None {
            return Err(Error::Invalid(format!("volume {:?} is never compressed", volume.volume.name)));
        }
        // The range is archived as the store holds it: cached writes go there first. Writes
        // that arrive later stay cached and replace the archived pages when flushed.
        self.flush_dirty()?;
        let _no_flush = self.writeback.direct();
        let mut total = tundra_store::pages::HeavyReport::default();
        let per_chunk = volume.volume.pages_per_chunk();
        let mut index = first;
        while index < first + count {
            let (chunk, page) = volume.volume.locate(index)?;
            let n = (per_chunk - u64::from(page.0)).min(first + count - index);
            let report = volume.pages.heavy_compress(chunk, page, n as u32)?;
            total.pages += report.pages;
            total.segments += report.segments;
            total.bytes_before += report.bytes_before;
            total.bytes_after += report.bytes_after;
            index += n;
        }
        Ok(total)
    }

    /// Makes acknowledged writes durable: those of `volume` (an NBD FLUSH covers its own
    /// export), or of every volume. Their dirty pages are written to the store (compressed,
    /// journalled). A flush of the uncompressed redo volume therefore never waits for data
    /// pages to be compressed: redo writes bypass the compression path (seed 000 §3.3.1).
    ///
    /// The store's writes are durable when they return (their journal commit flushes the data
    /// device, then the journal), and a volume's writes that are not in the write-back cache
    /// went to the store: so once the volume's cached pages are stored there is nothing of it
    /// left to flush on the devices, and a flush of a volume with nothing cached does no I/O.
    /// A flush of every volume (`None`) flushes both devices as well.
    pub fn flush(&self, volume: Option<&VolumeRef>) -> Result<()> {
        let started = Instant::now();
        match volume {
            Some(volume) => {
                volume.check_live()?;
                self.flush_dirty_of(Some(volume.volume.id))?;
                volume.latency.flush.observe(started.elapsed());
            }
            None => {
                self.flush_dirty()?;
                self.drive.flush()?;
                self.fast_device.flush()?;
            }
        }
        Ok(())
    }

    /// Writes every page that was dirty when it was called to the store.
    fn flush_dirty(&self) -> Result<()> {
        self.flush_dirty_of(None)
    }

    /// Writes the pages dirty when it was called (of one volume, or all) to the store, several
    /// at a time so that their journal records share group commits. One flush runs at a time.
    fn flush_dirty_of(&self, only: Option<VolumeId>) -> Result<()> {
        if self.writeback.is_empty() {
            return Ok(());
        }
        let _exclusive = self.writeback.flushing();
        let dirty = self.writeback.snapshot(only);
        if dirty.is_empty() {
            return Ok(());
        }
        // Batches of pages of one chunk, each stored with one journal commit; trims alone. The
        // snapshot is in volume order: each volume is looked up once.
        let mut batches: Vec<std::ops::Range<usize>> = Vec::new();
        let mut volume: Option<(VolumeId, Option<VolumeRef>)> = None;
        let mut chunk_of = |d: &Snapshot| {
            if volume.as_ref().is_none_or(|(id, _)| *id != d.key.0) {
                volume = Some((d.key.0, self.volume(d.key.0).ok()));
            }
            match (&d.content, volume.as_ref().and_then(|(_, v)| v.as_ref())) {
                (Content::Page(_), Some(v)) => v.volume.locate(d.key.1).ok().map(|(chunk, _)| chunk),
                _ => None,
            }
        };
        let mut start = 0;
        let mut start_chunk = chunk_of(&dirty[0]);
        for i in 1..=dirty.len() {
            let chunk = if i < dirty.len() { chunk_of(&dirty[i]) } else { None };
            if i == dirty.len() || chunk.is_none() || chunk != start_chunk || i - start >= FLUSH_BATCH_PAGES {
                batches.push(start..i);
                start = i;
                start_chunk = chunk;
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= batches.len() || failure.lock().is_some() {
                    break;
                }
                let batch = &dirty[batches[i].clone()];
                match self.flush_batch(batch) {
                    Ok(()) => batch.iter().for_each(|d| self.writeback.flushed(d)),
                    Err(error) => {
                        failure.lock().get_or_insert(error);
                        break;
                    }
                }
            }
        };
        // The calling thread is one of the writers: a flush of one batch (a redo volume's
        // commit) starts no thread.
        std::thread::scope(|scope| {
            for _ in 1..FLUSH_WORKERS.min(batches.len()) {
                scope.spawn(work);
            }
            work();
        });
        match failure.into_inner() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Stores one batch of a flush: pages of one chunk together, or one trim.
    fn flush_batch(&self, batch: &[Snapshot]) -> Result<()> {
        let (volume_id, first) = batch[0].key;
        // A volume deleted since has nothing left to write.
        let Ok(volume) = self.volume(volume_id) else { return Ok(()) };
        if let [Snapshot { content: Content::Trimmed, .. }] = batch {
            let (chunk, page) = volume.volume.locate(first)?;
            return Ok(volume.pages.trim_page(chunk, page)?);
        }
        let (chunk, _) = volume.volume.locate(first)?;
        let mut items = Vec::with_capacity(batch.len());
        for d in batch {
            let Content::Page(content) = &d.content else { unreachable!("trims are flushed alone") };
            let (_, page) = volume.volume.locate(d.key.1)?;
            let WriteMode::Auto { update_fraction } = self.block_write_mode(&volume, d.key.1) else {
                unreachable!("block writes use Algorithm 1")
            };
            items.push((page, content.as_slice(), self.next_lsn(), update_fraction));
        }
        Ok(volume.pages.write_pages(chunk, &items)?)
    }

    /// Reads `buf.len()` bytes at byte `offset` of a volume.
    pub fn read_bytes(&self, volume: &VolumeRef, offset: u64, buf: &mut [u8]) -> Result<()> {
        volume.check_live()?;
        check_bytes(volume, offset, buf.len() as u64)?;
        let page_size = volume.page_size();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let index = at / page_size as u64;
            let within = (at % page_size as u64) as usize;
            let n = (page_size - within).min(buf.len() - done);
            self.read_within(volume, index, within, &mut buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at byte `offset` (a block-device client): into the write-back cache, whole
    /// pages as they are and pieces merged into their page; durable at the next flush. With
    /// the cache off, whole aligned pages go through Algorithm 1 at once and pieces are merged
    /// into their stored page and stored raw (the none mode).
    pub fn write_bytes(&self, volume: &VolumeRef, offset: u64, data: &[u8]) -> Result<()> {
        volume.check_live()?;
        check_bytes(volume, offset, data.len() as u64)?;
        let page_size = volume.page_size();
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let index = at / page_size as u64;
            let within = (at % page_size as u64) as usize;
            let n = (page_size - within).min(data.len() - done);
            let piece = &data[done..done + n];
            let started = Instant::now();
            if self.writeback_enabled {
                let (chunk, page) = volume.volume.locate(index)?;
                let mut shard = self.writeback.lock((volume.volume.id, index));
                // Checked again under the page's lock: a deleted volume's cached writes are
                // dropped under the same locks, so none is cached after the drop.
                volume.check_live()?;
                if n == page_size {
                    shard.put(Content::Page(Arc::new(piece.to_vec())));
                } else if let Some(cached) = shard.page_mut() {
                    cached[within..within + n].copy_from_slice(piece);
                } else {
                    // The page's current content, under the shard's lock so that no other
                    // writer of this page slips in between the read and the merge.
                    let mut content = match shard.get() {
                        Some(Content::Trimmed) => None,
                        _ => volume.pages.read_page(chunk, page)?,
                    }
                    .unwrap_or_else(|| vec![0u8; page_size]);
                    content[within..within + n].copy_from_slice(piece);
                    shard.put(Content::Page(Arc::new(content)));
                }
            } else if within == 0 && n == page_size {
                let _no_flush = self.writeback.direct();
                self.store_page(volume, index, self.block_write_mode(volume, index), piece)?;
            } else {
                let (chunk, page) = volume.volume.locate(index)?;
                volume.pages.write_partial(chunk, page, within, piece, self.next_lsn())?;
            }
            volume.latency.page_write.observe(started.elapsed());
            done += n;
        }
        if self.writeback.over_limit() {
            self.flush_dirty()?;
        }
        Ok(())
    }

    /// Algorithm 1 for a block-device write, which carries no redo volume to estimate how much
    /// of the page changed: the comparison is made again on one rewrite in four (chosen by a
    /// hash of page and version, so pages do not move in step), and otherwise the page keeps
    /// its algorithm, so most rewrites compress once.
    fn block_write_mode(&self, volume: &VolumeRef, index: u64) -> WriteMode {
        let version = self.version.load(Ordering::Relaxed);
        let mix =
            (index ^ (u64::from(volume.volume.id.0) << 40)).wrapping_add(version).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        WriteMode::Auto { update_fraction: if mix >> 62 == 0 { None } else { Some(0.0) } }
    }

    /// Zeroes `len` bytes at `offset`: whole pages are trimmed (they read as zeros and free
    /// their blocks), pieces of pages written as zeros.
    pub fn zero_bytes(&self, volume: &VolumeRef, offset: u64, len: u64) -> Result<()> {
        volume.check_live()?;
        check_bytes(volume, offset, len)?;
        let page_size = volume.page_size() as u64;
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let index = at / page_size;
            let within = at % page_size;
            let n = (page_size - within).min(end - at);
            if within == 0 && n == page_size {
                // A run of whole pages.
                let pages = (end - at) / page_size;
                if self.writeback_enabled {
                    for i in index..index + pages {
                        let mut shard = self.writeback.lock((volume.volume.id, i));
                        volume.check_live()?;
                        shard.put(Content::Trimmed);
                    }
                } else {
                    self.trim_pages(volume, index, pages)?;
                }
                at += pages * page_size;
            } else {
                self.write_bytes(volume, at, &vec![0u8; n as usize])?;
                at += n;
            }
        }
        if self.writeback.over_limit() {
            self.flush_dirty()?;
        }
        Ok(())
    }

    /// Background work, called about once a second: writes the write-back cache to the store
    /// (so unflushed writes are at most about a second old), checkpoints when the journal is
    /// half full, compresses pages partial writes left raw (as the software setting says:
    /// never when it is off).
    pub fn background(&self) -> Result<()> {
        self.flush_dirty()?;
        self.data.maybe_checkpoint()?;
        self.fast.maybe_checkpoint()?;
        for pages in self.paths.values() {
            pages.recompress_partial()?;
        }
        Ok(())
    }

    /// Checks the whole node (what `tundra fsck` runs, offline): every page of both stores read
    /// and verified, every block referenced once, no leaked blocks.
    pub fn check(&self) -> Result<Vec<(Device, CheckReport)>> {
        let mut reports = Vec::new();
        for device in [Device::Drive, Device::Fast] {
            // Each page size's path reads its own volumes' pages; both count every block.
            let mut merged = CheckReport::default();
            for page_size in PAGE_SIZES {
                let report = self.paths[&(device, page_size.bytes() as u32)].check()?;
                merged.pages += report.pages;
                merged.referenced_bytes = report.referenced_bytes;
                merged.device_mapped_bytes = report.device_mapped_bytes;
                for line in report.damaged {
                    if !merged.damaged.contains(&line) {
                        merged.damaged.push(line);
                    }
                }
            }
            reports.push((device, merged));
        }
        Ok(reports)
    }

    /// What recovery found and dealt with in each store's journal when the node opened.
    pub fn recovery(&self) -> Vec<(Device, tundra_store::store::Recovery)> {
        let mut drive = self.data.recovery().clone();
        let notes = self.drive.recovery_notes().iter();
        drive.notes.extend(notes.map(|note| format!("the emulated drive in {}: {note}", layout::DRIVE_FILE)));
        vec![(Device::Drive, drive), (Device::Fast, self.fast.recovery().clone())]
    }

    /// Writes the write-back cache out and checkpoints both stores and the drive, so the next
    /// start recovers at once.
    pub fn close(&self) -> Result<()> {
        self.flush_dirty()?;
        self.data.checkpoint()?;
        self.fast.checkpoint()?;
        self.drive.checkpoint()?;
        self.fast_device.flush()?;
        Ok(())
    }

    /// Everything `tundra stats` shows.
    pub fn stats(&self) -> NodeStats {
        let drive = self.drive.stats();
        let mut volumes = Vec::new();
        let mut node = SpaceStats::default();
        for v in self.volumes() {
            let usage = self.store(v.device).volume_usage(v.volume.id);
            let logical = usage.pages * u64::from(v.volume.page_size);
            let space = SpaceStats {
                pages: usage.pages,
                logical_bytes: logical,
                software_bytes: usage.stored_bytes,
                compressed_bytes: usage.compressed_bytes,
                raw_pages: usage.raw_pages,
                lz4_pages: usage.lz4_pages,
                zstd_pages: usage.zstd_pages,
                heavy_pages: usage.heavy_pages,
            };
            if v.device == Device::Drive {
                node.add(&space);
            }
            volumes.push((v, space));
        }
        let drive_physical = drive.physical_used_bytes;
        let volumes = volumes
            .into_iter()
            .map(|(v, space)| {
                // The drive does not know volumes: its physical bytes are shared out in
                // proportion to the blocks each volume's pages take.
                let physical = match v.device {
                    Device::Drive if node.software_bytes > 0 => {
                        (drive_physical as u128 * space.software_bytes as u128 / node.software_bytes as u128) as u64
                    }
                    Device::Drive => 0,
                    Device::Fast => space.software_bytes,
                };
                VolumeStats {
                    id: v.volume.id.0,
                    name: v.volume.name.clone(),
                    size_bytes: v.volume.size_bytes,
                    page_size: v.volume.page_size,
                    mode: mode_name(v.volume.mode),
                    device: v.device,
                    software_ratio: ratio(space.logical_bytes, space.software_bytes),
                    physical_bytes_attributed: physical,
                    ratio: ratio(space.logical_bytes, physical),
                    space,
                    page_read: v.latency.page_read.summary(),
                    page_write: v.latency.page_write.summary(),
                    flush: v.latency.flush.summary(),
                }
            })
            .collect();
        let cache = self.paths.values().map(|p| p.cache_stats()).fold((0, 0), |(h, m), s| (h + s.hits, m + s.misses));
        let store = self.data.stats();
        NodeStats {
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            data_dir: self.data_dir.display().to_string(),
            configuration: self.configuration,
            software_ratio: ratio(node.logical_bytes, node.software_bytes),
            drive_ratio: ratio(drive.mapped_bytes, drive.physical_used_bytes),
            ratio: ratio(node.logical_bytes, drive.physical_used_bytes),
            compressed: node,
            drive: DriveStats {
                logical_capacity_bytes: drive.logical_capacity_bytes,
                physical_capacity_bytes: drive.physical_capacity_bytes,
                mapped_bytes: drive.mapped_bytes,
                physical_used_bytes: drive.physical_used_bytes,
                gc_write_amplification: drive.gc_write_amplification(),
                gc_moved_bytes: drive.counters.gc_moved_bytes,
                free_segments: drive.free_segments,
                segments: drive.segments,
            },
            fast_volume_bytes: self.layout.fast_volume_bytes,
            index_memory_bytes: store.index_memory_bytes + self.fast.stats().index_memory_bytes,
            index_bytes_per_page: if store.pages == 0 {
                0.0
            } else {
                store.index_memory_bytes as f64 / store.pages as f64
            },
            cache_hits: cache.0,
            cache_misses: cache.1,
            write_back_dirty_bytes: self.writeback.dirty_bytes(),
            volumes,
        }
    }
}

fn mode_name(mode: VolumeMode) -> &'static str {
    match mode {
        VolumeMode::Normal => "normal",
        VolumeMode::None => "none",
    }
}

fn ratio(logical: u64, physical: u64) -> f64 {
    if physical == 0 { 0.0 } else { logical as f64 / physical as f64 }
}

fn check_len(volume: &VolumeRef, len: usize) -> Result<()> {
    if len != volume.page_size() {
        return Err(Error::Invalid(format!(
            "a page of {len} bytes for volume {:?} of {}-byte pages",
            volume.volume.name, volume.volume.page_size
        )));
    }
    Ok(())
}

fn check_range(volume: &VolumeRef, first: u64, count: u64) -> Result<()> {
    match first.checked_add(count) {
        Some(end) if end <= volume.volume.page_count() => Ok(()),
        _ => Err(Error::Invalid(format!(
            "pages {first}..+{count} are outside volume {:?} ({} pages)",
            volume.volume.name,
            volume.volume.page_count()
        ))),
    }
}

fn check_bytes(volume: &VolumeRef, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= volume.volume.size_bytes => Ok(()),
        _ => Err(Error::Invalid(format!(
            "bytes {offset}..+{len} are outside volume {:?} ({} bytes)",
            volume.volume.name, volume.volume.size_bytes
        ))),
    }
}

/// Space of a set of pages, by layer.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SpaceStats {
    pub pages: u64,
    /// Pages times the page size.
    pub logical_bytes: u64,
    /// What the pages take after software compression, in 4 KiB blocks.
    pub software_bytes: u64,
    /// What they take at byte granularity.
    pub compressed_bytes: u64,
    pub raw_pages: u64,
    pub lz4_pages: u64,
    pub zstd_pages: u64,
    pub heavy_pages: u64,
}

impl SpaceStats {
    fn add(&mut self, o: &SpaceStats) {
        self.pages += o.pages;
        self.logical_bytes += o.logical_bytes;
        self.software_bytes += o.software_bytes;
        self.compressed_bytes += o.compressed_bytes;
        self.raw_pages += o.raw_pages;
        self.lz4_pages += o.lz4_pages;
        self.zstd_pages += o.zstd_pages;
        self.heavy_pages += o.heavy_pages;
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct DriveStats {
    pub logical_capacity_bytes: u64,
    pub physical_capacity_bytes: u64,
    pub mapped_bytes: u64,
    pub physical_used_bytes: u64,
    pub gc_write_amplification: f64,
    pub gc_moved_bytes: u64,
    pub free_segments: u64,
    pub segments: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VolumeStats {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    pub mode: &'static str,
    pub device: Device,
    #[serde(flatten)]
    pub space: SpaceStats,
    pub software_ratio: f64,
    /// The drive's physical bytes shared out by software bytes (the drive does not know
    /// volumes); for the fast device, the software bytes.
    pub physical_bytes_attributed: u64,
    pub ratio: f64,
    pub page_read: LatencySummary,
    pub page_write: LatencySummary,
    pub flush: LatencySummary,
}

#[derive(Clone, Debug, Serialize)]
pub struct NodeStats {
    pub uptime_seconds: f64,
    pub data_dir: String,
    /// Which layers compress.
    pub configuration: Configuration,
    /// The compressed volumes' pages (mode none volumes excluded).
    pub compressed: SpaceStats,
    /// Logical over software bytes.
    pub software_ratio: f64,
    /// The drive's own ratio: mapped over physical bytes.
    pub drive_ratio: f64,
    /// Both layers: logical over physical bytes.
    pub ratio: f64,
    pub drive: DriveStats,
    /// The fast device's space for uncompressed volumes (mode none).
    pub fast_volume_bytes: u64,
    pub index_memory_bytes: u64,
    pub index_bytes_per_page: f64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Block-device writes acknowledged and held in the write-back cache until the next flush.
    pub write_back_dirty_bytes: u64,
    pub volumes: Vec<VolumeStats>,
}

/// Runs `node.background()` every `period` until `stop` is set; errors are reported to `log`.
pub fn background_loop(node: &Node, period: Duration, stop: &std::sync::atomic::AtomicBool, log: &dyn Fn(&str)) {
    while !stop.load(Ordering::Relaxed) {
        let mut waited = Duration::ZERO;
        while waited < period && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            waited += Duration::from_millis(50);
        }
        if let Err(e) = node.background() {
            log(&format!("background work failed: {e}"));
        }
    }
}

#[allow(dead_code)]
const _: () = assert!(BLOCK_SIZE_BYTES == 4096);
