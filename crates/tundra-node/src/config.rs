//! The node's configuration: a TOML file, every key optional. `tundra serve` with no file runs
//! the embedded default: everything in `./tundra-data`, sizes chosen from the free disk there,
//! listening on 127.0.0.1 only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tundra_codec::{DRIVE_TIE_BYTES_PER_US, SelectorConfig};
use tundra_device::csd::CompressionMode;
use tundra_device::size::{format_size, parse_size};
use tundra_store::pages::SoftwareCompression;

use crate::{Error, Result};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the drive image, the fast device image and the node's layout file live.
    pub data_dir: PathBuf,
    pub listen: Listen,
    pub drive: DriveConfig,
    pub fast: FastConfig,
    pub compression: CompressionConfig,
    pub cache: CacheConfig,
    pub redo: RedoConfig,
    pub limits: LimitsConfig,
    /// Volumes served as files through FUSE in the node's process (`[[mount]]`, mount.rs).
    pub mount: Vec<MountConfig>,
    /// Membership of a cluster (docs/cli.md, "Clusters"); absent, the node stands alone.
    pub cluster: Option<ClusterConfig>,
}

/// One `[[mount]]`: a volume shown as a file, mounted when the node starts and unmounted when
/// it stops. With `size`, a volume that does not exist yet is created first (`page_size` and
/// `mode` then say how); without it, the volume must exist.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    pub volume: String,
    /// The file to mount on (created empty if missing): a regular file.
    pub file: PathBuf,
    /// The volume's size if it must be created (e.g. "4GiB").
    pub size: Option<String>,
    /// "8KiB" (the default) or "16KiB", for a volume created here.
    pub page_size: Option<String>,
    /// "normal" (compressed, the default) or "none" (the fast device), for a volume created here.
    pub mode: Option<String>,
    /// Whether requests may come through FUSE over io_uring where the kernel offers it
    /// (`/sys/module/fuse/parameters/enable_uring`); true by default. False keeps `/dev/fuse`.
    pub io_uring: Option<bool>,
}

impl MountConfig {
    /// The volume to create if it is missing: (size, page size, mode), or None without `size`.
    pub fn creation(&self) -> Result<Option<(u64, u32, tundra_store::volume::VolumeMode)>> {
        let Some(size) = &self.size else { return Ok(None) };
        let what = |key: &str, e: String| Error::Invalid(format!("[[mount]] {:?}: {key}: {e}", self.volume));
        let size = parse_size(size).map_err(|e| what("size", e.message().to_string()))?;
        let page_size = match self.page_size.as_deref().map(parse_size).transpose() {
            Ok(None) | Ok(Some(8192)) => 8192,
            Ok(Some(16384)) => 16384,
            Ok(Some(other)) => return Err(what("page_size", format!("{other} bytes: pages are 8KiB or 16KiB"))),
            Err(e) => return Err(what("page_size", e.message().to_string())),
        };
        let mode = match self.mode.as_deref() {
            None | Some("normal") => tundra_store::volume::VolumeMode::Normal,
            Some("none") => tundra_store::volume::VolumeMode::None,
            Some(other) => return Err(what("mode", format!("{other:?}: write \"normal\" or \"none\""))),
        };
        Ok(Some((size, page_size, mode)))
    }

    /// The transport this entry asks for.
    pub fn transport(&self) -> crate::file_export::Transport {
        match self.io_uring {
            Some(false) => crate::file_export::Transport::DevFuse,
            _ => crate::file_export::Transport::Auto,
        }
    }
}

