//! The crate's one error: its kind tells the caller what to do, the message says what happened.

use std::fmt;

/// What a caller can do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is wrong; it changed nothing.
    Invalid,
    /// Bytes from the media fail their checks.
    Corrupted,
    /// The device failed; what is in memory may be ahead of the media.
    Io,
    /// No room: the stream holds as much unapplied redo as it may.
    Full,
    /// The stream was stopped after an error, or closed.
    Closed,
}

#[derive(Debug, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

pub type Result<T> = std::result::Result<T, Error>;

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

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let class = match self.kind {
            ErrorKind::Invalid => "invalid request",
            ErrorKind::Corrupted => "corrupted",
            ErrorKind::Io => "I/O error",
            ErrorKind::Full => "redo stream full",
            ErrorKind::Closed => "closed",
        };
        write!(f, "{class}: {}", self.message)
    }
}

impl From<tundra_device::Error> for Error {
    fn from(error: tundra_device::Error) -> Error {
        let kind = match error.kind() {
            tundra_device::ErrorKind::Invalid => ErrorKind::Invalid,
            tundra_device::ErrorKind::Corrupted => ErrorKind::Corrupted,
            tundra_device::ErrorKind::Closed => ErrorKind::Closed,
            _ => ErrorKind::Io,
        };
        Error { kind, message: error.to_string(), source: Some(Box::new(error)) }
    }
}
