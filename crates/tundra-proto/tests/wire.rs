//! The server against a raw socket: the hello, framing errors and which of them the connection
//! survives, pipelining, shutdown. Bytes are written by hand here, so these tests also pin the
//! wire format independently of the client crate.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tundra_env::{Rng, seed_from_env};
use tundra_proto::frame::{
    ClientHello, FLAG_CLOSE, FrameHeader, HEADER_BYTES, MAGIC, NOTICE_ID, SERVER_HELLO_BYTES, ServerHello, write_frame,
};
use tundra_proto::mem::MemService;
use tundra_proto::{
    HeavyResult, MAX_BODY_BYTES, Opcode, Reply, Request, Server, ServerConfig, Service, ServiceError, Status,
    VERSION_MAX, VolumeInfo, VolumeMode, VolumeSpec, WriteMode,
};

fn start(config: ServerConfig) -> (Server, Arc<MemService>) {
    let service = Arc::new(MemService::new());
    let server = Server::start_with("127.0.0.1:0", service.clone(), config).unwrap();
    (server, service)
}

fn connect_raw(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.local_addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

fn read_hello(stream: &mut TcpStream) -> ServerHello {
    let mut bytes = [0u8; SERVER_HELLO_BYTES];
    stream.read_exact(&mut bytes).unwrap();
    ServerHello::decode(&bytes).expect("the server's magic")
}

/// A connection past a successful hello.
fn open(server: &Server) -> TcpStream {
    let mut stream = connect_raw(server);
    stream.write_all(&ClientHello::CURRENT.encode()).unwrap();
    assert_eq!(read_hello(&mut stream).version, VERSION_MAX);
    stream
}

fn send(stream: &mut TcpStream, opcode: u16, id: u64, body: &[u8]) {
    let mut bytes = Vec::new();
    write_frame(&mut bytes, opcode, 0, id, &[body]).unwrap();
    stream.write_all(&bytes).unwrap();
}

fn send_request(stream: &mut TcpStream, id: u64, request: Request<'_>) {
    send(stream, request.opcode().code(), id, &request.encode_body());
}

/// Reads one response frame and checks its checksum.
fn receive(stream: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    let mut header = [0u8; HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = FrameHeader::decode(&header);
    let mut body = vec![0u8; header.body_len()];
    stream.read_exact(&mut body).unwrap();
    header.verify(&body).unwrap();
    (header, body)
}

fn status_of(header: &FrameHeader) -> Status {
    Status::from_code(header.code).unwrap()
}

/// True when the server has closed the connection (end of file or reset, no more frames).
fn is_closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0) | Err(_))
}

fn ping_works(stream: &mut TcpStream, id: u64) {
    send_request(stream, id, Request::Ping { payload: b"still here" });
    let (header, body) = receive(stream);
    assert_eq!((status_of(&header), header.request_id, body.as_slice()), (Status::Ok, id, &b"still here"[..]));
}

#[test]
fn hello_negotiates_the_highest_common_version() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = connect_raw(&server);
    stream.write_all(&ClientHello { min_version: 1, max_version: 9 }.encode()).unwrap();
    let hello = read_hello(&mut stream);
    assert_eq!(hello, ServerHello { version: 2, server_min: 1, server_max: 2 });
    ping_works(&mut stream, 1);
    // A client that speaks only version 1 still gets version 1.
    let mut old = connect_raw(&server);
    old.write_all(&ClientHello { min_version: 1, max_version: 1 }.encode()).unwrap();
    assert_eq!(read_hello(&mut old), ServerHello { version: 1, server_min: 1, server_max: 2 });
    ping_works(&mut old, 1);
}

