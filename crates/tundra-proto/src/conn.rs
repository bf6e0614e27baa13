//! One connection: the hello, then requests executed one at a time in arrival order.
//!
//! Replies go into a buffered writer that is flushed only when no complete request is waiting
//! in the input buffer, just before the thread would block reading. A client at queue depth 1
//! gets its reply at once; a client that pipelines gets its replies in batches, one write for
//! as many requests as arrived together.

use std::io::{self, BufWriter, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::codes::{Opcode, Status};
use crate::frame::{
    self, CLIENT_HELLO_BYTES, ClientHello, FLAG_CLOSE, FrameError, HEADER_BYTES, MAX_BODY_BYTES, NOTICE_ID,
    ServerHello, VERSION_MAX, VERSION_MIN,
};
use crate::message::{Request, put_heavy_result, put_volume_info, put_volume_list};
use crate::server::{Activity, Shared};
use crate::service::{Service, ServiceError};
use crate::types::VolumeSpec;

/// The input buffer's size between large frames; also the least a read asks for.
const INPUT_BYTES: usize = 256 << 10;
/// The output buffer: large enough for a batch of replies of 16 KiB pages.
const OUTPUT_BYTES: usize = 256 << 10;
/// Error messages are for people; a longer one is cut.
const MAX_MESSAGE_BYTES: usize = 4096;
/// Buffers grown past this by a large frame are given back once it is done.
const KEEP_BYTES: usize = 1 << 20;

pub(crate) fn serve(shared: &Arc<Shared>, id: u64, stream: TcpStream, busy: bool, activity: &Activity) {
    // Errors here are the connection's end, not the server's: the client sees the socket close.
    let _ = serve_connection(shared, &stream, busy, activity);
    let _ = stream.shutdown(Shutdown::Both);
    shared.connection_ended(id);
}

fn serve_connection(shared: &Shared, stream: &TcpStream, busy: bool, activity: &Activity) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(shared.config.write_timeout)?;
    if !hello(shared, stream, busy, activity)? {
        return Ok(());
    }
    // Every read is bounded: inside a request by the request timeout (a stalled client is
    // cut off), between requests by the idle timeout, counted in request-timeout steps.
    stream.set_read_timeout(Some(shared.config.request_timeout))?;
    let mut idle_since = Instant::now();
    let mut input = Input::new();
    let mut output = BufWriter::with_capacity(OUTPUT_BYTES, stream);
    let mut reply = Vec::new();
    loop {
        if shared.is_stopping() {
            return say_shutting_down(&mut output, stream);
        }
        match frame::decode_frame(input.data(), MAX_BODY_BYTES) {
            Ok(Some((frame, used))) => {
                let id = frame.header.request_id;
                match answer(&*shared.service, frame.header, frame.body, &mut reply) {
                    Ok(()) => frame::write_frame(&mut output, Status::Ok.code(), 0, id, &[&reply])?,
                    Err(error) => frame::write_frame(&mut output, error.code.code(), 0, id, &[message_bytes(&error)])?,
                }
                input.consume(used);
                shrink(&mut reply);
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

/// Reads the client's hello and answers it; `Ok(false)` when the connection is refused.
fn hello(shared: &Shared, stream: &TcpStream, busy: bool, activity: &Activity) -> io::Result<bool> {
    stream.set_read_timeout(Some(shared.config.hello_timeout))?;
    let mut bytes = [0u8; CLIENT_HELLO_BYTES];
    if read_exact_or_eof(stream, &mut bytes)? {
        return Ok(false);
    }
    let Some(client) = ClientHello::decode(&bytes) else {
        return refuse_hello(stream, Status::Invalid, "not a Tundra client: the hello's magic is wrong");
    };
    if busy {
        return refuse_hello(stream, Status::Busy, "the server has as many connections as it accepts");
    }
    let Some(version) = client.negotiate(VERSION_MIN, VERSION_MAX) else {
        let message = format!(
            "the client speaks protocol versions {}..={}, this server {VERSION_MIN}..={VERSION_MAX}",
            client.min_version, client.max_version
        );
        return refuse_hello(stream, Status::UnsupportedVersion, &message);
    };
    // Counted as active before the client can know it is in: a connection the client sees
    // as open is never taken for one still silent in its hello.
    activity.touch(shared);
    let mut writer = stream;
    writer.write_all(&ServerHello { version, server_min: VERSION_MIN, server_max: VERSION_MAX }.encode())?;
    Ok(true)
}

/// Answers a hello with version 0 and the reason as an error frame, then closes.
fn refuse_hello(stream: &TcpStream, status: Status, message: &str) -> io::Result<bool> {
    let mut output = BufWriter::new(stream);
    output.write_all(&ServerHello { version: 0, server_min: VERSION_MIN, server_max: VERSION_MAX }.encode())?;
    frame::write_frame(&mut output, status.code(), FLAG_CLOSE, NOTICE_ID, &[message.as_bytes()])?;
    output.flush()?;
    linger(stream)?;
    Ok(false)
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

/// Executes one request whose frame verified; the reply body goes to `reply`.
fn answer(
    service: &dyn Service,
    header: frame::FrameHeader,
    body: &[u8],
    reply: &mut Vec<u8>,
) -> Result<(), ServiceError> {
    reply.clear();
    if header.flags != 0 {
        return Err(ServiceError::invalid(format!("request flags {:#06x}: version 1 defines none", header.flags)));
    }
    if header.request_id == NOTICE_ID {
        return Err(ServiceError::invalid("request id 0 is reserved for the server's notices"));
    }
    let Some(opcode) = Opcode::from_code(header.code) else {
        return Err(ServiceError::new(Status::UnknownOpcode, format!("opcode {} is not defined", header.code)));
    };
    let request = Request::decode(opcode, body).map_err(|error| ServiceError::invalid(error.to_string()))?;
    // A panicking service must not take the connection's thread (and the client's other
    // requests) with it; the panic message has gone to standard error already.
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| execute(service, request, reply)));
    let result = outcome.unwrap_or_else(|_| Err(ServiceError::internal(format!("the service panicked in {opcode}"))));
    match result {
        Ok(()) if reply.len() > MAX_BODY_BYTES as usize => {
            Err(ServiceError::internal(format!("the {opcode} reply of {} bytes is too large to send", reply.len())))
        }
        Err(error) if error.code == Status::Ok => {
            Err(ServiceError::internal(format!("the service refused {opcode} with status OK: {}", error.message)))
        }
        other => other,
    }
}

fn execute(service: &dyn Service, request: Request<'_>, reply: &mut Vec<u8>) -> Result<(), ServiceError> {
    match request {
        Request::Ping { payload } => reply.extend_from_slice(payload),
        Request::VolumeLookup { name } => put_volume_info(reply, &service.volume_lookup(name)?),
        Request::VolumeCreate { name, size_bytes, page_size, mode } => {
            let spec = VolumeSpec { name: name.to_string(), size_bytes, page_size, mode };
            put_volume_info(reply, &service.volume_create(spec)?);
        }
        Request::VolumeList => put_volume_list(reply, &service.volume_list()?),
        Request::VolumeResize { name, size_bytes } => put_volume_info(reply, &service.volume_resize(name, size_bytes)?),
        Request::VolumeDelete { name } => service.volume_delete(name)?,
        Request::ReadPage { volume, page } => service.read_page(volume, page, reply)?,
        Request::WritePage { volume, page, mode, data } => service.write_page(volume, page, mode, data)?,
        Request::Trim { volume, first, count } => service.trim(volume, first, count)?,
        Request::Flush { volume } => service.flush(volume)?,
        Request::HeavyCompress { volume, first, count } => {
            put_heavy_result(reply, &service.heavy_compress(volume, first, count)?);
        }
        Request::Stats { volume } => reply.extend_from_slice(service.stats(volume)?.as_bytes()),
    }
    Ok(())
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

fn shrink(buffer: &mut Vec<u8>) {
    if buffer.capacity() > KEEP_BYTES {
        *buffer = Vec::new();
    }
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
