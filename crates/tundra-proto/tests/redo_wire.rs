//! Version 2 on a raw socket: the redo opcodes answer on the wire with the documented bodies,
//! an old hello meets the version rule (a version 1 connection refuses the new opcodes, a
//! server that requires version 2 refuses a version 1 hello), a service without redo answers
//! NOT_SUPPORTED, the refusals a reader acts on carry their LSN, argument rules and cut frames
//! are refused without changing anything, and a service that answers wrongly is caught.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tundra_proto::frame::{
    ClientHello, FLAG_CLOSE, FrameHeader, HEADER_BYTES, NOTICE_ID, SERVER_HELLO_BYTES, ServerHello, write_frame,
};
use tundra_proto::mem::MemService;
use tundra_proto::message::decode_refusal;
use tundra_proto::{
    AppendOutcome, HeavyResult, LATEST_LSN, Opcode, PageList, PageLsns, PageRead, PagesRead, ReadAt, RedoAppend,
    RedoStatus, Reply, Request, Server, ServerConfig, Service, ServiceError, Status, VolumeInfo, VolumeMode,
    VolumeSpec, WriteMode,
};

const PAGE: usize = 8192;

fn start(service: Arc<dyn Service>, config: ServerConfig) -> Server {
    Server::start_with("127.0.0.1:0", service, config).unwrap()
}

fn connect(server: &Server, min_version: u16, max_version: u16) -> (TcpStream, ServerHello) {
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(&ClientHello { min_version, max_version }.encode()).unwrap();
    let mut bytes = [0u8; SERVER_HELLO_BYTES];
    stream.read_exact(&mut bytes).unwrap();
    (stream, ServerHello::decode(&bytes).unwrap())
}

fn send(stream: &mut TcpStream, id: u64, request: Request<'_>) {
    let mut bytes = Vec::new();
    write_frame(&mut bytes, request.opcode().code(), 0, id, &[&request.encode_body()]).unwrap();
    stream.write_all(&bytes).unwrap();
}

fn receive(stream: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    let mut header = [0u8; HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = FrameHeader::decode(&header);
    let mut body = vec![0u8; header.body_len()];
    stream.read_exact(&mut body).unwrap();
    header.verify(&body).unwrap();
    (header, body)
}

/// Sends `request` and returns its status and body, checking the id.
fn exchange(stream: &mut TcpStream, id: u64, request: Request<'_>) -> (Status, Vec<u8>) {
    send(stream, id, request);
    let (header, body) = receive(stream);
    assert_eq!((header.request_id, header.flags), (id, 0));
    (Status::from_code(header.code).unwrap(), body)
}

fn ok(stream: &mut TcpStream, id: u64, request: Request<'_>) -> Reply {
    let (status, body) = exchange(stream, id, request);
    assert_eq!(status, Status::Ok, "{}: {}", request.opcode(), String::from_utf8_lossy(&body));
    Reply::decode(request.opcode(), body).unwrap()
}

/// The refusal's status and LSN.
fn refused(stream: &mut TcpStream, id: u64, request: Request<'_>) -> (Status, Option<u64>, String) {
    let (status, body) = exchange(stream, id, request);
    let (lsn, message) = decode_refusal(request.opcode(), status, &body).unwrap();
    (status, lsn, message)
}

fn is_closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0) | Err(_))
}

fn at(request_lsn: u64) -> ReadAt {
    ReadAt { request_lsn, not_modified_since: 0, lease: None }
}

fn append(prev_lsn: u64, end_lsn: u64, records: &[u8]) -> Request<'_> {
    let record_count = u32::from(!records.is_empty());
    Request::AppendRedo(RedoAppend { volume: 1, writer_epoch: 1, prev_lsn, end_lsn, record_count, records })
}

