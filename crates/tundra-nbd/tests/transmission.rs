//! The transmission phase against the hand-written client: data round trips, flags passed to
//! the export, pipelining, several connections, and bad requests that must get an error reply
//! while the connection goes on.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use tundra_env::{Rng, seed_from_env};
use tundra_nbd::{ExportError, ExportErrorKind, SHUTDOWN_GRACE};

#[test]
fn writes_read_back_at_any_alignment() {
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("vol");
    let mut rng = Rng::new(seed_from_env(1));
    let mut model = vec![0u8; MIB as usize];
    for _ in 0..200 {
        let len = 1 + rng.below(70_000) as usize;
        let offset = rng.below(MIB - len as u64 + 1);
        let data = rng.bytes(len);
        assert_eq!(client.write(0, offset, &data), 0);
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        let check_len = 1 + rng.below(70_000) as usize;
        let check_offset = rng.below(MIB - check_len as u64 + 1);
        let read = client.read(check_offset, check_len as u32).expect("read");
        assert_same(&read, &model[check_offset as usize..check_offset as usize + check_len], "read back");
    }
    // The last byte, and a read of the whole export.
    assert_eq!(client.write(0, MIB - 1, &[0x5a]), 0);
    model[MIB as usize - 1] = 0x5a;
    assert_same(&client.read(0, MIB as u32).expect("read all"), &model, "whole export");
    assert_same(&fixture.vol.contents(), &model, "export contents");
    client.disconnect();
}

#[test]
fn trim_write_zeroes_flush_and_fua_reach_the_export() {
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("vol");
    assert_eq!(client.write(FLAG_FUA, 0, &[0xff; 8192]), 0);
    assert_eq!(client.command(0, CMD_TRIM, 100, 1000), 0);
    assert_eq!(client.command(FLAG_FUA, CMD_WRITE_ZEROES, 2000, 1000), 0);
    assert_eq!(client.command(FLAG_NO_HOLE, CMD_WRITE_ZEROES, 4000, 1000), 0);
    assert_eq!(client.command(FLAG_FUA | FLAG_NO_HOLE, CMD_WRITE_ZEROES, 6000, 100), 0);
    assert_eq!(client.command(FLAG_FUA, CMD_TRIM, 7000, 10), 0);
    assert_eq!(client.command(0, CMD_FLUSH, 0, 0), 0);
    assert_eq!(client.command(FLAG_FUA, CMD_FLUSH, 0, 0), 0);
    assert_eq!(client.command(0, CMD_CACHE, 0, 4096), 0);
    // A trim may cover the whole export, past the 32 MiB request limit of the others.
    let data = client.read(0, 8192).expect("read");
    for (range, zero) in
        [(0..100, false), (100..1100, true), (1100..2000, false), (2000..3000, true), (3000..4000, false)]
    {
        assert!(data[range.clone()].iter().all(|&b| (b == 0) == zero), "{range:?}");
    }
    assert!(data[4000..5000].iter().all(|&b| b == 0));
    let calls = fixture.vol.calls();
    assert_eq!(calls.fua_writes, 1);
    assert_eq!((calls.trims, calls.fua_trims), (2, 1));
    assert_eq!((calls.write_zeroes, calls.may_trim_write_zeroes, calls.fua_write_zeroes), (3, 1, 2));
    assert_eq!(calls.flushes, 2);
    let stats = fixture.server.stats();
    assert_eq!((stats.requests_trim, stats.requests_write_zeroes, stats.requests_flush), (2, 3, 2));
    assert_eq!((stats.requests_cache, stats.requests_write, stats.requests_read), (1, 1, 1));
    assert_eq!(
        (stats.bytes_written, stats.bytes_trimmed, stats.bytes_zeroed, stats.bytes_read),
        (8192, 1010, 2100, 8192)
    );
    client.disconnect();
    assert_eq!(fixture.server.stats().requests_disconnect, 1);
}

