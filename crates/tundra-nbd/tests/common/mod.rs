//! What the tests share: a server of in-memory exports, and a minimal NBD client written from
//! the protocol document independently of the server's code (its own constants), so that a
//! misreading in one is not copied into the other.

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tundra_nbd::mem::MemExport;
use tundra_nbd::{ExportMap, Limits, Server};

pub const NBDMAGIC: u64 = 0x4e42444d41474943;
pub const IHAVEOPT: u64 = 0x49484156454f5054;
pub const REPLY_MAGIC: u64 = 0x3e889045565a9;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// HAS_FLAGS, SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, CAN_MULTI_CONN, SEND_CACHE.
pub const EXPECTED_TRANSMISSION_FLAGS: u16 = 1 | 1 << 2 | 1 << 3 | 1 << 5 | 1 << 6 | 1 << 8 | 1 << 10;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const FLAG_FUA: u16 = 1;
pub const FLAG_NO_HOLE: u16 = 2;
pub const FLAG_DF: u16 = 4;
pub const FLAG_FAST_ZERO: u16 = 16;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

pub const MIB: u64 = 1024 * 1024;

/// A running server with in-memory exports "vol" (the default, 16 KiB pages) and "small".
pub struct Fixture {
    pub server: Server,
    pub exports: Arc<ExportMap>,
    pub vol: Arc<MemExport>,
    pub small: Arc<MemExport>,
}

impl Fixture {
    pub fn start(vol_size: u64) -> Fixture {
        Fixture::start_with(vol_size, Limits::default())
    }

    pub fn start_with(vol_size: u64, limits: Limits) -> Fixture {
        let vol = Arc::new(MemExport::new(vol_size).with_preferred_block_size(16384));
        let small = Arc::new(MemExport::new(64 * 1024));
        let exports = Arc::new(ExportMap::new());
        exports.insert("vol", "the test volume", vol.clone());
        exports.insert("small", "", small.clone());
        exports.set_default(Some("vol"));
        let server = Server::start_with("127.0.0.1:0", exports.clone(), limits).expect("start server");
        Fixture { server, exports, vol, small }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd://{}/{name}", self.addr())
    }

    /// A client in transmission on `name`.
    pub fn client(&self, name: &str) -> Client {
        Client::go(self.addr(), name)
    }
}

/// One option reply.
#[derive(Debug)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

/// A hand-written NBD client. Panics on anything unexpected; tests want that.
pub struct Client {
    pub reader: BufReader<TcpStream>,
    pub writer: BufWriter<TcpStream>,
    pub stream: TcpStream,
    pub handshake_flags: u16,
    pub size: u64,
    pub transmission_flags: u16,
    next_cookie: u64,
}

impl Client {
    /// Connects and reads the greeting; the client flags are not sent yet.
    pub fn greet(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        // A test that waits for a reply the server never sends fails instead of hanging.
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        let mut client = Client {
            reader: BufReader::new(stream.try_clone().expect("clone")),
            writer: BufWriter::new(stream.try_clone().expect("clone")),
            stream,
            handshake_flags: 0,
            size: 0,
            transmission_flags: 0,
            next_cookie: 1,
        };
        assert_eq!(client.u64(), NBDMAGIC);
        assert_eq!(client.u64(), IHAVEOPT);
        client.handshake_flags = client.u16();
        client
    }

    /// Connects and sends client flags FIXED_NEWSTYLE | NO_ZEROES.
    pub fn connect(addr: SocketAddr) -> Client {
        let mut client = Client::greet(addr);
        assert_eq!(client.handshake_flags, 3, "FIXED_NEWSTYLE | NO_ZEROES");
        client.send_bytes(&3u32.to_be_bytes());
        client
    }

