//! The one error type of the hash key-value store. Its kinds tell a caller what to do; the
//! message says what happened, and the device or overflow-store error that caused it, if any,
//! is its source.

use std::fmt;

/// What the caller can do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request itself is wrong (an empty or oversized key, an oversized value). Nothing
    /// changed.
    Invalid,
    /// The drive has no physical space left for the write. Nothing changed; delete records or
    /// give the drive more physical space.
    Full,
    /// Bytes read from the drive do not verify (a checksum, a magic number, a length). Never
    /// wrong data.
    Corrupted,
    /// The drive or the overflow store failed an I/O. The store refuses further writes until it
    /// is reopened, which replays the write-ahead log.
    Io,
    /// The store was closed, or failed earlier and must be reopened.
    Closed,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorKind::Invalid => "invalid request",
            ErrorKind::Full => "drive full",
            ErrorKind::Corrupted => "corrupted",
            ErrorKind::Io => "I/O error",
            ErrorKind::Closed => "store closed",
        };
        f.write_str(name)
    }
}

/// A hash KV error: a kind, a message, and the underlying cause if there is one.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), source: None }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }

    pub fn corrupted(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Corrupted, message)
    }

    pub fn full(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Full, message)
    }

    pub fn closed(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Closed, message)
    }

    /// A device error, with what the store was doing when it happened.
    pub fn device(context: &str, error: tundra_device::Error) -> Error {
        use tundra_device::ErrorKind as D;
        let kind = match error.kind() {
            D::DriveFull => ErrorKind::Full,
            D::Corrupted => ErrorKind::Corrupted,
            D::Closed => ErrorKind::Closed,
            // An out-of-range request comes from a layout this store computed: treat it as the
            // drive failing the request, not as the caller's mistake.
            _ => ErrorKind::Io,
        };
        Error { kind, message: format!("{context}: {error}"), source: Some(Box::new(error)) }
    }

    /// An overflow-store (redb) error, with what the store was doing.
    pub fn overflow(context: &str, error: impl std::error::Error + Send + Sync + 'static) -> Error {
        let message = format!("{context}: {error}");
        // The drive region under redb reports a full region or drive as an I/O error of kind
        // StorageFull (see overflow.rs); keep that a `Full` for the caller.
        let kind = if message.contains(crate::overflow::REGION_FULL) { ErrorKind::Full } else { ErrorKind::Io };
        Error { kind, message, source: Some(Box::new(error)) }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
