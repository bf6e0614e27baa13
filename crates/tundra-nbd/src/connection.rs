//! One client connection, from the first byte of the handshake to the close: buffered halves of
//! the socket, negotiation, then transmission. Runs on its own thread.

use std::io::{self, BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpStream};

use crate::server::{Activity, Shared};
use crate::stats::Counters;
use crate::{handshake, transmission};

/// Request bytes read from the socket at once. Large enough that a burst of pipelined requests
/// arrives in one system call and is answered with one more.
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// Reply bytes gathered before a write. Payloads larger than this go straight to the socket.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// Why a connection ended early.
#[derive(Clone, Debug)]
pub(crate) enum Close {
    /// The socket failed or the client went away: nothing to report.
    Io,
    /// The client stalled inside its handshake or a request past the limits' timeouts, or its
    /// request found no buffer room in time.
    TimedOut,
    /// The export went away (its volume was deleted): the client was told `ESHUTDOWN`.
    Gone,
    /// The client broke the protocol; the stream cannot be trusted any more.
    Violation(String),
}

impl From<io::Error> for Close {
    fn from(error: io::Error) -> Close {
        match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Close::TimedOut,
            _ => Close::Io,
        }
    }
}

/// Serves one client until it disconnects, breaks the protocol, stalls, or the server stops. A
/// violation is counted and recorded here, before the server's registration of the connection
/// closes its last descriptor, so a client that sees the close also sees the counters.
pub(crate) fn run(stream: TcpStream, peer: SocketAddr, shared: &Shared, id: u64, activity: &Activity) {
    let result = serve(&stream, shared, id, activity);
    match result {
        Err(Close::Violation(message)) => {
            Counters::add(&shared.counters.protocol_errors, 1);
            *shared.last_protocol_error.lock() = Some(format!("{peer}: {message}"));
        }
        Err(Close::TimedOut) => Counters::add(&shared.counters.connections_timed_out, 1),
        Ok(()) | Err(Close::Io) | Err(Close::Gone) => {}
    }
}

fn serve(stream: &TcpStream, shared: &Shared, id: u64, activity: &Activity) -> Result<(), Close> {
    // Replies are small and latency matters more than packet count: the writer already
    // batches pipelined replies, so Nagle's algorithm would only add delay.
    stream.set_nodelay(true)?;
    // A client that stops taking replies is cut off rather than holding its buffers forever.
    stream.set_write_timeout(Some(shared.limits.request_timeout))?;
    stream.set_read_timeout(Some(shared.limits.handshake_timeout))?;
    // Both halves borrow the one socket: a connection costs one descriptor (and the server's
    // handle on it), not one per half.
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, stream);
    let entering = || activity.touch(shared.started);
    let Some(negotiated) =
        handshake::negotiate(&mut reader, &mut writer, &*shared.exports, &shared.stopping, &entering)?
    else {
        return Ok(());
    };
    Counters::add(&shared.counters.connections_negotiated, 1);
    shared.negotiated(id, &negotiated.name);
    // From here the timeout bounds each read inside a request; between requests a read that
    // times out is only an idle client, and the wait goes on (transmission.rs).
    stream.set_read_timeout(Some(shared.limits.request_timeout))?;
    writer.flush()?;
    transmission::serve(&mut reader, writer, stream, &negotiated, shared, activity)
}
