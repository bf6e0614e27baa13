//! Replication's costs, measured on real processes: page writes at queue depth 1 over the
//! native protocol to a node alone and to the leader of a three-node cluster on 127.0.0.1
//! (the ratio is what replication adds: a loopback round trip and a follower's log sync), and
//! the bytes the leader sends its two followers per page against the page's compressed size
//! (the leader compresses once and ships the compressed image: the target is at most 1.05x),
//! and the process CPU time (utime + stime from /proc/PID/stat) each node spends per page
//! written, the followers' against the leader's.
//!
//! `leader_failover` kills -9 the node leading most groups of a volume of several chunks, asks a
//! survivor over the native protocol until every group the dead node led has a new leader, and
//! records each group's time; the node is restarted and caught up between kills.
//! `throughput_by_groups` writes pages spread across 1, 100 and 1,000 chunk groups per node (1 GiB
//! chunks, three replicas, one volume created on freshly started nodes: see [`build_groups`])
//! at a fixed client concurrency and reports pages/s.
//!
//! `heavy_costs` heavily compresses the same pages on a node alone and through a cluster's
//! leader, and compares what each stored, the bytes sent to the followers and their CPU.
//!
//! By default it runs tiny (a few pages, one round) so that it cannot rot. With
//! `TUNDRA_CLUSTER_BENCH_OUT=DIR` it runs three rounds of `TUNDRA_CLUSTER_BENCH_PAGES` (default
//! 1,000) pages of a real PostgreSQL heap (`target/realdata/flights.heap` from
//! scripts/pg-real-table; the tundra binary's bytes if absent) and writes the raw figures,
//! each round's, their medians and spread, and the machine's load, to DIR/replication.txt,
//! DIR/failover.txt and DIR/groups.txt. The tests take turns (a lock), so that no measurement
//! shares the machine with another.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;
#[path = "common/serve.rs"]
#[allow(dead_code)]
mod common_serve;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use tundra_proto::WriteMode;

const PAGE: usize = 8192;
/// Pages in a chunk: 1 GiB of 8 KiB pages (docs/cli.md "Clusters").
const PAGES_PER_CHUNK: u64 = (1 << 30) / PAGE as u64;

/// One measurement at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether the full run was asked for (`TUNDRA_CLUSTER_BENCH_OUT`), and where it writes.
fn out_dir() -> Option<String> {
    std::env::var("TUNDRA_CLUSTER_BENCH_OUT").ok()
}

