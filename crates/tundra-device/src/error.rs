//! The one error type of the device layer. Its kinds tell a caller what to do; the message says
//! what happened.

use std::fmt;

/// What the caller can do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request itself is wrong (misaligned buffer, address out of range). Nothing changed.
    Invalid,
    /// The drive has no physical space for the data. Nothing changed; free space (TRIM) and retry.
    DriveFull,
    /// Data read back does not verify (checksum, address or format mismatch). Never wrong data.
    Corrupted,
    /// The operating system or the media reported an error.
    Io,
    /// The device was shut down or has crashed (fault injection).
    Closed,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorKind::Invalid => "invalid request",
            ErrorKind::DriveFull => "drive full",
            ErrorKind::Corrupted => "corrupted",
            ErrorKind::Io => "I/O error",
            ErrorKind::Closed => "device closed",
        };
        f.write_str(name)
    }
}

/// A device-layer error: a kind, a message, and the underlying cause if there is one.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<std::io::Error>,
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

    pub fn drive_full(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::DriveFull, message)
    }

    pub fn closed(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Closed, message)
    }

    /// Wraps an operating-system error with what we were doing when it happened.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error { kind: ErrorKind::Io, message: context.into(), source: Some(source) }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
