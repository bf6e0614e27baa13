//! The data directory's geometry: chosen once, when the directory is set up, and recorded in
//! `layout.toml`, which is written last, so a setup cut short leaves no layout and is redone.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tundra_device::csd::FormatOptions;
use tundra_device::file::{FileDevice, lock_exclusive_waiting};
use tundra_device::size::{format_size, parse_size};
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice};
use tundra_store::journal::{JournalGeometry, PAGE_RECORD_BYTES};

use crate::config::Config;
use crate::{Error, Result};

pub const DRIVE_FILE: &str = "drive.img";
pub const FAST_FILE: &str = "fast.img";
pub const LAYOUT_FILE: &str = "layout.toml";
const FORMAT: u32 = 1;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Sizes of the node's devices.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub format: u32,
    /// The emulated drive: address space and media for data.
    pub drive_logical_bytes: u64,
    pub drive_physical_bytes: u64,
    /// The fast device: the store's journal, the uncompressed store's journal and its data.
    pub data_journal_checkpoint_blocks: u64,
    pub data_journal_log_blocks: u64,
    pub fast_journal_checkpoint_blocks: u64,
    pub fast_journal_log_blocks: u64,
    pub fast_volume_bytes: u64,
    /// Volumes' redo streams (seed 000 §3.3.1): this many streams of `redo_stream_blocks` each,
    /// after a two-block directory, at the end of the fast device. Zero in directories set up
    /// before redo streams existed: their volumes cannot take redo.
    #[serde(default)]
    pub redo_streams: u32,
    #[serde(default)]
    pub redo_stream_blocks: u64,
    /// Per-page log slots (seed 000 §3.3.3): each redo stream owns this many blocks of the
    /// drive's logical space after `drive_logical_bytes`, one per page of its volume. The drive
    /// stores a block that was never written (or was trimmed) for free and compresses the rest,
    /// so the region costs media only for the records it holds. Zero in directories set up
    /// before slots existed: their streams keep spilled records only in the redo log.
    #[serde(default)]
    pub redo_slot_blocks: u64,
}

/// (first block, block count) of each slice of the fast device.
pub struct FastSlices {
    pub data_journal: (u64, u64),
    pub fast_journal: (u64, u64),
    pub fast_data: (u64, u64),
    /// The redo area: its directory, then the streams (empty without redo streams).
    pub redo: (u64, u64),
}

/// Redo streams a new directory gets, and the blocks of each (16 MiB).
const REDO_STREAMS: u32 = 8;
const REDO_STREAM_BLOCKS: u64 = 4096;
/// Log slots a stream gets at most: 1 GiB of the drive's logical space, enough for every page
/// of a 4 GiB volume of 16 KiB pages. A volume with more pages keeps its further pages'
/// spilled records in memory (and in the log) only.
const REDO_SLOT_BLOCKS: u64 = 1 << 18;
/// Blocks of the redo area's directory: two copies.
pub const REDO_DIRECTORY_BLOCKS: u64 = 2;

/// Journal space for a checkpoint of `pages` page records, plus the volume records.
fn checkpoint_blocks(pages: u64) -> u64 {
    16 + (pages * PAGE_RECORD_BYTES as u64).div_ceil(BLOCK_SIZE_BYTES)
}

/// Pages whose records fit in a checkpoint of `blocks` blocks.
fn pages_in(blocks: u64) -> u64 {
    (blocks - 16) * BLOCK_SIZE_BYTES / PAGE_RECORD_BYTES as u64
}

impl Layout {
    /// The drive's format: the store's logical space, then the streams' log slots.
    pub fn drive_format(&self) -> FormatOptions {
        FormatOptions::new(self.drive_logical_bytes + self.slot_region_bytes(), self.drive_physical_bytes)
    }

    /// Blocks of the drive's logical space the page store owns: everything before the slots.
    pub fn store_drive_blocks(&self) -> u64 {
        self.drive_logical_bytes / BLOCK_SIZE_BYTES
    }

    /// The first block of redo stream `stream`'s log slots on the drive, and how many it has
    /// (zero without slots).
    pub fn slot_region(&self, stream: u32) -> (u64, u64) {
        (self.store_drive_blocks() + u64::from(stream) * self.redo_slot_blocks, self.redo_slot_blocks)
    }

    fn slot_region_bytes(&self) -> u64 {
        u64::from(self.redo_streams) * self.redo_slot_blocks * BLOCK_SIZE_BYTES
    }

    pub fn data_journal_geometry(&self) -> JournalGeometry {
        JournalGeometry {
            checkpoint_blocks: self.data_journal_checkpoint_blocks,
            log_blocks: self.data_journal_log_blocks,
        }
    }

    pub fn fast_journal_geometry(&self) -> JournalGeometry {
        JournalGeometry {
            checkpoint_blocks: self.fast_journal_checkpoint_blocks,
            log_blocks: self.fast_journal_log_blocks,
        }
    }

