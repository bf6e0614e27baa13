//! Fuzzing the NBD server over a socket: arbitrary bytes after the greeting (the client flags
//! and option parser), arbitrary bytes after a successful NBD_OPT_GO (the request parser), and
//! mutations (bit flips, cuts, inserted junk, numbers near their limits) of a valid session:
//! options (LIST, INFO, GO), then READ, WRITE, FLUSH, TRIM, WRITE_ZEROES and DISC. The server
//! must never panic, must answer or close every connection within a bound, and must still
//! serve a clean client afterwards. `TUNDRA_FUZZ_CASES` sets the cases (default 256).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use proptest::prelude::*;

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn cases() -> u32 {
    let cases = std::env::var("TUNDRA_FUZZ_CASES").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(256);
    eprintln!("fuzz cases per property: {cases}");
    cases
}

/// One server for every case ("vol" of 1 MiB and "small"), and a hook that counts panics on any
/// thread, the server's connection threads included.
fn fixture() -> &'static Fixture {
    static FIXTURE: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
        Fixture::start(MIB)
    })
}

fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    requests.iter().for_each(|r| data.extend_from_slice(&r.to_be_bytes()));
    data
}

fn request(out: &mut Vec<u8>, flags: u16, command: u16, offset: u64, length: u32, payload: &[u8]) {
    out.extend_from_slice(&0x25609513u32.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&(offset ^ 0xc0c0).to_be_bytes()); // the cookie
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The client flags and the options of a session that enters transmission on "vol".
fn handshake() -> Vec<u8> {
    let mut out = 3u32.to_be_bytes().to_vec(); // FIXED_NEWSTYLE | NO_ZEROES
    option(&mut out, OPT_LIST, &[]);
    option(&mut out, OPT_INFO, &info_data("small", &[INFO_BLOCK_SIZE, INFO_NAME]));
    option(&mut out, OPT_GO, &info_data("vol", &[INFO_BLOCK_SIZE]));
    out
}

/// A valid session: the handshake, then commands at `offset`, and a clean disconnect.
fn valid_session(offset: u64, fill: u8) -> Vec<u8> {
    let offset = offset % (MIB - 16384) / 512 * 512;
    let mut out = handshake();
    request(&mut out, 0, CMD_WRITE, offset, 8192, &vec![fill; 8192]);
    request(&mut out, 0, CMD_READ, offset, 4096, &[]);
    request(&mut out, FLAG_FUA, CMD_WRITE, offset + 512, 512, &[fill ^ 1; 512]);
    request(&mut out, 0, CMD_FLUSH, 0, 0, &[]);
    request(&mut out, 0, CMD_TRIM, offset, 4096, &[]);
    request(&mut out, FLAG_NO_HOLE, CMD_WRITE_ZEROES, offset + 4096, 4096, &[]);
    request(&mut out, 0, CMD_CACHE, offset, 4096, &[]);
    request(&mut out, 0, CMD_BLOCK_STATUS, offset, 4096, &[]);
    request(&mut out, 0, CMD_DISC, 0, 0, &[]);
    out
}

/// A change to a byte stream.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Cut(usize),
    Insert(usize, Vec<u8>),
    /// Overwrite 4 bytes with a number near a limit (a length, an offset, a count).
    Number(usize, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
        1 => any::<usize>().prop_map(Mutation::Cut),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..40)).prop_map(|(a, b)| Mutation::Insert(a, b)),
        2 => (any::<usize>(), prop_oneof![Just(0u32), Just(u32::MAX), Just(1 << 31), Just(1 << 25), 0..20u32])
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
            bytes[at..end].copy_from_slice(&n.to_be_bytes()[..end - at]);
        }
    }
}

/// Reads the greeting, sends `bytes` (from another thread, so replies never block it) and reads
/// until the server closes. Returns the bytes the server sent after the greeting.
fn exchange(bytes: Vec<u8>) -> Result<usize, TestCaseError> {
    let mut stream = TcpStream::connect(fixture().addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).expect("greeting");
    let mut writer = stream.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        // The server may close first (a refused handshake): a failed write is expected then.
        let _ = writer.write_all(&bytes);
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut received = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(TestCaseError::fail(format!("the server neither answered nor closed: {e}"))),
        }
    }
    sender.join().expect("sender");
    Ok(received)
}

/// A clean client still reads what it wrote: the server survived.
fn still_serves() {
    let mut client = fixture().client("vol");
    assert_eq!(client.write(0, 4096, &[0x5a; 512]), 0);
    assert_eq!(client.read(4096, 512).expect("read after fuzzing"), vec![0x5a; 512]);
    client.disconnect();
}

/// The harness: an unmutated session is answered and ends cleanly.
#[test]
fn a_valid_session_is_answered() {
    let received = exchange(valid_session(8192, 3)).expect("exchange");
    assert!(received > 8 * 16 + 4096, "{received} bytes back");
    still_serves();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_handshake_bytes_never_panic_the_server(bytes in prop::collection::vec(any::<u8>(), 0..300), flags in any::<bool>()) {
        let mut session = if flags { 3u32.to_be_bytes().to_vec() } else { Vec::new() };
        session.extend_from_slice(&bytes);
        exchange(session)?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    }

    #[test]
    fn arbitrary_requests_never_panic_the_server(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut session = handshake();
        session.extend_from_slice(&bytes);
        exchange(session)?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    }

    #[test]
    fn mutated_sessions_never_panic_the_server(
        offset in any::<u64>(),
        fill in any::<u8>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let mut session = valid_session(offset, fill);
        for m in &mutations {
            apply(&mut session, m);
        }
        exchange(session)?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    }
}

#[test]
fn the_server_survives_the_fuzzing() {
    still_serves();
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}
