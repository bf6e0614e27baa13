//! A log-structured store of elements on the compressing drive, and virtual data trim (seed 001
//! §3.2): the store zeroes or trims the dead parts of its segments so that the drive's
//! compression returns their physical space before garbage collection does.
//!
//! [`core::LogCore`] takes every decision with no I/O (placement, trims, when and what to
//! collect) under a [`policy::Policy`]; [`store::Lss`] carries them out on any
//! `BlockDevice`, the emulated drive in particular, as a real store (put, get, delete, flush,
//! recovery); [`model::run_model`] drives the same core with no device at Table 1's scale.
//! [`meter`] defines the figures both report, [`workload`] what they run, and [`drive_run`] runs
//! the store on an emulated drive held in memory with the workload of a model run.

pub mod core;
pub mod drive_run;
mod error;
pub mod geometry;
pub mod meter;
pub mod model;
pub mod policy;
pub mod store;
pub mod workload;

pub use error::{Error, ErrorKind, Result};
pub use meter::Figures;
pub use policy::{Mode, Policy};
pub use store::Lss;
pub use workload::{RunConfig, Scale};
