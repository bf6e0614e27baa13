//! The part of the command line that the `tundra` binary and the measurement tools
//! (crates/tundra-bench) share: database files read as pages, Algorithm 1's decompression costs
//! calibrated on sample pages of them, and the flags that say how (page size, tie rate).
//!
//! It is a library so that `tundra analyze` and `tundra-bench store` read the same pages and
//! calibrate the same way, while the product binary depends on nothing of the benchmarks. Its
//! errors are `anyhow` errors, as the binaries it serves print them.

pub mod input;