#[test]
fn an_unsupported_version_is_refused_with_both_ranges() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = connect_raw(&server);
    stream.write_all(&ClientHello { min_version: 3, max_version: 4 }.encode()).unwrap();
    let hello = read_hello(&mut stream);
    assert_eq!(hello, ServerHello { version: 0, server_min: 1, server_max: 2 });
    let (header, body) = receive(&mut stream);
    assert_eq!(status_of(&header), Status::UnsupportedVersion);
    assert_eq!((header.request_id, header.flags), (NOTICE_ID, FLAG_CLOSE));
    let message = String::from_utf8(body).unwrap();
    assert!(message.contains("3..=4") && message.contains("1..=2"), "{message}");
    assert!(is_closed(&mut stream));
}

#[test]
fn a_wrong_magic_is_refused() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = connect_raw(&server);
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_hello(&mut stream).version, 0);
    let (header, _) = receive(&mut stream);
    assert_eq!(status_of(&header), Status::Invalid);
    assert!(is_closed(&mut stream));
}

#[test]
fn a_silent_client_is_dropped_after_the_hello_timeout() {
    let config = ServerConfig { hello_timeout: Duration::from_millis(100), ..ServerConfig::default() };
    let (server, _) = start(config);
    let mut stream = connect_raw(&server);
    stream.write_all(&MAGIC[..4]).unwrap();
    assert!(is_closed(&mut stream));
}

#[test]
fn every_opcode_answers_on_the_wire() {
    let (server, service) = start(ServerConfig::default());
    let mut stream = open(&server);
    let page = vec![0x5A; 8192];
    let requests = [
        Request::VolumeCreate {
            name: "db",
            size_bytes: 8192 * 64,
            page_size: 8192,
            mode: VolumeMode::Normal,
            replicas: 1,
        },
        Request::VolumeLookup { name: "db" },
        Request::VolumeList,
        Request::VolumeResize { name: "db", size_bytes: 8192 * 128 },
        Request::WritePage { volume: 1, page: 3, mode: WriteMode::Zstd, data: &page },
        Request::ReadPage { volume: 1, page: 3 },
        Request::Flush { volume: Some(1) },
        Request::HeavyCompress { volume: 1, first: 0, count: 128 },
        Request::Stats { volume: None },
        Request::Trim { volume: 1, first: 3, count: 1 },
        Request::ReadPage { volume: 1, page: 3 },
        Request::VolumeDelete { name: "db" },
        Request::Ping { payload: b"" },
    ];
    for (i, request) in requests.iter().enumerate() {
        send_request(&mut stream, i as u64 + 1, *request);
    }
    let mut replies = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let (header, body) = receive(&mut stream);
        assert_eq!(header.request_id, i as u64 + 1, "answers come in order from a version 1 or 2 server");
        assert_eq!(status_of(&header), Status::Ok, "{:?}: {}", request.opcode(), String::from_utf8_lossy(&body));
        replies.push(Reply::decode(request.opcode(), body).unwrap());
    }
    let info =
        VolumeInfo { id: 1, name: "db".into(), size_bytes: 8192 * 64, page_size: 8192, mode: VolumeMode::Normal };
    let grown = VolumeInfo { size_bytes: 8192 * 128, ..info.clone() };
    assert_eq!(replies[0], Reply::Volume(info.clone()));
    assert_eq!(replies[1], Reply::Volume(info.clone()));
    assert_eq!(replies[2], Reply::Volumes(vec![info]));
    assert_eq!(replies[3], Reply::Volume(grown));
    assert_eq!(replies[4], Reply::Done);
    assert_eq!(replies[5], Reply::Page(page));
    assert_eq!(replies[7], Reply::Heavy(HeavyResult { pages: 1, segments: 1, bytes_before: 8192, bytes_after: 2048 }));
    assert!(matches!(&replies[8], Reply::Stats(text) if text.contains("\"pages\":1")));
    assert_eq!(replies[10], Reply::Page(vec![0; 8192]));
    assert_eq!(replies[12], Reply::Pong(Vec::new()));
    assert_eq!(service.flush_count(), 1);
    assert_eq!(service.stored_pages(), 0);
}

