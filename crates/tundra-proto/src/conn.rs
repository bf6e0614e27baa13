//! One connection: the hello, then requests executed one at a time in arrival order (each by
//! `dispatch.rs`).
//!
//! Replies go into a buffered writer that is flushed only when no complete request is waiting
//! in the input buffer, just before the thread would block reading. A client at queue depth 1
//! gets its reply at once; a client that pipelines gets its replies in batches, one write for
//! as many requests as arrived together.

use std::io::{self, BufWriter, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::codes::Status;
use crate::dispatch::{Reply, answer};
use crate::frame::{
    self, CLIENT_HELLO_BYTES, ClientHello, FLAG_CLOSE, FrameError, HEADER_BYTES, MAX_BODY_BYTES, NOTICE_ID, ServerHello,
};
use crate::message::put_refusal_head;
use crate::server::{Activity, Shared};
use crate::service::ServiceError;

/// The input buffer's size between large frames; also the least a read asks for.
const INPUT_BYTES: usize = 256 << 10;
/// The output buffer: large enough for a batch of replies of 16 KiB pages.
const OUTPUT_BYTES: usize = 256 << 10;
/// Error messages are for people; a longer one is cut.
const MAX_MESSAGE_BYTES: usize = 4096;
/// Buffers grown past this by a large frame are given back once it is done.
pub(crate) const KEEP_BYTES: usize = 1 << 20;

pub(crate) fn serve(shared: &Arc<Shared>, id: u64, stream: TcpStream, busy: bool, activity: &Activity) {
    // Errors here are the connection's end, not the server's: the client sees the socket close.
    let _ = serve_connection(shared, &stream, busy, activity);
    let _ = stream.shutdown(Shutdown::Both);
    shared.connection_ended(id);
}

fn serve_connection(shared: &Shared, stream: &TcpStream, busy: bool, activity: &Activity) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(shared.config.write_timeout)?;
    let Some(version) = hello(shared, stream, busy, activity)? else {
        return Ok(());
    };
    // Every read is bounded: inside a request by the request timeout (a stalled client is
    // cut off), between requests by the idle timeout, counted in request-timeout steps.
    stream.set_read_timeout(Some(shared.config.request_timeout))?;
    let mut idle_since = Instant::now();
    let mut input = Input::new();
    let mut output = BufWriter::with_capacity(OUTPUT_BYTES, stream);
    let mut reply = Reply::default();
    loop {
        if shared.is_stopping() {
            return say_shutting_down(&mut output, stream);
        }
        match frame::decode_frame(input.data(), MAX_BODY_BYTES) {
            Ok(Some((frame, used))) => {
                let id = frame.header.request_id;
                match answer(&*shared.service, version, frame.header, frame.body, &mut reply) {
                    Ok(()) => frame::write_frame(&mut output, Status::Ok.code(), 0, id, &[&reply.head, &reply.data])?,
                    Err(error) => {
                        reply.head.clear();
                        put_refusal_head(&mut reply.head, error.code, error.lsn);
                        let parts = [reply.head.as_slice(), message_bytes(&error)];
                        frame::write_frame(&mut output, error.code.code(), 0, id, &parts)?;
                    }
                }
                input.consume(used);
                reply.shrink();
                activity.touch(shared);
                idle_since = Instant::now();
            }
            Ok(None) => {
                output.flush()?;
                let filled = match input.fill(stream) {
                    Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                        if !input.data().is_empty() || idle_since.elapsed() >= shared.config.idle_timeout {
                            // Stalled inside a request, or idle too long: the connection ends.
                            return Ok(());
                        }
                        continue;
                    }
                    other => other?,
                };
                if filled == 0 {
                    if shared.is_stopping() {
                        return say_shutting_down(&mut output, stream);
                    }
                    // The client closed its side: every reply is out already.
                    return Ok(());
                }
            }
            Err(error) => return refuse_frame(&mut output, stream, &error),
        }
    }
}

/// Reads the client's hello and answers it; returns the version chosen, `None` when the
/// connection is refused.
fn hello(shared: &Shared, stream: &TcpStream, busy: bool, activity: &Activity) -> io::Result<Option<u16>> {
    stream.set_read_timeout(Some(shared.config.hello_timeout))?;
    let mut bytes = [0u8; CLIENT_HELLO_BYTES];
    if read_exact_or_eof(stream, &mut bytes)? {
        return Ok(None);
    }
    let (server_min, server_max) = (shared.config.min_version, shared.config.max_version);
    let Some(client) = ClientHello::decode(&bytes) else {
        return refuse_hello(shared, stream, Status::Invalid, "not a Tundra client: the hello's magic is wrong");
    };
    if busy {
        return refuse_hello(shared, stream, Status::Busy, "the server has as many connections as it accepts");
    }
    let Some(version) = client.negotiate(server_min, server_max) else {
        let message = format!(
            "the client speaks protocol versions {}..={}, this server {server_min}..={server_max}",
            client.min_version, client.max_version
        );
        return refuse_hello(shared, stream, Status::UnsupportedVersion, &message);
    };
    // Counted as active before the client can know it is in: a connection the client sees
    // as open is never taken for one still silent in its hello.
    activity.touch(shared);
    let mut writer = stream;
    writer.write_all(&ServerHello { version, server_min, server_max }.encode())?;
    Ok(Some(version))
}

