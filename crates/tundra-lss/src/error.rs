//! The crate's one error type. Its kinds tell the caller what to do; device errors keep theirs as
//! the source.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is wrong (an element too large, a bad configuration). Nothing changed.
    Invalid,
    /// No room: the store's live data is at its limit, or the drive is short of physical space.
    /// Nothing changed.
    Full,
    /// Stored bytes do not verify. Never wrong data.
    Corrupted,
    /// A device reported an error.
    Io,
    /// The store stopped after a device error in the middle of a change; reopen it.
    Closed,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Invalid => "invalid request",
            ErrorKind::Full => "no space",
            ErrorKind::Corrupted => "corrupted",
            ErrorKind::Io => "I/O error",
            ErrorKind::Closed => "store closed",
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<tundra_device::Error>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), source: None }
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }
    pub fn full(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Full, message)
    }
    pub fn corrupted(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Corrupted, message)
    }
    pub fn closed(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Closed, message)
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<tundra_device::Error> for Error {
    fn from(error: tundra_device::Error) -> Error {
        use tundra_device::ErrorKind as Device;
        let kind = match error.kind() {
            Device::Invalid => ErrorKind::Invalid,
            Device::DriveFull => ErrorKind::Full,
            Device::Corrupted => ErrorKind::Corrupted,
            Device::Closed => ErrorKind::Closed,
            _ => ErrorKind::Io,
        };
        Error { kind, message: error.message().to_string(), source: Some(error) }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