#[test]
fn an_unknown_opcode_keeps_the_connection() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    send(&mut stream, 999, 5, b"whatever");
    let (header, body) = receive(&mut stream);
    assert_eq!((status_of(&header), header.request_id, header.flags), (Status::UnknownOpcode, 5, 0));
    assert!(String::from_utf8(body).unwrap().contains("999"));
    ping_works(&mut stream, 6);
}

#[test]
fn malformed_bodies_flags_and_id_zero_are_invalid_and_keep_the_connection() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    // A READ_PAGE one byte short.
    send(&mut stream, Opcode::ReadPage.code(), 1, &[0; 11]);
    // Trailing bytes after a lookup's name.
    send(&mut stream, Opcode::VolumeLookup.code(), 2, &[1, 0, b'a', 7]);
    // A flag version 1 does not define.
    let mut bytes = Vec::new();
    write_frame(&mut bytes, Opcode::Ping.code(), 0x8000, 3, &[b""]).unwrap();
    stream.write_all(&bytes).unwrap();
    // Request id 0 is the server's.
    send(&mut stream, Opcode::Ping.code(), 0, b"");
    for id in [1, 2, 3, 0] {
        let (header, _) = receive(&mut stream);
        assert_eq!((status_of(&header), header.request_id, header.flags), (Status::Invalid, id, 0));
    }
    ping_works(&mut stream, 4);
}

#[test]
fn service_errors_carry_their_status_and_keep_the_connection() {
    let (server, service) = start(ServerConfig::default());
    let mut stream = open(&server);
    send_request(&mut stream, 1, Request::VolumeLookup { name: "nope" });
    let (header, body) = receive(&mut stream);
    assert_eq!(status_of(&header), Status::NotFound);
    assert!(String::from_utf8(body).unwrap().contains("nope"));
    service.fail_next(ServiceError::io("the device is gone"));
    send_request(&mut stream, 2, Request::VolumeList);
    let (header, body) = receive(&mut stream);
    assert_eq!(status_of(&header), Status::Io);
    assert_eq!(body, b"the device is gone");
    ping_works(&mut stream, 3);
}

#[test]
fn a_bad_checksum_is_answered_corrupted_then_closed() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    let mut bytes = Vec::new();
    write_frame(&mut bytes, Opcode::Ping.code(), 0, 77, &[b"payload"]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    stream.write_all(&bytes).unwrap();
    let (header, _) = receive(&mut stream);
    assert_eq!((status_of(&header), header.request_id, header.flags), (Status::Corrupted, 77, FLAG_CLOSE));
    assert!(is_closed(&mut stream));
}

#[test]
fn a_too_large_frame_is_refused_from_its_header_then_closed() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    let header =
        FrameHeader { body_len: MAX_BODY_BYTES + 1, code: Opcode::WritePage.code(), flags: 0, request_id: 8, crc: 0 };
    stream.write_all(&header.encode()).unwrap();
    // The client goes on sending part of its body; the server must not wait for all of it.
    stream.write_all(&vec![0u8; 256 << 10]).unwrap();
    let (header, body) = receive(&mut stream);
    assert_eq!((status_of(&header), header.request_id, header.flags), (Status::TooLarge, 8, FLAG_CLOSE));
    assert!(String::from_utf8(body).unwrap().contains("longer than"));
    assert!(is_closed(&mut stream));
}

#[test]
fn a_body_of_the_largest_allowed_size_is_accepted() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    let payload = vec![0xA5u8; MAX_BODY_BYTES as usize];
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        thread::spawn(move || send(&mut stream, Opcode::Ping.code(), 1, &payload))
    };
    let (header, body) = receive(&mut stream);
    writer.join().unwrap();
    assert_eq!((status_of(&header), body.len()), (Status::Ok, MAX_BODY_BYTES as usize));
    assert!(body.iter().all(|&b| b == 0xA5));
    ping_works(&mut stream, 2);
}