#[test]
fn whole_export_trim_and_write_zeroes_are_not_limited_to_32_mib() {
    let fixture = Fixture::start(40 * MIB);
    let mut client = fixture.client("vol");
    assert_eq!(client.command(0, CMD_TRIM, 0, (40 * MIB) as u32), 0);
    assert_eq!(client.command(0, CMD_WRITE_ZEROES, 0, (32 * MIB) as u32), 0);
    // No payload: mkfs and the kernel zero whole devices in one request.
    assert_eq!(client.command(0, CMD_WRITE_ZEROES, 0, (40 * MIB) as u32), 0);
    assert_eq!(client.command(0, CMD_WRITE_ZEROES, 0, (40 * MIB) as u32 + 1), ENOSPC);
    client.disconnect();
}

#[test]
fn bad_requests_get_errors_and_the_connection_goes_on() {
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("vol");
    let size = MIB;
    let big = 32 * 1024 * 1024 + 1;
    let cases: &[(&str, u16, u16, u64, u32, u32)] = &[
        ("read past the end", 0, CMD_READ, size - 10, 11, EINVAL),
        ("read at the end", 0, CMD_READ, size, 1, EINVAL),
        ("read wrapping around", 0, CMD_READ, u64::MAX - 1, 4, EINVAL),
        ("trim past the end", 0, CMD_TRIM, size - 1, 2, EINVAL),
        ("cache past the end", 0, CMD_CACHE, size, 1, EINVAL),
        ("zero past the end", 0, CMD_WRITE_ZEROES, size - 1, 2, ENOSPC),
        ("zero-length read", 0, CMD_READ, 0, 0, EINVAL),
        ("zero-length trim", 0, CMD_TRIM, 0, 0, EINVAL),
        ("zero-length write-zeroes", 0, CMD_WRITE_ZEROES, 0, 0, EINVAL),
        ("zero-length cache", 0, CMD_CACHE, 0, 0, EINVAL),
        ("oversized read", 0, CMD_READ, 0, big, EINVAL),
        ("oversized write-zeroes past the end", 0, CMD_WRITE_ZEROES, 0, big, ENOSPC),
        ("flush with a length", 0, CMD_FLUSH, 0, 1, EINVAL),
        ("flush with an offset", 0, CMD_FLUSH, 1, 0, EINVAL),
        ("block status", 0, CMD_BLOCK_STATUS, 0, 512, EINVAL),
        ("unknown command", 0, 99, 0, 512, EINVAL),
        ("unknown command, top", 0, u16::MAX, 0, 0, EINVAL),
        ("unknown flag on read", 0x80, CMD_READ, 0, 512, EINVAL),
        ("DF without structured replies", FLAG_DF, CMD_READ, 0, 512, EINVAL),
        ("NO_HOLE on trim", FLAG_NO_HOLE, CMD_TRIM, 0, 512, EINVAL),
        ("FAST_ZERO not advertised", FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 0, 512, EINVAL),
        ("unknown flag on flush", 0x8000, CMD_FLUSH, 0, 0, EINVAL),
    ];
    for &(what, flags, command, offset, length, expected) in cases {
        assert_eq!(client.command(flags, command, offset, length), expected, "{what}");
    }
    // Writes: the payload is read and discarded, however long, and the stream stays in step.
    let write_cases: &[(&str, u16, u64, usize, u32)] = &[
        ("write past the end", 0, size - 100, 4096, ENOSPC),
        ("write wrapping around", 0, u64::MAX, 2, ENOSPC),
        ("zero-length write", 0, 0, 0, EINVAL),
        ("write with an unknown flag", 0x40, 0, 512, EINVAL),
        ("write with NO_HOLE", FLAG_NO_HOLE, 0, 512, EINVAL),
        ("write over 32 MiB", 0, 0, big as usize, EINVAL),
    ];
    for &(what, flags, offset, len, expected) in write_cases {
        assert_eq!(client.write(flags, offset, &vec![0xee; len]), expected, "{what}");
    }
    assert!(fixture.vol.contents().iter().all(|&b| b == 0), "no refused write changed anything");
    // And the connection still works.
    assert_eq!(client.write(0, 10, b"alive"), 0);
    assert_eq!(client.read(8, 9), Ok(b"\0\0alive\0\0".to_vec()));
    let stats = fixture.server.stats();
    assert_eq!(stats.error_replies, (cases.len() + write_cases.len()) as u64);
    assert_eq!(stats.export_errors, 0);
    assert_eq!(stats.requests_unknown, 3);
    assert_eq!(stats.protocol_errors, 0);
    client.disconnect();
}

