//! The client's one error. Its variants tell the caller what to do: a `Status` refused one
//! request and the connection goes on; every other variant but `NotPending` and
//! `NothingInFlight` means the connection is gone and a new one is needed.

use std::io;

use tundra_proto::{ServiceError, Status};

use crate::RequestId;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server (or the client, before sending: a name or page too long for the wire)
    /// refused this request. The connection stays usable.
    #[error("{status}: {message}")]
    Status { status: Status, message: String },
    /// The connection failed: connect, read, write or timeout. It is unusable now. (Not marked
    /// as the source: the message already says it, and a chain printed in full would say it
    /// twice.)
    #[error("connection failed: {0}")]
    Io(io::Error),
    /// The peer broke the protocol or speaks another one. The connection is unusable now.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The connection had ended before this call: the server closed it (with `status`, e.g.
    /// `SHUTTING_DOWN`) or an earlier call failed. Requests not answered were lost.
    #[error("the connection is closed: {message}")]
    Closed { status: Option<Status>, message: String },
    /// `wait` for an id that is not in flight (never submitted, or already waited for).
    #[error("request {0} is not in flight")]
    NotPending(RequestId),
    /// `wait_any` with nothing in flight.
    #[error("no request is in flight")]
    NothingInFlight,
}

impl Error {
    /// The protocol status behind the error, if there is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Status { status, .. } => Some(*status),
            Error::Closed { status, .. } => *status,
            _ => None,
        }
    }

    /// True when the connection can no longer be used.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Error::Io(_) | Error::Protocol(_) | Error::Closed { .. })
    }
}

impl From<io::Error> for Error {
    fn from(error: io::Error) -> Error {
        Error::Io(error)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A service's refusal, for code that calls a `Service` in process and a `Client` alike.
impl From<ServiceError> for Error {
    fn from(error: ServiceError) -> Error {
        Error::Status { status: error.code, message: error.message }
    }
}