#[test]
fn pipelined_requests_are_all_answered_in_order() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    let mut bytes = Vec::new();
    for id in 1..=500u64 {
        write_frame(&mut bytes, Opcode::Ping.code(), 0, id, &[&id.to_le_bytes()]).unwrap();
    }
    stream.write_all(&bytes).unwrap();
    for id in 1..=500u64 {
        let (header, body) = receive(&mut stream);
        assert_eq!((header.request_id, body), (id, id.to_le_bytes().to_vec()));
    }
}

#[test]
fn requests_before_a_half_close_are_all_answered() {
    let (server, _) = start(ServerConfig::default());
    let mut stream = open(&server);
    for id in 1..=20 {
        send_request(&mut stream, id, Request::Ping { payload: b"x" });
    }
    stream.shutdown(Shutdown::Write).unwrap();
    for id in 1..=20 {
        assert_eq!(receive(&mut stream).0.request_id, id);
    }
    assert!(is_closed(&mut stream));
}

#[test]
fn connections_over_the_limit_are_busy() {
    let config = ServerConfig { max_connections: 2, ..ServerConfig::default() };
    let (server, _) = start(config);
    let mut first = open(&server);
    let _second = open(&server);
    let mut third = connect_raw(&server);
    third.write_all(&ClientHello::CURRENT.encode()).unwrap();
    assert_eq!(read_hello(&mut third).version, 0);
    assert_eq!(status_of(&receive(&mut third).0), Status::Busy);
    ping_works(&mut first, 1);
}

/// A service whose every call panics.
struct Panicking;

impl Service for Panicking {
    fn volume_lookup(&self, _: &str) -> Result<VolumeInfo, ServiceError> {
        panic!("deliberate panic in a test service")
    }
    fn volume_create(&self, _: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        unimplemented!()
    }
    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        unimplemented!()
    }
    fn volume_resize(&self, _: &str, _: u64) -> Result<VolumeInfo, ServiceError> {
        unimplemented!()
    }
    fn volume_delete(&self, _: &str) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn read_page(&self, _: u32, _: u64, _: &mut Vec<u8>) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn write_page(&self, _: u32, _: u64, _: WriteMode, _: &[u8]) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn trim(&self, _: u32, _: u64, _: u64) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn flush(&self, _: Option<u32>) -> Result<(), ServiceError> {
        Err(ServiceError::new(Status::Ok, "a service bug: an error with status OK"))
    }
    fn heavy_compress(&self, _: u32, _: u64, _: u64) -> Result<HeavyResult, ServiceError> {
        unimplemented!()
    }
    fn stats(&self, _: Option<u32>) -> Result<String, ServiceError> {
        unimplemented!()
    }
}

#[test]
fn a_panicking_service_answers_internal_and_keeps_the_connection() {
    let server = Server::start("127.0.0.1:0", Arc::new(Panicking)).unwrap();
    let mut stream = open(&server);
    send_request(&mut stream, 1, Request::VolumeLookup { name: "x" });
    let (header, _) = receive(&mut stream);
    assert_eq!((status_of(&header), header.request_id), (Status::Internal, 1));
    send_request(&mut stream, 2, Request::Flush { volume: None });
    let (header, body) = receive(&mut stream);
    assert_eq!(status_of(&header), Status::Internal, "{}", String::from_utf8_lossy(&body));
    ping_works(&mut stream, 3);
}

#[test]
fn shutdown_tells_idle_clients_and_joins_quickly() {
    let (server, _) = start(ServerConfig::default());
    let mut streams: Vec<TcpStream> = (0..4).map(|_| open(&server)).collect();
    ping_works(&mut streams[0], 1);
    let began = Instant::now();
    let report = server.shutdown();
    assert!(began.elapsed() < Duration::from_secs(2), "shutdown took {:?}", began.elapsed());
    // A connection whose thread had not yet gone back to reading when the flag went up may
    // have ended before the count.
    assert!(report.connections <= 4, "{report:?}");
    assert_eq!((report.forced, report.abandoned), (0, 0));
    for stream in &mut streams {
        let (header, body) = receive(stream);
        assert_eq!(
            (status_of(&header), header.request_id, header.flags),
            (Status::ShuttingDown, NOTICE_ID, FLAG_CLOSE)
        );
        assert!(String::from_utf8(body).unwrap().contains("not executed"));
        assert!(is_closed(stream));
    }
}

