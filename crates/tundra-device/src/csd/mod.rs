//! The emulated compressing drive: a faithful, measurable model of PolarCSD (seed 000 §3.2.2,
//! §4.1.2), built on any [`BlockDevice`] as its "NAND".
//!
//! Each 4 KiB logical block is compressed on its own with raw deflate level 5 ([`deflate`]),
//! stored raw when that saves nothing, and not stored at all when it is all zeros (seed 001 §2).
//! Compression is a runtime setting ([`CompressionMode`]), not part of the media: with it off,
//! every block is stored as is, and a drive reads whatever records it finds either way.
//! Payloads are packed at 16-byte granularity as records in a log of fixed-size segments
//! ([`layout`]); an in-memory map of 7 bytes per LBA says where each block's record is ([`map`]).
//! Overwrites and TRIM leave dead records behind; garbage collection ([`gc`]) relocates the live
//! records of the emptiest segments and returns them to the free pool, drawing on an
//! over-provisioning reserve so that it can always make progress. The logical capacity is larger
//! than the physical one (the paper provisions 2.4x), and a write that needs physical space the
//! drive does not have fails with [`ErrorKind::DriveFull`](crate::ErrorKind::DriveFull) and changes
//! nothing (seed 000 §4.2.1: physical space is what operators must watch).
//!
//! Crash consistency ([`recovery`]): writes are durable after a flush; every record carries its
//! LBA, a sequence number and a checksum, so the map can be rebuilt from a periodic map checkpoint
//! plus a scan of the segments written since.
//!
//! The files split the drive along its seams: [`config`] and [`stats`] are what callers set and
//! read, `device.rs` is [`CsdDevice`] itself, `read.rs`, `write.rs` and `trim.rs` are the three
//! request paths, `background.rs` the drive's own work, and `state.rs` the decisions under the
//! lock, which do no I/O but write an open segment out.

mod background;
mod config;
mod cpu;
mod deflate;
mod device;
mod gc;
pub mod layout;
mod map;
mod read;
mod recovery;
mod state;
mod stats;
mod trim;
mod write;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::BlockDevice;

pub use config::{CompressionMode, CsdConfig, GcPolicy};
pub use cpu::DriveCpu;
pub use deflate::{DEFLATE_LEVEL, stored_payload_bytes};
pub use device::{CsdDevice, RangeUsage};
use layout::Geometry;
use read::Wanted;
pub use recovery::FormatOptions;
use state::State;
pub use stats::{Counters, CsdStats};
use write::{DeferredBlock, Prepared};

/// What the drive's handles and its background thread share.
pub(crate) struct Shared {
    media: Arc<dyn BlockDevice>,
    geometry: Geometry,
    config: CsdConfig,
    state: Mutex<State>,
    /// Readers hold it shared while they read a record from the media; a segment returns to the
    /// free pool only under it exclusively, so no reader ever reads a reused segment.
    reuse_gate: RwLock<()>,
    gc_lock: Mutex<()>,
    checkpoint: Mutex<recovery::CheckpointCursor>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// The host CPU the drive's emulation costs (cpu.rs).
    cpu: cpu::CpuCounters,
}

#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod tests;
