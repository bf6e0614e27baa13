//! A table-less hash key-value store on the compressing drive's sparse logical space, after seed
//! 001 §3.3 (HotStorage '20, "Re-think data management software design upon the arrival of
//! storage hardware with built-in transparent compression").
//!
//! Keys hash straight to 4 KiB LBAs of a logical range much larger than the data ([`layout`]):
//! there is no index in memory and nothing to compact. Each block is a bucket of records packed
//! at its start with zeros after them ([`bucket`]); the drive (tundra-device's `csd`) compresses
//! every block on its own and stores zeros for nothing, so the unused logical space costs no
//! physical space. A PUT is durable once in the write-ahead log ([`wal`], group commit); sections
//! with one writer thread each apply logged records to their buckets in batches ([`section`],
//! [`apply`]); a GET reads its bucket synchronously. The rare records that do not fit their
//! bucket go to a redb database on another region of the same drive ([`overflow`]).
//!
//! [`load`] is the load generator that measures this store and its peer (RocksDB, in the
//! `tundra` binary's `bench hashkv`) under the same workload.

pub mod apply;
pub mod bucket;
pub mod drive;
mod error;
pub mod layout;
pub mod load;
pub mod overflow;
pub mod section;
mod store;
pub mod wal;

#[cfg(test)]
mod crash_tests;
#[cfg(test)]
mod tests;

pub use error::{Error, ErrorKind, Result};
pub use layout::Key;
pub use store::{HashKv, HashKvConfig, HashKvOptions, HashKvStats};

/// The longest key, in bytes (seed 001 §3.3.3 used 16-byte keys).
pub const MAX_KEY_BYTES: usize = 16;
/// The longest value, in bytes: the paper's 400-byte values with room to spare, and short
/// enough that a record always fits an empty bucket and a log block.
pub const MAX_VALUE_BYTES: usize = 1024;
