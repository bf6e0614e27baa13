//! The client's version 2 calls end to end over 127.0.0.1, against the in-memory service's toy
//! redo streams: appends and their outcomes, reads at an LSN single and vectored, the typed
//! refusals (`TooOld`, `NotYet`, `LeaseLost`) after which the connection goes on, a reader's
//! lease from registration to loss, pipelined appends and reads; and against older or broken
//! servers: a version 1 server, whose redo calls are refused before anything is sent, and a
//! server that serves a page from the wrong LSN.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;

use tundra_client::{Client, ClientConfig, Error};
use tundra_proto::frame::{CLIENT_HELLO_BYTES, HEADER_BYTES, ServerHello, write_frame};
use tundra_proto::mem::{LEASE_MS, MemService};
use tundra_proto::{
    AppendOutcome, LATEST_LSN, MAX_PAGES_PER_READ, ReadAt, RedoAppend, RedoStatus, Server, ServerConfig, Status,
    VolumeMode, VolumeSpec,
};

const PAGE: usize = 8192;

fn start(config: ServerConfig) -> (Server, Arc<MemService>) {
    let service = Arc::new(MemService::new());
    let server = Server::start_with("127.0.0.1:0", service.clone(), config).unwrap();
    (server, service)
}

/// A server with a volume of 64 pages, and a client on it.
fn setup() -> (Server, Arc<MemService>, Client, u32) {
    let (server, service) = start(ServerConfig::default());
    let mut client = Client::connect(server.local_addr()).unwrap();
    let spec = VolumeSpec {
        name: "db".into(),
        size_bytes: 64 * PAGE as u64,
        page_size: PAGE as u32,
        mode: VolumeMode::Normal,
    };
    let volume = client.volume_create(&spec).unwrap().id;
    (server, service, client, volume)
}

fn batch(volume: u32, writer_epoch: u64, prev_lsn: u64, end_lsn: u64, records: &[u8]) -> RedoAppend<'_> {
    RedoAppend { volume, writer_epoch, prev_lsn, end_lsn, record_count: u32::from(!records.is_empty()), records }
}

fn at(request_lsn: u64) -> ReadAt {
    ReadAt { request_lsn, not_modified_since: 0, lease: None }
}

fn page(fill: u8) -> Vec<u8> {
    vec![fill; PAGE]
}

#[test]
fn a_writer_appends_and_sees_gaps_and_fencing_as_outcomes() {
    let (_server, service, mut client, volume) = setup();
    assert!(client.supports_redo());
    assert_eq!(client.append_redo(&batch(volume, 1, 0, 10, b"one")).unwrap(), AppendOutcome::Ok { durable_lsn: 10 });
    assert_eq!(
        client.append_redo(&batch(volume, 1, 0, 20, b"again")).unwrap(),
        AppendOutcome::Gap { expected_prev_lsn: 10 }
    );
    // An empty batch is a heartbeat: it moves the stream's end.
    assert_eq!(client.append_redo(&batch(volume, 1, 10, 15, b"")).unwrap(), AppendOutcome::Ok { durable_lsn: 15 });
    // A new writer takes a higher epoch and fences the old one.
    assert_eq!(client.append_redo(&batch(volume, 2, 15, 30, b"two")).unwrap(), AppendOutcome::Ok { durable_lsn: 30 });
    assert_eq!(client.append_redo(&batch(volume, 1, 30, 40, b"old")).unwrap(), AppendOutcome::Fenced { epoch: 2 });
    let status = client.redo_status(volume).unwrap();
    assert_eq!(status, RedoStatus { writer_epoch: 2, durable_lsn: 30, complete_lsn: 30, lsn_min: 0 });
    let records: Vec<Vec<u8>> = service.appended_batches(volume).into_iter().map(|b| b.records).collect();
    assert_eq!(records, vec![b"one".to_vec(), Vec::new(), b"two".to_vec()]);

    // Broken batches are refused as invalid and change nothing.
    let broken = RedoAppend { record_count: 5, ..batch(volume, 2, 30, 32, b"abcde") };
    let error = client.append_redo(&broken).unwrap_err();
    assert_eq!(error.status(), Some(Status::Invalid), "{error}");
    assert_eq!(client.append_redo(&batch(volume + 1, 2, 30, 40, b"x")).unwrap_err().status(), Some(Status::NotFound));
    assert_eq!(client.redo_status(volume).unwrap().durable_lsn, 30);
}

