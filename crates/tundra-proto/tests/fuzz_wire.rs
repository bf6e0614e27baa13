//! Fuzzing the native protocol's server over a socket: arbitrary bytes, and mutations (bit
//! flips, cuts, inserted junk) of a valid session (hello, volume create, page writes and reads,
//! trim, flush, stats, and version 2's redo appends, reads at an LSN and leases), sent to a
//! running server; and sound frames of the redo opcodes around arbitrary bodies, each of which
//! must be answered. The server must never panic, must close or
//! answer every connection within a bound, and must still serve a clean session afterwards.
//! The frame, hello and message decoders alone are fuzzed in fuzz.rs; this reaches the
//! connection loop that drives them. `TUNDRA_FUZZ_CASES` sets the cases (default 256).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tundra_proto::frame::{ClientHello, FrameHeader, HEADER_BYTES, SERVER_HELLO_BYTES, decode_frame, write_frame};
use tundra_proto::mem::MemService;
use tundra_proto::{
    MAX_BODY_BYTES, Opcode, PageList, PageRead, PagesRead, ReadAt, RedoAppend, Request, Server, VolumeMode, WriteMode,
};

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn cases() -> u32 {
    let cases = std::env::var("TUNDRA_FUZZ_CASES").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(256);
    eprintln!("fuzz cases per property: {cases}");
    cases
}

/// One server for every case, and a hook that counts panics on any thread (the server's
/// connection threads included).
fn server() -> &'static Server {
    static SERVER: std::sync::OnceLock<Server> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
        Server::start("127.0.0.1:0", Arc::new(MemService::new())).expect("server")
    })
}

/// A valid session's bytes: the hello, then requests with ids 1, 2, ...
fn valid_session(page: u64, fill: u8) -> Vec<u8> {
    let data = vec![fill; 8192];
    let at = ReadAt { request_lsn: 40, not_modified_since: 10, lease: Some(1) };
    let pages = [page, page + 1, 0];
    let requests = [
        Request::Ping { payload: b"hello" },
        Request::VolumeCreate {
            name: "fuzz",
            size_bytes: 1 << 20,
            page_size: 8192,
            mode: VolumeMode::Normal,
            replicas: 1,
        },
        Request::VolumeLookup { name: "fuzz" },
        Request::WritePage { volume: 1, page, mode: WriteMode::Lz4, data: &data },
        Request::ReadPage { volume: 1, page },
        Request::Trim { volume: 1, first: page, count: 2 },
        Request::Flush { volume: None },
        Request::Stats { volume: Some(1) },
        Request::VolumeList,
        Request::HeavyCompress { volume: 1, first: 0, count: 16 },
        Request::AppendRedo(RedoAppend {
            volume: 1,
            writer_epoch: 1,
            prev_lsn: 0,
            end_lsn: 50,
            record_count: 3,
            records: &data[..300],
        }),
        Request::RegisterReader { volume: 1, reader_id: 9, start_lsn: 20 },
        Request::GetPageAtLsn(PageRead { volume: 1, page, at }),
        Request::GetPagesAtLsn(PagesRead { volume: 1, pages: PageList::Numbers(&pages), at }),
        Request::RenewReader { volume: 1, lease_id: 1, apply_lsn: 45 },
        Request::RedoStatus { volume: 1 },
        Request::ReleaseReader { volume: 1, lease_id: 1 },
    ];
    let mut bytes = ClientHello::CURRENT.encode().to_vec();
    for (id, request) in requests.iter().enumerate() {
        write_frame(&mut bytes, request.opcode().code(), 0, id as u64 + 1, &[&request.encode_body()]).expect("frame");
    }
    bytes
}

