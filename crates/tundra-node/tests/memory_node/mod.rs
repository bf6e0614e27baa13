//! A node's memory media and a layout written out by hand, for tests that build a node with
//! `Node::from_devices` and no data directory.
#![allow(dead_code)]

use std::sync::Arc;

use tundra_device::csd::{CsdConfig, CsdDevice};
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice};
use tundra_node::{Config, Devices, Layout};
use tundra_store::journal::PAGE_RECORD_BYTES;

pub mod redo_model;

pub const MIB: u64 = 1 << 20;

/// Checkpoint blocks for `pages` page records, with room for the volume records.
pub fn checkpoint_blocks(pages: u64) -> u64 {
    16 + (pages * PAGE_RECORD_BYTES as u64).div_ceil(BLOCK_SIZE_BYTES)
}

pub fn layout() -> Layout {
    let logical = 128 * MIB;
    let fast_volume_bytes = 32 * MIB;
    Layout {
        format: 1,
        drive_logical_bytes: logical,
        drive_physical_bytes: 64 * MIB,
        data_journal_checkpoint_blocks: checkpoint_blocks(logical / BLOCK_SIZE_BYTES),
        data_journal_log_blocks: 1024,
        fast_journal_checkpoint_blocks: checkpoint_blocks(fast_volume_bytes / BLOCK_SIZE_BYTES / 2),
        fast_journal_log_blocks: 256,
        fast_volume_bytes,
        redo_streams: 4,
        redo_stream_blocks: 1024,
        redo_slot_blocks: 4096,
    }
}

/// The media of both devices, kept across rebuilds as a disk would be.
pub struct Media {
    pub drive: Arc<MemDevice>,
    pub fast: Arc<MemDevice>,
}

impl Media {
    pub fn new(layout: &Layout) -> Media {
        let drive_bytes = layout.drive_format().geometry().unwrap().total_bytes();
        let slices = layout.fast_slices();
        let fast_blocks = slices.redo.0 + slices.redo.1;
        Media {
            drive: Arc::new(MemDevice::new(drive_bytes / BLOCK_SIZE_BYTES)),
            fast: Arc::new(MemDevice::new(fast_blocks)),
        }
    }

    pub fn format(&self, layout: &Layout) -> Devices {
        self.format_with(layout, CsdConfig::default())
    }

    /// [`Media::format`] with the drive configured as `csd` says (its background thread off,
    /// for a run that must replay exactly).
    pub fn format_with(&self, layout: &Layout, csd: CsdConfig) -> Devices {
        let drive = CsdDevice::format(self.drive.clone(), &layout.drive_format(), csd).unwrap();
        let devices = Devices { drive: Arc::new(drive), fast: self.fast.clone() as Arc<dyn BlockDevice> };
        devices.format_journals(layout).unwrap();
        devices
    }

    pub fn open(&self) -> Devices {
        let drive = CsdDevice::open(self.drive.clone(), CsdConfig::default()).unwrap();
        Devices { drive: Arc::new(drive), fast: self.fast.clone() as Arc<dyn BlockDevice> }
    }
}

pub fn config(dir: &std::path::Path) -> Config {
    let mut config = Config::parse("").unwrap();
    config.data_dir = dir.join("never-made");
    config
}
