//! The client against a server over the in-memory service: every opcode, errors and which of
//! them the connection survives, pipelining with answers taken out of order, several clients,
//! shutdown.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tundra_client::{Client, ClientConfig, Error, RequestId};
use tundra_proto::mem::MemService;
use tundra_proto::{HeavyResult, Reply, Server, ServiceError, Status, VolumeMode, VolumeSpec, WriteMode};

const PAGE: usize = 16384;

fn start() -> (Server, Arc<MemService>) {
    start_with(MemService::new())
}

fn start_with(service: MemService) -> (Server, Arc<MemService>) {
    let service = Arc::new(service);
    let server = Server::start("127.0.0.1:0", service.clone()).unwrap();
    (server, service)
}

fn spec(name: &str, pages: u64) -> VolumeSpec {
    VolumeSpec { name: name.into(), size_bytes: pages * PAGE as u64, page_size: PAGE as u32, mode: VolumeMode::Normal }
}

fn page(seed: u64) -> Vec<u8> {
    (0..PAGE as u64).map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9E37)) as u8).collect()
}

fn status(error: Error) -> Status {
    match error {
        Error::Status { status, .. } => status,
        other => panic!("expected a status, got {other:?}"),
    }
}

#[test]
fn every_opcode_round_trips() {
    let (server, service) = start();
    let mut client = Client::connect(server.local_addr()).unwrap();
    assert_eq!(client.version(), 2);
    assert_eq!(client.ping(b"hello").unwrap(), b"hello");

    let info = client.volume_create(&spec("db", 64)).unwrap();
    assert_eq!((info.name.as_str(), info.size_bytes, info.page_size), ("db", 64 * PAGE as u64, PAGE as u32));
    assert_eq!(client.volume_lookup("db").unwrap(), info);
    let wal = client.volume_create(&VolumeSpec { mode: VolumeMode::None, ..spec("wal", 8) }).unwrap();
    assert_eq!(wal.mode, VolumeMode::None);
    assert_eq!(client.volume_list().unwrap(), vec![info.clone(), wal.clone()]);
    let grown = client.volume_resize("db", 128 * PAGE as u64).unwrap();
    assert_eq!(grown.page_count(), 128);

    for (number, mode) in WriteMode::ALL.into_iter().enumerate() {
        client.write_page(info.id, number as u64, mode, &page(number as u64)).unwrap();
        assert_eq!(service.write_mode(info.id, number as u64), Some(mode));
    }
    assert_eq!(client.read_page(info.id, 2).unwrap(), page(2));
    assert_eq!(client.read_page(info.id, 100).unwrap(), vec![0; PAGE], "a page never written reads as zeros");
    client.flush(Some(info.id)).unwrap();
    client.flush(None).unwrap();
    assert_eq!(service.flush_count(), 2);
    let heavy = client.heavy_compress(info.id, 0, 128).unwrap();
    assert_eq!(heavy, HeavyResult { pages: 4, segments: 1, bytes_before: 4 * PAGE as u64, bytes_after: PAGE as u64 });
    client.trim(info.id, 0, 2).unwrap();
    assert_eq!(client.read_page(info.id, 1).unwrap(), vec![0; PAGE]);
    let stats: serde_json::Value = serde_json::from_str(&client.stats(None).unwrap()).unwrap();
    assert_eq!(stats["pages"], 2);
    assert!(client.stats(Some(info.id)).unwrap().contains("\"name\":\"db\""));
    client.volume_delete("wal").unwrap();
    assert_eq!(client.volume_list().unwrap().len(), 1);
}