#[test]
fn export_errors_become_nbd_errors() {
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("vol");
    let kinds = [
        (ExportErrorKind::Invalid, EINVAL),
        (ExportErrorKind::NoSpace, ENOSPC),
        (ExportErrorKind::Io, EIO),
        (ExportErrorKind::Overflow, EOVERFLOW),
        (ExportErrorKind::NotSupported, ENOTSUP),
        (ExportErrorKind::Perm, EPERM),
    ];
    for (kind, errno) in kinds {
        fixture.vol.inject_error(Some(ExportError::new(kind, "injected")));
        // A failed read sends no payload: the next reply follows at once.
        assert_eq!(client.read(0, 4096), Err(errno), "{kind:?}");
        assert_eq!(client.write(0, 0, &[1; 100]), errno);
        assert_eq!(client.command(0, CMD_FLUSH, 0, 0), errno);
        assert_eq!(client.command(0, CMD_TRIM, 0, 10), errno);
        assert_eq!(client.command(0, CMD_WRITE_ZEROES, 0, 10), errno);
    }
    fixture.vol.inject_error(None);
    assert_eq!(client.read(0, 4), Ok(vec![0; 4]));
    let stats = fixture.server.stats();
    assert_eq!((stats.export_errors, stats.error_replies), (30, 30));
    client.disconnect();
}

/// An export that is gone (a deleted volume) answers `ESHUTDOWN`, then the server closes the
/// connection: nothing it could serve remains. Other connections go on.
#[test]
fn a_shutdown_error_closes_the_connection_after_its_reply() {
    for request in 0..3 {
        let fixture = Fixture::start(MIB);
        let mut client = fixture.client("vol");
        let mut other = fixture.client("vol");
        fixture.vol.inject_error(Some(ExportError::new(ExportErrorKind::Shutdown, "volume deleted")));
        match request {
            0 => assert_eq!(client.read(0, 4096), Err(ESHUTDOWN)),
            1 => assert_eq!(client.write(0, 0, &[1; 100]), ESHUTDOWN),
            _ => assert_eq!(client.command(0, CMD_FLUSH, 0, 0), ESHUTDOWN),
        }
        client.expect_closed();
        fixture.vol.inject_error(None);
        assert_eq!(other.read(0, 4), Ok(vec![0; 4]));
        other.disconnect();
    }
}

/// Pipelined requests in waves: within a wave no two requests overlap, so any order of running
/// them gives the same result; every request is answered exactly once, with its cookie, and
/// every read returns what the model holds. Replies may come in any order.
#[test]
fn pipelined_requests_are_each_answered_once_with_the_right_data() {
    const SLOT: u64 = 64 * 1024;
    let fixture = Fixture::start(4 * MIB);
    let mut client = fixture.client("vol");
    let mut rng = Rng::new(seed_from_env(7));
    let mut model = vec![0u8; 4 * MIB as usize];
    let slots = 4 * MIB / SLOT;
    let mut cookie = 0u64;
    for _wave in 0..120 {
        let mut free: Vec<u64> = (0..slots).collect();
        let mut expected = std::collections::HashMap::new();
        for _ in 0..24 {
            let slot = free.swap_remove(rng.below(free.len() as u64) as usize);
            let offset = slot * SLOT + rng.below(SLOT / 2);
            let len = 1 + rng.below(SLOT / 2) as usize;
            cookie += 1;
            if rng.below(2) == 0 {
                let data = rng.bytes(len);
                model[offset as usize..offset as usize + len].copy_from_slice(&data);
                client.queue_request(0, CMD_WRITE, cookie, offset, len as u32, &data);
                expected.insert(cookie, None);
            } else {
                client.queue_request(0, CMD_READ, cookie, offset, len as u32, &[]);
                expected.insert(cookie, Some(model[offset as usize..offset as usize + len].to_vec()));
            }
        }
        client.writer.flush().expect("send");
        while !expected.is_empty() {
            let (error, reply_cookie) = client.reply();
            assert_eq!(error, 0, "cookie {reply_cookie}");
            let wanted = expected.remove(&reply_cookie).unwrap_or_else(|| panic!("unexpected cookie {reply_cookie}"));
            if let Some(bytes) = wanted {
                assert_same(&client.bytes(bytes.len()), &bytes, &format!("read {reply_cookie}"));
            }
        }
    }
    assert_same(&fixture.vol.contents(), &model, "export contents");
    client.disconnect();
}