/// `[cluster]`: this node's id and every node's id and peer address, itself included, as
/// `"ID@HOST:PORT"`. Peers prove they belong to the cluster with the key in `key_file`
/// (required unless every peer address is on loopback).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    pub node_id: u64,
    pub peers: Vec<String>,
    /// A file holding the cluster's shared secret (at least 32 bytes).
    pub key_file: Option<PathBuf>,
    /// Pages per second the background scrub reads and verifies on this node, repairing bad
    /// ones from a peer ([`DEFAULT_SCRUB_PAGES_PER_SEC`] when absent; 0 turns it off).
    pub scrub_pages_per_sec: Option<u64>,
    /// The node ids of the cluster manager's Raft group (tundra-member's `manager.rs`); absent,
    /// the three lowest ids of `peers` (all of them when there are fewer). Fixed for the
    /// cluster's life: changing it is not supported.
    pub managers: Option<Vec<u64>>,
    /// `tundra cluster rebalance`'s band [c_l, c_h] around the cluster's average compression
    /// ratio (seed 000 §4.2.2), as fractions below and above it (0.10 each when absent: the
    /// paper's clusters used about ±10%).
    pub rebalance_band_below: Option<f64>,
    pub rebalance_band_above: Option<f64>,
    /// The logical rule's margin (seed 000 §4.2.1): a node more than this fraction above the
    /// average logical usage sheds chunks (0.10 when absent).
    pub rebalance_logical_margin: Option<f64>,
    /// Bytes per second a chunk move's catch-up traffic (the snapshot sent to the new replica)
    /// may take on the sending node ([`DEFAULT_MOVE_BYTES_PER_SEC`] when absent; 0 is
    /// unlimited).
    pub move_bytes_per_sec: Option<u64>,
    /// How often the cluster manager's leader runs a background rebalance round ("60s",
    /// "500ms", "5m"; "off" or absent: never, only `tundra cluster rebalance` moves chunks).
    pub rebalance_every: Option<String>,
    /// The policy of the background rounds: "compression-aware" (when absent) or "logical".
    pub rebalance_policy: Option<String>,
    /// How often this node's leader balancer runs (tundra-member's `leaders.rs`), as "5s",
    /// "500ms" or "1m" ("5s" when absent); "off" or "0s" turns it off. A node leading fewer
    /// than its share of the chunk groups it is a replica of campaigns for a few of them.
    pub leader_balance_every: Option<String>,
    /// How long a member of the cluster manager's group may go without a report before the
    /// manager's leader gives its place to an up node (tundra-member's `manager_members.rs`):
    /// "60s" when absent, at least the 5 s after which a report is stale; "off" never.
    pub manager_replace_after: Option<String>,
    /// How long a node may go without a report before the cluster manager's leader moves its
    /// chunk and redo replicas onto up nodes (tundra-member's `dead_nodes.rs`): "10m" when
    /// absent, at least the 5 s after which a report is stale; "off" never.
    pub repair_after: Option<String>,
}

/// The default pace of a move's catch-up: a 1 GiB chunk (less after compression) in under
/// 20 seconds, a fraction of a disk's or a 10 Gb/s link's bandwidth.
pub const DEFAULT_MOVE_BYTES_PER_SEC: u64 = 64 << 20;

/// The scrub's default pace: a 1 GiB chunk of 8 KiB pages is read once in about 22 minutes.
pub const DEFAULT_SCRUB_PAGES_PER_SEC: u64 = 100;

impl Default for Config {
    fn default() -> Config {
        Config {
            data_dir: PathBuf::from("tundra-data"),
            listen: Listen::default(),
            drive: DriveConfig::default(),
            fast: FastConfig::default(),
            compression: CompressionConfig::default(),
            cache: CacheConfig::default(),
            redo: RedoConfig::default(),
            limits: LimitsConfig::default(),
            mount: Vec::new(),
            cluster: None,
        }
    }
}

/// Addresses the node listens on; an empty string turns that listener off.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Listen {
    /// The native page protocol (docs/protocol.md), also used by the `tundra` command line.
    pub native: String,
    /// NBD, one export per volume.
    pub nbd: String,
    /// Prometheus metrics over HTTP at /metrics.
    pub metrics: String,
}

pub const DEFAULT_NATIVE_ADDR: &str = "127.0.0.1:7807";
pub const DEFAULT_NBD_ADDR: &str = "127.0.0.1:10809";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9807";

impl Default for Listen {
    fn default() -> Listen {
        Listen {
            native: DEFAULT_NATIVE_ADDR.into(),
            nbd: DEFAULT_NBD_ADDR.into(),
            metrics: DEFAULT_METRICS_ADDR.into(),
        }
    }
}

/// The emulated compressing drive. The sizes apply when the data directory is first set up;
/// `compression` and `deferred` at every start.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DriveConfig {
    /// Physical capacity (e.g. "8GiB"); default: half the free space, between 256 MiB and 16 GiB.
    pub physical: Option<String>,
    /// Logical capacity the drive exposes; default: twice the physical.
    pub logical: Option<String>,
    /// Whether the drive compresses the 4 KiB blocks it stores.
    pub compression: DriveCompression,
    /// With compression on: whether the drive stores blocks raw at once and compresses them on
    /// its own background thread (true, the default), as a hardware drive's engine works beside
    /// the host, or deflates each block in the writing thread before the write returns. A flush
    /// is durable either way; the raw copy stays until its compressed copy is durable.
    pub deferred: bool,
    /// Whether compressed volumes may together be larger than the drive's logical space (their
    /// pages must then compress to fit; writes fail with no space once they do not). Off by
    /// default: such a volume is refused.
    pub overcommit: bool,
}

