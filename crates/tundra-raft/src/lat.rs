//! The replicated write path's latency trace: with `TUNDRA_LATENCY_TRACE=PREFIX` in its
//! environment, each process appends one line `STAGE MICROSECONDS` per traced stage (the
//! leader's Algorithm 1 and proposal, the log's append and sync, a peer's append round trip, a
//! follower's append, an apply) to the file `PREFIX.PID`; `scripts/latency-summary` prints each
//! stage's percentiles. Off (one check of a cached variable) unless set.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

static SINK: OnceLock<Option<parking_lot::Mutex<std::fs::File>>> = OnceLock::new();

fn sink() -> &'static Option<parking_lot::Mutex<std::fs::File>> {
    SINK.get_or_init(|| {
        let prefix = std::env::var("TUNDRA_LATENCY_TRACE").ok()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(format!("{prefix}.{}", std::process::id()))
            .ok()?;
        Some(parking_lot::Mutex::new(file))
    })
}

/// Notes that `stage`, begun at `start`, ended now.
pub fn note(stage: &str, start: Instant) {
    if let Some(file) = sink() {
        let _ = writeln!(file.lock(), "{stage} {}", start.elapsed().as_micros());
    }
}
