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
//! [`Pages`](tundra_store::pages::Pages) for every write path and the background pass) and `[drive] compression` (the drive
//! compresses its 4 KiB blocks or stores them as written). [`Node::configuration`] reports both.
//!
//! A page-protocol write is durable when it returns (the store's journal commits it). A
//! block-device write goes to the write-back cache (writeback.rs, on by default) and is durable
//! at the client's next flush or FUA, as on a disk with a volatile cache; `cache.write_back =
//! "0"` makes every block-device write durable on return.
//!
//! The crate, module by module: node.rs holds [`Node`] and the types its entry points speak
//! ([`VolumeRef`], [`Device`], [`WriteMode`]); open.rs builds a node, from its data directory
//! ([`Node::open`]) or from opened devices and an [`Environment`] ([`Node::from_devices`]);
//! admin.rs keeps the volume table; pages_io.rs serves page I/O and bytes.rs byte I/O, which
//! walks its ranges page by page as spans.rs cuts them; writeback.rs is the write-back cache and
//! flush.rs writes it to the store; background.rs runs the periodic upkeep, check.rs the offline
//! check; stats.rs reports; error.rs holds the one [`Error`]. config.rs, layout.rs and repair.rs
//! are the data directory's configuration, geometry and journal damage; native.rs, nbd.rs and
//! metrics.rs serve the node over its protocols, with histogram.rs for their latencies.

mod admin;
mod background;
mod bytes;
mod check;
pub mod config;
mod error;
pub mod file_export;
mod flush;
pub mod histogram;
mod layout;
pub mod metrics;
pub mod mount;
pub mod native;
pub mod nbd;
mod node;
mod open;
mod pages_io;
mod redo;
pub mod repair;
mod spans;
mod stats;
mod writeback;

pub use admin::DeletedListener;
pub use background::background_loop;
pub use config::{ClusterConfig, Config, DriveCompression};
pub use error::{Error, Result};
pub use layout::Layout;
pub use node::{ClusterVolumes, Configuration, Device, Node, VolumeLatency, VolumeRef, WriteMode};
pub use open::{Devices, Environment, HOST_FLUSH_WRITERS};
pub use redo::{
    CopyBug, CopyHead, FOLD_PAGES_PER_PASS, FoldBug, LeaseGrant, NOT_YET_WAIT, RedoRefusal, RedoWatermarks, ServedPage,
};
pub use stats::{ChunkSpace, DriveStats, NodeStats, SpaceStats, VolumeStats};
pub use tundra_store::pages::SoftwareCompression;

// The node's messages and statistics speak of 4 KiB blocks.
const _: () = assert!(tundra_device::BLOCK_SIZE_BYTES == 4096);