    pub fn fast_slices(&self) -> FastSlices {
        let data_journal = self.data_journal_geometry().total_blocks();
        let fast_journal = self.fast_journal_geometry().total_blocks();
        let fast_data = (data_journal + fast_journal, self.fast_volume_bytes / BLOCK_SIZE_BYTES);
        let redo_blocks = match self.redo_streams {
            0 => 0,
            streams => REDO_DIRECTORY_BLOCKS + u64::from(streams) * self.redo_stream_blocks,
        };
        FastSlices {
            data_journal: (0, data_journal),
            fast_journal: (data_journal, fast_journal),
            fast_data,
            redo: (fast_data.0 + fast_data.1, redo_blocks),
        }
    }

    fn fast_bytes(&self) -> u64 {
        let s = self.fast_slices();
        (s.redo.0 + s.redo.1) * BLOCK_SIZE_BYTES
    }

    /// Pages all compressed volumes may hold together.
    pub fn drive_page_limit(&self) -> u64 {
        pages_in(self.data_journal_checkpoint_blocks)
    }

    /// Pages all uncompressed volumes may hold together.
    pub fn fast_page_limit(&self) -> u64 {
        pages_in(self.fast_journal_checkpoint_blocks).min(self.fast_volume_bytes / BLOCK_SIZE_BYTES / 2)
    }

    /// The sizes for a new directory: from the config where it names them, otherwise from the
    /// free space of the filesystem holding `dir`.
    fn choose(dir: &Path, config: &Config) -> Result<Layout> {
        let free = free_bytes(dir)?;
        let size = |text: &Option<String>, what: &str| -> Result<Option<u64>> {
            text.as_deref()
                .map(|t| parse_size(t).map_err(|e| Error::Invalid(format!("{what} = {t:?}: {}", e.message()))))
                .transpose()
        };
        let round = |bytes: u64| bytes / MIB * MIB;
        let physical = match size(&config.drive.physical, "[drive] physical")? {
            Some(bytes) => bytes,
            None => round(free / 2).clamp(256 * MIB, 16 * GIB),
        };
        let logical = size(&config.drive.logical, "[drive] logical")?.unwrap_or(2 * physical);
        let fast_volume_bytes = match size(&config.fast.volumes, "[fast] volumes")? {
            Some(bytes) => bytes,
            None => round(free / 8).clamp(256 * MIB, 4 * GIB),
        };
        if physical < 64 * MIB || logical < physical || fast_volume_bytes < 16 * MIB {
            return Err(Error::Invalid(format!(
                "drive physical {} (at least 64 MiB), logical {} (at least the physical), fast volumes {} \
                 (at least 16 MiB)",
                format_size(physical),
                format_size(logical),
                format_size(fast_volume_bytes)
            )));
        }
        let block = |bytes: u64| bytes / BLOCK_SIZE_BYTES * BLOCK_SIZE_BYTES;
        let fast_volume_bytes = block(fast_volume_bytes);
        let slot_blocks = (block(logical) / BLOCK_SIZE_BYTES / u64::from(REDO_STREAMS)).min(REDO_SLOT_BLOCKS);
        check_map_memory(logical + u64::from(REDO_STREAMS) * slot_blocks * BLOCK_SIZE_BYTES)?;
        let layout = Layout {
            format: FORMAT,
            drive_logical_bytes: block(logical),
            drive_physical_bytes: block(physical),
            // A page takes at least one block of the drive's address space, unless it is heavy.
            data_journal_checkpoint_blocks: checkpoint_blocks(logical / BLOCK_SIZE_BYTES),
            data_journal_log_blocks: 16384,
            fast_journal_checkpoint_blocks: checkpoint_blocks(fast_volume_bytes / BLOCK_SIZE_BYTES / 2),
            fast_journal_log_blocks: 4096,
            fast_volume_bytes,
            redo_streams: REDO_STREAMS,
            redo_stream_blocks: REDO_STREAM_BLOCKS,
            redo_slot_blocks: slot_blocks,
        };
        let needed = layout.drive_format().geometry()?.total_bytes() + layout.fast_bytes();
        if needed > free {
            return Err(Error::NoSpace(format!(
                "the node needs up to {} in {} (drive media, its map and the fast device with the \
                 journal's checkpoints) but {} is free; set smaller sizes under [drive] and [fast] in the config",
                format_size(needed),
                dir.display(),
                format_size(free)
            )));
        }
        Ok(layout)
    }
}

/// Bytes of the drive's in-memory map per 4 KiB logical block (tundra-device's csd/map.rs).
const MAP_ENTRY_BYTES: u64 = 7;

