//! Building a node. [`Node::open`] is the data directory's side: the layout, the directory's
//! lock, the files of the emulated drive and the fast device, formatted on first use.
//! [`Node::from_devices`] is everything after: both stores recovered from already-opened
//! devices, a page path per device and page size, the volume table. What would make two
//! starts on the same devices differ (decompression costs timed on this machine, the host's
//! CPU load, the clock, random numbers, how many threads a flush runs on) comes in as an
//! [`Environment`], so that a node can also be built over devices and inputs a test chooses:
//! [`Environment::simulated`] makes a node whose every byte on its devices is a function of a
//! seed and of what it is asked to do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Mutex, RwLock};
use tundra_codec::{CpuSampler, DecompressCost, PageCodec, PageSize, Selector, calibration_pages};
use tundra_device::csd::{CsdConfig, CsdDevice};
use tundra_device::file::FileDevice;
use tundra_device::slice::SliceDevice;
use tundra_device::{BlockDevice, Lba};
use tundra_env::{CpuGauge, Env, FixedCpu, Rng, SystemClock};
use tundra_store::journal::Journal;
use tundra_store::pages::{CpuLoad, Pages};
use tundra_store::store::TrimPolicy;

use crate::config::Config;
use crate::layout::{self, Layout};
use crate::node::{Configuration, Device, Node, Overcommit, PAGE_SIZES};
use crate::writeback::WriteBack;
use crate::{Error, Result, repair};

/// The devices a node runs on, opened: the drive formatted or recovered, the fast device
/// holding the slices its [`Layout`] describes.
pub struct Devices {
    /// The emulated compressing drive: the compressed store's pages.
    pub drive: Arc<CsdDevice>,
    /// The fast device: both stores' journals and the uncompressed store's data.
    pub fast: Arc<dyn BlockDevice>,
}

/// The fast device's three slices, as the layout cuts it.
struct FastParts {
    data_journal: Arc<dyn BlockDevice>,
    fast_journal: Arc<dyn BlockDevice>,
    fast_data: Arc<dyn BlockDevice>,
}

impl Devices {
    fn fast_parts(&self, layout: &Layout) -> Result<FastParts> {
        let slices = layout.fast_slices();
        let slice = |(first, count): (u64, u64)| -> Result<Arc<dyn BlockDevice>> {
            Ok(Arc::new(SliceDevice::new(self.fast.clone(), Lba(first), count)?))
        };
        Ok(FastParts {
            data_journal: slice(slices.data_journal)?,
            fast_journal: slice(slices.fast_journal)?,
            fast_data: slice(slices.fast_data)?,
        })
    }

    /// Formats both stores' journals on a new fast device, as `layout` places them.
    pub fn format_journals(&self, layout: &Layout) -> Result<()> {
        let parts = self.fast_parts(layout)?;
        Journal::format(parts.data_journal.as_ref(), layout.data_journal_geometry())?;
        Journal::format(parts.fast_journal.as_ref(), layout.fast_journal_geometry())?;
        Ok(())
    }
}

/// The inputs besides devices and configuration that make two starts of a node differ.
#[derive(Clone)]
pub struct Environment {
    /// The decompression cost model Algorithm 1 weighs, one per page size (each names its
    /// own).
    pub decompress_costs: Vec<DecompressCost>,
    /// The clock (latencies, uptime), the random stream (heavy segment nonces) and the CPU load
    /// Algorithm 1 looks at.
    pub env: Env,
    /// Threads a flush of the write-back cache writes with at once. Several overlap their
    /// journal commits on a host; more than one makes the order of allocations, and so the
    /// placement of blocks, depend on thread scheduling.
    pub flush_writers: usize,
}

/// Threads a flush writes with on a host.
pub const HOST_FLUSH_WRITERS: usize = 4;