impl Default for DriveConfig {
    fn default() -> DriveConfig {
        DriveConfig {
            physical: None,
            logical: None,
            compression: DriveCompression::On,
            deferred: true,
            overcommit: false,
        }
    }
}

/// The drive layer of seed 000 §5.3 (Figure 13): on compresses every 4 KiB block in the drive
/// (PolarCSD, §3.2.2); off stores blocks as written, so the node runs on software compression
/// alone. A runtime setting: blocks written under either stay readable under the other.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DriveCompression {
    #[default]
    On,
    Off,
}

impl DriveCompression {
    pub fn name(self) -> &'static str {
        match self {
            DriveCompression::On => "on",
            DriveCompression::Off => "off",
        }
    }

    /// The drive's compression mode for this setting; `deferred`: compression off the
    /// writer's path, on the drive's background thread.
    pub fn mode(self, deferred: bool) -> CompressionMode {
        match self {
            DriveCompression::On if deferred => CompressionMode::Deferred,
            DriveCompression::On => CompressionMode::Inline,
            DriveCompression::Off => CompressionMode::Off,
        }
    }
}

/// The fast device: the store's journal, and the uncompressed volumes (mode none).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FastConfig {
    /// Space for uncompressed volumes; default: an eighth of the free space, between 256 MiB and 4 GiB.
    pub volumes: Option<String>,
    /// Whether uncompressed volumes may together be larger than `volumes` (writes fail with no
    /// space once it is full). Off by default: such a volume is refused.
    pub overcommit: bool,
}

/// The software layer: which algorithm compresses whole pages, and Algorithm 1's thresholds
/// (seed 000 §3.3.2) and Tundra's tie rule.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CompressionConfig {
    /// "auto" (Algorithm 1), "lz4" or "zstd" (that algorithm for every page), "off" (every page
    /// raw, left to the drive): the software layer of seed 000 §5.3 (Figure 13).
    #[serde(with = "SoftwareCompressionName")]
    pub software: SoftwareCompression,
    pub threshold_bytes_per_us: f64,
    pub cpu_busy_threshold: f64,
    pub update_threshold: f64,
    /// B/µs for 4 KiB block ties, or 0 for the paper's rule.
    pub tie_bytes_per_us: f64,
    /// Pages written while the host was busy (lz4 without comparing, often stored raw) that
    /// the background pass compares again per second once the host is idle; 0 turns it off.
    pub rechoose_pages_per_second: usize,
    /// The host's CPU utilisation in [0, 1] at or below which that pass runs; by default
    /// Algorithm 1's own `cpu_busy_threshold` (a value here overrides it for the pass only,
    /// e.g. 1.0 to run it whatever the load, at its rate).
    pub rechoose_idle_threshold: Option<f64>,
}

impl Default for CompressionConfig {
    fn default() -> CompressionConfig {
        let paper = SelectorConfig::default();
        CompressionConfig {
            software: SoftwareCompression::Auto,
            threshold_bytes_per_us: paper.threshold_bytes_per_us,
            cpu_busy_threshold: paper.cpu_busy_threshold,
            update_threshold: paper.update_threshold,
            tie_bytes_per_us: DRIVE_TIE_BYTES_PER_US,
            rechoose_pages_per_second: DEFAULT_RECHOOSE_PAGES_PER_SECOND,
            rechoose_idle_threshold: None,
        }
    }
}

/// Pages compared again per second by default: about 8 MiB of 8 KiB pages, a few percent of
/// one core, so the pass never competes with a database for long.
pub const DEFAULT_RECHOOSE_PAGES_PER_SECOND: usize = 1024;

/// The names of [`SoftwareCompression`] in the file.
#[derive(Deserialize, Serialize)]
#[serde(remote = "SoftwareCompression", rename_all = "lowercase")]
enum SoftwareCompressionName {
    Auto,
    Lz4,
    Zstd,
    Off,
}

impl CompressionConfig {
    pub fn selector(&self) -> SelectorConfig {
        SelectorConfig {
            threshold_bytes_per_us: self.threshold_bytes_per_us,
            cpu_busy_threshold: self.cpu_busy_threshold,
            update_threshold: self.update_threshold,
            tie_bytes_per_us: (self.tie_bytes_per_us > 0.0).then_some(self.tie_bytes_per_us),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Decompressed pages kept in memory per page size and device (0 turns the cache off).
    pub pages: usize,
    /// The write-back cache for block-device (NBD) writes: dirty bytes held until a flush, or
    /// until this limit is passed ("0" writes every block-device write through, durably).
    pub write_back: String,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig { pages: tundra_store::pages::DEFAULT_CACHE_PAGES, write_back: "64MiB".into() }
    }
}

/// Volumes' redo streams (seed 000 §2.1, §3.3).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedoConfig {
    /// Redo records of each stream kept in memory until their page is materialized; past it the
    /// oldest leave memory for their page's log slot (or, with `log_slots` off, for the redo
    /// log alone), so a reader lagging behind LSN_min never holds the whole stream in memory.
    pub cache: String,
    /// Per-page log slots (Opt#3, §3.3.3): a page rebuilt from records that left memory costs
    /// one slot read. Off, such records are read back from the redo log (the paper's baseline);
    /// the choice applies to streams as the node opens them.
    pub log_slots: bool,
}

