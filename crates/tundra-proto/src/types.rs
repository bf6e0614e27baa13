//! The values requests and replies carry: volumes, write modes, heavy compression results.
//! They mirror the store's vocabulary (docs/glossary.md) without depending on the store.

use serde::{Deserialize, Serialize};

/// Whether a volume's pages are compressed (seed 000 §3.2.3). Wire byte: normal 0, none 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeMode {
    Normal,
    /// Never compressed: the place for redo logs (seed 000 §3.3.1).
    None,
}

impl VolumeMode {
    pub fn code(self) -> u8 {
        match self {
            VolumeMode::Normal => 0,
            VolumeMode::None => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<VolumeMode> {
        match code {
            0 => Some(VolumeMode::Normal),
            1 => Some(VolumeMode::None),
            _ => None,
        }
    }
}

/// How a page write is compressed. Wire byte: auto 0, lz4 1, zstd 2, none 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// The node chooses between lz4 and zstd page by page (Algorithm 1, seed 000 §3.3.2).
    Auto,
    Lz4,
    Zstd,
    /// Stored uncompressed (seed 000 §3.2.3, "no compression").
    None,
}

impl WriteMode {
    pub const ALL: [WriteMode; 4] = [WriteMode::Auto, WriteMode::Lz4, WriteMode::Zstd, WriteMode::None];

    pub fn code(self) -> u8 {
        match self {
            WriteMode::Auto => 0,
            WriteMode::Lz4 => 1,
            WriteMode::Zstd => 2,
            WriteMode::None => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<WriteMode> {
        WriteMode::ALL.into_iter().find(|mode| mode.code() == code)
    }
}

/// A volume as the node describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    /// The number page requests name the volume by; chosen by the node.
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    pub mode: VolumeMode,
}

impl VolumeInfo {
    /// How many pages the volume has (0 if the node reports a page size of 0).
    pub fn page_count(&self) -> u64 {
        self.size_bytes.checked_div(u64::from(self.page_size)).unwrap_or(0)
    }
}

/// What a client asks for when it creates a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSpec {
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    pub mode: VolumeMode,
}

/// What a heavy compression pass did (seed 000 §3.2.3, "heavy compression").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeavyResult {
    /// Pages moved into heavy segments.
    pub pages: u64,
    /// Segments written.
    pub segments: u64,
    /// Stored bytes of those pages before the pass.
    pub bytes_before: u64,
    /// Stored bytes of the segments after it.
    pub bytes_after: u64,
}