/// Answers a hello with version 0 and the reason as an error frame, then closes. The statuses
/// used here are all version 1's, which every client knows.
fn refuse_hello(shared: &Shared, stream: &TcpStream, status: Status, message: &str) -> io::Result<Option<u16>> {
    debug_assert_eq!(status.since(), 1);
    let (server_min, server_max) = (shared.config.min_version, shared.config.max_version);
    let mut output = BufWriter::new(stream);
    output.write_all(&ServerHello { version: 0, server_min, server_max }.encode())?;
    frame::write_frame(&mut output, status.code(), FLAG_CLOSE, NOTICE_ID, &[message.as_bytes()])?;
    output.flush()?;
    linger(stream)?;
    Ok(None)
}

/// Fills `bytes`; `Ok(true)` if the peer closed (or went silent past the timeout) first.
fn read_exact_or_eof(mut stream: &TcpStream, bytes: &mut [u8]) -> io::Result<bool> {
    match stream.read_exact(bytes) {
        Ok(()) => Ok(false),
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(true)
        }
        Err(error) => Err(error),
    }
}

/// Answers a frame that cannot be trusted, then closes: framing is lost.
fn refuse_frame(output: &mut BufWriter<&TcpStream>, stream: &TcpStream, error: &FrameError) -> io::Result<()> {
    let message = format!("{error}; closing the connection");
    frame::write_frame(output, error.status().code(), FLAG_CLOSE, error.request_id(), &[message.as_bytes()])?;
    output.flush()?;
    linger(stream)
}

/// Tells the client the server is going away. Every request answered before this notice was
/// executed; every other one was not.
fn say_shutting_down(output: &mut BufWriter<&TcpStream>, stream: &TcpStream) -> io::Result<()> {
    let message = "the server is shutting down; requests not answered before this were not executed";
    frame::write_frame(output, Status::ShuttingDown.code(), FLAG_CLOSE, NOTICE_ID, &[message.as_bytes()])?;
    output.flush()?;
    let _ = stream.shutdown(Shutdown::Write);
    Ok(())
}

/// Closes our side, then reads and drops what the client still sends, briefly. Closing a socket
/// with unread input makes the kernel send a reset, which can destroy the error frame before
/// the client reads it.
fn linger(mut stream: &TcpStream) -> io::Result<()> {
    stream.shutdown(Shutdown::Write)?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut sink = [0u8; 16 << 10];
    while Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}

/// An error message as sent: at most `MAX_MESSAGE_BYTES`, cut at a character boundary.
fn message_bytes(error: &ServiceError) -> &[u8] {
    let message = error.message.as_str();
    let mut end = message.len().min(MAX_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message.as_bytes()[..end]
}

/// Request bytes read from the socket and not yet executed.
struct Input {
    buffer: Vec<u8>,
    start: usize,
    end: usize,
}

impl Input {
    fn new() -> Input {
        Input { buffer: vec![0; INPUT_BYTES], start: 0, end: 0 }
    }

    fn data(&self) -> &[u8] {
        &self.buffer[self.start..self.end]
    }

    fn consume(&mut self, used: usize) {
        assert!(used <= self.end - self.start);
        self.start += used;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buffer.len() > KEEP_BYTES {
                self.buffer = vec![0; INPUT_BYTES];
            }
        }
    }

    /// Reads once, after making room for the frame that starts the buffer. Returns the bytes
    /// read, 0 at end of file. The buffer grows at most twofold per read, so a header that
    /// announces a large body costs memory only as its bytes arrive.
    fn fill(&mut self, mut stream: &TcpStream) -> io::Result<usize> {
        let held = self.end - self.start;
        let wanted = match self.data().first_chunk::<HEADER_BYTES>() {
            Some(header) => HEADER_BYTES + frame::FrameHeader::decode(header).body_len(),
            None => HEADER_BYTES,
        };
        if self.start > 0 && self.buffer.len() - self.start < wanted.max(INPUT_BYTES) {
            self.buffer.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = held;
        }
        if self.buffer.len() < wanted {
            let grown = (self.buffer.len() * 2).min(wanted);
            self.buffer.resize(grown, 0);
        }
        debug_assert!(self.end < self.buffer.len());
        loop {
            match stream.read(&mut self.buffer[self.end..]) {
                Ok(read) => {
                    self.end += read;
                    return Ok(read);
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            }
        }
    }
}
