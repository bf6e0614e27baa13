//! Redo streams (seed 000 §2.1, §3.3.1, §3.3.3; seed 002 §3): a volume's one writer (the RW
//! compute node) sends only redo; storage makes each batch durable on the fast device without
//! compressing it (Opt#1), applies the records to pages in the background, and serves each page
//! at the LSN a reader asks for. Read-only nodes read at their own LSN; pages are materialized
//! only up to LSN_min, the slowest live reader.
//!
//! - `record.rs`: the records and batches a writer sends ([`RedoRecord`], [`Payload`],
//!   [`RedoBatch`]) and what an append answers ([`AppendOutcome`]).
//!
//! This crate knows volumes' pages by index and LSNs. It knows nothing of networks or of how
//! the store compresses pages.

mod error;
pub mod record;

pub use error::{Error, ErrorKind, Result};
pub use record::{AppendOutcome, Payload, RedoBatch, RedoRecord, WriterEpoch};