#[test]
fn pages_are_read_as_of_the_lsn_asked_for() {
    let (_server, service, mut client, volume) = setup();
    client.append_redo(&batch(volume, 1, 0, 100, b"r")).unwrap();
    service.put_page_version(volume, 5, 10, page(1));
    service.put_page_version(volume, 5, 60, page(2));
    let served = client.get_page_at_lsn(volume, 5, at(59)).unwrap();
    assert_eq!((served.served_lsn, served.page_lsn, served.data), (59, 10, page(1)));
    let served = client.get_page_at_lsn(volume, 5, at(LATEST_LSN)).unwrap();
    assert_eq!((served.served_lsn, served.page_lsn, served.data), (100, 60, page(2)));
    // Not modified since 50: the node may answer at anything from 50 up.
    let lazy = ReadAt { request_lsn: 80, not_modified_since: 50, lease: None };
    assert!(lazy.admits(client.get_page_at_lsn(volume, 6, lazy).unwrap().served_lsn));

    let served = client.get_pages_at_lsn(volume, &[5, 6, 5], at(70)).unwrap();
    assert_eq!((served.served_lsn, served.page_size, served.page_lsns.clone()), (70, PAGE as u32, vec![60, 0, 60]));
    assert_eq!(served.page(0).unwrap().1, &page(2)[..]);
    assert_eq!(served.page(1).unwrap().1, &page(0)[..]);

    let bad = client.get_page_at_lsn(volume, 5, at(0)).unwrap_err();
    assert_eq!(bad.status(), Some(Status::Invalid), "LSN 0 is a bad request: {bad}");
    let past = client.get_page_at_lsn(volume, 64, at(5)).unwrap_err();
    assert_eq!(past.status(), Some(Status::Invalid));
    let too_many = vec![0; MAX_PAGES_PER_READ + 1];
    let error = client.get_pages_at_lsn(volume, &too_many, at(5)).unwrap_err();
    assert!(matches!(&error, Error::Status { status: Status::Invalid, message } if message.contains("at most")));
    assert_eq!(client.ping(b"still").unwrap(), b"still");
}

#[test]
fn refusals_a_reader_acts_on_are_typed_and_keep_the_connection() {
    let (_server, service, mut client, volume) = setup();
    client.append_redo(&batch(volume, 1, 0, 100, b"r")).unwrap();
    service.hold_complete(volume, Some(70));
    let waiting = ReadAt { request_lsn: 100, not_modified_since: 90, lease: None };
    let error = client.get_page_at_lsn(volume, 1, waiting).unwrap_err();
    assert!(matches!(error, Error::NotYet { complete_lsn: 70, .. }), "{error}");
    assert!(!error.is_connection_lost());
    assert_eq!(error.status(), Some(Status::NotYet));
    service.put_page_version(volume, 2, 45, page(4));
    service.fold_history(volume, 40);
    let error = client.get_pages_at_lsn(volume, &[1, 2], at(39)).unwrap_err();
    assert!(matches!(error, Error::TooOld { lsn_min: 40, .. }), "{error}");
    let error = client.register_reader(volume, 1, 30).unwrap_err();
    assert!(matches!(error, Error::TooOld { lsn_min: 40, .. }), "{error}");
    let leased = ReadAt { lease: Some(77), ..at(50) };
    let error = client.get_page_at_lsn(volume, 1, leased).unwrap_err();
    assert!(matches!(error, Error::LeaseLost { lsn_min: 40, .. }), "{error}");
    assert_eq!(client.get_page_at_lsn(volume, 1, at(50)).unwrap().served_lsn, 50);
}

#[test]
fn a_reader_holds_history_with_its_lease_until_it_lags_too_far() {
    let (server, service, mut client, volume) = setup();
    let mut writer = Client::connect(server.local_addr()).unwrap();
    writer.append_redo(&batch(volume, 1, 0, 100, b"r")).unwrap();
    let lease = client.register_reader(volume, 42, 80).unwrap();
    assert_eq!((lease.granted_lsn, lease.valid_for_ms), (80, LEASE_MS));
    service.fold_history(volume, 100);
    assert_eq!(client.redo_status(volume).unwrap().lsn_min, 80, "the lease holds history at the reader's LSN");
    let leased = ReadAt { lease: Some(lease.lease_id), ..at(85) };
    assert_eq!(client.get_page_at_lsn(volume, 3, leased).unwrap().served_lsn, 85);
    let renewal = client.renew_reader(volume, lease.lease_id, 90).unwrap();
    assert_eq!(renewal.lsn_min, 90);

    // The writer runs ahead; past the maximum lag the reader loses its lease and resyncs.
    service.set_max_reader_lag(Some(50));
    writer.append_redo(&batch(volume, 1, 100, 200, b"r")).unwrap();
    let error = client.renew_reader(volume, lease.lease_id, 120).unwrap_err();
    let Error::LeaseLost { lsn_min, .. } = error else { panic!("{error}") };
    assert_eq!(lsn_min, 100);
    let again = client.register_reader(volume, 42, lsn_min).unwrap();
    assert_eq!(again.granted_lsn, 100);
    client.release_reader(volume, again.lease_id).unwrap();
    client.release_reader(volume, again.lease_id).unwrap();
    assert_eq!(service.lease_count(volume), 0);
}