impl Environment {
    /// This machine's: the decompression costs timed here (tens of milliseconds per page
    /// size), the system clock, a random stream seeded from the clock, the host's CPU load
    /// (an idle host where /proc/stat cannot be read).
    pub fn host() -> Result<Environment> {
        let codec = PageCodec::default();
        let mut decompress_costs = Vec::new();
        for page_size in PAGE_SIZES {
            let samples = calibration_pages(page_size);
            let refs: Vec<&[u8]> = samples.iter().map(|p| p.as_slice()).collect();
            let cost = DecompressCost::calibrate(&codec, &refs).map_err(|e| Error::Io(e.to_string()))?;
            decompress_costs.push(cost);
        }
        let cpu: Arc<dyn CpuGauge> = match CpuSampler::new() {
            Ok(sampler) => Arc::new(sampler),
            Err(_) => Arc::new(FixedCpu(0.0)),
        };
        let clock = SystemClock::new();
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let env = Env::new(Arc::new(clock), Rng::new(seed ^ u64::from(std::process::id()).rotate_left(32)), cpu);
        Ok(Environment { decompress_costs, env, flush_writers: HOST_FLUSH_WRITERS })
    }

    /// A simulated environment: the nominal decompression costs
    /// ([`DecompressCost::nominal`]), a manual clock, randomness from `seed`, an idle CPU and
    /// one flush writer. A node built on it over memory devices (with the drive's background
    /// thread off) writes the same bytes for the same seed and the same requests.
    pub fn simulated(seed: u64) -> Environment {
        Environment {
            decompress_costs: PAGE_SIZES.iter().map(|&p| DecompressCost::nominal(p)).collect(),
            env: Env::simulated(seed),
            flush_writers: 1,
        }
    }

    /// This environment with another CPU load: a fixed busy fraction in [0, 1].
    pub fn with_fixed_cpu(mut self, busy_fraction: f64) -> Environment {
        self.env = Env::new(self.env.clock.clone(), self.env.fork_rng(), Arc::new(FixedCpu(busy_fraction)));
        self
    }

    fn decompress_cost(&self, page_size: PageSize) -> Result<DecompressCost> {
        self.decompress_costs.iter().find(|cost| cost.page_size == page_size).copied().ok_or_else(|| {
            Error::Invalid(format!("the environment has no decompression cost for {}-byte pages", page_size.bytes()))
        })
    }
}

