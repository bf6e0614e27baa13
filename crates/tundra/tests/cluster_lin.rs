//! Linearizability of real runs: three `tundra serve` processes, clients reading and writing
//! pages of a replicated volume over the native protocol, each at a node of its own (moving to
//! another when its node dies), while a nemesis injects one fault at a time, again and again:
//! kill -9 of a node and its restart, a link between two nodes cut both ways, a link cut one
//! way, or a node cut off from both peers (a partition; its clients still reach it). Every peer
//! link runs through a proxy of common/links.rs, which holds the bytes a cut stops and lets
//! them go at the heal. The history (each operation's call and return times, a write whose answer never
//! came recorded as of unknown outcome) is checked with Porcupine (scripts/lincheck, a pinned Go
//! module), page by page as registers. A twin check alters one read of the same history and
//! expects the checker to find the violation.
//!
//! By default the run is short (a few seconds). `TUNDRA_LIN_OPS=N` runs until N operations
//! completed, and `TUNDRA_LIN_OUT=DIR` writes the counts to DIR/linearizability.txt. The run
//! prints how many faults of each kind it injected.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use common_links::{Cut, Links};
use tundra_env::Rng;
use tundra_proto::WriteMode;

const PAGE: usize = 8192;
const PAGES: u64 = 4;
const CLIENTS: u64 = 4;

/// The faults the nemesis injects, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// kill -9 of a node, then its restart.
    Kill,
    /// Nothing passes between two nodes.
    CutBothWays,
    /// What one node sends another is held; the other's bytes still reach it.
    CutOneWay,
    /// A node cut off from both peers, both ways, while its clients still reach it.
    Partition,
}

const FAULTS: [Fault; 4] = [Fault::Kill, Fault::CutBothWays, Fault::CutOneWay, Fault::Partition];

impl Fault {
    fn index(self) -> usize {
        FAULTS.iter().position(|&f| f == self).expect("a fault kind")
    }
}

/// Injects `fault` on node `a` (and `b`, the other end of a link), holds it a while, and
/// repairs it.
fn inject(cluster: &mut Cluster, rng: &mut Rng, fault: Fault, a: u64, b: u64) {
    let hold = Duration::from_millis(300 + rng.below(1700));
    if fault == Fault::Kill {
        cluster.kill9(a);
        std::thread::sleep(hold);
        cluster.start(a);
        return;
    }
    let links: &Links = cluster.links.as_ref().expect("a cluster with faulty links");
    match fault {
        Fault::CutBothWays => links.cut(a, b, Cut::Both),
        Fault::CutOneWay => links.cut(a, b, Cut::OneWay),
        Fault::Partition => links.isolate(a),
        Fault::Kill => unreachable!("handled above"),
    }
    std::thread::sleep(hold);
    links.heal();
}