/// A service whose page reads block until the test lets them go.
struct Stuck {
    entered: parking_lot::Mutex<Option<mpsc::Sender<()>>>,
    release: parking_lot::Mutex<mpsc::Receiver<()>>,
}

impl Service for Stuck {
    fn read_page(&self, _: u32, _: u64, out: &mut Vec<u8>) -> Result<(), ServiceError> {
        if let Some(entered) = self.entered.lock().take() {
            entered.send(()).unwrap();
        }
        let _ = self.release.lock().recv();
        out.resize(8192, 0);
        Ok(())
    }
    fn volume_lookup(&self, _: &str) -> Result<VolumeInfo, ServiceError> {
        unimplemented!()
    }
    fn volume_create(&self, _: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        unimplemented!()
    }
    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        unimplemented!()
    }
    fn volume_resize(&self, _: &str, _: u64) -> Result<VolumeInfo, ServiceError> {
        unimplemented!()
    }
    fn volume_delete(&self, _: &str) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn write_page(&self, _: u32, _: u64, _: WriteMode, _: &[u8]) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn trim(&self, _: u32, _: u64, _: u64) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn flush(&self, _: Option<u32>) -> Result<(), ServiceError> {
        unimplemented!()
    }
    fn heavy_compress(&self, _: u32, _: u64, _: u64) -> Result<HeavyResult, ServiceError> {
        unimplemented!()
    }
    fn stats(&self, _: Option<u32>) -> Result<String, ServiceError> {
        unimplemented!()
    }
}

#[test]
fn shutdown_is_bounded_when_a_service_call_never_returns() {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let service = Arc::new(Stuck {
        entered: parking_lot::Mutex::new(Some(entered_tx)),
        release: parking_lot::Mutex::new(release_rx),
    });
    let config = ServerConfig { shutdown_grace: Duration::from_millis(200), ..ServerConfig::default() };
    let server = Server::start_with("127.0.0.1:0", service, config).unwrap();
    let mut stuck = open(&server);
    let mut idle = open(&server);
    send_request(&mut stuck, 1, Request::ReadPage { volume: 1, page: 0 });
    send_request(&mut stuck, 2, Request::ReadPage { volume: 1, page: 1 });
    entered_rx.recv().unwrap();

    let began = Instant::now();
    let report = server.shutdown();
    let took = began.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert_eq!((report.forced, report.abandoned), (1, 1), "{report:?}");
    assert_eq!(status_of(&receive(&mut idle).0), Status::ShuttingDown);
    // The stuck connection's socket was shut under it: the client sees the connection end.
    assert!(is_closed(&mut stuck));
    // Letting the call return lets the abandoned thread finish.
    drop(release_tx);
}

#[test]
fn random_bytes_after_the_hello_never_stop_the_server() {
    let (server, _) = start(ServerConfig { hello_timeout: Duration::from_millis(200), ..ServerConfig::default() });
    let mut rng = Rng::new(seed_from_env(0x1234_5678_9ABC_DEF0));
    for round in 0..40 {
        let mut stream = if round % 4 == 0 { connect_raw(&server) } else { open(&server) };
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let len = rng.below(4096) as usize;
        let mut garbage = rng.bytes(len);
        if round % 3 == 0 && garbage.len() >= HEADER_BYTES {
            // A plausible header: small length, a real opcode, so the body parser is reached.
            let header = FrameHeader::new(Opcode::ALL[round % 12].code(), 0, 1, &[&garbage[HEADER_BYTES..]]);
            garbage[..HEADER_BYTES].copy_from_slice(&header.encode());
        }
        let _ = stream.write_all(&garbage);
        let _ = stream.shutdown(Shutdown::Write);
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
    }
    let mut stream = open(&server);
    ping_works(&mut stream, 1);
}