/// A slow request does not hold up the quick ones behind it: their replies overtake its reply,
/// and the server counts them as out of order.
#[test]
fn a_slow_request_is_overtaken_by_later_ones() {
    let fixture = Fixture::start(MIB);
    tundra_nbd::Export::write(&*fixture.vol, 0, &[7u8; 4096], false).expect("write");
    fixture.vol.delay_at(0, Some(Duration::from_millis(400)));
    let mut client = fixture.client("vol");
    client.queue_request(0, CMD_READ, 1, 0, 4096, &[]);
    for cookie in 2..=5u64 {
        client.queue_request(0, CMD_WRITE, cookie, cookie * 4096, 4096, &[cookie as u8; 4096]);
    }
    client.queue_request(0, CMD_READ, 6, 8192, 4096, &[]);
    client.writer.flush().expect("send");
    let mut order = Vec::new();
    for _ in 0..6 {
        let (error, cookie) = client.reply();
        assert_eq!(error, 0);
        if cookie == 1 {
            assert_eq!(client.bytes(4096), vec![7u8; 4096]);
        }
        if cookie == 6 {
            // It overlaps cookie 2's write, received before it: it reads that write's data.
            assert_eq!(client.bytes(4096), vec![2u8; 4096]);
            assert!(order.contains(&2), "cookie 6 answered before the write it follows: {order:?}");
        }
        order.push(cookie);
    }
    assert_eq!(order.last(), Some(&1), "the slow read is answered last: {order:?}");
    assert!(fixture.server.stats().replies_out_of_order >= 5, "{:?}", fixture.server.stats());
    client.disconnect();
}

/// Requests that overlap one in flight which changes data wait for it: a slow write, then a
/// write and a read of the same range, end with the second write's data; a flush is answered
/// only after the writes received before it.
#[test]
fn conflicting_requests_keep_their_order_and_a_flush_follows_earlier_writes() {
    let fixture = Fixture::start(MIB);
    fixture.vol.delay_at(0, Some(Duration::from_millis(200)));
    let mut client = fixture.client("vol");
    client.queue_request(0, CMD_WRITE, 1, 0, 4096, &[1u8; 4096]);
    client.queue_request(0, CMD_WRITE, 2, 1024, 1024, &[2u8; 1024]);
    client.queue_request(0, CMD_READ, 3, 0, 4096, &[]);
    client.queue_request(0, CMD_FLUSH, 4, 0, 0, &[]);
    client.writer.flush().expect("send");
    let mut order = Vec::new();
    for _ in 0..4 {
        let (error, cookie) = client.reply();
        assert_eq!(error, 0);
        if cookie == 3 {
            let mut expected = vec![1u8; 4096];
            expected[1024..2048].fill(2);
            assert_eq!(client.bytes(4096), expected);
        }
        order.push(cookie);
    }
    assert_eq!(&order[..2], &[1, 2], "{order:?}");
    let flush_at = order.iter().position(|&c| c == 4).expect("flush answered");
    assert!(flush_at > 1, "the flush waited for both writes: {order:?}");
    client.disconnect();
}

