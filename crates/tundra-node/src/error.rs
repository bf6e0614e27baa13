//! The node's one error type: the classes the protocols report (NBD and native statuses, the
//! command line's messages), and how the store's and the device's errors map to them.

/// What went wrong, in the classes the protocols report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    NoSpace(String),
    #[error("damaged data: {0}")]
    Corrupted(String),
    #[error("I/O error: {0}")]
    Io(String),
    #[error("{0}")]
    Closed(String),
    /// The node holds as much as it takes for now (a volume's unapplied redo at its bound):
    /// nothing changed; the caller tries again later.
    #[error("{0}")]
    Busy(String),
}

impl Error {
    /// The message without its class, for a protocol that sends the class as a status.
    pub fn message(&self) -> &str {
        match self {
            Error::Invalid(m)
            | Error::NotFound(m)
            | Error::Exists(m)
            | Error::NoSpace(m)
            | Error::Corrupted(m)
            | Error::Io(m)
            | Error::Closed(m)
            | Error::Busy(m) => m,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<tundra_store::Error> for Error {
    fn from(e: tundra_store::Error) -> Error {
        use tundra_store::ErrorKind as K;
        // The protocols name the class (INVALID, NO_SPACE ...): the message is the store's
        // words alone, with the device's reason where there is one, so nothing is said twice.
        let mut message = e.message().to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            // A device error restates the store's message with its own class: only what it
            // adds (the system's reason underneath) is kept.
            let text = c.to_string();
            if !text.contains(message.as_str()) {
                message = format!("{message}: {text}");
            }
            cause = c.source();
        }
        match e.kind() {
            K::Invalid => Error::Invalid(message),
            K::Full => Error::NoSpace(message),
            K::Corrupted => Error::Corrupted(message),
            K::Io => Error::Io(message),
            K::Closed => Error::Closed(message),
            _ => Error::Io(message),
        }
    }
}

impl From<tundra_device::Error> for Error {
    fn from(e: tundra_device::Error) -> Error {
        tundra_store::Error::from(e).into()
    }
}