/// A server over a memory service with one volume of 16 pages of 8 KiB, and a version 2
/// connection to it.
fn redo_server() -> (Server, Arc<MemService>, TcpStream) {
    let service = Arc::new(MemService::new());
    let spec = VolumeSpec {
        name: "db".into(),
        size_bytes: 16 * PAGE as u64,
        page_size: PAGE as u32,
        mode: VolumeMode::Normal,
    };
    assert_eq!(service.volume_create(spec).unwrap().id, 1);
    let server = start(service.clone(), ServerConfig::default());
    let (stream, hello) = connect(&server, 1, 2);
    assert_eq!(hello.version, 2);
    (server, service, stream)
}

#[test]
fn every_redo_opcode_answers_on_the_wire() {
    let (_server, service, mut stream) = redo_server();
    let outcome = ok(&mut stream, 1, append(0, 10, b"records"));
    assert_eq!(outcome, Reply::Appended(AppendOutcome::Ok { durable_lsn: 10 }));
    let batches = service.appended_batches(1);
    assert_eq!((batches.len(), batches[0].records.as_slice(), batches[0].record_count), (1, &b"records"[..], 1));
    assert_eq!(ok(&mut stream, 2, append(0, 20, b"x")), Reply::Appended(AppendOutcome::Gap { expected_prev_lsn: 10 }));
    let stale = Request::AppendRedo(RedoAppend {
        volume: 1,
        writer_epoch: 0,
        prev_lsn: 10,
        end_lsn: 20,
        record_count: 0,
        records: b"",
    });
    assert_eq!(ok(&mut stream, 3, stale), Reply::Appended(AppendOutcome::Fenced { epoch: 1 }));
    let status = RedoStatus { writer_epoch: 1, durable_lsn: 10, complete_lsn: 10, lsn_min: 0 };
    assert_eq!(ok(&mut stream, 4, Request::RedoStatus { volume: 1 }), Reply::RedoStatus(status));

    service.put_page_version(1, 2, 7, vec![7; PAGE]);
    let Reply::PageAtLsn(page) = ok(&mut stream, 5, Request::GetPageAtLsn(PageRead { volume: 1, page: 2, at: at(9) }))
    else {
        panic!("a page")
    };
    assert_eq!((page.served_lsn, page.page_lsn, page.data), (9, 7, vec![7; PAGE]));
    let read = PagesRead { volume: 1, pages: PageList::Numbers(&[2, 3]), at: at(LATEST_LSN) };
    let Reply::PagesAtLsn(pages) = ok(&mut stream, 6, Request::GetPagesAtLsn(read)) else { panic!("pages") };
    assert_eq!((pages.served_lsn, pages.page_size, pages.page_lsns.clone()), (10, PAGE as u32, vec![7, 0]));
    assert_eq!(pages.page(0), Some((7, &vec![7; PAGE][..])));
    assert_eq!(pages.page(1), Some((0, &vec![0; PAGE][..])));

    let register = Request::RegisterReader { volume: 1, reader_id: 5, start_lsn: 4 };
    let Reply::Lease(lease) = ok(&mut stream, 7, register) else { panic!("a lease") };
    assert_eq!(lease.granted_lsn, 4);
    let renew = Request::RenewReader { volume: 1, lease_id: lease.lease_id, apply_lsn: 6 };
    let Reply::Renewed(renewal) = ok(&mut stream, 8, renew) else { panic!("a renewal") };
    assert_eq!(renewal.lsn_min, 0);
    assert_eq!(ok(&mut stream, 9, Request::ReleaseReader { volume: 1, lease_id: lease.lease_id }), Reply::Done);
    assert_eq!(service.lease_count(1), 0);
}

