//! The Rust client of Tundra's native protocol (docs/protocol.md): one blocking TCP connection
//! to a node, used from one thread.
//!
//! Every opcode has a blocking method (`read_page`, `write_page`, ...). For a queue depth above
//! one on a single connection, `submit_*` sends a request without waiting and returns its
//! [`RequestId`]; `wait` takes one request's answer and `wait_any` the next answer to arrive.
//! Answers that arrive for other requests while waiting are kept until asked for.
//!
//! Submitted requests are buffered and sent together by the next `wait`, `wait_any` or `send`
//! (or when the buffer fills), so that a burst of submissions costs one write.
//!
//! Version 2's redo calls (appends, reads at an LSN, reader leases) are in `redo.rs`; on a
//! connection whose hello chose version 1 they are refused before anything is sent.
//!
//! What the protocol costs per request against in-process calls is measured apart, by
//! `tundra-bench protocol` (crates/tundra-bench).

mod error;
mod redo;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use tundra_proto::frame::{
    self, ClientHello, FLAG_CLOSE, FrameHeader, HEADER_BYTES, NOTICE_ID, RESPONSE_FLAGS, SERVER_HELLO_BYTES,
    ServerHello,
};
use tundra_proto::message::MAX_STRING_BYTES;
use tundra_proto::message::decode_refusal;
use tundra_proto::{
    HeavyResult, MAX_BODY_BYTES, MAX_PAGES_PER_READ, Opcode, Reply, Request, Status, VERSION_MAX, VERSION_MIN,
    VolumeInfo, VolumeSpec, WriteMode,
};

pub use error::{Error, Result};

/// Answers read ahead: sixteen 16 KiB pages, so that a queue of 16 reads drains in few reads.
const READ_BUFFER_BYTES: usize = 256 << 10;
/// Requests gathered before a write.
const WRITE_BUFFER_BYTES: usize = 256 << 10;

/// How a client connects and how long it waits. `Default` gives the documented values.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// For each address the name resolves to.
    pub connect_timeout: Duration,
    /// How long one read of an answer may block. A timeout ends the connection: the client no
    /// longer knows where the next frame starts. `None` waits forever.
    pub read_timeout: Option<Duration>,
    /// How long one write may block. `None` waits forever.
    pub write_timeout: Option<Duration>,
    /// Requests in flight at most; a submission beyond this first reads one answer. Bounds what
    /// both directions of the connection hold, so that client and server never both block
    /// writing (docs/protocol.md, "Deadlock and queue depth").
    pub max_in_flight: usize,
    /// The protocol versions offered in the hello; other values are for testing negotiation.
    pub min_version: u16,
    pub max_version: u16,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            connect_timeout: Duration::from_secs(5),
            read_timeout: Some(Duration::from_secs(60)),
            write_timeout: Some(Duration::from_secs(60)),
            max_in_flight: 64,
            min_version: VERSION_MIN,
            max_version: VERSION_MAX,
        }
    }
}

/// Names a request in flight on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why the connection ended.
#[derive(Clone, Debug)]
struct Ended {
    status: Option<Status>,
    message: String,
}

impl Ended {
    fn error(&self) -> Error {
        Error::Closed { status: self.status, message: self.message.clone() }
    }
}

/// One connection to a node.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    version: u16,
    max_in_flight: usize,
    next_id: u64,
    /// The opcode of each request sent and not yet answered, by id.
    in_flight: HashMap<u64, Opcode>,
    /// Answers received and not yet taken, by id, and the order they arrived in. `arrived` may
    /// name ids `wait` took since; `wait_any` skips them.
    answered: HashMap<u64, Result<Reply>>,
    arrived: VecDeque<u64>,
    ended: Option<Ended>,
    /// Reused for encoding request heads.
    scratch: Vec<u8>,
}

