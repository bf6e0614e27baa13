//! Tundra's benchmarks and measurements, kept apart from the product so that the `tundra` binary
//! holds only what users run. Each measures a part against a baseline taken in the same run:
//!
//! - [`drive`]: the emulated drive against a plain file device (seed 000 Figure 7) and its
//!   garbage collection under random overwrites (`tundra-bench drive`);
//! - [`store`]: database files written page by page through the store onto an emulated drive,
//!   once per way of compressing, against the drive alone (`tundra-bench store`);
//! - [`protocol`]: a real node's native protocol against in-process calls on it
//!   (`tundra-bench protocol`), through [`overhead`], which runs on any `Service`;
//! - [`redo`]: a redo commit through the redo log at queue depth 1, plain and with compressed
//!   batches (and optionally through a real node's protocol), against `pwrite` and `fdatasync`
//!   of the same bytes, buffered and with `O_DIRECT` (`tundra-bench redo`);
//! - [`measure`]: latency percentiles, the process's CPU time and the machine's description,
//!   which the others share.
//!
//! Every command runs at a tiny size in the crate's tests, so that none of them can rot. The
//! command names, flags and JSON keys are a contract (docs/bench-cli.md): bench/eval and
//! scripts/test read them.

pub mod drive;
pub mod measure;
pub mod overhead;
pub mod protocol;
pub mod redo;
pub mod store;