impl Default for RedoConfig {
    fn default() -> RedoConfig {
        RedoConfig { cache: "16MiB".into(), log_slots: true }
    }
}

impl RedoConfig {
    pub fn cache_bytes(&self) -> Result<u64> {
        parse_size(&self.cache).map_err(|e| Error::Invalid(format!("[redo] cache = {:?}: {}", self.cache, e.message())))
    }
}

/// What clients may hold of the node, on each of the NBD and native listeners: connections,
/// time and buffered bytes. A client that stalls or idles is the first to go when room is
/// needed, so a valid client is always served.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Connections open at once per listener. At the cap a new connection closes the one that
    /// has waited longest in its handshake, else one idle past `evict_idle_after_secs`.
    pub max_connections: usize,
    /// Seconds a new connection may take for each part of its handshake.
    pub handshake_timeout_secs: u64,
    /// Seconds the node waits for each further piece of a request once it has begun (and for
    /// the client to take each piece of a reply); a client that stalls longer is cut off.
    pub request_timeout_secs: u64,
    /// Seconds a client idle between requests may be closed after to make room at the cap.
    pub evict_idle_after_secs: u64,
    /// Seconds a native-protocol client may stay connected without a request. NBD clients may
    /// idle for ever (a mounted filesystem does), except when room is needed at the cap.
    pub native_idle_timeout_secs: u64,
    /// NBD payload bytes held for all connections at once (e.g. "256MiB"); at least 32 MiB,
    /// the largest request.
    pub nbd_buffered: String,
    /// NBD requests one connection may have in flight at once, run side by side and answered
    /// as each finishes.
    pub nbd_requests_in_flight: usize,
    /// NBD payload bytes of one connection's requests in flight (e.g. "64MiB"); at least 32
    /// MiB, at most `nbd_buffered`.
    pub nbd_connection_buffered: String,
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        let nbd = tundra_nbd::Limits::default();
        LimitsConfig {
            max_connections: nbd.max_connections,
            handshake_timeout_secs: nbd.handshake_timeout.as_secs(),
            request_timeout_secs: nbd.request_timeout.as_secs(),
            evict_idle_after_secs: nbd.evict_idle_after.as_secs(),
            native_idle_timeout_secs: 3600,
            nbd_buffered: tundra_device::size::format_size(nbd.max_buffered_bytes),
            nbd_requests_in_flight: nbd.max_requests_in_flight,
            nbd_connection_buffered: tundra_device::size::format_size(nbd.max_bytes_in_flight),
        }
    }
}

impl LimitsConfig {
    /// The NBD server's limits, or why these cannot work.
    pub fn nbd(&self) -> Result<tundra_nbd::Limits> {
        let buffered = tundra_device::size::parse_size(&self.nbd_buffered)
            .map_err(|e| Error::Invalid(format!("[limits] nbd_buffered = {:?}: {e}", self.nbd_buffered)))?;
        let per_connection = tundra_device::size::parse_size(&self.nbd_connection_buffered).map_err(|e| {
            Error::Invalid(format!("[limits] nbd_connection_buffered = {:?}: {e}", self.nbd_connection_buffered))
        })?;
        let limits = tundra_nbd::Limits {
            max_connections: self.max_connections,
            handshake_timeout: Duration::from_secs(self.handshake_timeout_secs),
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            evict_idle_after: Duration::from_secs(self.evict_idle_after_secs),
            max_buffered_bytes: buffered,
            max_requests_in_flight: self.nbd_requests_in_flight,
            max_bytes_in_flight: per_connection,
        };
        match limits.problem() {
            Some(problem) => Err(Error::Invalid(format!("[limits]: {problem}"))),
            None => Ok(limits),
        }
    }