impl Client {
    /// Connects with the default configuration and negotiates the protocol version.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Client> {
        Client::connect_with(addr, &ClientConfig::default())
    }

    pub fn connect_with(addr: impl ToSocketAddrs, config: &ClientConfig) -> Result<Client> {
        assert!(config.max_in_flight >= 1, "max_in_flight must allow one request");
        let stream = open(addr, config.connect_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(config.read_timeout)?;
        stream.set_write_timeout(config.write_timeout)?;
        let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream.try_clone()?);
        let hello = ClientHello { min_version: config.min_version, max_version: config.max_version };
        let version = handshake(&stream, &mut reader, hello)?;
        Ok(Client {
            reader,
            writer: BufWriter::with_capacity(WRITE_BUFFER_BYTES, stream),
            version,
            max_in_flight: config.max_in_flight,
            next_id: 1,
            in_flight: HashMap::new(),
            answered: HashMap::new(),
            arrived: VecDeque::new(),
            ended: None,
            scratch: Vec::new(),
        })
    }

    /// The protocol version the hello chose.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Requests sent (or buffered) and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    // Blocking calls, one per opcode.

    /// Sends `payload` and returns the echo.
    pub fn ping(&mut self, payload: &[u8]) -> Result<Vec<u8>> {
        match self.call(Request::Ping { payload })? {
            Reply::Pong(echo) => Ok(echo),
            other => Err(unexpected(Opcode::Ping, &other)),
        }
    }

    pub fn volume_lookup(&mut self, name: &str) -> Result<VolumeInfo> {
        self.call_volume(Request::VolumeLookup { name })
    }

    pub fn volume_create(&mut self, spec: &VolumeSpec) -> Result<VolumeInfo> {
        self.call_volume(Request::volume_create(spec))
    }

    /// Creates a volume with `replicas` copies on the nodes of the server's cluster.
    pub fn volume_create_replicated(&mut self, spec: &VolumeSpec, replicas: u8) -> Result<VolumeInfo> {
        let request = match Request::volume_create(spec) {
            Request::VolumeCreate { name, size_bytes, page_size, mode, .. } => {
                Request::VolumeCreate { name, size_bytes, page_size, mode, replicas }
            }
            other => other,
        };
        self.call_volume(request)
    }

    pub fn volume_list(&mut self) -> Result<Vec<VolumeInfo>> {
        match self.call(Request::VolumeList)? {
            Reply::Volumes(infos) => Ok(infos),
            other => Err(unexpected(Opcode::VolumeList, &other)),
        }
    }

    pub fn volume_resize(&mut self, name: &str, size_bytes: u64) -> Result<VolumeInfo> {
        self.call_volume(Request::VolumeResize { name, size_bytes })
    }

    pub fn volume_delete(&mut self, name: &str) -> Result<()> {
        self.call_done(Request::VolumeDelete { name })
    }

    /// Returns the page: exactly the volume's page size.
    pub fn read_page(&mut self, volume: u32, page: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_page_into(volume, page, &mut out)?;
        Ok(out)
    }

    /// Replaces `out` with the page.
    pub fn read_page_into(&mut self, volume: u32, page: u64, out: &mut Vec<u8>) -> Result<()> {
        match self.call(Request::ReadPage { volume, page })? {
            Reply::Page(bytes) => {
                *out = bytes;
                Ok(())
            }
            other => Err(unexpected(Opcode::ReadPage, &other)),
        }
    }

    pub fn write_page(&mut self, volume: u32, page: u64, mode: WriteMode, data: &[u8]) -> Result<()> {
        self.call_done(Request::WritePage { volume, page, mode, data })
    }

    pub fn trim(&mut self, volume: u32, first: u64, count: u64) -> Result<()> {
        self.call_done(Request::Trim { volume, first, count })
    }

    /// Returns once every write answered before this call is durable; `None` flushes every
    /// volume.
    pub fn flush(&mut self, volume: Option<u32>) -> Result<()> {
        self.call_done(Request::Flush { volume })
    }

    pub fn heavy_compress(&mut self, volume: u32, first: u64, count: u64) -> Result<HeavyResult> {
        match self.call(Request::HeavyCompress { volume, first, count })? {
            Reply::Heavy(result) => Ok(result),
            other => Err(unexpected(Opcode::HeavyCompress, &other)),
        }
    }

    /// The node's statistics text (JSON by convention), for one volume or the node.
    /// A cluster operation (JSON text) asked of the node; its answer as JSON text.
    pub fn cluster_admin(&mut self, request: &str) -> Result<String> {
        match self.call(Request::ClusterAdmin { request })? {
            Reply::Admin(text) => Ok(text),
            other => Err(unexpected(Opcode::ClusterAdmin, &other)),
        }
    }

    pub fn stats(&mut self, volume: Option<u32>) -> Result<String> {
        match self.call(Request::Stats { volume })? {
            Reply::Stats(text) => Ok(text),
            other => Err(unexpected(Opcode::Stats, &other)),
        }
    }

    /// Sends `request` and waits for its answer.
    pub fn call(&mut self, request: Request<'_>) -> Result<Reply> {
        let id = self.submit(request)?;
        self.wait(id)
    }

    fn call_volume(&mut self, request: Request<'_>) -> Result<VolumeInfo> {
        let opcode = request.opcode();
        match self.call(request)? {
            Reply::Volume(info) => Ok(info),
            other => Err(unexpected(opcode, &other)),
        }
    }

    fn call_done(&mut self, request: Request<'_>) -> Result<()> {
        let opcode = request.opcode();
        match self.call(request)? {
            Reply::Done => Ok(()),
            other => Err(unexpected(opcode, &other)),
        }
    }

    // Pipelining.

    pub fn submit_read_page(&mut self, volume: u32, page: u64) -> Result<RequestId> {
        self.submit(Request::ReadPage { volume, page })
    }

    pub fn submit_write_page(&mut self, volume: u32, page: u64, mode: WriteMode, data: &[u8]) -> Result<RequestId> {
        self.submit(Request::WritePage { volume, page, mode, data })
    }

    pub fn submit_trim(&mut self, volume: u32, first: u64, count: u64) -> Result<RequestId> {
        self.submit(Request::Trim { volume, first, count })
    }

    pub fn submit_flush(&mut self, volume: Option<u32>) -> Result<RequestId> {
        self.submit(Request::Flush { volume })
    }

    /// Buffers `request` for sending and returns its id. With `max_in_flight` requests in
    /// flight, first reads answers until one is taken off the wire (it is kept for `wait`).
    pub fn submit(&mut self, request: Request<'_>) -> Result<RequestId> {
        self.check_open()?;
        check_fits(&request)?;
        let opcode = request.opcode();
        if opcode.since() > self.version {
            let message = format!(
                "{opcode} needs protocol version {}; the server chose version {}",
                opcode.since(),
                self.version
            );
            return Err(Error::Status { status: Status::UnknownOpcode, message });
        }
        while self.in_flight.len() >= self.max_in_flight {
            self.receive_one()?;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.scratch.clear();
        request.encode_head(&mut self.scratch);
        let parts = [self.scratch.as_slice(), request.trailing_data()];
        if let Err(error) = frame::write_frame(&mut self.writer, request.opcode().code(), 0, id, &parts) {
            return Err(self.lose(Error::Io(error)));
        }
        self.in_flight.insert(id, request.opcode());
        Ok(RequestId(id))
    }

    /// Sends every buffered request now.
    pub fn send(&mut self) -> Result<()> {
        self.check_open()?;
        io::Write::flush(&mut self.writer).map_err(|error| self.lose(Error::Io(error)))
    }

    /// Waits for the answer to `id`, keeping any other answers that arrive first.
    pub fn wait(&mut self, id: RequestId) -> Result<Reply> {
        loop {
            if let Some(result) = self.answered.remove(&id.0) {
                return result;
            }
            self.check_open()?;
            if !self.in_flight.contains_key(&id.0) {
                return Err(Error::NotPending(id));
            }
            self.receive_one()?;
        }
    }

    /// Waits for the next answer, in the order answers arrived. The outer error is the
    /// connection's: every request still in flight is lost with it.
    pub fn wait_any(&mut self) -> Result<(RequestId, Result<Reply>)> {
        loop {
            while let Some(id) = self.arrived.pop_front() {
                if let Some(result) = self.answered.remove(&id) {
                    return Ok((RequestId(id), result));
                }
            }
            self.check_open()?;
            if self.in_flight.is_empty() {
                return Err(Error::NothingInFlight);
            }
            self.receive_one()?;
        }
    }

    fn check_open(&self) -> Result<()> {
        match &self.ended {
            Some(ended) => Err(ended.error()),
            None => Ok(()),
        }
    }

    /// Reads one frame and files its answer. Buffered requests are sent first unless a whole
    /// frame is already buffered: while answers are waiting, submissions pile up and go out
    /// together when the answers run dry, which is what makes a deep queue cheaper per request.
    fn receive_one(&mut self) -> Result<()> {
        if !self.frame_buffered()
            && let Err(error) = io::Write::flush(&mut self.writer)
        {
            return Err(self.lose(Error::Io(error)));
        }
        let (header, body) = match read_frame(&mut self.reader) {
            Ok(frame) => frame,
            Err(error) => return Err(self.lose(error)),
        };
        match self.file_answer(header, body) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.lose(error)),
        }
    }

    /// True when the read buffer holds a whole frame, so reading it cannot block.
    fn frame_buffered(&self) -> bool {
        let buffered = self.reader.buffer();
        buffered
            .first_chunk::<HEADER_BYTES>()
            .is_some_and(|header| buffered.len() >= HEADER_BYTES + FrameHeader::decode(header).body_len())
    }

    fn file_answer(&mut self, header: FrameHeader, body: Vec<u8>) -> Result<()> {
        let Some(status) = Status::from_code(header.code).filter(|status| status.since() <= self.version) else {
            return Err(Error::Protocol(format!("status {} on a version {} connection", header.code, self.version)));
        };
        if header.flags & !RESPONSE_FLAGS != 0 {
            return Err(Error::Protocol(format!("unknown response flags {:#06x}", header.flags)));
        }
        if header.request_id == NOTICE_ID {
            let message = String::from_utf8_lossy(&body).into_owned();
            return Err(Error::Closed { status: Some(status), message });
        }
        let Some(opcode) = self.in_flight.remove(&header.request_id) else {
            return Err(Error::Protocol(format!("an answer to request {} which is not in flight", header.request_id)));
        };
        let result = if status == Status::Ok {
            Ok(Reply::decode(opcode, body).map_err(|error| Error::Protocol(error.to_string()))?)
        } else {
            let (lsn, message) =
                decode_refusal(opcode, status, &body).map_err(|error| Error::Protocol(error.to_string()))?;
            Err(Error::refusal(status, lsn, message))
        };
        let ended = (header.flags & FLAG_CLOSE != 0).then(|| Ended {
            status: result.as_ref().err().and_then(Error::status),
            message: match &result {
                Err(error) => format!("the server closed the connection after {error}"),
                Ok(_) => "the server closed the connection".to_string(),
            },
        });
        self.answered.insert(header.request_id, result);
        self.arrived.push_back(header.request_id);
        if let Some(ended) = ended {
            self.end(ended);
        }
        Ok(())
    }

    /// Ends the connection after `error` and returns `error` for the call that hit it.
    pub(crate) fn lose(&mut self, error: Error) -> Error {
        let ended = match &error {
            Error::Closed { status, message } => Ended { status: *status, message: message.clone() },
            other => Ended { status: other.status(), message: other.to_string() },
        };
        self.end(ended);
        error
    }

    /// Requests in flight are lost; answers already received stay available. The first reason
    /// given is the one kept.
    fn end(&mut self, ended: Ended) {
        self.ended.get_or_insert(ended);
        self.in_flight.clear();
        let _ = self.writer.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.writer.get_ref().peer_addr().ok())
            .field("version", &self.version)
            .field("in_flight", &self.in_flight.len())
            .field("ended", &self.ended.as_ref().map(|ended| &ended.message))
            .finish()
    }
}