    /// Connects and enters transmission on `name` with NBD_OPT_GO.
    pub fn go(addr: SocketAddr, name: &str) -> Client {
        let mut client = Client::connect(addr);
        let replies = client.info(OPT_GO, name, &[]);
        let last = replies.last().expect("a reply");
        assert_eq!(last.reply_type, REP_ACK, "GO {name}: {replies:?}");
        client
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("send");
        self.writer.flush().expect("send");
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut message = Vec::new();
        message.extend_from_slice(&IHAVEOPT.to_be_bytes());
        message.extend_from_slice(&option.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.send_bytes(&message);
    }

    pub fn option_reply(&mut self) -> OptionReply {
        assert_eq!(self.u64(), REPLY_MAGIC);
        let option = self.u32();
        let reply_type = self.u32();
        let len = self.u32() as usize;
        let data = self.bytes(len);
        OptionReply { option, reply_type, data }
    }

    /// Option replies up to and including the final one (an ACK or an error).
    pub fn option_replies(&mut self) -> Vec<OptionReply> {
        let mut replies = Vec::new();
        loop {
            let reply = self.option_reply();
            let last = reply.reply_type == REP_ACK || reply.reply_type & 0x8000_0000 != 0;
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    /// Sends NBD_OPT_INFO or NBD_OPT_GO and returns the replies; records the size and flags.
    pub fn info(&mut self, option: u32, name: &str, requests: &[u16]) -> Vec<OptionReply> {
        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for request in requests {
            data.extend_from_slice(&request.to_be_bytes());
        }
        self.send_option(option, &data);
        let replies = self.option_replies();
        for reply in &replies {
            if reply.reply_type == REP_INFO && reply.data[..2] == INFO_EXPORT.to_be_bytes() {
                assert_eq!(reply.data.len(), 12);
                self.size = u64::from_be_bytes(reply.data[2..10].try_into().unwrap());
                self.transmission_flags = u16::from_be_bytes(reply.data[10..12].try_into().unwrap());
            }
        }
        replies
    }

    /// Sends one request (and its payload) without waiting for the reply; returns the cookie.
    pub fn send_request(&mut self, flags: u16, command: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.queue_request(flags, command, cookie, offset, length, payload);
        self.writer.flush().expect("send");
        cookie
    }

    /// Buffers one request without flushing.
    pub fn queue_request(&mut self, flags: u16, command: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
        let mut header = Vec::with_capacity(28);
        header.extend_from_slice(&0x25609513u32.to_be_bytes());
        header.extend_from_slice(&flags.to_be_bytes());
        header.extend_from_slice(&command.to_be_bytes());
        header.extend_from_slice(&cookie.to_be_bytes());
        header.extend_from_slice(&offset.to_be_bytes());
        header.extend_from_slice(&length.to_be_bytes());
        self.writer.write_all(&header).expect("send");
        self.writer.write_all(payload).expect("send");
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn reply(&mut self) -> (u32, u64) {
        assert_eq!(self.u32(), 0x67446698, "simple reply magic");
        let error = self.u32();
        let cookie = self.u64();
        (error, cookie)
    }

    /// Sends a request without payload in its reply and returns the error value (0 = success).
    pub fn command(&mut self, flags: u16, command: u16, offset: u64, length: u32) -> u32 {
        let cookie = self.send_request(flags, command, offset, length, &[]);
        let (error, reply_cookie) = self.reply();
        assert_eq!(reply_cookie, cookie);
        error
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        self.read_flags(0, offset, length)
    }

    pub fn read_flags(&mut self, flags: u16, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let cookie = self.send_request(flags, CMD_READ, offset, length, &[]);
        let (error, reply_cookie) = self.reply();
        assert_eq!(reply_cookie, cookie);
        if error != 0 {
            return Err(error);
        }
        Ok(self.bytes(length as usize))
    }

    pub fn write(&mut self, flags: u16, offset: u64, data: &[u8]) -> u32 {
        let cookie = self.send_request(flags, CMD_WRITE, offset, data.len() as u32, data);
        let (error, reply_cookie) = self.reply();
        assert_eq!(reply_cookie, cookie);
        error
    }

    /// Sends NBD_CMD_DISC and checks that the server closes the connection.
    pub fn disconnect(mut self) {
        self.send_request(0, CMD_DISC, 0, 0, &[]);
        self.expect_closed();
    }

    /// Checks that the server closed the connection: the next read finds end of file.
    pub fn expect_closed(&mut self) {
        let mut byte = [0u8; 1];
        match self.reader.read(&mut byte) {
            Ok(0) => {}
            Ok(_) => panic!("server sent more data instead of closing"),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(error) => panic!("server did not close: {error}"),
        }
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        self.reader.read_exact(&mut bytes).expect("receive");
        bytes
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.bytes(2).try_into().unwrap())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.bytes(4).try_into().unwrap())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.bytes(8).try_into().unwrap())
    }
}

/// Compares byte images, reporting the first difference instead of printing megabytes.
#[track_caller]
pub fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    if let Some(offset) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {offset}: {} instead of {}", actual[offset], expected[offset]);
    }
}
