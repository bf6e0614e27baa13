//! One client connection, from the first byte of the handshake to the close: buffered halves of
//! the socket, negotiation, then transmission. Runs on its own thread.

use std::io::{self, BufReader, BufWriter};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;

use crate::export::Exports;
use crate::server::Shared;
use crate::stats::Counters;
use crate::{handshake, transmission};

/// Request bytes read from the socket at once. Large enough that a burst of pipelined requests
/// arrives in one system call and is answered with one more.
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// Reply bytes gathered before a write. Payloads larger than this go straight to the socket.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// Why a connection ended early.
#[derive(Debug)]
pub(crate) enum Close {
    /// The socket failed or the client went away: nothing to report.
    Io,
    /// The client broke the protocol; the stream cannot be trusted any more.
    Violation(String),
}

impl From<io::Error> for Close {
    fn from(_: io::Error) -> Close {
        Close::Io
    }
}

/// Serves one client until it disconnects, breaks the protocol, or the server stops. A
/// violation is counted and recorded here, before the server's registration of the connection
/// closes its last descriptor, so a client that sees the close also sees the counters.
pub(crate) fn run(stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let result = buffered(&stream).and_then(|(mut reader, mut writer)| {
        serve(&mut reader, &mut writer, &*shared.exports, &shared.counters, &shared.stopping)
    });
    if let Err(Close::Violation(message)) = result {
        Counters::add(&shared.counters.protocol_errors, 1);
        *shared.last_protocol_error.lock() = Some(format!("{peer}: {message}"));
    }
}

/// The two buffered halves of the socket.
fn buffered(stream: &TcpStream) -> Result<(BufReader<TcpStream>, BufWriter<TcpStream>), Close> {
    // Replies are small and latency matters more than packet count: the writer already
    // batches pipelined replies, so Nagle's algorithm would only add delay.
    stream.set_nodelay(true)?;
    let reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream.try_clone()?);
    let writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, stream.try_clone()?);
    Ok((reader, writer))
}

fn serve(
    reader: &mut BufReader<TcpStream>,
    writer: &mut BufWriter<TcpStream>,
    exports: &dyn Exports,
    counters: &Counters,
    stopping: &AtomicBool,
) -> Result<(), Close> {
    let Some(negotiated) = handshake::negotiate(reader, writer, exports, stopping)? else {
        return Ok(());
    };
    Counters::add(&counters.connections_negotiated, 1);
    transmission::serve(reader, writer, &negotiated, counters, stopping)
}
