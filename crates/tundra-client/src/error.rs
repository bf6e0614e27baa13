//! The client's one error. Its variants tell the caller what to do: a `Status` refused one
//! request and the connection goes on; so did `TooOld`, `NotYet` and `LeaseLost`, the refusals
//! of reads at an LSN and of leases, each with the LSN the reader acts on; every other variant
//! but `NotPending` and `NothingInFlight` means the connection is gone and a new one is needed.

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
    /// The LSN asked for is below the volume's minimum reader LSN, `lsn_min`: that history is
    /// gone. The reader resyncs at or above `lsn_min`. The connection stays usable.
    #[error("TOO_OLD (the minimum reader LSN is {lsn_min}): {message}")]
    TooOld { lsn_min: u64, message: String },
    /// The server's redo is complete only up to `complete_lsn`, short of what the read needs,
    /// even after waiting. Retry later or on another server. The connection stays usable.
    #[error("NOT_YET (complete up to LSN {complete_lsn}): {message}")]
    NotYet { complete_lsn: u64, message: String },
    /// The reader's lease is gone: register again at or above `lsn_min`, the volume's minimum
    /// reader LSN, and resync. The connection stays usable.
    #[error("LEASE_LOST (the minimum reader LSN is {lsn_min}): {message}")]
    LeaseLost { lsn_min: u64, message: String },
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
            Error::TooOld { .. } => Some(Status::TooOld),
            Error::NotYet { .. } => Some(Status::NotYet),
            Error::LeaseLost { .. } => Some(Status::LeaseLost),
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
        Error::refusal(error.code, error.lsn, error.message)
    }
}

impl Error {
    /// A refusal with `status`, typed by what the caller does about it. A status that carries
    /// an LSN comes with one (`lsn` is `None` only for the others).
    pub(crate) fn refusal(status: Status, lsn: Option<u64>, message: String) -> Error {
        let lsn_or_zero = lsn.unwrap_or(0);
        match status {
            Status::TooOld => Error::TooOld { lsn_min: lsn_or_zero, message },
            Status::NotYet => Error::NotYet { complete_lsn: lsn_or_zero, message },
            Status::LeaseLost => Error::LeaseLost { lsn_min: lsn_or_zero, message },
            status => Error::Status { status, message },
        }
    }
}