/// Rounds of a full run: `TUNDRA_CLUSTER_BENCH_ROUNDS`, 3 unless set.
fn full_rounds() -> usize {
    std::env::var("TUNDRA_CLUSTER_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

/// The CPU time (user + system) process `pid` has used, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // The fields after the command name's closing parenthesis start at field 3 (the state);
    // utime and stime are fields 14 and 15, in clock ticks.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a command name") + 1..].split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a constant of the system.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Each running node's CPU time, by node id.
fn cluster_cpu(cluster: &Cluster) -> [f64; 3] {
    [1, 2, 3].map(|id| cluster.pid(id).map_or(0.0, cpu_seconds))
}

/// The `cluster` object of node `client`'s stats (what `tundra cluster status --json` prints).
fn view(client: &mut tundra_client::Client) -> serde_json::Value {
    let stats: serde_json::Value = serde_json::from_str(&client.stats(None).expect("stats")).expect("stats are JSON");
    stats["cluster"].clone()
}

/// Each chunk of `volume` and its leader, as a status reports them (None: no leader).
fn leaders(status: &serde_json::Value, volume: &str) -> Vec<(u32, Option<u64>)> {
    status["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .filter(|c| c["volume"] == volume)
        .map(|c| (c["chunk"].as_u64().expect("chunk") as u32, c["leader"].as_u64()))
        .collect()
}

/// Waits until every node is up and every chunk of `volume` has a leader and no replica lags.
fn wait_caught_up(cluster: &Cluster, asked: u64, volume: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        let up = status["nodes"].as_array().expect("nodes").iter().all(|n| n["up"] == true);
        let chunks: Vec<&serde_json::Value> =
            status["chunks"].as_array().expect("chunks").iter().filter(|c| c["volume"] == volume).collect();
        if up && !chunks.is_empty() && chunks.iter().all(|c| c["leader"].is_u64() && c["lag"] == 0) {
            return;
        }
        assert!(started.elapsed() < limit, "{volume} did not catch up: {status}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every chunk of `volume` has a leader; returns the leaders by chunk.
fn wait_leaders(cluster: &Cluster, asked: u64, volume: &str, limit: Duration) -> Vec<u64> {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        let found = leaders(&status, volume);
        if !found.is_empty() && found.iter().all(|(_, l)| l.is_some()) {
            let mut found: Vec<(u32, u64)> = found.into_iter().map(|(c, l)| (c, l.expect("a leader"))).collect();
            found.sort();
            return found.into_iter().map(|(_, l)| l).collect();
        }
        assert!(started.elapsed() < limit, "{volume} has chunks without a leader\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn pages(count: usize) -> (Vec<Vec<u8>>, &'static str) {
    let (bytes, what) = match common::realdata_heap(PAGE * 16) {
        Some((_, bytes)) => (bytes, "flights.heap (PostgreSQL, nycflights13)"),
        None => (std::fs::read(env!("CARGO_BIN_EXE_tundra")).expect("read the binary"), "the tundra binary"),
    };
    let available = bytes.len() / PAGE;
    ((0..count).map(|i| bytes[(i % available) * PAGE..(i % available + 1) * PAGE].to_vec()).collect(), what)
}

/// Writes every page at queue depth 1; returns each write's latency in microseconds.
fn write_all(client: &mut tundra_client::Client, volume: u32, pages: &[Vec<u8>]) -> Vec<f64> {
    pages
        .iter()
        .enumerate()
        .map(|(i, page)| {
            let started = Instant::now();
            client.write_page(volume, i as u64, WriteMode::Auto, page).expect("write a page");
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() as f64 * p) as usize).min(values.len() - 1)]
}

/// What replication may add to a write at queue depth 1 (issue's target): one loopback round
/// trip of a page-sized message and one follower's log sync, each measured here in the same
/// round: `rtt_us` the median time for 8 KiB to go to a thread on 127.0.0.1 and 64 bytes back
/// over TCP (one connection, one at a time), `fsync_us` the median time to write 8 KiB into a
/// file of the nodes' temporary directory grown ahead with zeros (as the Raft log is) and
/// `fdatasync` it; also answered, `fsync_append_us`, the same for 8 KiB appended to a growing
/// file (every sync then commits the file's new size).
fn budget(samples: usize) -> (f64, f64, f64) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let echo = std::thread::spawn(move || {
        let (mut peer, _) = listener.accept().expect("accept");
        peer.set_nodelay(true).expect("nodelay");
        let mut buf = vec![0u8; PAGE];
        for _ in 0..samples {
            peer.read_exact(&mut buf).expect("read");
            peer.write_all(&buf[..64]).expect("write");
        }
    });
    let mut link = std::net::TcpStream::connect(addr).expect("connect");
    link.set_nodelay(true).expect("nodelay");
    let page = vec![7u8; PAGE];
    let mut back = [0u8; 64];
    let mut rtt = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        link.write_all(&page).expect("write");
        link.read_exact(&mut back).expect("read");
        rtt.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().expect("echo");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut file = std::fs::File::create(dir.path().join("sync")).expect("create");
    let mut fsync_append = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        file.write_all(&page).expect("append");
        file.sync_data().expect("fdatasync");
        fsync_append.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let mut fsync = syncs_into_zeros(&dir.path().join("ahead"), samples, || {});
    (median(&mut rtt), median(&mut fsync), median(&mut fsync_append))
}

/// `samples` times, after `before_each`: 8 KiB written into a file of zeros written ahead (as
/// the Raft log grows) and `fdatasync`ed, each one's microseconds.
fn syncs_into_zeros(path: &std::path::Path, samples: usize, before_each: impl Fn()) -> Vec<f64> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::create(path).expect("create");
    file.write_all_at(&vec![0u8; samples * PAGE], 0).expect("zeros ahead");
    file.sync_all().expect("sync the zeros");
    let page = vec![7u8; PAGE];
    let mut took = Vec::with_capacity(samples);
    for i in 0..samples {
        before_each();
        let t0 = Instant::now();
        file.write_all_at(&page, (i * PAGE) as u64).expect("write");
        file.sync_data().expect("fdatasync");
        took.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    took
}

/// What one node's log sync costs while the other two sync too, as three nodes on one machine
/// do (their logs share one filesystem and device): the median time of `fsync_us`'s write and
/// `fdatasync` when three threads each do it at once, each into its own file grown ahead, in
/// step (a barrier before each).
fn three_syncs(samples: usize) -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let start = std::sync::Arc::new(std::sync::Barrier::new(3));
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let path = dir.path().join(format!("sync-{t}"));
            let start = start.clone();
            std::thread::spawn(move || {
                syncs_into_zeros(&path, samples, || {
                    start.wait();
                })
            })
        })
        .collect();
    let mut all: Vec<f64> = threads.into_iter().flat_map(|t| t.join().expect("a sync thread")).collect();
    median(&mut all)
}

struct Round {
    /// One loopback round trip and one log sync, measured in the round (see [`budget`]).
    rtt_us: f64,
    fsync_us: f64,
    fsync_append_us: f64,
    /// A log sync while the other two nodes sync too ([`three_syncs`]).
    fsync_three_us: f64,
    single_us_p50: f64,
    replicated_us_p50: f64,
    replicated_us_p99: f64,
    /// The same writes to a cluster whose Raft logs grow by their frames alone
    /// (`TUNDRA_TEST_RAFT_LOG_APPENDS=1`): what growing the log ahead saves.
    appends_us_p50: f64,
    appends_us_p99: f64,
    /// The same writes to a cluster whose leaders sync their own log before the followers see
    /// an entry (`TUNDRA_TEST_LEADER_SYNC_FIRST=1`): what sending before the sync saves.
    sync_first_us_p50: f64,
    sync_first_us_p99: f64,
    single_us_p99: f64,
    follower_bytes_per_page: f64,
    compressed_bytes_per_page: f64,
    /// CPU time per page written, in microseconds: the leader's, then each follower's.
    leader_cpu_us_per_page: f64,
    follower_cpu_us_per_page: [f64; 2],
}

impl Round {
    /// The followers' mean CPU per page against the leader's.
    /// What replication added at the median, over one round trip plus one log sync.
    fn over_budget(&self) -> f64 {
        (self.replicated_us_p50 - self.single_us_p50) / (self.rtt_us + self.fsync_us)
    }

    /// The same, with the sync one of three at once ([`three_syncs`]): what the budget is on
    /// one machine, where a follower's sync always meets the leader's and the other follower's.
    fn over_budget_three(&self) -> f64 {
        (self.replicated_us_p50 - self.single_us_p50) / (self.rtt_us + self.fsync_three_us)
    }

    fn cpu_ratio(&self) -> f64 {
        (self.follower_cpu_us_per_page[0] + self.follower_cpu_us_per_page[1]) / 2.0 / self.leader_cpu_us_per_page
    }
}

/// The latencies of writing `pages` at queue depth 1 to the chunk's leader on three fresh
/// nodes run with the benchmark hook `hook` set to 1.
fn replicated_with(hook: &str, pages: &[Vec<u8>]) -> Vec<f64> {
    let mut cluster = Cluster::new(|_| None);
    cluster.env.push((hook.into(), "1".into()));
    cluster.start_all();
    succeeds(&["volume", "create", "bench", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let leader = cluster.leader(1, "bench");
    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    let volume = client.volume_lookup("bench").expect("lookup").id;
    write_all(&mut client, volume, pages)
}

fn round(count: usize) -> Round {
    let (pages, _) = pages(count);
    let (rtt_us, fsync_us, fsync_append_us) = budget(count.max(100));
    let fsync_three_us = three_syncs(count.clamp(100, 1000));
    // A node alone.
    let site = common_serve::Site::new();
    let single = site.start();
    single.create_volume("bench", "64MiB", "8KiB", "normal");
    let mut client = single.client();
    let volume = client.volume_lookup("bench").expect("lookup").id;
    let mut single_us = write_all(&mut client, volume, &pages);
    drop(single);

    // Three nodes; the client talks to the chunk's leader.
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    succeeds(&["volume", "create", "bench", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let leader = cluster.leader(1, "bench");
    let before = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    let volume = client.volume_lookup("bench").expect("lookup").id;
    let cpu_before = cluster_cpu(&cluster);
    let mut replicated_us = write_all(&mut client, volume, &pages);
    // Let the followers hear the last commit index, so nothing of the run is still to send
    // (and the followers have applied every page when their CPU time is read).
    std::thread::sleep(Duration::from_millis(300));
    let cpu_after = cluster_cpu(&cluster);
    let after = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    let cpu_us_per_page = |id: u64| (cpu_after[id as usize - 1] - cpu_before[id as usize - 1]) * 1e6 / count as f64;
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let stats: serde_json::Value =
        serde_json::from_str(&client.stats(Some(volume)).expect("stats")).expect("stats are JSON");
    let compressed = stats["compressed_bytes"].as_u64().expect("compressed bytes");
    let follower_bytes_per_page = (after - before) as f64 / 2.0 / count as f64;
    drop((client, cluster));

    // Three nodes whose Raft logs grow by their frames alone, then three whose leaders sync
    // their own log before the followers see an entry.
    let mut appends_us = replicated_with("TUNDRA_TEST_RAFT_LOG_APPENDS", &pages);
    let mut sync_first_us = replicated_with("TUNDRA_TEST_LEADER_SYNC_FIRST", &pages);
    Round {
        fsync_three_us,
        sync_first_us_p50: median(&mut sync_first_us),
        sync_first_us_p99: percentile(&mut sync_first_us, 0.99),
        rtt_us,
        fsync_us,
        fsync_append_us,
        appends_us_p50: median(&mut appends_us),
        appends_us_p99: percentile(&mut appends_us, 0.99),
        single_us_p50: median(&mut single_us),
        single_us_p99: percentile(&mut single_us, 0.99),
        replicated_us_p50: median(&mut replicated_us),
        replicated_us_p99: percentile(&mut replicated_us, 0.99),
        follower_bytes_per_page,
        compressed_bytes_per_page: compressed as f64 / count as f64,
        leader_cpu_us_per_page: cpu_us_per_page(leader),
        follower_cpu_us_per_page: [cpu_us_per_page(followers[0]), cpu_us_per_page(followers[1])],
    }
}

/// A results directory named relative to the repository's root (tests run in the crate's).
fn results_dir(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir)
}

fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

#[test]
fn replication_costs() {
    let _serial = serial();
    let out = out_dir();
    let count: usize = match &out {
        Some(_) => std::env::var("TUNDRA_CLUSTER_BENCH_PAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        None => 16,
    };
    let rounds = if out.is_some() { full_rounds() } else { 1 };
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let results: Vec<Round> = (0..rounds).map(|_| round(count)).collect();
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for r in &results {
        assert!(r.single_us_p50 > 0.0 && r.replicated_us_p50 > 0.0 && r.appends_us_p50 > 0.0);
        assert!(r.sync_first_us_p50 > 0.0 && r.fsync_three_us > 0.0);
        assert!(r.rtt_us > 0.0 && r.fsync_us > 0.0 && r.over_budget().is_finite());
        assert!(r.compressed_bytes_per_page > 0.0 && r.follower_bytes_per_page > 0.0);
        assert!(r.leader_cpu_us_per_page.is_finite() && r.follower_cpu_us_per_page.iter().all(|c| c.is_finite()));
    }
    let Some(dir) = out else { return };
    let (_, what) = pages(1);
    let ratio: Vec<f64> = results.iter().map(|r| r.replicated_us_p50 / r.single_us_p50).collect();
    let bytes: Vec<f64> = results.iter().map(|r| r.follower_bytes_per_page / r.compressed_bytes_per_page).collect();
    let mut text = String::new();
    let release = if cfg!(debug_assertions) { "" } else { " --release" };
    writeln!(text, "# TUNDRA_CLUSTER_BENCH_OUT={dir} TUNDRA_CLUSTER_BENCH_PAGES={count} cargo test{release} -p tundra --test cluster_bench replication_costs -- --nocapture").unwrap();
    writeln!(text, "# pages: {count} 8 KiB pages of {what}, written at queue depth 1 over the native protocol")
        .unwrap();
    let (profile, flag) = if cfg!(debug_assertions) {
        ("the test profile (opt-level 1)", "")
    } else {
        ("the release profile", " --release")
    };
    writeln!(text, "# build: {profile} (cargo test{flag}); both sides of each ratio in the same round").unwrap();
    writeln!(text, "# budget: replicated_us_p50 - single_us_p50 (extra_us) against one loopback round trip of 8 KiB (rtt_us) plus one 8 KiB write and fdatasync into a file grown ahead with zeros in the nodes' temporary directory (fsync_us; the same appended to a growing file: fsync_append_us), all medians measured in the same round").unwrap();
    writeln!(text, "# appends: the same writes to a cluster whose Raft logs grow by their frames alone (TUNDRA_TEST_RAFT_LOG_APPENDS=1; appends_us_*), against the logs grown ahead (replicated_us_*): appends_over_ahead_p50").unwrap();
    writeln!(text, "# sync first: the same writes to a cluster whose leaders sync their own Raft log before the followers see an entry (TUNDRA_TEST_LEADER_SYNC_FIRST=1; sync_first_us_*), against leaders that send first (replicated_us_*): ahead_over_sync_first_p50").unwrap();
    writeln!(text, "# three syncs: one 8 KiB write and fdatasync while two other threads do the same at once, each into its own file grown ahead in the nodes' temporary directory (fsync_three_us, the median over the three): what a follower's sync costs where three nodes share one filesystem; extra_over_budget_three is extra_us against rtt_us + fsync_three_us").unwrap();
    writeln!(text, "# cpu: utime + stime of each tundra serve process (/proc/PID/stat, {} ticks a second) from before the first replicated write to 300 ms after the last, per page; the leader's includes serving the client", clock_ticks()).unwrap();
    writeln!(text, "# loadavg before: {}# loadavg after: {}", load_before, load_after).unwrap();
    writeln!(text, "round\tsingle_us_p50\tsingle_us_p99\treplicated_us_p50\treplicated_us_p99\tlatency_ratio_p50\tfollower_bytes_per_page\tcompressed_bytes_per_page\tbytes_ratio\tleader_cpu_us_per_page\tfollower1_cpu_us_per_page\tfollower2_cpu_us_per_page\tfollower_cpu_ratio\trtt_us\tfsync_us\textra_us\textra_over_budget\tfsync_append_us\tappends_us_p50\tappends_us_p99\tappends_over_ahead_p50\tsync_first_us_p50\tsync_first_us_p99\tahead_over_sync_first_p50\tfsync_three_us\textra_over_budget_three").unwrap();
    for (i, r) in results.iter().enumerate() {
        writeln!(
            text,
            "{i}\t{:.0}\t{:.0}\t{:.0}\t{:.0}\t{:.3}\t{:.1}\t{:.1}\t{:.4}\t{:.0}\t{:.0}\t{:.0}\t{:.3}\t{:.0}\t{:.0}\t{:.0}\t{:.2}\t{:.0}\t{:.0}\t{:.0}\t{:.3}\t{:.0}\t{:.0}\t{:.3}\t{:.0}\t{:.2}",
            r.single_us_p50,
            r.single_us_p99,
            r.replicated_us_p50,
            r.replicated_us_p99,
            ratio[i],
            r.follower_bytes_per_page,
            r.compressed_bytes_per_page,
            bytes[i],
            r.leader_cpu_us_per_page,
            r.follower_cpu_us_per_page[0],
            r.follower_cpu_us_per_page[1],
            r.cpu_ratio(),
            r.rtt_us,
            r.fsync_us,
            r.replicated_us_p50 - r.single_us_p50,
            r.over_budget(),
            r.fsync_append_us,
            r.appends_us_p50,
            r.appends_us_p99,
            r.appends_us_p50 / r.replicated_us_p50,
            r.sync_first_us_p50,
            r.sync_first_us_p99,
            r.replicated_us_p50 / r.sync_first_us_p50,
            r.fsync_three_us,
            r.over_budget_three(),
        )
        .unwrap();
    }
    let (m, lo, hi) = spread(&results.iter().map(Round::over_budget).collect::<Vec<f64>>());
    writeln!(text, "extra_over_budget median {m:.2} (min {lo:.2}, max {hi:.2}): the target is at most 1").unwrap();
    let (m, lo, hi) = spread(&results.iter().map(Round::over_budget_three).collect::<Vec<f64>>());
    writeln!(
        text,
        "extra_over_budget_three median {m:.2} (min {lo:.2}, max {hi:.2}): the same with the sync one of three at once"
    )
    .unwrap();
    let (m, lo, hi) = spread(&ratio);
    writeln!(text, "latency_ratio_p50 median {m:.3} (min {lo:.3}, max {hi:.3})").unwrap();
    let singles: Vec<f64> = results.iter().map(|r| r.single_us_p50).collect();
    let replicated: Vec<f64> = results.iter().map(|r| r.replicated_us_p50).collect();
    let (s, slo, shi) = spread(&singles);
    let (r, rlo, rhi) = spread(&replicated);
    writeln!(text, "single_us_p50 median {s:.0} (min {slo:.0}, max {shi:.0}); replicated_us_p50 median {r:.0} (min {rlo:.0}, max {rhi:.0})").unwrap();
    let (m, lo, hi) = spread(&results.iter().map(|r| r.appends_us_p50 / r.replicated_us_p50).collect::<Vec<f64>>());
    writeln!(text, "appends_over_ahead_p50 median {m:.3} (min {lo:.3}, max {hi:.3}): the Raft logs growing by their frames alone against grown ahead").unwrap();
    let (m, lo, hi) = spread(&results.iter().map(|r| r.replicated_us_p50 / r.sync_first_us_p50).collect::<Vec<f64>>());
    writeln!(text, "ahead_over_sync_first_p50 median {m:.3} (min {lo:.3}, max {hi:.3}): leaders that send before their own log's sync against leaders that sync first").unwrap();
    let (m, lo, hi) = spread(&bytes);
    writeln!(text, "bytes_ratio median {m:.4} (min {lo:.4}, max {hi:.4})").unwrap();
    let leader_cpu: Vec<f64> = results.iter().map(|r| r.leader_cpu_us_per_page).collect();
    let follower_cpu: Vec<f64> =
        results.iter().map(|r| (r.follower_cpu_us_per_page[0] + r.follower_cpu_us_per_page[1]) / 2.0).collect();
    let cpu_ratio: Vec<f64> = results.iter().map(Round::cpu_ratio).collect();
    let (l, llo, lhi) = spread(&leader_cpu);
    let (f, flo, fhi) = spread(&follower_cpu);
    let (m, lo, hi) = spread(&cpu_ratio);
    writeln!(text, "leader_cpu_us_per_page median {l:.0} (min {llo:.0}, max {lhi:.0}); follower_cpu_us_per_page (mean of the two) median {f:.0} (min {flo:.0}, max {fhi:.0})").unwrap();
    writeln!(text, "follower_cpu_ratio median {m:.3} (min {lo:.3}, max {hi:.3})").unwrap();
    std::fs::create_dir_all(results_dir(&dir)).expect("create the results directory");
    std::fs::write(results_dir(&dir).join("replication.txt"), &text).expect("write the results");
    print!("{text}");
}

/// The `[drive]` section of a node holding `groups` 1 GiB chunks of 8 KiB pages. Compressed
/// volumes may hold together as many pages as the journal's checkpoint has records, one per
/// 4 KiB block of `logical` (docs/cli.md "Volumes"), so `logical` is half the volumes' size
/// and a little more; the volumes' sizes pass `logical`, hence `overcommit` (the pages written
/// are few). The physical space stays small.
fn drive_for(groups: usize) -> String {
    format!("physical = \"256MiB\"\nlogical = \"{}MiB\"\novercommit = true", (groups + 1) * 512)
}

/// One kill of a leader: the node killed and, for each group it led, the milliseconds until a
/// survivor reported the group's new leader.
struct Kill {
    victim: u64,
    times_ms: Vec<(u32, f64)>,
    polls: usize,
    slowest_poll_ms: f64,
}

/// A volume of `groups` chunks on a fresh cluster, `kills` kills of the node leading most of
/// them, each followed by its restart and catch-up.
fn failover_round(groups: usize, kills: usize) -> Vec<Kill> {
    let mut cluster = Cluster::with_drive(|_| None, &drive_for(groups));
    cluster.start_all();
    let size = format!("{groups}GiB");
    succeeds(&["volume", "create", "fo", "--size", &size, "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    // A few pages in every group, so that each has entries to replicate and catch up on.
    let (pages, _) = pages(4);
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let volume = client.volume_lookup("fo").expect("lookup").id;
    for chunk in 0..groups as u64 {
        for (i, page) in pages.iter().enumerate() {
            client.write_page(volume, chunk * PAGES_PER_CHUNK + i as u64, WriteMode::Auto, page).expect("write");
        }
    }
    drop(client);
    wait_caught_up(&cluster, 1, "fo", Duration::from_secs(60));
    let mut done = Vec::new();
    for _ in 0..kills {
        let before = wait_leaders(&cluster, 1, "fo", Duration::from_secs(60));
        let victim = (1..=3u64)
            .max_by_key(|&n| (before.iter().filter(|&&l| l == n).count(), std::cmp::Reverse(n)))
            .expect("a node");
        let led: Vec<u32> = (0..groups as u32).filter(|&c| before[c as usize] == victim).collect();
        let survivor = (1..=3u64).find(|&n| n != victim).expect("a survivor");
        let mut client = tundra_client::Client::connect(cluster.member(survivor).native).expect("connect");
        let mut times_ms: Vec<(u32, f64)> = Vec::new();
        let (mut polls, mut slowest_poll_ms) = (0, 0.0f64);
        let killed = Instant::now();
        cluster.kill9(victim);
        while times_ms.len() < led.len() {
            let asked = Instant::now();
            let now = leaders(&view(&mut client), "fo");
            polls += 1;
            slowest_poll_ms = slowest_poll_ms.max(asked.elapsed().as_secs_f64() * 1e3);
            let elapsed_ms = killed.elapsed().as_secs_f64() * 1e3;
            for (chunk, leader) in now {
                let new = leader.is_some_and(|l| l != victim);
                if new && led.contains(&chunk) && !times_ms.iter().any(|(c, _)| *c == chunk) {
                    times_ms.push((chunk, elapsed_ms));
                }
            }
            assert!(killed.elapsed() < Duration::from_secs(60), "no new leaders after 60 s\n{}", cluster.logs());
            std::thread::sleep(Duration::from_millis(5));
        }
        cluster.start(victim);
        wait_caught_up(&cluster, survivor, "fo", Duration::from_secs(120));
        done.push(Kill { victim, times_ms, polls, slowest_poll_ms });
    }
    done
}

#[test]
fn leader_failover() {
    let _serial = serial();
    let out = out_dir();
    let (groups, kills, rounds) = if out.is_some() {
        let groups = std::env::var("TUNDRA_CLUSTER_BENCH_FAILOVER_GROUPS").ok().and_then(|v| v.parse().ok());
        (groups.unwrap_or(8), 4, full_rounds())
    } else {
        (2, 1, 1)
    };
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let results: Vec<Vec<Kill>> = (0..rounds).map(|_| failover_round(groups, kills)).collect();
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for kill in results.iter().flatten() {
        assert!(!kill.times_ms.is_empty(), "node {} led no group", kill.victim);
    }
    let Some(dir) = out else { return };
    let mut text = String::new();
    writeln!(text, "# TUNDRA_CLUSTER_BENCH_OUT={dir} cargo test -p tundra --test cluster_bench -- --nocapture")
        .unwrap();
    writeln!(text, "# a volume of {groups} chunks (one Raft group each, 1 GiB, three replicas) with 4 pages written to each; per round a fresh cluster and {kills} kills").unwrap();
    writeln!(text, "# each kill: kill -9 of the node leading most groups, then the survivor with the lowest id asked over the native protocol (the stats `tundra cluster status --json` prints) every 5 ms until each group the dead node led reports a leader on another node; ms from just before the kill; then the node restarts and every replica catches up (lag 0) before the next kill").unwrap();
    writeln!(
        text,
        "# raft timing: heartbeat_config({groups} groups): heartbeat {} ms, election timeout {}-{} ms",
        groups.clamp(50, 1000),
        3 * groups.clamp(50, 1000),
        6 * groups.clamp(50, 1000)
    )
    .unwrap();
    writeln!(text, "# build: the test profile (opt-level 1); the groups were idle (no writes) during the kills")
        .unwrap();
    writeln!(text, "# loadavg before: {}# loadavg after: {}", load_before, load_after).unwrap();
    writeln!(text, "round\tkill\tvictim\tgroups_led\tpolls\tslowest_poll_ms\tnew_leader_ms (chunk:ms)").unwrap();
    let mut per_round: Vec<(f64, f64, usize)> = Vec::new();
    let mut all: Vec<f64> = Vec::new();
    for (r, kills) in results.iter().enumerate() {
        let mut times: Vec<f64> = Vec::new();
        for (k, kill) in kills.iter().enumerate() {
            let list: Vec<String> = kill.times_ms.iter().map(|(c, ms)| format!("{c}:{ms:.0}")).collect();
            writeln!(
                text,
                "{r}\t{k}\t{}\t{}\t{}\t{:.1}\t{}",
                kill.victim,
                kill.times_ms.len(),
                kill.polls,
                kill.slowest_poll_ms,
                list.join(" ")
            )
            .unwrap();
            times.extend(kill.times_ms.iter().map(|(_, ms)| *ms));
        }
        all.extend(&times);
        let n = times.len();
        per_round.push((percentile(&mut times, 0.5), percentile(&mut times, 0.99), n));
    }
    for (r, (p50, p99, n)) in per_round.iter().enumerate() {
        writeln!(text, "round {r}: groups {n}, p50 {p50:.0} ms, p99 {p99:.0} ms").unwrap();
    }
    let (m, lo, hi) = spread(&per_round.iter().map(|p| p.0).collect::<Vec<f64>>());
    writeln!(text, "new_leader_ms_p50 median {m:.0} (min {lo:.0}, max {hi:.0})").unwrap();
    let (m, lo, hi) = spread(&per_round.iter().map(|p| p.1).collect::<Vec<f64>>());
    writeln!(text, "new_leader_ms_p99 median {m:.0} (min {lo:.0}, max {hi:.0})").unwrap();
    let n = all.len();
    writeln!(
        text,
        "all rounds: {n} group failovers, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&mut all, 0.5),
        percentile(&mut all, 0.99),
        percentile(&mut all, 1.0)
    )
    .unwrap();
    std::fs::create_dir_all(results_dir(&dir)).expect("create the results directory");
    std::fs::write(results_dir(&dir).join("failover.txt"), &text).expect("write the results");
    print!("{text}");
}

/// A cluster hosting `groups` chunk groups, ready to be written.
struct Groups {
    cluster: Cluster,
    /// Each group: its volume's id, the chunk's index in the volume, and its leader.
    chunks: Vec<(u32, u64, u64)>,
    /// The volumes created, each with its chunks, in order.
    volumes: Vec<(String, usize)>,
    create_s: f64,
}

/// A fresh cluster hosting `groups` groups: one volume of `groups` chunks created on freshly
/// started nodes. Each node gives a volume's groups the heartbeat interval of the groups it
/// runs once they are added (clamp(groups, 50, 1000) ms), so no restart is needed for the
/// groups to run at the interval the product picks for the node's group count.
fn build_groups(groups: usize) -> Groups {
    let mut cluster = Cluster::with_drive(|_| None, &drive_for(groups));
    cluster.start_timeout = Duration::from_secs(600);
    cluster.start_all();
    let started = Instant::now();
    let name = "tp0".to_string();
    let size = format!("{groups}GiB");
    succeeds(&["volume", "create", &name, "--size", &size, "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volumes = vec![(name, groups)];
    let mut client = tundra_client::Client::connect(cluster.member(1).native).expect("connect");
    let mut chunks = Vec::new();
    for (name, count) in &volumes {
        let by_chunk = wait_leaders(&cluster, 1, name, Duration::from_secs(300));
        assert_eq!(by_chunk.len(), *count);
        let id = client.volume_lookup(name).expect("lookup").id;
        chunks.extend(by_chunk.into_iter().enumerate().map(|(c, leader)| (id, c as u64, leader)));
    }
    let create_s = started.elapsed().as_secs_f64();
    Groups { cluster, chunks, volumes, create_s }
}

/// One throughput measurement.
struct Spread {
    groups: usize,
    idle_cpu_percent: [f64; 3],
    pages_per_s: f64,
    cpu_us_per_page: [f64; 3],
}

/// `clients` threads write `count` pages, page i to group i mod G (pages not written before:
/// `round` moves them along), each to its group's leader.
fn groups_round(set: &Groups, round: usize, clients: usize, count: usize, pages: &[Vec<u8>], idle: Duration) -> Spread {
    let groups = set.chunks.len();
    let cpu_idle = cluster_cpu(&set.cluster);
    std::thread::sleep(idle);
    let cpu_before = cluster_cpu(&set.cluster);
    let idle_cpu_percent = [0, 1, 2].map(|i| (cpu_before[i] - cpu_idle[i]) * 100.0 / idle.as_secs_f64());
    let first = (round * count).div_ceil(groups) as u64;
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..clients {
            scope.spawn(move || {
                let mut connections: Vec<Option<tundra_client::Client>> = vec![None, None, None];
                for i in (t..count).step_by(clients) {
                    let (volume, chunk, leader) = set.chunks[i % groups];
                    let page = chunk * PAGES_PER_CHUNK + first + (i / groups) as u64;
                    let client = connections[leader as usize - 1].get_or_insert_with(|| {
                        tundra_client::Client::connect(set.cluster.member(leader).native).expect("connect")
                    });
                    client.write_page(volume, page, WriteMode::Auto, &pages[i % pages.len()]).expect("write a page");
                }
            });
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = cluster_cpu(&set.cluster);
    Spread {
        groups,
        idle_cpu_percent,
        pages_per_s: count as f64 / seconds,
        cpu_us_per_page: [0, 1, 2].map(|i| (cpu_after[i] - cpu_before[i]) * 1e6 / count as f64),
    }
}

#[test]
fn throughput_by_groups() {
    let _serial = serial();
    let out = out_dir();
    let full = out.is_some();
    let groups: Vec<usize> = match std::env::var("TUNDRA_CLUSTER_BENCH_GROUPS") {
        Ok(list) => list.split(',').map(|g| g.trim().parse().expect("TUNDRA_CLUSTER_BENCH_GROUPS: numbers")).collect(),
        Err(_) if full => vec![1, 100, 1000],
        Err(_) => vec![1, 2],
    };
    let (clients, count, rounds, idle) =
        if full { (16, 3000, full_rounds(), Duration::from_secs(3)) } else { (4, 32, 1, Duration::from_millis(200)) };
    let (pages, what) = pages(count);
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut results: Vec<Spread> = Vec::new();
    // Per G: the seconds to set the groups up, the groups each node leads, the volumes.
    type Setup = (usize, f64, [usize; 3], Vec<(String, usize)>);
    let mut setups: Vec<Setup> = Vec::new();
    for &g in &groups {
        let set = build_groups(g);
        let leaders = [1, 2, 3].map(|n| set.chunks.iter().filter(|c| c.2 == n).count());
        for round in 0..rounds {
            results.push(groups_round(&set, round, clients, count, &pages, idle));
        }
        setups.push((g, set.create_s, leaders, set.volumes.clone()));
    }
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for r in &results {
        assert!(r.pages_per_s > 0.0);
    }
    let Some(dir) = out else { return };
    let mut text = String::new();
    writeln!(text, "# TUNDRA_CLUSTER_BENCH_OUT={dir} cargo test -p tundra --test cluster_bench -- --nocapture")
        .unwrap();
    writeln!(text, "# per G a fresh three-node cluster hosting G Raft groups (chunks of 1 GiB, a replica of each on every node), made as one volume of G chunks on freshly started nodes: a node gives a volume's groups the heartbeat interval of the groups it runs once they are added, clamp(G, 50, 1000) ms").unwrap();
    writeln!(text, "# each node: [drive] {}", drive_for(groups.iter().copied().max().unwrap_or(1)).replace('\n', "; "))
        .unwrap();
    writeln!(text, "# writes: {count} 8 KiB pages of {what} per round, page i to group i mod G (pages not written before), by {clients} client threads at once over the native protocol, each write sent to its group's leader; {rounds} rounds on the same cluster").unwrap();
    writeln!(text, "# idle_cpu: each node's CPU (% of one core) over {} s with nothing written, just before the round's writes; cpu_us_per_page: each node's CPU time during the writes per page", idle.as_secs_f64()).unwrap();
    writeln!(text, "# build: the test profile (opt-level 1)").unwrap();
    writeln!(text, "# loadavg before: {}# loadavg after: {}", load_before, load_after).unwrap();
    for (g, create_s, leaders, volumes) in &setups {
        let list: Vec<String> = volumes.iter().map(|(n, c)| format!("{n}:{c}")).collect();
        writeln!(
            text,
            "setup G={g}: volumes {} ; {create_s:.1} s to create and elect; groups led by n1,n2,n3: {},{},{}",
            list.join(" "),
            leaders[0],
            leaders[1],
            leaders[2]
        )
        .unwrap();
    }
    writeln!(text, "round\tgroups\tidle_cpu_percent(n1,n2,n3)\tpages_per_s\tcpu_us_per_page(n1,n2,n3)").unwrap();
    for (i, r) in results.iter().enumerate() {
        writeln!(
            text,
            "{}\t{}\t{:.1},{:.1},{:.1}\t{:.0}\t{:.0},{:.0},{:.0}",
            i % rounds,
            r.groups,
            r.idle_cpu_percent[0],
            r.idle_cpu_percent[1],
            r.idle_cpu_percent[2],
            r.pages_per_s,
            r.cpu_us_per_page[0],
            r.cpu_us_per_page[1],
            r.cpu_us_per_page[2]
        )
        .unwrap();
    }
    let base: Vec<f64> = results.iter().filter(|r| r.groups == groups[0]).map(|r| r.pages_per_s).collect();
    let (b, _, _) = spread(&base);
    for &g in &groups {
        let rate: Vec<f64> = results.iter().filter(|r| r.groups == g).map(|r| r.pages_per_s).collect();
        let idle: Vec<f64> =
            results.iter().filter(|r| r.groups == g).map(|r| r.idle_cpu_percent.iter().sum::<f64>()).collect();
        let (m, lo, hi) = spread(&rate);
        let (im, ilo, ihi) = spread(&idle);
        writeln!(text, "groups {g}: pages_per_s median {m:.0} (min {lo:.0}, max {hi:.0}); against {} group(s): {:.3} (medians; {:.3} to {:.3}); idle CPU of the three nodes together median {im:.1}% of a core (min {ilo:.1}, max {ihi:.1})", groups[0], m / b, lo / b, hi / b).unwrap();
    }
    std::fs::create_dir_all(results_dir(&dir)).expect("create the results directory");
    std::fs::write(results_dir(&dir).join("groups.txt"), &text).expect("write the results");
    print!("{text}");
}

/// One round of heavy compression's costs: what a node alone and a three-node cluster each
/// stored for the same pages, the bytes the cluster's leader sent each follower, and each
/// node's CPU time during the compression.
struct HeavyRound {
    single: tundra_proto::HeavyResult,
    replicated: tundra_proto::HeavyResult,
    follower_bytes: f64,
    leader_cpu_s: f64,
    follower_cpu_s: [f64; 2],
}

fn heavy_round(count: usize) -> HeavyRound {
    let (pages, _) = pages(count);
    let site = common_serve::Site::new();
    let single = site.start();
    single.create_volume("bench", "64MiB", "8KiB", "normal");
    let mut client = single.client();
    let volume = client.volume_lookup("bench").expect("lookup").id;
    write_all(&mut client, volume, &pages);
    let single_result = client.heavy_compress(volume, 0, count as u64).expect("heavy compression on a node alone");
    drop((client, single));

    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    succeeds(&["volume", "create", "bench", "--size", "64MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let leader = cluster.leader(1, "bench");
    let mut client = tundra_client::Client::connect(cluster.member(leader).native).expect("connect");
    let volume = client.volume_lookup("bench").expect("lookup").id;
    write_all(&mut client, volume, &pages);
    wait_caught_up(&cluster, leader, "bench", Duration::from_secs(60));
    let sent_before = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    let cpu_before = cluster_cpu(&cluster);
    let replicated = client.heavy_compress(volume, 0, count as u64).expect("heavy compression of a replicated volume");
    // The followers hear the last commit index and apply the last segment.
    std::thread::sleep(Duration::from_millis(300));
    let cpu_after = cluster_cpu(&cluster);
    let sent_after = cluster.status(leader)["traffic"]["raft_bytes_sent"].as_u64().expect("traffic");
    let cpu = |id: u64| cpu_after[id as usize - 1] - cpu_before[id as usize - 1];
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    HeavyRound {
        single: single_result,
        replicated,
        follower_bytes: (sent_after - sent_before) as f64 / 2.0,
        leader_cpu_s: cpu(leader),
        follower_cpu_s: [cpu(followers[0]), cpu(followers[1])],
    }
}

/// Heavy compression of a replicated volume (seed 000 §3.2.3): the same pages of a real
/// PostgreSQL heap written to a node alone and to a three-node cluster, then heavily
/// compressed through the chunk's leader. The leader compresses once and ships the segments:
/// the cluster stores what the node alone stores, each follower receives about the segments'
/// bytes, and the followers spend a fraction of the leader's CPU (they decompress nothing and
/// compress nothing). Tiny by default; with `TUNDRA_CLUSTER_BENCH_OUT`, three rounds of
/// `TUNDRA_CLUSTER_BENCH_PAGES` (default 1,000) pages written to DIR/heavy.txt.
#[test]
fn heavy_costs() {
    let _serial = serial();
    let out = out_dir();
    let count: usize = match &out {
        Some(_) => std::env::var("TUNDRA_CLUSTER_BENCH_PAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        None => 64,
    };
    let rounds = if out.is_some() { full_rounds() } else { 1 };
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let results: Vec<HeavyRound> = (0..rounds).map(|_| heavy_round(count)).collect();
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for r in &results {
        assert_eq!(r.single.pages, count as u64, "{:?}", r.single);
        assert_eq!(r.replicated.pages, count as u64, "{:?}", r.replicated);
        assert!(r.single.bytes_after < r.single.bytes_before, "{:?}", r.single);
        // The same pages in the same groups give the same segments, wherever compressed.
        assert_eq!((r.replicated.segments, r.replicated.bytes_after), (r.single.segments, r.single.bytes_after));
        assert!(r.follower_bytes > 0.0 && r.leader_cpu_s >= 0.0);
    }
    let Some(dir) = out else { return };
    let (_, what) = pages(1);
    let mut text = String::new();
    let release = if cfg!(debug_assertions) { "" } else { " --release" };
    writeln!(text, "# TUNDRA_CLUSTER_BENCH_OUT={dir} TUNDRA_CLUSTER_BENCH_PAGES={count} cargo test{release} -p tundra --test cluster_bench heavy_costs -- --nocapture").unwrap();
    writeln!(text, "# pages: {count} 8 KiB pages of {what}, written, then heavily compressed in one request (a node alone; then through the leader of a three-node cluster)").unwrap();
    writeln!(text, "# bytes: the stored bytes the pages took before and take after (4 KiB-rounded), as HEAVY_COMPRESS answers; follower_bytes: the leader's Raft bytes sent during the compression, per follower; cpu: utime + stime of each tundra serve process from before the request to 300 ms after its answer ({} ticks a second)", clock_ticks()).unwrap();
    writeln!(text, "# loadavg before: {}# loadavg after: {}", load_before, load_after).unwrap();
    writeln!(text, "round\tsingle_before\tsingle_after\tsingle_ratio\treplicated_before\treplicated_after\tsegments\tfollower_bytes\tfollower_bytes_over_after\tleader_cpu_ms\tfollower1_cpu_ms\tfollower2_cpu_ms").unwrap();
    for (i, r) in results.iter().enumerate() {
        writeln!(
            text,
            "{i}\t{}\t{}\t{:.3}\t{}\t{}\t{}\t{:.0}\t{:.4}\t{:.0}\t{:.0}\t{:.0}",
            r.single.bytes_before,
            r.single.bytes_after,
            r.single.bytes_before as f64 / r.single.bytes_after as f64,
            r.replicated.bytes_before,
            r.replicated.bytes_after,
            r.replicated.segments,
            r.follower_bytes,
            r.follower_bytes / r.replicated.bytes_after as f64,
            r.leader_cpu_s * 1e3,
            r.follower_cpu_s[0] * 1e3,
            r.follower_cpu_s[1] * 1e3,
        )
        .unwrap();
    }
    let ratio: Vec<f64> =
        results.iter().map(|r| (r.follower_cpu_s[0] + r.follower_cpu_s[1]) / 2.0 / r.leader_cpu_s.max(1e-9)).collect();
    let (m, lo, hi) = spread(&ratio);
    writeln!(text, "follower_cpu_over_leader median {m:.3} (min {lo:.3}, max {hi:.3})").unwrap();
    std::fs::create_dir_all(results_dir(&dir)).expect("create the results directory");
    std::fs::write(results_dir(&dir).join("heavy.txt"), &text).expect("write the results");
    print!("{text}");
}
