//! The one error type of the codec layer. Its kinds tell a caller what to do; the message says
//! what happened.

use std::fmt;

/// What the caller can do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request itself is wrong (a buffer that is not a page, a level out of range). Nothing
    /// was compressed; fix the request.
    Invalid,
    /// Compressed bytes do not decompress to what they must (a whole page, a whole segment).
    /// Never wrong data: the caller treats the stored copy as lost.
    Corrupted,
    /// The operating system failed or answered something unexpected (reading /proc/stat).
    Io,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorKind::Invalid => "invalid request",
            ErrorKind::Corrupted => "corrupted",
            ErrorKind::Io => "I/O error",
        };
        f.write_str(name)
    }
}

/// A codec-layer error: a kind, a message, and the underlying cause if there is one.
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