/// A change to a byte stream.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, Vec<u8>),
    /// Overwrite 4 bytes with a number near a limit (a length, an id, a count).
    Number(usize, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
        1 => any::<usize>().prop_map(Mutation::Cut),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..40)).prop_map(|(a, b)| Mutation::Insert(a, b)),
        2 => (any::<usize>(), prop_oneof![Just(0u32), Just(u32::MAX), Just(1 << 31), Just(1 << 24), 0..20u32])
            .prop_map(|(a, n)| Mutation::Number(a, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match mutation {
        Mutation::Flip(at, bit) => {
            let at = at % bytes.len();
            bytes[at] ^= 1 << (bit % 8);
        }
        Mutation::Cut(at) => bytes.truncate(at % bytes.len()),
        Mutation::Insert(at, junk) => {
            let at = at % bytes.len();
            bytes.splice(at..at, junk.iter().copied());
        }
        Mutation::Number(at, n) => {
            let at = at % bytes.len().saturating_sub(3).max(1);
            let end = (at + 4).min(bytes.len());
            bytes[at..end].copy_from_slice(&n.to_le_bytes()[..end - at]);
        }
    }
}

/// Sends `bytes` on a fresh connection (from another thread, so that replies never block it),
/// then reads until the server closes. Returns the bytes the server sent.
fn exchange(bytes: Vec<u8>) -> Result<Vec<u8>, TestCaseError> {
    let stream = TcpStream::connect(server().local_addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        // The server may close first (a bad hello): a failed write is expected then.
        let _ = writer.write_all(&bytes);
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut reader = stream;
    let mut received = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(TestCaseError::fail(format!("the server neither answered nor closed: {e}"))),
        }
    }
    sender.join().expect("sender");
    Ok(received)
}

/// A clean session still works: the server survived.
fn still_serves() {
    let mut stream = TcpStream::connect(server().local_addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    stream.write_all(&ClientHello::CURRENT.encode()).expect("hello");
    let mut hello = [0u8; SERVER_HELLO_BYTES];
    stream.read_exact(&mut hello).expect("server hello");
    let mut ping = Vec::new();
    let request = Request::Ping { payload: b"alive" };
    write_frame(&mut ping, request.opcode().code(), 0, 7, &[&request.encode_body()]).expect("frame");
    stream.write_all(&ping).expect("ping");
    let mut header = [0u8; HEADER_BYTES];
    stream.read_exact(&mut header).expect("the server answers a ping after the fuzzing");
}

/// The harness: an unmutated session gets answers to all its requests.
#[test]
fn a_valid_session_is_answered() {
    let received = exchange(valid_session(3, 1)).expect("exchange");
    assert!(received.len() > SERVER_HELLO_BYTES + 17 * HEADER_BYTES, "{} bytes back", received.len());
    still_serves();
}

/// The frames in a server's answer after its hello.
fn answers(received: &[u8]) -> Vec<FrameHeader> {
    let mut rest = received.get(SERVER_HELLO_BYTES..).unwrap_or_default();
    let mut headers = Vec::new();
    while let Ok(Some((frame, used))) = decode_frame(rest, MAX_BODY_BYTES) {
        headers.push(frame.header);
        rest = &rest[used..];
    }
    assert!(rest.is_empty(), "{} bytes after the last whole answer", rest.len());
    headers
}

fn redo_opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(Opcode::ALL.iter().copied().filter(|opcode| opcode.since() == 2).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_server(bytes in prop::collection::vec(any::<u8>(), 0..400), hello in any::<bool>()) {
        let mut session = if hello { ClientHello::CURRENT.encode().to_vec() } else { Vec::new() };
        session.extend_from_slice(&bytes);
        exchange(session)?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    }

    #[test]
    fn mutated_sessions_never_panic_the_server(
        page in 0..128u64,
        fill in any::<u8>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let mut session = valid_session(page, fill);
        for m in &mutations {
            apply(&mut session, m);
        }
        exchange(session)?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    }

    #[test]
    fn sound_frames_of_redo_opcodes_with_arbitrary_bodies_are_each_answered(
        frames in prop::collection::vec((redo_opcode(), prop::collection::vec(any::<u8>(), 0..120)), 1..12),
        prefix in any::<bool>(),
    ) {
        // Half the cases start with a valid session's volume and stream, so that some bodies
        // reach the service; the others meet an empty server.
        let mut session = if prefix { valid_session(1, 7) } else { ClientHello::CURRENT.encode().to_vec() };
        let first_id = if prefix { 100 } else { 1 };
        for (n, (opcode, body)) in frames.iter().enumerate() {
            write_frame(&mut session, opcode.code(), 0, first_id + n as u64, &[body]).expect("frame");
        }
        let received = exchange(session)?;
        let answered = answers(&received);
        let expected = frames.len() + if prefix { 17 } else { 0 };
        prop_assert_eq!(answered.len(), expected, "every sound frame gets one answer");
        prop_assert!(answered.iter().all(|header| header.flags == 0), "no answer closes the connection");
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    }
}

/// Runs after the properties in the same process when tests run one at a time; on its own it
/// still checks a fresh server.
#[test]
fn the_server_survives_the_fuzzing() {
    still_serves();
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}
