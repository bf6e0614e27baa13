//! The crate's one error. Its kind tells the caller what to do; the message says what happened.
//! Refusals of reads at an LSN and of leases carry the LSN the caller acts on, as the storage
//! sent it.

use std::fmt;

use tundra_redo::WriterEpoch;
use tundra_store::ids::Lsn;

/// What a caller can do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is wrong (a key or value too long, a page outside the volume); it changed
    /// nothing.
    Invalid,
    /// Page bytes fail their checks (checksum, format, LSN): storage or redo is damaged, or a
    /// node applied redo wrongly.
    Corrupted,
    /// The version asked for is gone: the reader resyncs at or above `lsn_min`.
    TooOld { lsn_min: Lsn },
    /// Storage has redo only up to `complete_lsn`, short of what the read needs: retry later.
    NotYet { complete_lsn: Lsn },
    /// The reader's lease is gone: it registers again at or above `lsn_min` and resyncs.
    LeaseLost { lsn_min: Lsn },
    /// A writer of a higher epoch owns the volume's stream: this writer stops for good.
    Fenced { epoch: WriterEpoch },
    /// No room: the volume has no free page, or storage holds as much redo as it may.
    Full,
    /// Storage holds as much unapplied redo as it may for now (a reader holds folding back):
    /// the batch was not appended and nothing changed; the same batch may be sent again.
    Busy,
    /// Storage could not be reached or failed; for a commit, its outcome is unknown.
    Unavailable,
    /// The node stopped after an error that left its state uncertain; open a new one.
    Closed,
}

#[derive(Debug, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }

    pub fn corrupted(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Corrupted, message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `context` in front of its message.
    pub fn context(self, context: impl fmt::Display) -> Error {
        Error { kind: self.kind, message: format!("{context}: {}", self.message) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Invalid => write!(f, "invalid request: {}", self.message),
            ErrorKind::Corrupted => write!(f, "corrupted: {}", self.message),
            ErrorKind::TooOld { lsn_min } => write!(f, "too old (LSN_min {lsn_min}): {}", self.message),
            ErrorKind::NotYet { complete_lsn } => write!(f, "not yet (complete to {complete_lsn}): {}", self.message),
            ErrorKind::LeaseLost { lsn_min } => write!(f, "lease lost (LSN_min {lsn_min}): {}", self.message),
            ErrorKind::Fenced { epoch } => write!(f, "fenced by writer epoch {}: {}", epoch.0, self.message),
            ErrorKind::Full => write!(f, "full: {}", self.message),
            ErrorKind::Busy => write!(f, "storage busy, nothing appended: {}", self.message),
            ErrorKind::Unavailable => write!(f, "storage unavailable: {}", self.message),
            ErrorKind::Closed => write!(f, "closed: {}", self.message),
        }
    }
}

impl From<tundra_redo::Error> for Error {
    fn from(error: tundra_redo::Error) -> Error {
        let kind = match error.kind() {
            tundra_redo::ErrorKind::Invalid => ErrorKind::Invalid,
            tundra_redo::ErrorKind::Corrupted => ErrorKind::Corrupted,
            tundra_redo::ErrorKind::Full => ErrorKind::Full,
            tundra_redo::ErrorKind::Closed => ErrorKind::Closed,
            _ => ErrorKind::Unavailable,
        };
        Error::new(kind, error.message())
    }
}

impl From<tundra_client::Error> for Error {
    fn from(error: tundra_client::Error) -> Error {
        use tundra_client::Error as C;
        use tundra_proto::Status;
        let kind = match &error {
            C::TooOld { lsn_min, .. } => ErrorKind::TooOld { lsn_min: Lsn(*lsn_min) },
            C::NotYet { complete_lsn, .. } => ErrorKind::NotYet { complete_lsn: Lsn(*complete_lsn) },
            C::LeaseLost { lsn_min, .. } => ErrorKind::LeaseLost { lsn_min: Lsn(*lsn_min) },
            C::Status { status: Status::Invalid | Status::NotFound | Status::NotSupported, .. } => ErrorKind::Invalid,
            C::Status { status: Status::Corrupted, .. } => ErrorKind::Corrupted,
            C::Status { status: Status::NoSpace, .. } => ErrorKind::Full,
            C::Status { status: Status::Busy, .. } => ErrorKind::Busy,
            _ => ErrorKind::Unavailable,
        };
        Error::new(kind, error.to_string())
    }
}