#[test]
fn refusals_a_reader_acts_on_carry_their_lsn() {
    let (_server, service, mut stream) = redo_server();
    ok(&mut stream, 1, append(0, 50, b"r"));
    service.hold_complete(1, Some(30));
    let waiting = ReadAt { request_lsn: 50, not_modified_since: 40, lease: None };
    let (status, lsn, _) = refused(&mut stream, 2, Request::GetPageAtLsn(PageRead { volume: 1, page: 0, at: waiting }));
    assert_eq!((status, lsn), (Status::NotYet, Some(30)));
    service.put_page_version(1, 0, 15, vec![1; PAGE]);
    service.fold_history(1, 20);
    let (status, lsn, message) =
        refused(&mut stream, 3, Request::GetPageAtLsn(PageRead { volume: 1, page: 0, at: at(10) }));
    assert_eq!((status, lsn), (Status::TooOld, Some(20)), "{message}");
    let (status, lsn, _) = refused(&mut stream, 4, Request::RegisterReader { volume: 1, reader_id: 1, start_lsn: 19 });
    assert_eq!((status, lsn), (Status::TooOld, Some(20)));
    let (status, lsn, _) = refused(&mut stream, 5, Request::RenewReader { volume: 1, lease_id: 99, apply_lsn: 30 });
    assert_eq!((status, lsn), (Status::LeaseLost, Some(20)), "the volume's minimum reader LSN");
    let (status, lsn, _) = refused(&mut stream, 6, Request::RedoStatus { volume: 9 });
    assert_eq!((status, lsn), (Status::NotFound, None));
}

#[test]
fn argument_rules_are_refused_before_the_service_and_change_nothing() {
    let (_server, service, mut stream) = redo_server();
    let bad = [
        Request::GetPageAtLsn(PageRead { volume: 1, page: 0, at: at(0) }),
        Request::GetPageAtLsn(PageRead {
            volume: 1,
            page: 0,
            at: ReadAt { request_lsn: 5, not_modified_since: 6, lease: None },
        }),
        Request::GetPagesAtLsn(PagesRead { volume: 1, pages: PageList::Numbers(&[]), at: at(5) }),
        append(10, 5, b""),
        Request::AppendRedo(RedoAppend {
            volume: 1,
            writer_epoch: 1,
            prev_lsn: 0,
            end_lsn: 5,
            record_count: 1,
            records: b"",
        }),
        Request::AppendRedo(RedoAppend {
            volume: 1,
            writer_epoch: 1,
            prev_lsn: 0,
            end_lsn: 2,
            record_count: 3,
            records: b"abc",
        }),
        Request::AppendRedo(RedoAppend {
            volume: 1,
            writer_epoch: 1,
            prev_lsn: 0,
            end_lsn: 9,
            record_count: 3,
            records: b"ab",
        }),
    ];
    for (id, request) in bad.into_iter().enumerate() {
        let (status, lsn, message) = refused(&mut stream, id as u64 + 1, request);
        assert_eq!((status, lsn), (Status::Invalid, None), "{request:?}: {message}");
    }
    assert!(service.appended_batches(1).is_empty());
    assert_eq!(service.redo_status(1).unwrap().durable_lsn, 0);
    // A vectored read naming more pages than allowed is refused from its count.
    let mut body = Vec::new();
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    body.extend_from_slice(&129u32.to_le_bytes());
    body.extend_from_slice(&vec![0; 129 * 8]);
    let mut bytes = Vec::new();
    write_frame(&mut bytes, Opcode::GetPagesAtLsn.code(), 0, 50, &[&body]).unwrap();
    stream.write_all(&bytes).unwrap();
    let (header, body) = receive(&mut stream);
    assert_eq!(Status::from_code(header.code), Some(Status::Invalid));
    assert!(String::from_utf8(body).unwrap().contains("at most 128"));
}