/// The drive keeps a map of 7 bytes per 4 KiB logical block in memory: a logical size this
/// machine cannot hold is refused before anything is written.
fn check_map_memory(logical: u64) -> Result<()> {
    let map = logical / BLOCK_SIZE_BYTES * MAP_ENTRY_BYTES;
    let Some(memory) = crate::config::physical_memory() else { return Ok(()) };
    if map > memory / 2 {
        let most = memory / 2 / MAP_ENTRY_BYTES * BLOCK_SIZE_BYTES;
        return Err(Error::Invalid(format!(
            "[drive] logical {} needs {} of memory for the drive's map (7 bytes per 4 KiB block), more than \
             half of this machine's {}; set logical to at most {}",
            format_size(logical),
            format_size(map),
            format_size(memory),
            format_size(most)
        )));
    }
    Ok(())
}

/// The free space where `dir` is or will be: of its nearest existing ancestor.
fn free_bytes(dir: &Path) -> Result<u64> {
    let dir = dir.ancestors().find(|d| d.exists()).unwrap_or(Path::new("."));
    let stat =
        rustix::fs::statvfs(dir).map_err(|e| Error::Io(format!("reading the free space of {}: {e}", dir.display())))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The layout recorded in `dir`.
pub fn read(dir: &Path) -> Result<Layout> {
    let path = dir.join(LAYOUT_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?;
    let layout: Layout = toml::from_str(&text).map_err(|e| Error::Corrupted(format!("{}: {e}", path.display())))?;
    if layout.format != FORMAT {
        return Err(Error::Invalid(format!(
            "{} is of format {}; this Tundra reads format {FORMAT}",
            path.display(),
            layout.format
        )));
    }
    Ok(layout)
}

/// Takes the data directory's lock, held for as long as the returned file is open, so that two
/// nodes never run on one directory. A node that is just stopping is waited for a moment
/// ([`lock_exclusive_waiting`]).
fn lock(dir: &Path) -> Result<std::fs::File> {
    let file = std::fs::File::open(dir).map_err(|e| Error::Io(format!("opening {}: {e}", dir.display())))?;
    match lock_exclusive_waiting(&file) {
        Ok(true) => Ok(file),
        Ok(false) => Err(Error::Exists(format!(
            "a node is already running on {} (lock held); stop it first or use another --data-dir",
            dir.display()
        ))),
        Err(e) => Err(Error::Io(format!("locking {}: {e}", dir.display()))),
    }
}

/// The directory's layout, setting it up if it has none: the sizes are chosen and checked
/// before the directory is created, then it is locked and the two image files created. Returns
/// whether the devices are new and must be formatted ([`commit`] records the layout after), and
/// the directory's lock.
pub fn open_or_create(
    dir: &Path,
    config: &Config,
    progress: &mut dyn FnMut(&str),
) -> Result<(Layout, bool, std::fs::File)> {
    let path = dir.join(LAYOUT_FILE);
    if path.exists() {
        let lock = lock(dir)?;
        return Ok((read(dir)?, false, lock));
    }
    let layout = Layout::choose(dir, config)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("creating {}: {e}", dir.display())))?;
    let lock = lock(dir)?;
    progress(&format!(
        "setting up {}: drive {} logical on {} physical ({}), fast device {} ({}), of which {} for \
         uncompressed volumes and {} for {} redo streams",
        dir.display(),
        format_size(layout.drive_logical_bytes),
        format_size(layout.drive_physical_bytes),
        DRIVE_FILE,
        format_size(layout.fast_bytes()),
        FAST_FILE,
        format_size(layout.fast_volume_bytes),
        format_size(layout.fast_slices().redo.1 * BLOCK_SIZE_BYTES),
        layout.redo_streams
    ));
    // No layout means no setup ever finished, so no volume exists: leftovers of a setup cut
    // short are replaced.
    for file in [DRIVE_FILE, FAST_FILE] {
        let leftover = dir.join(file);
        if leftover.exists() {
            std::fs::remove_file(&leftover).map_err(|e| Error::Io(format!("removing {}: {e}", leftover.display())))?;
        }
    }
    let media_bytes = layout.drive_format().geometry()?.total_bytes();
    drop(FileDevice::create(dir.join(DRIVE_FILE), media_bytes)?);
    let fast = FileDevice::create(dir.join(FAST_FILE), layout.fast_bytes())?;
    fast.flush()?;
    Ok((layout, true, lock))
}

/// Records the layout: the last step of setting a directory up.
pub fn commit(dir: &Path, layout: &Layout) -> Result<()> {
    let text = toml::to_string(layout).map_err(|e| Error::Invalid(e.to_string()))?;
    let text = format!("# Written when this directory was set up; the devices depend on it. Do not edit.\n{text}");
    let tmp = dir.join(format!("{LAYOUT_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, dir.join(LAYOUT_FILE))?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| Error::Io(format!("writing {}: {e}", dir.join(LAYOUT_FILE).display())))
}