fn unexpected(opcode: Opcode, reply: &Reply) -> Error {
    Error::Protocol(format!("{opcode} answered with {reply:?}"))
}

/// Refuses, before anything is sent, a request the wire cannot carry.
fn check_fits(request: &Request<'_>) -> Result<()> {
    if request.longest_string() > MAX_STRING_BYTES {
        let message =
            format!("a name of {} bytes; the wire carries at most {MAX_STRING_BYTES}", request.longest_string());
        return Err(Error::Status { status: Status::Invalid, message });
    }
    if let Request::GetPagesAtLsn(read) = request
        && read.pages.len() > MAX_PAGES_PER_READ
    {
        let message = format!("{} pages; a vectored read names at most {MAX_PAGES_PER_READ}", read.pages.len());
        return Err(Error::Status { status: Status::Invalid, message });
    }
    // The heads in front of trailing data (pages, records, payloads) are at most 36 bytes.
    if request.trailing_data().len() > MAX_BODY_BYTES as usize - 64 {
        let message =
            format!("{} bytes of data; a frame carries at most {MAX_BODY_BYTES}", request.trailing_data().len());
        return Err(Error::Status { status: Status::TooLarge, message });
    }
    Ok(())
}

fn open(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "the address resolved to nothing");
    for candidate in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(Error::Io(last))
}

