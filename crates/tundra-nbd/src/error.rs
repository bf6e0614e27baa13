//! The error an [`Export`](crate::Export) returns, and the NBD error number each kind becomes on
//! the wire.

use std::fmt;

/// What went wrong, as the client will be told: each kind maps to one NBD error value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExportErrorKind {
    /// The request is wrong for this export. `NBD_EINVAL` (22).
    Invalid,
    /// No space for the data (a full drive, a write past the end). `NBD_ENOSPC` (28).
    NoSpace,
    /// The storage failed. `NBD_EIO` (5).
    Io,
    /// A value does not fit. `NBD_EOVERFLOW` (75).
    Overflow,
    /// The export cannot do this. `NBD_ENOTSUP` (95).
    NotSupported,
    /// The export refuses the operation (read-only, fenced). `NBD_EPERM` (1).
    Perm,
    /// The export is going away; the client should disconnect. `NBD_ESHUTDOWN` (108).
    Shutdown,
}

impl ExportErrorKind {
    /// The NBD error value sent in the reply.
    pub fn errno(self) -> u32 {
        match self {
            ExportErrorKind::Invalid => crate::proto::EINVAL,
            ExportErrorKind::NoSpace => crate::proto::ENOSPC,
            ExportErrorKind::Io => crate::proto::EIO,
            ExportErrorKind::Overflow => crate::proto::EOVERFLOW,
            ExportErrorKind::NotSupported => crate::proto::ENOTSUP,
            ExportErrorKind::Perm => crate::proto::EPERM,
            ExportErrorKind::Shutdown => crate::proto::ESHUTDOWN,
        }
    }
}

impl fmt::Display for ExportErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ExportErrorKind::Invalid => "invalid request",
            ExportErrorKind::NoSpace => "no space",
            ExportErrorKind::Io => "I/O error",
            ExportErrorKind::Overflow => "overflow",
            ExportErrorKind::NotSupported => "not supported",
            ExportErrorKind::Perm => "not permitted",
            ExportErrorKind::Shutdown => "shutting down",
        };
        f.write_str(name)
    }
}

/// An export's failure: a kind for the client, a message for the logs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ExportError {
    kind: ExportErrorKind,
    message: String,
}

impl ExportError {
    pub fn new(kind: ExportErrorKind, message: impl Into<String>) -> ExportError {
        ExportError { kind, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::Invalid, message)
    }

    pub fn no_space(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::NoSpace, message)
    }

    pub fn io(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::Io, message)
    }

    pub fn overflow(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::Overflow, message)
    }

    pub fn not_supported(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::NotSupported, message)
    }

    pub fn perm(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::Perm, message)
    }

    pub fn shutdown(message: impl Into<String>) -> ExportError {
        ExportError::new(ExportErrorKind::Shutdown, message)
    }

    pub fn kind(&self) -> ExportErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The NBD error value sent in the reply.
    pub fn errno(&self) -> u32 {
        self.kind.errno()
    }
}
