//! The store: one node's engine for its chunks (seed 000 §3.2.1, §3.2.3).
//!
//! Pages of 8 or 16 KiB are compressed into runs of 4 KiB blocks on a data device (normally the
//! emulated compressing drive, which compresses each block again). A hash index maps each page
//! to its blocks; a device allocator hands 128 KiB extents to chunks and each chunk tracks its
//! 4 KiB blocks in per-extent bitmaps; a journal on a fast device records every index change.
//! The allocator is not journalled: it is derived from the index at recovery, and
//! `Store::check_invariants` compares the two.
//!
//! Two sides, split where replication will cut (seed 000 §3.2.1, Figure 4): `store.rs` applies
//! already-encoded page images (allocate, write, journal, install) and never compresses;
//! `pages.rs` is the local leader path that encodes pages (Algorithm 1, partial writes, heavy
//! segments, the page cache) and then applies them.
//!
//! This crate knows pages, chunks and blocks. It knows nothing of networks, Raft or SQL.

pub mod alloc;
pub mod buf;
pub mod cache;
pub mod command;
mod error;
pub mod ids;
pub mod index;
pub mod journal;
pub mod pages;
pub mod store;
pub mod volume;

pub use error::{Error, ErrorKind, Result};
