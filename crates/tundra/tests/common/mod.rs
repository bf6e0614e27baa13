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
