//! Counters of what the server did, for the node's metrics: shared atomics the connection
//! threads bump, and [`Stats`], the plain copy a caller reads.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::proto;

/// A snapshot of the server's counters. Every field only grows, except `connections_open`, `requests_in_flight` and
/// `payload_bytes_held`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted since the server started.
    pub connections_accepted: u64,
    /// Connections open now (handshake or transmission).
    pub connections_open: u64,
    /// Connections that entered the transmission phase.
    pub connections_negotiated: u64,
    /// Connections closed at the cap to make room for a new one (negotiating, or idle).
    pub connections_evicted: u64,
    /// New connections refused at the cap because every open one was busy.
    pub connections_refused: u64,
    /// Connections closed because the client stalled inside a request or its handshake, or
    /// its request waited too long for buffer room.
    pub connections_timed_out: u64,
    /// Connections closed because the client broke the protocol (bad magic, unknown client
    /// flags, no fixed newstyle, an `NBD_OPT_EXPORT_NAME` for an unknown export). A client
    /// that hangs up, even in the middle of a message, is not counted.
    pub protocol_errors: u64,
    pub requests_read: u64,
    pub requests_write: u64,
    pub requests_flush: u64,
    pub requests_trim: u64,
    pub requests_write_zeroes: u64,
    pub requests_cache: u64,
    pub requests_disconnect: u64,
    /// Requests with a command this server does not know.
    pub requests_unknown: u64,
    /// Bytes returned by successful reads.
    pub bytes_read: u64,
    /// Bytes stored by successful writes.
    pub bytes_written: u64,
    /// Bytes covered by successful trims.
    pub bytes_trimmed: u64,
    /// Bytes covered by successful write-zeroes.
    pub bytes_zeroed: u64,
    /// Payload bytes the connections hold now (write data received, read data not yet sent),
    /// at most [`crate::Limits::max_buffered_bytes`].
    pub payload_bytes_held: u64,
    /// Replies that carried an error, whatever the cause.
    pub error_replies: u64,
    /// Of those, errors the export returned (the rest are requests the server refused).
    pub export_errors: u64,
    /// Replies sent while a request its connection received earlier was still in flight.
    pub replies_out_of_order: u64,
    /// Requests received and not yet answered, over all connections, now.
    pub requests_in_flight: u64,
}

/// The live counters behind [`Stats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub connections_accepted: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_negotiated: AtomicU64,
    pub connections_evicted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_timed_out: AtomicU64,
    pub protocol_errors: AtomicU64,
    requests: [AtomicU64; 8],
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_trimmed: AtomicU64,
    pub bytes_zeroed: AtomicU64,
    pub error_replies: AtomicU64,
    pub export_errors: AtomicU64,
    pub replies_out_of_order: AtomicU64,
    pub requests_in_flight: AtomicU64,
}

/// Index into `Counters::requests` of the unknown commands.
const UNKNOWN_SLOT: usize = 7;

impl Counters {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn count_request(&self, command: u16) {
        let slot = match command {
            proto::CMD_READ => 0,
            proto::CMD_WRITE => 1,
            proto::CMD_DISC => 2,
            proto::CMD_FLUSH => 3,
            proto::CMD_TRIM => 4,
            proto::CMD_CACHE => 5,
            proto::CMD_WRITE_ZEROES => 6,
            _ => UNKNOWN_SLOT,
        };
        Counters::add(&self.requests[slot], 1);
    }

    pub fn snapshot(&self) -> Stats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            connections_accepted: get(&self.connections_accepted),
            connections_open: get(&self.connections_open),
            connections_negotiated: get(&self.connections_negotiated),
            connections_evicted: get(&self.connections_evicted),
            connections_refused: get(&self.connections_refused),
            connections_timed_out: get(&self.connections_timed_out),
            protocol_errors: get(&self.protocol_errors),
            requests_read: get(&self.requests[0]),
            requests_write: get(&self.requests[1]),
            requests_disconnect: get(&self.requests[2]),
            requests_flush: get(&self.requests[3]),
            requests_trim: get(&self.requests[4]),
            requests_cache: get(&self.requests[5]),
            requests_write_zeroes: get(&self.requests[6]),
            requests_unknown: get(&self.requests[UNKNOWN_SLOT]),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            bytes_trimmed: get(&self.bytes_trimmed),
            bytes_zeroed: get(&self.bytes_zeroed),
            error_replies: get(&self.error_replies),
            export_errors: get(&self.export_errors),
            replies_out_of_order: get(&self.replies_out_of_order),
            requests_in_flight: get(&self.requests_in_flight),
            payload_bytes_held: 0,
        }
    }
}
