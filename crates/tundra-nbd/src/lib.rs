//! An NBD (Network Block Device) server: how PostgreSQL and MariaDB hosts reach Tundra volumes.
//!
//! [`Server::start`] listens on one address and serves each connection on its own thread; the
//! caller supplies the volumes through [`Exports`] (a name → [`Export`] lookup; [`ExportMap`] is
//! a ready one). [`mem::MemExport`] is an in-memory export for tests.
//!
//! Supported: the fixed newstyle handshake (`NBD_FLAG_FIXED_NEWSTYLE`, `NBD_FLAG_NO_ZEROES`);
//! the options `NBD_OPT_GO`, `NBD_OPT_INFO` (with `NBD_INFO_EXPORT`, `NBD_INFO_BLOCK_SIZE`, and
//! `NBD_INFO_NAME` and `NBD_INFO_DESCRIPTION` when asked), `NBD_OPT_EXPORT_NAME`,
//! `NBD_OPT_LIST` and `NBD_OPT_ABORT`; the commands `NBD_CMD_READ`, `WRITE`, `FLUSH`, `TRIM`,
//! `WRITE_ZEROES` (with `NBD_CMD_FLAG_NO_HOLE`), `CACHE` (accepted and ignored) and `DISC`, with
//! `NBD_CMD_FLAG_FUA`; transmission flags `HAS_FLAGS`, `SEND_FLUSH`, `SEND_FUA`, `SEND_TRIM`,
//! `SEND_WRITE_ZEROES`, `SEND_CACHE` and `CAN_MULTI_CONN`. Block sizes advertised: minimum 1
//! (any alignment), preferred from [`Export::preferred_block_size`], maximum 32 MiB. Pipelined
//! requests run side by side, up to [`Limits::max_requests_in_flight`] per connection, and
//! are answered as each finishes, out of order where a later one finishes first (simple
//! replies; the client matches them by cookie); replies finishing together leave in one write.
//!
//! Not supported, and refused cleanly: structured replies, block status and metadata contexts,
//! extended headers, TLS (`NBD_REP_ERR_UNSUP` to their options); fast zero (not advertised,
//! `NBD_CMD_FLAG_FAST_ZERO` is `EINVAL`); read-only exports; resize; the oldstyle and non-fixed
//! newstyle handshakes (the connection is closed).
//!
//! Errors. A request is checked before the export sees it: unknown command or flag, zero
//! length, a read, write or cache over 32 MiB, or a flush with nonzero offset or
//! length is `EINVAL`; a range past the end is `ENOSPC` for writes and write-zeroes and
//! `EINVAL` otherwise. A refused write's payload is still read and discarded, whatever its
//! length, so the connection continues. Errors from the export map by [`ExportErrorKind`]:
//! Invalid → `EINVAL` (22), NoSpace → `ENOSPC` (28), Io → `EIO` (5), Overflow → `EOVERFLOW`
//! (75), NotSupported → `ENOTSUP` (95), Perm → `EPERM` (1), Shutdown → `ESHUTDOWN` (108). The
//! connection is closed when the stream cannot be trusted (a bad magic, unknown client flags,
//! or an `NBD_OPT_EXPORT_NAME` that cannot be served, which has no error reply), after an
//! `ESHUTDOWN` reply (the export is gone: its volume was deleted), and by
//! [`Server::close_export`].
//!
//! Limits ([`Limits`]): connections are capped per server, the oldest still negotiating (else
//! one idle past a bound) is closed to admit a new one; negotiation and every read inside a
//! request are timed, while a client may idle between requests; a write's payload buffer grows
//! as its bytes arrive and all connections share one budget of buffered bytes; each connection's
//! requests in flight are bounded in number and in payload bytes, and past that bound the
//! server reads no more of its requests until one is answered.
//!
//! This crate knows the NBD wire format and nothing of pages, chunks or compression: an export
//! is a range of bytes.

mod connection;
mod error;
mod export;
mod handshake;
mod limits;
pub mod mem;
mod pipeline;
mod proto;
mod server;
mod stats;
mod transmission;

pub use error::{ExportError, ExportErrorKind};
pub use export::{Export, ExportMap, Exports};
pub use limits::Limits;
pub use proto::{MAX_REQUEST_BYTES, MIN_BLOCK_BYTES};
pub use server::{SHUTDOWN_GRACE, Server};
pub use stats::Stats;