/// The next fault: each kind once, in a random order, then again, so that every run of four
/// faults or more has them all.
fn next_fault(rng: &mut Rng, round: &mut Vec<Fault>) -> Fault {
    if round.is_empty() {
        round.extend(FAULTS);
        for i in (1..round.len()).rev() {
            round.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    round.pop().expect("a fault")
}

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
fn reads_and_writes_stay_linearizable_while_nodes_are_killed_and_cut_off() {
    let target_ops: Option<u64> = std::env::var("TUNDRA_LIN_OPS").ok().and_then(|v| v.parse().ok());
    let short = Duration::from_secs(8);
    let mut cluster = Cluster::with_faulty_links(|_| None);
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
    // The nemesis: one fault, held a while and repaired, a pause to settle, again.
    let mut counts = [0u64; FAULTS.len()];
    let mut rng = Rng::new(0x9e);
    let mut round = Vec::new();
    loop {
        let finished = match target_ops {
            Some(n) => done.load(Ordering::Relaxed) >= n,
            None => start.elapsed() >= short && counts.iter().all(|&c| c > 0),
        };
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(500 + rng.below(1000)));
        let fault = next_fault(&mut rng, &mut round);
        let a = 1 + rng.below(3);
        let b = 1 + (a + rng.below(2)) % 3;
        inject(&mut cluster, &mut rng, fault, a, b);
        counts[fault.index()] += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut history: Vec<Record> = clients.into_iter().flat_map(|c| c.join().expect("a client thread")).collect();
    history.sort_by_key(|r| r.call_ns);
    let held = cluster.links.as_ref().map_or(0, Links::held_reads);
    let (status, verdict) = check(&checker, &history, &cluster.path().join("history.jsonl"));
    let summary = format!(
        "operations {} (reads {}, writes {}, of unknown outcome {}), faults: kill -9 and restart {}, link cut both ways {}, \
         link cut one way {}, partition {} (peer reads held by cuts {held}), verdict {}, violations {}",
        verdict["operations"],
        verdict["reads"],
        verdict["writes"],
        verdict["unknown_outcome_writes"],
        counts[Fault::Kill.index()],
        counts[Fault::CutBothWays.index()],
        counts[Fault::CutOneWay.index()],
        counts[Fault::Partition.index()],
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
             a nemesis that injects one fault at a time (kill -9 and restart, a link cut both ways or one way, a node partitioned from both peers), \
             each held 0.3 to 2 s, every peer link through a proxy that holds cut bytes; checked by scripts/lincheck (Porcupine v1.3.1)\n\
             # loadavg after: {load}{}\nseconds {:.0}\n",
            target_ops.map_or("(short)".to_string(), |n| n.to_string()),
            verdict,
            start.elapsed().as_secs_f64()
        );
        std::fs::write(results_dir(&dir).join("linearizability.txt"), format!("{text}{summary}\n"))
            .expect("write results");
    }
    assert_eq!(status, 0, "{summary}\n{}", cluster.logs());
    assert!(counts.iter().all(|&c| c > 0) && verdict["operations"].as_u64().is_some_and(|n| n > 20), "{summary}");
    // The cuts met live traffic: a proxy that never held anything would make them no faults.
    assert!(held > 0, "{summary}");

    // The twin: one read altered to a value no write ever wrote must be caught.
    let mut broken = history.clone();
    let read = broken.iter_mut().rev().find(|r| !r.write).expect("a read in the history");
    read.value = u64::MAX;
    let (status, verdict) = check(&checker, &broken, &cluster.path().join("broken.jsonl"));
    assert_eq!(status, 2, "an altered read passed the checker: {verdict}");
}

/// Whether a byte sent on a fresh connection through `proxy` (to `upstream`, which accepts it)
/// arrives: from the dialing side when `from_dialer`, else from the side dialed.
fn passes(proxy: std::net::SocketAddr, upstream: &std::net::TcpListener, from_dialer: bool) -> bool {
    use std::io::Read;
    let dialer = std::net::TcpStream::connect(proxy).expect("connect to the proxy");
    let (dialed, _) = upstream.accept().expect("the proxy dials upstream");
    let (mut from, mut to) = if from_dialer { (dialer, dialed) } else { (dialed, dialer) };
    from.write_all(b"x").expect("send");
    to.set_read_timeout(Some(Duration::from_millis(250))).expect("timeout");
    let mut byte = [0u8; 1];
    to.read_exact(&mut byte).is_ok()
}

/// The fault injector itself: a cut holds exactly the directions it names, on the proxies of
/// both ends, and a heal lets everything pass again. (Without this, a proxy that cut nothing
/// would leave the nemesis above injecting no link faults at all.)
#[test]
fn cut_links_hold_what_they_name_and_heal() {
    let upstreams: Vec<std::net::TcpListener> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let addrs: Vec<_> = upstreams.iter().map(|l| l.local_addr().expect("addr")).collect();
    let links = Links::start(&addrs);
    // What `from` sends `to`, over the connection `dialer` opened (whichever of them it is).
    let sends = |dialer: u64, from: u64, to: u64| {
        let dialed = if dialer == from { to } else { from };
        passes(links.addr(dialer, dialed), &upstreams[dialed as usize - 1], dialer == from)
    };
    let everything = |links_ok: &dyn Fn(u64, u64) -> bool| {
        for (a, b) in [(1, 2), (1, 3), (2, 3)] {
            for dialer in [a, b] {
                assert_eq!(sends(dialer, a, b), links_ok(a, b), "{a}->{b} dialed by {dialer}");
                assert_eq!(sends(dialer, b, a), links_ok(b, a), "{b}->{a} dialed by {dialer}");
            }
        }
    };
    everything(&|_, _| true);
    links.cut(1, 2, Cut::OneWay);
    everything(&|from, to| (from, to) != (1, 2));
    links.heal();
    links.cut(2, 3, Cut::Both);
    everything(&|from, to| ![(2, 3), (3, 2)].contains(&(from, to)));
    links.heal();
    links.isolate(1);
    everything(&|from, to| from != 1 && to != 1);
    links.heal();
    everything(&|_, _| true);
    assert!(links.held_reads() > 0);
}
