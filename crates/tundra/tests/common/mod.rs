//! Running the `tundra` binary from the end-to-end tests.

use std::process::{Command, Output};

pub fn tundra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tundra")).args(args).output().expect("run tundra")
}

/// Runs tundra, requires success, and returns its output.
pub fn succeeds(args: &[&str]) -> Output {
    let out = tundra(args);
    assert!(out.status.success(), "tundra {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Runs tundra and requires a failure whose `tundra: ` message contains `needle`; returns the
/// message.
pub fn fails(args: &[&str], needle: &str) -> String {
    let out = tundra(args);
    assert!(!out.status.success(), "tundra {args:?} should fail");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.starts_with("tundra: "), "{stderr}");
    assert!(stderr.contains(needle), "tundra {args:?}: expected {needle:?} in {stderr}");
    stderr
}

/// [`fails`], and the message names its class once (never `INVALID: invalid request: ...`).
#[allow(dead_code)]
pub fn fails_once(args: &[&str], needle: &str) -> String {
    let stderr = fails(args, needle);
    for class in ["invalid request: ", "no space: "] {
        assert!(!stderr.contains(class), "tundra {args:?} names its class twice: {stderr}");
    }
    stderr
}

/// The real PostgreSQL table file the cluster tests write (`target/realdata/flights.heap`,
/// made by scripts/pg-real-table), if it is there with at least `min_bytes`. Without it a test
/// falls back to other bytes, unless `TUNDRA_REQUIRE_REALDATA=1` (scripts/test sets it, after
/// making the file), where its absence fails the test.
#[allow(dead_code)]
pub fn realdata_heap(min_bytes: usize) -> Option<(std::path::PathBuf, Vec<u8>)> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/realdata/flights.heap");
    let required = std::env::var("TUNDRA_REQUIRE_REALDATA").is_ok_and(|v| v == "1");
    realdata_at(&path, min_bytes, required).map(|bytes| (path, bytes))
}

/// The bytes of `path` if it holds at least `min_bytes`; a panic instead of None when
/// `required`.
#[allow(dead_code)]
pub fn realdata_at(path: &std::path::Path, min_bytes: usize, required: bool) -> Option<Vec<u8>> {
    let found = std::fs::read(path).ok().filter(|bytes| bytes.len() >= min_bytes);
    if found.is_none() && required {
        panic!(
            "TUNDRA_REQUIRE_REALDATA=1 but {} is missing or shorter than {min_bytes} bytes: make it with \
             scripts/pg-real-table",
            path.display()
        );
    }
    found
}

/// `count` distinct loopback addresses that were free a moment ago, on ports below the
/// kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`, 32768 and up by
/// default). A port from that range, released and then bound again by a server the test
/// starts (or restarts after killing it), can meanwhile be the local port of some outgoing
/// connection, and the server then fails with `Address already in use`; ports below it are
/// never given to outgoing connections. Ports 22000 to 31999: above the default ports (7807,
/// 9807, 10809) and the fixed ports the scripts start from (up to 20819). Each process starts
/// at its own place in the range (from its pid) and never hands out a port twice.
#[allow(dead_code)]
pub fn free_addrs(count: usize) -> Vec<std::net::SocketAddr> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 22_000;
    const SPAN: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(2_654_435_761)) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let mut addrs = Vec::with_capacity(count);
    let mut tries = 0;
    while addrs.len() < count {
        tries += 1;
        assert!(tries < SPAN as usize, "no free port in {FIRST}..{}", FIRST + SPAN);
        let port = FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port as u16));
        // Taken by someone else now: the next one.
        if std::net::TcpListener::bind(addr).is_ok() {
            addrs.push(addr);
        }
    }
    addrs
}