#[test]
fn appends_and_reads_pipeline() {
    let (_server, service, mut client, volume) = setup();
    let records: Vec<Vec<u8>> = (0..24u8).map(|n| vec![n; 100 + n as usize]).collect();
    let appends: Vec<_> = (0..24u64)
        .map(|n| client.submit_append_redo(&batch(volume, 1, n * 10, n * 10 + 10, &records[n as usize])).unwrap())
        .collect();
    for n in 0..24u64 {
        service.put_page_version(volume, n, n * 10 + 5, page(n as u8));
    }
    let reads: Vec<_> = (0..24u64).map(|n| client.submit_get_page_at_lsn(volume, n, at(n * 10 + 9)).unwrap()).collect();
    let vectored = client.submit_get_pages_at_lsn(volume, &[0, 23], at(LATEST_LSN)).unwrap();
    assert_eq!(client.in_flight(), 49);
    // Answers come back in order of submission, so the last one waited for first keeps the
    // others for later.
    let served = client.wait_pages_at_lsn(vectored).unwrap();
    assert_eq!((served.served_lsn, served.page_lsns), (240, vec![5, 235]));
    for (n, id) in reads.into_iter().enumerate().rev() {
        let served = client.wait_page_at_lsn(id).unwrap();
        assert_eq!((served.page_lsn, served.data[0]), (n as u64 * 10 + 5, n as u8));
    }
    for (n, id) in appends.into_iter().enumerate() {
        assert_eq!(client.wait_appended(id).unwrap(), AppendOutcome::Ok { durable_lsn: n as u64 * 10 + 10 });
    }
    assert_eq!(service.appended_batches(volume).len(), 24);
}

#[test]
fn against_a_version_1_server_redo_calls_are_refused_before_sending() {
    let (server, service) = start(ServerConfig { max_version: 1, ..ServerConfig::default() });
    let mut client = Client::connect(server.local_addr()).unwrap();
    assert_eq!(client.version(), 1);
    assert!(!client.supports_redo());
    let error = client.append_redo(&batch(1, 1, 0, 10, b"r")).unwrap_err();
    assert_eq!(error.status(), Some(Status::UnknownOpcode));
    assert!(error.to_string().contains("APPEND_REDO needs protocol version 2"), "{error}");
    assert!(!error.is_connection_lost());
    assert_eq!(client.in_flight(), 0, "nothing was sent");
    assert_eq!(client.get_page_at_lsn(1, 0, at(1)).unwrap_err().status(), Some(Status::UnknownOpcode));
    assert_eq!(client.ping(b"v1").unwrap(), b"v1");
    assert_eq!(service.stored_pages(), 0);
    // A client that needs version 2 is told at connect.
    let config = ClientConfig { min_version: 2, ..ClientConfig::default() };
    let error = Client::connect_with(server.local_addr(), &config).unwrap_err();
    assert_eq!(error.status(), Some(Status::UnsupportedVersion));
    assert!(error.to_string().contains("1..=1"), "{error}");
}

/// A server that answers the hello with version 2, then every request with a page served at
/// LSN 9 whose own LSN is `page_lsn`: right or wrong depending on what was asked.
fn fake_server(page_lsn: u64) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut hello = [0u8; CLIENT_HELLO_BYTES];
        stream.read_exact(&mut hello).unwrap();
        stream.write_all(&ServerHello { version: 2, server_min: 1, server_max: 2 }.encode()).unwrap();
        let mut header = [0u8; HEADER_BYTES];
        while stream.read_exact(&mut header).is_ok() {
            let header = tundra_proto::frame::FrameHeader::decode(&header);
            let mut body = vec![0u8; header.body_len()];
            stream.read_exact(&mut body).unwrap();
            let mut reply = Vec::new();
            reply.extend_from_slice(&9u64.to_le_bytes());
            reply.extend_from_slice(&page_lsn.to_le_bytes());
            reply.extend_from_slice(&[0; 16]);
            let mut frame = Vec::new();
            write_frame(&mut frame, Status::Ok.code(), 0, header.request_id, &[&reply]).unwrap();
            if stream.write_all(&frame).is_err() {
                break;
            }
        }
    });
    addr
}

#[test]
fn a_page_served_from_the_wrong_lsn_is_a_broken_server() {
    let mut client = Client::connect(fake_server(3)).unwrap();
    assert_eq!(client.get_page_at_lsn(1, 0, at(9)).unwrap().data, vec![0; 16]);
    let error = client.get_page_at_lsn(1, 0, at(8)).unwrap_err();
    assert!(matches!(error, Error::Protocol(_)), "served above the LSN asked for: {error}");
    assert!(client.ping(b"x").unwrap_err().is_connection_lost());

    let mut client = Client::connect(fake_server(10)).unwrap();
    let error = client.get_page_at_lsn(1, 0, at(9)).unwrap_err();
    assert!(matches!(error, Error::Protocol(_)), "a page newer than the LSN served: {error}");
    let mut client = Client::connect(fake_server(3)).unwrap();
    let lazy = ReadAt { request_lsn: 20, not_modified_since: 10, lease: None };
    assert!(matches!(client.get_page_at_lsn(1, 0, lazy).unwrap_err(), Error::Protocol(_)), "below not-modified-since");
}
