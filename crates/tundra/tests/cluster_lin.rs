//! Linearizability of real runs: three `tundra serve` processes, clients reading and writing
//! pages of a replicated volume over the native protocol, each at a node of its own (moving to
//! another when its node dies), while a nemesis kills a node with kill -9 and restarts it, again
//! and again. The history (each operation's call and return times, a write whose answer never
//! came recorded as of unknown outcome) is checked with Porcupine (scripts/lincheck, a pinned Go
//! module), page by page as registers. A twin check alters one read of the same history and
//! expects the checker to find the violation.
//!
//! By default the run is short (a few seconds). `TUNDRA_LIN_OPS=N` runs until N operations
//! completed, and `TUNDRA_LIN_OUT=DIR` writes the counts to DIR/linearizability.txt.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use tundra_env::Rng;
use tundra_proto::WriteMode;

const PAGE: usize = 8192;
const PAGES: u64 = 4;
const CLIENTS: u64 = 4;

#[derive(Clone, Copy)]
struct Record {
    client: u64,
    write: bool,
    page: u64,
    value: u64,
    call_ns: i64,
    /// -1: a write whose outcome the client never learned.
    ret_ns: i64,
}

impl Record {
    fn json(&self) -> String {
        format!(
            "{{\"client\":{},\"kind\":\"{}\",\"page\":{},\"value\":{},\"call\":{},\"ret\":{}}}",
            self.client,
            if self.write { "w" } else { "r" },
            self.page,
            self.value,
            self.call_ns,
            self.ret_ns
        )
    }
}

/// One client: operations at its node until `stop`; a failed connection or request moves it to
/// the next node.
fn client(
    id: u64,
    addrs: Vec<std::net::SocketAddr>,
    volume: u32,
    start: Instant,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<Record> {
    let mut rng = Rng::new(0x11ce ^ id);
    let mut history = Vec::new();
    let mut node = id as usize % addrs.len();
    let mut seq = 0u64;
    let now = || start.elapsed().as_nanos() as i64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut connection) = tundra_client::Client::connect(addrs[node]) else {
            node = (node + 1) % addrs.len();
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let page = rng.below(PAGES);
            if rng.below(2) == 0 {
                seq += 1;
                let value = ((id + 1) << 40) | seq;
                let mut content = vec![0u8; PAGE];
                content[..8].copy_from_slice(&value.to_le_bytes());
                let call_ns = now();
                let result = connection.write_page(volume, page, WriteMode::Auto, &content);
                let ret_ns = if result.is_ok() { now() } else { -1 };
                history.push(Record { client: id, write: true, page, value, call_ns, ret_ns });
                if result.is_err() {
                    break;
                }
            } else {
                let call_ns = now();
                let Ok(content) = connection.read_page(volume, page) else { break };
                let ret_ns = now();
                let mut value = [0u8; 8];
                value.copy_from_slice(&content[..8]);
                history.push(Record {
                    client: id,
                    write: false,
                    page,
                    value: u64::from_le_bytes(value),
                    call_ns,
                    ret_ns,
                });
            }
            done.fetch_add(1, Ordering::Relaxed);
        }
        node = (node + 1) % addrs.len();
    }
    history
}

/// A results directory named relative to the repository's root (tests run in the crate's).
fn results_dir(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir)
}

fn lincheck(dir: &Path) -> PathBuf {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/lincheck");
    let binary = dir.join("lincheck");
    let out = Command::new("go")
        .args(["build", "-o", binary.to_str().expect("utf-8")])
        .current_dir(&source)
        .output()
        .unwrap_or_else(|e| panic!("go: {e} (install Go with scripts/install-deps)"));
    assert!(out.status.success(), "building scripts/lincheck: {}", String::from_utf8_lossy(&out.stderr));
    binary
}

