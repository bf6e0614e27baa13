//! The server's limits against clients that misbehave: connections that never negotiate,
//! requests that announce a large payload and stall, clients idle at the cap, and exports that
//! go away. A valid client is always served, and memory holds only bytes that arrived.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use tundra_nbd::Limits;

/// Waits (bounded) until `done` holds; panics with `what` if it never does.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Many more silent connections than the cap: the oldest negotiating ones are closed to admit
/// new ones, the open count stays at the cap, and a valid client is served among them.
#[test]
fn silent_connections_past_the_cap_never_lock_out_a_valid_client() {
    let limits = Limits { max_connections: 16, ..Limits::default() };
    let fixture = Fixture::start_with(MIB, limits);
    let silent: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(fixture.addr()).unwrap()).collect();
    eventually("every silent connection accepted", || fixture.server.stats().connections_accepted >= 200);
    let mut client = fixture.client("vol");
    assert_eq!(client.write(0, 0, &[7; 4096]), 0);
    assert_eq!(client.read(0, 4096), Ok(vec![7; 4096]));
    let stats = fixture.server.stats();
    assert!(stats.connections_evicted >= 185, "{stats:?}");
    assert_eq!(stats.connections_refused, 0);
    eventually("evicted threads gone", || fixture.server.stats().connections_open <= 16);
    drop(silent);
    client.disconnect();
}

/// A connection that negotiates nothing within the handshake timeout is closed.
#[test]
fn a_silent_handshake_times_out() {
    let limits = Limits { handshake_timeout: Duration::from_millis(200), ..Limits::default() };
    let fixture = Fixture::start_with(MIB, limits);
    let mut client = Client::greet(fixture.addr());
    client.expect_closed();
    eventually("counted", || fixture.server.stats().connections_timed_out == 1);
}

/// Write headers announcing 32 MiB each, whose data never comes: the server holds at most one
/// payload step for each, not 32 MiB, and cuts them off after the request timeout, giving
/// every byte back; meanwhile a valid client is served.
#[test]
fn stalled_large_writes_hold_no_memory_and_are_cut_off() {
    let limits = Limits { request_timeout: Duration::from_millis(500), ..Limits::default() };
    let fixture = Fixture::start_with(64 * MIB, limits);
    let mut stalled: Vec<Client> = (0..8).map(|_| fixture.client("vol")).collect();
    for client in &mut stalled {
        client.send_request(0, CMD_WRITE, 0, 32 << 20, &[]);
    }
    eventually("every header read", || fixture.server.stats().requests_write >= 8);
    let held = fixture.server.stats().payload_bytes_held;
    assert!(held <= 8 * (256 << 10), "stalled writes hold {held} bytes");
    let mut client = fixture.client("vol");
    assert_eq!(client.write(0, 4096, &[9; 8192]), 0);
    for client in &mut stalled {
        client.expect_closed();
    }
    let stats = fixture.server.stats();
    assert_eq!(stats.connections_timed_out, 8, "{stats:?}");
    assert_eq!(stats.payload_bytes_held, 0, "every byte given back");
    // A client idle between requests past the request timeout is not cut off.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(client.read(4096, 8192), Ok(vec![9; 8192]));
    client.disconnect();
}

/// At the cap with every connection negotiated and recently busy, a new connection is refused
/// rather than cutting off a client in use.
#[test]
fn busy_clients_at_the_cap_are_kept_and_a_newcomer_refused() {
    let limits = Limits { max_connections: 2, ..Limits::default() };
    let fixture = Fixture::start_with(MIB, limits);
    let mut a = fixture.client("vol");
    let mut b = fixture.client("vol");
    let mut late = TcpStream::connect(fixture.addr()).unwrap();
    late.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(std::io::Read::read(&mut late, &mut byte).unwrap_or(0), 0, "the newcomer is closed at once");
    assert_eq!(fixture.server.stats().connections_refused, 1);
    assert_eq!(a.read(0, 4), Ok(vec![0; 4]));
    assert_eq!(b.read(0, 4), Ok(vec![0; 4]));
    a.disconnect();
    b.disconnect();
}

/// `close_export` closes the connections of one export (a deleted volume) and no other.
#[test]
fn closing_an_export_closes_only_its_connections() {
    let fixture = Fixture::start(MIB);
    let mut on_vol = fixture.client("vol");
    let mut on_small = fixture.client("small");
    assert_eq!(fixture.server.close_export("vol"), 1);
    on_vol.expect_closed();
    assert_eq!(on_small.read(0, 4), Ok(vec![0; 4]));
    eventually("the closed connection gone", || fixture.server.stats().connections_open == 1);
    assert_eq!(fixture.server.close_export("vol"), 0);
    on_small.disconnect();
}

#[test]
fn limits_that_cannot_work_are_refused_at_start() {
    let exports = std::sync::Arc::new(tundra_nbd::ExportMap::new());
    let limits = Limits { max_buffered_bytes: 1 << 20, ..Limits::default() };
    let error = tundra_nbd::Server::start_with("127.0.0.1:0", exports, limits).err().unwrap();
    assert!(error.to_string().contains("max_buffered_bytes"), "{error}");
}
