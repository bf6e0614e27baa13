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