/// Runs the checker on a history; returns its exit status and its JSON verdict.
fn check(binary: &Path, history: &[Record], file: &Path) -> (i32, serde_json::Value) {
    let mut text = std::fs::File::create(file).expect("history file");
    for record in history {
        writeln!(text, "{}", record.json()).expect("write history");
    }
    drop(text);
    let out = Command::new(binary).arg(file).output().expect("run lincheck");
    let verdict = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("lincheck said: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), verdict)
}

#[test]
fn reads_and_writes_stay_linearizable_while_nodes_are_killed() {
    let target_ops: Option<u64> = std::env::var("TUNDRA_LIN_OPS").ok().and_then(|v| v.parse().ok());
    let short = Duration::from_secs(8);
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    let checker = lincheck(cluster.path());
    succeeds(&["volume", "create", "lin", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volume = tundra_client::Client::connect(cluster.member(1).native)
        .expect("connect")
        .volume_lookup("lin")
        .expect("lookup")
        .id;
    let addrs: Vec<_> = (1..=3).map(|id| cluster.member(id).native).collect();
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let (addrs, stop, done) = (addrs.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || client(id, addrs, volume, start, stop, done))
        })
        .collect();
    // The nemesis: kill -9 one node, restart it, let the cluster settle, again.
    let kills = Arc::new(Mutex::new(0u64));
    let mut rng = Rng::new(0x9e);
    loop {
        let finished = match target_ops {
            Some(n) => done.load(Ordering::Relaxed) >= n,
            None => start.elapsed() >= short,
        };
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(800 + rng.below(1200)));
        let victim = 1 + rng.below(3);
        cluster.kill9(victim);
        *kills.lock().expect("kills") += 1;
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        cluster.start(victim);
    }
    stop.store(true, Ordering::Relaxed);
    let mut history: Vec<Record> = clients.into_iter().flat_map(|c| c.join().expect("a client thread")).collect();
    history.sort_by_key(|r| r.call_ns);
    let kills = *kills.lock().expect("kills");
    let (status, verdict) = check(&checker, &history, &cluster.path().join("history.jsonl"));
    let summary = format!(
        "operations {} (reads {}, writes {}, of unknown outcome {}), kill -9 and restart {kills}, verdict {}, violations {}",
        verdict["operations"],
        verdict["reads"],
        verdict["writes"],
        verdict["unknown_outcome_writes"],
        verdict["verdict"],
        verdict["violations"]
    );
    println!("{summary}");
    if let Ok(dir) = std::env::var("TUNDRA_LIN_OUT") {
        std::fs::create_dir_all(results_dir(&dir)).expect("results dir");
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let text = format!(
            "# TUNDRA_LIN_OPS={} TUNDRA_LIN_OUT={dir} cargo test -p tundra --test cluster_lin -- --nocapture\n\
             # three tundra serve on 127.0.0.1, {CLIENTS} clients over the native protocol, {PAGES} pages of one replicated volume, \
             a nemesis that kills -9 a random node and restarts it; checked by scripts/lincheck (Porcupine v1.3.1)\n\
             # loadavg after: {load}{}\nseconds {:.0}\n",
            target_ops.map_or("(short)".to_string(), |n| n.to_string()),
            verdict,
            start.elapsed().as_secs_f64()
        );
        std::fs::write(results_dir(&dir).join("linearizability.txt"), format!("{text}{summary}\n"))
            .expect("write results");
    }
    assert_eq!(status, 0, "{summary}\n{}", cluster.logs());
    assert!(kills >= 1 && verdict["operations"].as_u64().is_some_and(|n| n > 20), "{summary}");

    // The twin: one read altered to a value no write ever wrote must be caught.
    let mut broken = history.clone();
    let read = broken.iter_mut().rev().find(|r| !r.write).expect("a read in the history");
    read.value = u64::MAX;
    let (status, verdict) = check(&checker, &broken, &cluster.path().join("broken.jsonl"));
    assert_eq!(status, 2, "an altered read passed the checker: {verdict}");
}