#[test]
fn errors_carry_their_status_and_the_connection_survives() {
    let (server, service) = start_with(MemService::with_capacity_pages(2));
    let mut client = Client::connect(server.local_addr()).unwrap();
    assert_eq!(status(client.volume_lookup("missing").unwrap_err()), Status::NotFound);
    assert_eq!(
        status(client.volume_create(&VolumeSpec { page_size: 4096, ..spec("x", 8) }).unwrap_err()),
        Status::Invalid
    );
    let info = client.volume_create(&spec("db", 8)).unwrap();
    assert_eq!(status(client.volume_create(&spec("db", 8)).unwrap_err()), Status::Exists);
    assert_eq!(status(client.read_page(info.id, 8).unwrap_err()), Status::Invalid);
    assert_eq!(status(client.read_page(info.id + 1, 0).unwrap_err()), Status::NotFound);
    assert_eq!(status(client.write_page(info.id, 0, WriteMode::Auto, &[1; 100]).unwrap_err()), Status::Invalid);
    client.write_page(info.id, 0, WriteMode::Auto, &page(0)).unwrap();
    client.write_page(info.id, 1, WriteMode::Auto, &page(1)).unwrap();
    assert_eq!(status(client.write_page(info.id, 2, WriteMode::Auto, &page(2)).unwrap_err()), Status::NoSpace);
    service.fail_next(ServiceError::corrupted("block 7 failed its checksum"));
    let error = client.read_page(info.id, 0).unwrap_err();
    assert!(!error.is_connection_lost());
    assert_eq!(error.to_string(), "CORRUPTED: block 7 failed its checksum");
    assert_eq!(client.read_page(info.id, 0).unwrap(), page(0));
}

#[test]
fn a_name_too_long_for_the_wire_is_refused_before_sending() {
    let (server, _) = start();
    let mut client = Client::connect(server.local_addr()).unwrap();
    let name = "n".repeat(70_000);
    assert_eq!(status(client.volume_lookup(&name).unwrap_err()), Status::Invalid);
    assert_eq!(client.ping(b"x").unwrap(), b"x");
}

#[test]
fn an_unsupported_version_is_refused_at_connect() {
    let (server, _) = start();
    let config = ClientConfig { min_version: 3, max_version: 4, ..ClientConfig::default() };
    let error = Client::connect_with(server.local_addr(), &config).unwrap_err();
    let message = error.to_string();
    assert_eq!(error.status(), Some(Status::UnsupportedVersion), "{message}");
    assert!(message.contains("1..=2"), "{message}");
}

#[test]
fn connecting_to_nothing_is_an_io_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let Err(error) = Client::connect(addr) else { panic!("nothing listens there") };
    assert!(matches!(error, Error::Io(_)), "{error}");
    // The reason is said once, even when the whole chain of causes is printed.
    let mut chain = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(c) = cause {
        chain.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert_eq!(chain.matches("refused").count(), 1, "{chain}");
}

#[test]
fn pipelined_answers_can_be_taken_in_any_order() {
    let (server, _) = start();
    let mut client = Client::connect(server.local_addr()).unwrap();
    let info = client.volume_create(&spec("db", 64)).unwrap();
    let writes: Vec<RequestId> =
        (0..32).map(|n| client.submit_write_page(info.id, n, WriteMode::Lz4, &page(n)).unwrap()).collect();
    let reads: Vec<RequestId> = (0..32).map(|n| client.submit_read_page(info.id, n).unwrap()).collect();
    assert_eq!(client.in_flight(), 64);
    // Reads last to first: every other answer arrives first and is kept.
    for (n, id) in reads.iter().enumerate().rev() {
        assert_eq!(client.wait(*id).unwrap(), Reply::Page(page(n as u64)));
    }
    for id in writes.iter().rev() {
        assert_eq!(client.wait(*id).unwrap(), Reply::Done);
    }
    assert!(matches!(client.wait(reads[0]), Err(Error::NotPending(_))));
    assert!(matches!(client.wait_any(), Err(Error::NothingInFlight)));
}

#[test]
fn wait_any_returns_answers_in_arrival_order_with_their_own_errors() {
    let (server, _) = start();
    let mut client = Client::connect(server.local_addr()).unwrap();
    let info = client.volume_create(&spec("db", 4)).unwrap();
    let good = client.submit_write_page(info.id, 0, WriteMode::Auto, &page(0)).unwrap();
    let bad = client.submit_read_page(info.id, 99).unwrap();
    let flush = client.submit_flush(None).unwrap();
    let (first, result) = client.wait_any().unwrap();
    assert_eq!((first, result.unwrap()), (good, Reply::Done));
    let (second, result) = client.wait_any().unwrap();
    assert_eq!((second, status(result.unwrap_err())), (bad, Status::Invalid));
    let (third, result) = client.wait_any().unwrap();
    assert_eq!((third, result.unwrap()), (flush, Reply::Done));
}