/// Sends the hello and reads the answer; returns the chosen version.
fn handshake(mut stream: &TcpStream, reader: &mut BufReader<TcpStream>, hello: ClientHello) -> Result<u16> {
    io::Write::write_all(&mut stream, &hello.encode())?;
    let mut bytes = [0u8; SERVER_HELLO_BYTES];
    reader.read_exact(&mut bytes)?;
    let Some(answer) = ServerHello::decode(&bytes) else {
        return Err(Error::Protocol("the peer is not a Tundra node: its hello's magic is wrong".into()));
    };
    if answer.version == 0 {
        // The refusal's reason follows as an error frame; if it cannot be read, say what we know.
        let fallback = Error::Status {
            status: Status::UnsupportedVersion,
            message: format!(
                "the client speaks versions {}..={}, the server {}..={}",
                hello.min_version, hello.max_version, answer.server_min, answer.server_max
            ),
        };
        return Err(match read_frame(reader) {
            Ok((header, body)) => match Status::from_code(header.code) {
                Some(status) if status != Status::Ok => {
                    Error::Status { status, message: String::from_utf8_lossy(&body).into_owned() }
                }
                _ => fallback,
            },
            Err(_) => fallback,
        });
    }
    if answer.version < hello.min_version || answer.version > hello.max_version {
        return Err(Error::Protocol(format!(
            "the server chose version {}, which the client did not offer",
            answer.version
        )));
    }
    Ok(answer.version)
}

/// Reads one frame and verifies it.
fn read_frame(reader: &mut BufReader<TcpStream>) -> Result<(FrameHeader, Vec<u8>)> {
    let mut header_bytes = [0u8; HEADER_BYTES];
    reader.read_exact(&mut header_bytes)?;
    let header = FrameHeader::decode(&header_bytes);
    header.check(MAX_BODY_BYTES).map_err(|error| Error::Protocol(error.to_string()))?;
    let mut body = vec![0u8; header.body_len()];
    reader.read_exact(&mut body)?;
    header.verify(&body).map_err(|error| Error::Protocol(error.to_string()))?;
    Ok((header, body))
}