impl Node {
    /// Opens the node on `config.data_dir`, setting the directory up on first use. `progress`
    /// hears what the open does (set-up, recovery). Damage in the log of a store's journal that
    /// would lose acknowledged writes is a `Corrupted` error naming it.
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
        let csd_config =
            CsdConfig { compression: config.drive.compression.mode(config.drive.deferred), ..CsdConfig::default() };
        let drive = Arc::new(if fresh {
            CsdDevice::format(Arc::new(drive_media), &layout.drive_format(), csd_config)?
        } else {
            CsdDevice::open(Arc::new(drive_media), csd_config)?
        });
        for note in drive.recovery_notes() {
            progress(&format!("the emulated drive in {}: {note}", layout::DRIVE_FILE));
        }
        let fast: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(dir.join(layout::FAST_FILE))?);
        let devices = Devices { drive, fast };
        if fresh {
            devices.format_journals(&layout)?;
            // Written last: a set-up cut short before this leaves no layout and is redone.
            layout::commit(&dir, &layout)?;
        }
        let environment = Environment::host()?;
        let mut node = Node::from_devices(config, layout, devices, &environment, accept_loss, progress)?;
        node._lock = Some(lock);
        Ok(node)
    }

    /// Builds a node on opened devices (the journals formatted, see [`Devices`]): recovers
    /// both stores, makes a page path per device and page size as `config` and `environment`
    /// say, and loads the volume table. `config` is taken as valid; its data directory only
    /// names the node in its statistics.
    pub fn from_devices(
        config: &Config,
        layout: Layout,
        devices: Devices,
        environment: &Environment,
        accept_loss: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Node> {
        let parts = devices.fast_parts(&layout)?;
        progress("recovering the page store");
        let [data_place, fast_place] = repair::journal_places(&layout.fast_slices());
        // The store owns the drive's blocks before the redo streams' log slots.
        let store_drive: Arc<dyn BlockDevice> = if layout.redo_slot_blocks > 0 {
            Arc::new(SliceDevice::new(devices.drive.clone(), Lba(0), layout.store_drive_blocks())?)
        } else {
            devices.drive.clone()
        };
        let data = repair::open_store(store_drive, parts.data_journal, data_place, accept_loss, progress)?;
        let data = Arc::new(data);
        // The fast device does not compress: a trim there only gives space back to the
        // filesystem holding fast.img, at a cost per rewritten page, so freed blocks are
        // reused untrimmed (trimmed at open, at a check and when a volume is deleted).
        let fast = repair::open_store(parts.fast_data, parts.fast_journal, fast_place, accept_loss, progress)?;
        // Its volumes take a database's WAL: a small commit's image goes to its run off the
        // committing thread (the background loop writes them every 50 ms), so the commit makes
        // one device write, the log's (bench/results/2026-11-30-unwritten-images).
        let fast = Arc::new(fast.with_trim_policy(TrimPolicy::Deferred).with_write_behind(true));

        let codec = PageCodec::default();
        let mut paths = BTreeMap::new();
        for page_size in PAGE_SIZES {
            let cost = environment.decompress_cost(page_size)?;
            for (device, store) in [(Device::Drive, &data), (Device::Fast, &fast)] {
                let selector = Selector::new(config.compression.selector(), codec, cost)
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                let cpu = CpuLoad::Gauge(environment.env.cpu.clone());
                let pages = Pages::new(store.clone(), page_size, selector, codec, cpu)?
                    .with_software_compression(config.compression.software)
                    .with_nonce_seed(environment.env.next_u64());
                pages.set_cache_pages(config.cache.pages);
                paths.insert((device, page_size.bytes() as u32), Arc::new(pages));
            }
        }
        let write_back_bytes = config.cache.write_back_bytes()?;
        let redo_options = crate::redo::RedoOptions::of(config)?;
        let drive_deferred = devices.drive.config().compression == tundra_device::csd::CompressionMode::Deferred;
        let max_version = data.entries().iter().chain(fast.entries().iter()).map(|(_, _, e)| e.lsn.0).max();
        let mut node = Node {
            data_dir: config.data_dir.clone(),
            layout,
            drive: devices.drive,
            fast_device: devices.fast,
            data,
            fast,
            paths,
            volumes: RwLock::new(BTreeMap::new()),
            tracked: Mutex::new(BTreeMap::new()),
            deleted_listeners: Mutex::new(Vec::new()),
            overcommit: Overcommit { drive: config.drive.overcommit, fast: config.fast.overcommit },
            _lock: None,
            version: AtomicU64::new(max_version.unwrap_or(0) + 1),
            admin: Mutex::new(()),
            writeback: WriteBack::new(write_back_bytes),
            writeback_enabled: write_back_bytes > 0,
            configuration: Configuration {
                software_compression: config.compression.software.name(),
                drive_compression: config.drive.compression.name(),
                drive_deferred,
            },
            started: environment.env.clock.now(),
            clock: environment.env.clock.clone(),
            flush_writers: environment.flush_writers.max(1),
            redo: crate::redo::Redo::empty(&environment.env, redo_options),
            mounts: Mutex::new(BTreeMap::new()),
            cluster_volumes: parking_lot::RwLock::new(None),
            rechoose_pages: config.compression.rechoose_pages_per_second,
            rechoose_idle_below: config
                .compression
                .rechoose_idle_threshold
                .unwrap_or(config.compression.cpu_busy_threshold),
        };
        node.refresh_volumes();
        let volumes = node.volumes.read().clone();
        let drive: Arc<dyn BlockDevice> = node.drive.clone();
        node.redo = crate::redo::Redo::open(
            &node.layout,
            &node.fast_device,
            drive,
            &environment.env,
            redo_options,
            &volumes,
            progress,
        )?;
        Ok(node)
    }
}