#[test]
fn a_deep_queue_of_mixed_reads_and_writes_does_not_deadlock() {
    let (server, _) = start();
    let config = ClientConfig { max_in_flight: 64, read_timeout: Some(Duration::from_secs(20)), ..Default::default() };
    let mut client = Client::connect_with(server.local_addr(), &config).unwrap();
    let info = client.volume_create(&spec("db", 256)).unwrap();
    let data: Vec<Vec<u8>> = (0..256).map(page).collect();
    for n in 0..256 {
        client.write_page(info.id, n, WriteMode::None, &data[n as usize]).unwrap();
    }
    // 16 KiB pages flow both ways at once, far more than one socket buffer's worth in flight
    // over the run; the in-flight bound makes the client read before it writes too far ahead.
    let mut expected = std::collections::HashMap::new();
    for round in 0..2000u64 {
        let n = round % 256;
        let id = if round % 2 == 0 {
            client.submit_write_page(info.id, n, WriteMode::None, &data[n as usize]).unwrap()
        } else {
            client.submit_read_page(info.id, n).unwrap()
        };
        expected.insert(id, (round % 2 == 1).then_some(n));
        assert!(client.in_flight() <= 64);
    }
    while let Ok((id, result)) = client.wait_any() {
        match expected.remove(&id).unwrap() {
            Some(n) => assert_eq!(result.unwrap(), Reply::Page(data[n as usize].clone())),
            None => assert_eq!(result.unwrap(), Reply::Done),
        }
    }
    assert!(expected.is_empty());
}

#[test]
fn several_clients_at_once() {
    let (server, _) = start();
    let addr = server.local_addr();
    let mut setup = Client::connect(addr).unwrap();
    let volume = setup.volume_create(&spec("db", 1024)).unwrap().id;
    let workers: Vec<_> = (0..4u64)
        .map(|worker| {
            thread::spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                for round in 0..100 {
                    let n = worker * 256 + round;
                    client.write_page(volume, n, WriteMode::Auto, &page(n)).unwrap();
                    let id = client.submit_read_page(volume, n).unwrap();
                    assert_eq!(client.wait(id).unwrap(), Reply::Page(page(n)));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(setup.read_page(volume, 3 * 256 + 99).unwrap(), page(3 * 256 + 99));
}

#[test]
fn shutdown_while_clients_are_connected() {
    let (server, _) = start();
    let addr = server.local_addr();
    let mut idle = Client::connect(addr).unwrap();
    let mut busy = Client::connect(addr).unwrap();
    let info = busy.volume_create(&spec("db", 64)).unwrap();
    // Requests the server has answered before shutdown stay available after it.
    let done = busy.submit_write_page(info.id, 0, WriteMode::Auto, &page(0)).unwrap();
    busy.send().unwrap();
    thread::sleep(Duration::from_millis(50));

    let began = Instant::now();
    let report = server.shutdown();
    assert!(began.elapsed() < Duration::from_secs(3), "shutdown took {:?}", began.elapsed());
    assert_eq!((report.forced, report.abandoned), (0, 0), "{report:?}");

    let error = idle.ping(b"x").unwrap_err();
    assert!(
        error.status() == Some(Status::ShuttingDown) || matches!(error, Error::Io(_)),
        "a clean shutting-down or I/O error, not {error:?}"
    );
    assert!(error.is_connection_lost());
    assert_eq!(busy.wait(done).unwrap(), Reply::Done);
    let late = busy.submit_read_page(info.id, 0);
    let error = late.and_then(|id| busy.wait(id)).unwrap_err();
    assert!(error.is_connection_lost(), "{error:?}");
    // Every later call reports the closed connection.
    assert!(matches!(idle.ping(b"y"), Err(Error::Closed { .. })));
}

#[test]
fn a_dropped_server_ends_its_connections() {
    let (server, _) = start();
    let mut client = Client::connect(server.local_addr()).unwrap();
    drop(server);
    assert!(client.ping(b"x").unwrap_err().is_connection_lost());
}