    /// The native protocol server's configuration, or why it cannot work.
    pub fn native(&self) -> Result<tundra_proto::ServerConfig> {
        let config = tundra_proto::ServerConfig {
            max_connections: self.max_connections,
            hello_timeout: Duration::from_secs(self.handshake_timeout_secs),
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            write_timeout: Some(Duration::from_secs(self.request_timeout_secs)),
            idle_timeout: Duration::from_secs(self.native_idle_timeout_secs),
            evict_idle_after: Duration::from_secs(self.evict_idle_after_secs),
            ..tundra_proto::ServerConfig::default()
        };
        match config.problem() {
            Some(problem) => Err(Error::Invalid(format!("[limits]: {problem}"))),
            None => Ok(config),
        }
    }
}

impl Config {
    /// Reads a TOML file; unknown keys are errors, so a typo never passes silently.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Invalid(format!("reading config {}: {e}", path.display())))?;
        Config::parse(&text).map_err(|e| Error::Invalid(format!("config {}: {e}", path.display())))
    }

    pub fn parse(text: &str) -> Result<Config> {
        let config: Config = toml::from_str(text).map_err(|e| Error::Invalid(e.to_string()))?;
        let flat = tundra_codec::LinearCost { fixed_us: 1.0, us_per_byte: 0.0 };
        let cost = tundra_codec::DecompressCost { page_size: tundra_codec::PageSize::Kib8, lz4: flat, zstd: flat };
        tundra_codec::Selector::new(config.compression.selector(), tundra_codec::PageCodec::default(), cost)
            .map_err(|e| Error::Invalid(format!("[compression]: {e}")))?;
        if config.compression.rechoose_idle_threshold.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
            return Err(Error::Invalid("[compression] rechoose_idle_threshold is not in [0, 1]".into()));
        }
        if config.compression.tie_bytes_per_us < 0.0 {
            return Err(Error::Invalid("[compression] tie_bytes_per_us is negative".into()));
        }
        config.limits.nbd()?;
        config.limits.native()?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what can be checked before anything is written: addresses, sizes, and memory
    /// against this machine's (the drive's sizes are checked when the directory is set up,
    /// before it is created).
    pub fn validate(&self) -> Result<()> {
        for (key, addr) in
            [("native", &self.listen.native), ("nbd", &self.listen.nbd), ("metrics", &self.listen.metrics)]
        {
            check_addr(key, addr)?;
        }
        for (key, text) in [("physical", &self.drive.physical), ("logical", &self.drive.logical)] {
            if let Some(text) = text {
                parse_size(text).map_err(|e| Error::Invalid(format!("[drive] {key} = {text:?}: {}", e.message())))?;
            }
        }
        self.redo.cache_bytes()?;
        if let Some(text) = &self.fast.volumes {
            parse_size(text).map_err(|e| Error::Invalid(format!("[fast] volumes = {text:?}: {}", e.message())))?;
        }
        let mut files = std::collections::BTreeSet::new();
        for mount in &self.mount {
            mount.creation()?;
            if !files.insert(&mount.file) {
                return Err(Error::Invalid(format!("[[mount]]: {} is named twice", mount.file.display())));
            }
        }
        let write_back = self.cache.write_back_bytes()?;
        // Each page size on each device has its own page cache.
        let page_cache = (self.cache.pages as u64).saturating_mul(2 * (8192 + 16384));
        if let Some(memory) = physical_memory() {
            let half = memory / 2;
            if write_back > half {
                return Err(Error::Invalid(format!(
                    "[cache] write_back = {:?} is more than half of this machine's {} of memory; set it to                      at most {}",
                    self.cache.write_back,
                    format_size(memory),
                    format_size(half)
                )));
            }
            if page_cache > half {
                return Err(Error::Invalid(format!(
                    "[cache] pages = {} would take {} of memory (pages of 8 and 16 KiB on both devices), more                      than half of this machine's {}; set it to at most {}",
                    self.cache.pages,
                    format_size(page_cache),
                    format_size(memory),
                    half / (2 * (8192 + 16384))
                )));
            }
        }
        Ok(())
    }
}

/// A listen address: empty (off), or an IP address and port; `localhost:PORT` is taken too.
fn check_addr(key: &str, addr: &str) -> Result<()> {
    if addr.is_empty() || addr.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    if let Some(("localhost", port)) = addr.rsplit_once(':')
        && port.parse::<u16>().is_ok()
    {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "[listen] {key} = {addr:?} is not an address: write IP:PORT (e.g. \"127.0.0.1:7807\"), or \"\" to \
         turn that listener off"
    )))
}

/// This machine's memory (MemTotal of /proc/meminfo), if it can be read.
pub fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl CacheConfig {
    /// `write_back` in bytes.
    pub fn write_back_bytes(&self) -> Result<u64> {
        parse_size(&self.write_back)
            .map_err(|e| Error::Invalid(format!("[cache] write_back = {:?}: {}", self.write_back, e.message())))
    }
}