#[test]
fn a_cut_redo_frame_is_refused() {
    let (_server, service, mut stream) = redo_server();
    // Bodies cut short, each under a checksum of its own: the frame is sound, the body is not.
    let requests = [
        append(0, 10, b"records"),
        Request::GetPageAtLsn(PageRead { volume: 1, page: 0, at: at(5) }),
        Request::GetPagesAtLsn(PagesRead { volume: 1, pages: PageList::Numbers(&[1, 2]), at: at(5) }),
        Request::RegisterReader { volume: 1, reader_id: 1, start_lsn: 0 },
        Request::RenewReader { volume: 1, lease_id: 1, apply_lsn: 1 },
        Request::ReleaseReader { volume: 1, lease_id: 1 },
        Request::RedoStatus { volume: 1 },
    ];
    let mut id = 0;
    for request in requests {
        let body = request.encode_body();
        for cut in [1, body.len() / 2, body.len()] {
            id += 1;
            let mut bytes = Vec::new();
            write_frame(&mut bytes, request.opcode().code(), 0, id, &[&body[..body.len() - cut]]).unwrap();
            stream.write_all(&bytes).unwrap();
            let (header, message) = receive(&mut stream);
            let message = String::from_utf8(message).unwrap();
            assert_eq!((Status::from_code(header.code), header.request_id), (Some(Status::Invalid), id), "{message}");
        }
    }
    assert!(service.appended_batches(1).is_empty());
    // A frame whose bytes stop before its announced end is never answered: the connection ends.
    let mut bytes = Vec::new();
    let request = append(0, 10, b"records");
    write_frame(&mut bytes, request.opcode().code(), 0, 99, &[&request.encode_body()]).unwrap();
    stream.write_all(&bytes[..bytes.len() - 3]).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut stream));
    assert!(service.appended_batches(1).is_empty());
}

#[test]
fn a_version_1_connection_refuses_the_redo_opcodes() {
    let (server, service, _) = redo_server();
    let (mut stream, hello) = connect(&server, 1, 1);
    assert_eq!(hello, ServerHello { version: 1, server_min: 1, server_max: 2 });
    let (status, lsn, message) = refused(&mut stream, 1, append(0, 10, b"r"));
    assert_eq!((status, lsn), (Status::UnknownOpcode, None));
    assert!(message.contains("APPEND_REDO") && message.contains("version 2"), "{message}");
    assert!(service.appended_batches(1).is_empty());
    assert_eq!(ok(&mut stream, 2, Request::Ping { payload: b"v1" }), Reply::Pong(b"v1".to_vec()));
}

#[test]
fn a_server_that_requires_version_2_refuses_an_old_hello_clearly() {
    let config = ServerConfig { min_version: 2, ..ServerConfig::default() };
    let server = start(Arc::new(MemService::new()), config);
    let (mut stream, hello) = connect(&server, 1, 1);
    assert_eq!(hello, ServerHello { version: 0, server_min: 2, server_max: 2 });
    let (header, body) = receive(&mut stream);
    assert_eq!(Status::from_code(header.code), Some(Status::UnsupportedVersion));
    assert_eq!((header.request_id, header.flags), (NOTICE_ID, FLAG_CLOSE));
    let message = String::from_utf8(body).unwrap();
    assert!(message.contains("1..=1") && message.contains("2..=2"), "{message}");
    assert!(is_closed(&mut stream));
    let (_, hello) = connect(&server, 1, 2);
    assert_eq!(hello.version, 2);
    let wrong = ServerConfig { min_version: 2, max_version: 3, ..ServerConfig::default() };
    assert!(Server::start_with("127.0.0.1:0", Arc::new(MemService::new()), wrong).is_err());
}

/// A service with only version 1's methods, whose redo answers (when `lie` is set) break the
/// protocol's promises.
struct Plain {
    lie: bool,
}