/// At most `max_requests_in_flight` requests of a connection run at once, and the rest wait
/// for room; all are answered.
#[test]
fn requests_in_flight_are_bounded_per_connection() {
    let limits = tundra_nbd::Limits { max_requests_in_flight: 3, ..tundra_nbd::Limits::default() };
    let fixture = Fixture::start_with(MIB, limits);
    let mut client = fixture.client("vol");
    for i in 0..12u64 {
        fixture.vol.delay_at(i * 4096, Some(Duration::from_millis(60)));
        client.queue_request(0, CMD_READ, i + 1, i * 4096, 4096, &[]);
    }
    client.writer.flush().expect("send");
    let mut seen = Vec::new();
    for _ in 0..12 {
        let (error, cookie) = client.reply();
        assert_eq!(error, 0);
        client.bytes(4096);
        seen.push(cookie);
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=12).collect::<Vec<_>>());
    let max = fixture.vol.calls().max_concurrent;
    assert!((2..=3).contains(&max), "at most 3 at once, and more than one: {max}");
    client.disconnect();
    // A request leaves the count just after its reply is sent.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixture.server.stats().requests_in_flight != 0 {
        assert!(Instant::now() < deadline, "{:?}", fixture.server.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Payload bytes in flight are bounded per connection too: two 20 MiB reads do not run at once
/// under a 32 MiB bound, yet a request as large as the bound runs alone.
#[test]
fn bytes_in_flight_are_bounded_per_connection() {
    let limits = tundra_nbd::Limits { max_bytes_in_flight: 32 * MIB, ..tundra_nbd::Limits::default() };
    let fixture = Fixture::start_with(64 * MIB, limits);
    let mut client = fixture.client("vol");
    fixture.vol.delay_at(0, Some(Duration::from_millis(100)));
    fixture.vol.delay_at(20 * MIB, Some(Duration::from_millis(100)));
    client.queue_request(0, CMD_READ, 1, 0, 20 * MIB as u32, &[]);
    client.queue_request(0, CMD_READ, 2, 20 * MIB, 20 * MIB as u32, &[]);
    client.queue_request(0, CMD_READ, 3, 32 * MIB, 32 * MIB as u32, &[]);
    client.writer.flush().expect("send");
    for _ in 0..3 {
        let (error, cookie) = client.reply();
        assert_eq!(error, 0);
        client.bytes(if cookie == 3 { 32 * MIB as usize } else { 20 * MIB as usize });
    }
    assert_eq!(fixture.vol.calls().max_concurrent, 1);
    client.disconnect();
}

#[test]
fn queue_depth_one_round_trips_do_not_wait_for_more_requests() {
    // With a reply left in the server's buffer this would stall until the client's read
    // timeout; with Nagle's algorithm on, each round trip could take tens of milliseconds.
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("vol");
    for i in 0..2000u64 {
        assert_eq!(client.write(0, (i * 512) % MIB, &[i as u8; 512]), 0);
        assert_eq!(client.read((i * 512) % MIB, 512), Ok(vec![i as u8; 512]));
    }
    client.disconnect();
}

#[test]
fn several_connections_share_one_export() {
    let fixture = Fixture::start(8 * MIB);
    let writers: Vec<_> = (0..8u8)
        .map(|i| {
            let mut client = fixture.client("vol");
            std::thread::spawn(move || {
                let base = u64::from(i) * MIB;
                for chunk in 0..16u64 {
                    assert_eq!(client.write(0, base + chunk * 65536, &[i + 1; 65536]), 0);
                }
                assert_eq!(client.command(0, CMD_FLUSH, 0, 0), 0);
                client.disconnect();
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer");
    }
    let mut reader = fixture.client("vol");
    for i in 0..8u8 {
        let data = reader.read(u64::from(i) * MIB, MIB as u32).expect("read");
        assert_same(&data, &vec![i + 1; MIB as usize], &format!("region of connection {i}"));
    }
    reader.disconnect();
    let stats = fixture.server.stats();
    assert_eq!((stats.connections_accepted, stats.connections_negotiated), (9, 9));
    assert_eq!(stats.bytes_written, 8 * MIB);
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let fixture = Fixture::start(MIB);
    let mut good = fixture.client("vol");
    let mut bad = fixture.client("vol");
    bad.send_bytes(&[0u8; 28]);
    bad.expect_closed();
    assert_eq!(good.read(0, 1), Ok(vec![0]));
    good.disconnect();
    let stats = fixture.server.stats();
    assert_eq!(stats.protocol_errors, 1);
    assert!(fixture.server.last_protocol_error().expect("recorded").contains("magic"));
}

#[test]
fn random_requests_never_break_the_server() {
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("small");
    let mut rng = Rng::new(seed_from_env(42));
    let size = 64 * 1024u64;
    for cookie in 1..=3000u64 {
        let command = match rng.below(4) {
            0 => rng.below(12) as u16,
            _ => rng.below(7) as u16,
        };
        if command == CMD_DISC {
            continue;
        }
        let flags = if rng.below(3) == 0 { rng.next_u64() as u16 } else { rng.below(4) as u16 };
        let offset = match rng.below(4) {
            0 => rng.next_u64(),
            1 => size - rng.below(100),
            _ => rng.below(size),
        };
        let length = match rng.below(5) {
            0 => 0,
            // Huge lengths, but a write's payload is really sent: keep those to a few.
            1 if command != CMD_WRITE || rng.below(50) == 0 => rng.next_u64() as u32 & 0x3ff_ffff,
            _ => rng.below(9000) as u32,
        };
        let payload = if command == CMD_WRITE { vec![cookie as u8; length as usize] } else { Vec::new() };
        client.queue_request(flags, command, cookie, offset, length, &payload);
        client.writer.flush().expect("send");
        let (error, reply_cookie) = client.reply();
        assert_eq!(reply_cookie, cookie);
        if command == CMD_READ && error == 0 {
            client.bytes(length as usize);
        }
    }
    assert_eq!(client.read(0, 1).map(|data| data.len()), Ok(1));
    client.disconnect();
    assert_eq!(fixture.server.stats().protocol_errors, 0);
}

#[test]
fn shutdown_closes_idle_busy_and_stuck_connections_in_bounded_time() {
    let fixture = Fixture::start(32 * MIB);
    let common::Fixture { server, .. } = fixture;
    let addr = server.local_addr();
    // One idle in transmission, one in the middle of the handshake, one that sent reads of
    // 32 MiB and does not read the replies (the server blocks writing them).
    let mut idle = Client::go(addr, "vol");
    let mut haggling = Client::connect(addr);
    let mut stuck = Client::go(addr, "vol");
    for _ in 0..8 {
        stuck.queue_request(0, CMD_READ, 1, 0, 32 * MIB as u32, &[]);
    }
    stuck.writer.flush().expect("send");
    assert_eq!(idle.read(0, 1), Ok(vec![0]));
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    server.shutdown();
    let took = started.elapsed();
    assert!(took < SHUTDOWN_GRACE + Duration::from_secs(3), "shutdown took {took:?}");
    idle.expect_closed();
    haggling.expect_closed();
    assert!(std::net::TcpStream::connect(addr).is_err() || Client::greet_fails(addr));
}

impl Client {
    /// Whether a connection to `addr` gets no greeting (nothing listens any more).
    fn greet_fails(addr: std::net::SocketAddr) -> bool {
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return true;
        };
        stream.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let mut byte = [0u8; 1];
        !matches!(std::io::Read::read(&mut stream, &mut byte), Ok(1))
    }
}

#[test]
fn dropping_the_server_stops_it() {
    let fixture = Fixture::start(MIB);
    let mut client = fixture.client("vol");
    let stats = fixture.server.stats();
    assert_eq!((stats.connections_open, stats.connections_accepted), (1, 1));
    drop(fixture);
    client.expect_closed();
}
