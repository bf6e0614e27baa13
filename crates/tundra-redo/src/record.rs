//! What a volume's writer sends: batches of redo records, each a physical change to one page.
//!
//! A record changes one page of the volume (pages are numbered from 0 by the volume's page
//! size). Its payload is either a whole page image (`will_init`: the record does not need the
//! page's earlier content) or byte ranges to overwrite in the page as it was. A real engine maps
//! its own redo onto these: a full-page image after a checkpoint is an image, a heap insert or
//! an index update is the byte ranges it changed. The byte layout is in docs/format.md, "Redo
//! records".

use tundra_store::ids::Lsn;
use tundra_store::ids::VolumeId;

/// The writer's epoch: a new RW node (or a restarted one) takes a higher epoch, and storage
/// refuses every batch of a lower one (fencing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriterEpoch(pub u64);

/// The change a record makes to its page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// The whole page: the record needs nothing of the page before it (`will_init`).
    Image(Vec<u8>),
    /// `(offset, bytes)` pieces written over the page as it was, in order.
    Ranges(Vec<(u32, Vec<u8>)>),
}

/// One redo record: a change to one page at one LSN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedoRecord {
    pub lsn: Lsn,
    /// The page's index in its volume.
    pub page: u64,
    pub payload: Payload,
}

impl RedoRecord {
    /// True when the record needs nothing of the page before it.
    pub fn will_init(&self) -> bool {
        matches!(self.payload, Payload::Image(_))
    }
}

/// A batch from a volume's writer: it claims every record in `(prev_lsn, end_lsn]`, and its
/// records' LSNs strictly increase inside that range. An empty batch only moves the stream's
/// end (a heartbeat).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedoBatch {
    pub volume: VolumeId,
    pub epoch: WriterEpoch,
    /// Must equal the end of the last batch the stream accepted.
    pub prev_lsn: Lsn,
    pub end_lsn: Lsn,
    pub records: Vec<RedoRecord>,
}

/// What an append answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// The batch is durable; every record up to `durable_lsn` is.
    Ok { durable_lsn: Lsn },
    /// `prev_lsn` is not the end of the stream: the writer resends from `expected_prev_lsn`.
    Gap { expected_prev_lsn: Lsn },
    /// A writer of epoch `epoch` (higher) took the stream over: this writer must stop.
    Fenced { epoch: WriterEpoch },
}