impl Service for Plain {
    fn volume_lookup(&self, _: &str) -> Result<VolumeInfo, ServiceError> {
        Err(ServiceError::not_found("none"))
    }
    fn volume_create(&self, _: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        Err(ServiceError::invalid("none"))
    }
    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        Ok(Vec::new())
    }
    fn volume_resize(&self, _: &str, _: u64) -> Result<VolumeInfo, ServiceError> {
        Err(ServiceError::not_found("none"))
    }
    fn volume_delete(&self, _: &str) -> Result<(), ServiceError> {
        Err(ServiceError::not_found("none"))
    }
    /// A version 2 status from a version 1 opcode: only right on a version 2 connection.
    fn read_page(&self, _: u32, _: u64, _: &mut Vec<u8>) -> Result<(), ServiceError> {
        Err(ServiceError::not_yet(3, "not applied"))
    }
    fn write_page(&self, _: u32, _: u64, _: WriteMode, _: &[u8]) -> Result<(), ServiceError> {
        Err(ServiceError::new(Status::TooOld, "an LSN status without its LSN"))
    }
    fn trim(&self, _: u32, _: u64, _: u64) -> Result<(), ServiceError> {
        Ok(())
    }
    fn flush(&self, _: Option<u32>) -> Result<(), ServiceError> {
        Ok(())
    }
    fn heavy_compress(&self, _: u32, _: u64, _: u64) -> Result<HeavyResult, ServiceError> {
        Ok(HeavyResult::default())
    }
    fn stats(&self, _: Option<u32>) -> Result<String, ServiceError> {
        Ok("{}".into())
    }
    fn get_page_at_lsn(&self, _: u32, page: u64, at: ReadAt, out: &mut Vec<u8>) -> Result<PageLsns, ServiceError> {
        if !self.lie {
            return Err(ServiceError::unsupported(Opcode::GetPageAtLsn));
        }
        out.resize(PAGE, 0);
        // Page 0: served above the LSN asked for; page 1: a page newer than the LSN served.
        Ok(match page {
            0 => PageLsns { served_lsn: at.request_lsn + 1, page_lsn: 0 },
            _ => PageLsns { served_lsn: at.request_lsn, page_lsn: at.request_lsn + 1 },
        })
    }
}

#[test]
fn a_service_without_redo_answers_not_supported() {
    let server = start(Arc::new(Plain { lie: false }), ServerConfig::default());
    let (mut stream, _) = connect(&server, 1, 2);
    let requests = [
        append(0, 1, b"r"),
        Request::RedoStatus { volume: 1 },
        Request::GetPageAtLsn(PageRead { volume: 1, page: 0, at: at(1) }),
        Request::GetPagesAtLsn(PagesRead { volume: 1, pages: PageList::Numbers(&[0]), at: at(1) }),
        Request::RegisterReader { volume: 1, reader_id: 1, start_lsn: 0 },
        Request::RenewReader { volume: 1, lease_id: 1, apply_lsn: 1 },
        Request::ReleaseReader { volume: 1, lease_id: 1 },
    ];
    for (id, request) in requests.into_iter().enumerate() {
        let (status, _, message) = refused(&mut stream, id as u64 + 1, request);
        assert_eq!(status, Status::NotSupported, "{request:?}");
        assert!(message.contains(request.opcode().name()), "{message}");
    }
}

#[test]
fn a_service_breaking_the_protocols_promises_answers_internal() {
    let server = start(Arc::new(Plain { lie: true }), ServerConfig::default());
    let (mut stream, _) = connect(&server, 1, 2);
    for (id, page) in [(1, 0), (2, 1)] {
        let (status, _, message) =
            refused(&mut stream, id, Request::GetPageAtLsn(PageRead { volume: 1, page, at: at(5) }));
        assert_eq!(status, Status::Internal, "{message}");
    }
    let (status, lsn, message) = refused(&mut stream, 3, Request::ReadPage { volume: 1, page: 0 });
    assert_eq!((status, lsn), (Status::NotYet, Some(3)), "version 2 allows it: {message}");
    let page = vec![0; PAGE];
    let write = Request::WritePage { volume: 1, page: 0, mode: WriteMode::Auto, data: &page };
    let (status, _, message) = refused(&mut stream, 4, write);
    assert_eq!(status, Status::Internal, "TOO_OLD needs its LSN: {message}");
    // On a version 1 connection a version 2 status never goes out.
    let (mut old, _) = connect(&server, 1, 1);
    let (status, _, message) = refused(&mut old, 1, Request::ReadPage { volume: 1, page: 0 });
    assert_eq!(status, Status::Internal, "{message}");
    assert!(message.contains("NOT_YET"), "{message}");
}
