//! The replicated write path's latency trace: with `TUNDRA_LATENCY_TRACE=PREFIX` in its
//! environment, each process appends one line `STAGE MICROSECONDS` per traced stage (the
//! leader's Algorithm 1 and proposal, the log's append and sync, a peer's append round trip, a
//! follower's append, an apply) to the file `PREFIX.PID`; `scripts/latency-summary` prints each
//! stage's percentiles. Off (one check of a cached variable) unless set.
//!
//! With it set, each process also appends one line `STAGE MICROSECONDS` per [`mark`] to
//! `PREFIX.PID.marks`, the microseconds being the wall clock every process on the machine shares:
//! `scripts/latency-timeline` lines up the marks of a cluster's processes write by write, to show
//! where a write waits between the stages (a task hop, a connection's queue).

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

type Sink = Option<parking_lot::Mutex<std::fs::File>>;

static SINK: OnceLock<Sink> = OnceLock::new();
/// Marks are buffered (a write of the file per mark would be a hop of its own); the last
/// buffer's worth of a process killed is lost.
static MARKS: OnceLock<Option<parking_lot::Mutex<std::io::BufWriter<std::fs::File>>>> = OnceLock::new();

fn open(suffix: &str) -> Option<std::fs::File> {
    let prefix = std::env::var("TUNDRA_LATENCY_TRACE").ok()?;
    std::fs::OpenOptions::new().create(true).append(true).open(format!("{prefix}.{}{suffix}", std::process::id())).ok()
}

fn sink() -> &'static Sink {
    SINK.get_or_init(|| open("").map(parking_lot::Mutex::new))
}

/// Notes that `stage` happens now (see the module's documentation).
pub fn mark(stage: &str) {
    let marks = MARKS
        .get_or_init(|| open(".marks").map(|f| parking_lot::Mutex::new(std::io::BufWriter::with_capacity(1 << 16, f))));
    if let Some(file) = marks {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let _ = writeln!(file.lock(), "{stage} {}", now.as_micros());
    }
}

/// Notes that `stage`, begun at `start`, ended now.
pub fn note(stage: &str, start: Instant) {
    if let Some(file) = sink() {
        let _ = writeln!(file.lock(), "{stage} {}", start.elapsed().as_micros());
    }
}
