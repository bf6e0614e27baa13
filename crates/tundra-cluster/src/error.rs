//! The crate's one error type. Its kinds tell the caller what to do; a refused command changes
//! nothing in the manager's state.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The command is wrong (an unknown node or chunk, a bad configuration, a chunk that is
    /// already placed). Fix the caller.
    Invalid,
    /// No room: too few nodes can take a replica without passing the fullness limit. Add nodes
    /// (or wait for a migration to free some).
    Full,
    /// The command conflicts with one under way (a chunk already moving, a move that is not the
    /// one in flight). Retry after the other finishes.
    Conflict,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Invalid => "invalid command",
            ErrorKind::Full => "cluster full",
            ErrorKind::Conflict => "conflict",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }
    pub fn full(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Full, message)
    }
    pub fn conflict(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Conflict, message)
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
