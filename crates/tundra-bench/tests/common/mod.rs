//! Running the `tundra-bench` binary from the end-to-end tests.

use std::process::{Command, Output};

pub fn tundra_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tundra-bench")).args(args).output().expect("run tundra-bench")
}

/// Runs tundra-bench, requires success, and returns its output.
pub fn succeeds(args: &[&str]) -> Output {
    let out = tundra_bench(args);
    assert!(out.status.success(), "tundra-bench {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Runs tundra-bench and requires a failure whose `tundra-bench: ` message contains `needle`.
pub fn fails(args: &[&str], needle: &str) {
    let out = tundra_bench(args);
    assert!(!out.status.success(), "tundra-bench {args:?} should fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("tundra-bench: "), "{stderr}");
    assert!(stderr.contains(needle), "tundra-bench {args:?}: expected {needle:?} in {stderr}");
}
