//! Compression-aware rebalancing of a running cluster, end to end (seed 000 §4.2.2): five
//! `tundra serve` processes on 127.0.0.1; ten small volumes, each one chunk, of highly
//! compressible real data (pages of the PostgreSQL heap `target/realdata/flights.heap`) or of
//! incompressible real data (the same heap compressed with deflate, level 6, by libdeflater:
//! bytes no compressor shrinks again), created one after the other so that placement (by
//! logical usage) leaves the nodes' compression ratios skewed. `tundra cluster rebalance
//! --policy compression-aware` runs while a writer rewrites pages of every volume; afterwards
//! every page checks against the writer's log through every node (a twin with one altered log
//! entry must fail), `tundra cluster status` shows every node's ratio inside the band, and the
//! physical space each node freed or gained matches what the dry run (tundra-cluster's `plan()`
//! run as a simulation over the same starting state) predicted, within a stated tolerance.
//!
//! `TUNDRA_REBALANCE_RAW=PATH` appends the run's figures (moves, bytes, time, the writer's
//! rate before and during the moves, predicted and actual space per node) to PATH, for
//! docs/measurements.md.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use serde_json::Value;
use tundra_proto::WriteMode;

const DRIVE: &str = "physical = \"64MiB\"\nlogical = \"128MiB\"";
const PAGE: usize = 8192;
/// Each volume is one chunk of this many pages.
const VOLUME_PAGES: u64 = 128;
/// The writes per second of the writer that runs during the rebalance.
const WRITER_PACE: f64 = 150.0;
const VOLUMES: usize = 10;
/// Which volumes hold compressible data: with placement's round robin over five nodes (three
/// replicas each), nodes 2 and 3 get four compressible replicas of six and node 5 none.
const COMPRESSIBLE: [usize; 4] = [0, 2, 5, 7];
/// The band and the logical margin the nodes are configured with. Six chunks a node, so one
/// chunk more or less is 17% of a node's logical usage: a zone move that leaves a node two
/// chunks from the average would break a narrower margin and is not planned (with 0.25, runs
/// ended with a node in zone D that only such a move could fix). Whole chunks of ratio 1 and of
/// ratio 3 cannot bring every node within ±10% of the average, hence ±15%.
const BAND: f64 = 0.15;
const LOGICAL_MARGIN: f64 = 0.4;
/// `[cluster] move_bytes_per_sec`: slow enough that the writer's rate during the moves is
/// measured over seconds, not the fraction of a second unthrottled moves of these small chunks
/// take.
const MOVE_BYTES_PER_SEC: u64 = 1 << 20;

/// The two kinds of real data, as whole pages.
struct Data {
    compressible: Vec<u8>,
    incompressible: Vec<u8>,
    real: bool,
}

impl Data {
    fn load() -> Data {
        match common::realdata_heap(8 << 20) {
            Some((path, heap)) => {
                let mut deflate = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(6).expect("level 6"));
                let mut packed = vec![0u8; deflate.deflate_compress_bound(heap.len())];
                let len = deflate.deflate_compress(&heap, &mut packed).expect("deflate the heap");
                packed.truncate(len - len % PAGE);
                println!("data: pages of {} and of its deflate ({} bytes)", path.display(), packed.len());
                Data {
                    compressible: heap[..heap.len() - heap.len() % PAGE].to_vec(),
                    incompressible: packed,
                    real: true,
                }
            }
            None => {
                println!(
                    "data: no target/realdata/flights.heap (scripts/pg-real-table makes it); text and noise instead"
                );
                let text: Vec<u8> =
                    (0..4096u64).flat_map(|i| format!("row {i} flight AA{} ", i % 97).into_bytes()).collect();
                let mut x = 0x9e37_79b9_7f4a_7c15u64;
                let noise: Vec<u8> = (0..(2 << 20))
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let text = text[..text.len() - text.len() % PAGE].to_vec();
                Data { compressible: text, incompressible: noise, real: false }
            }
        }
    }

    /// Page `page` of volume number `v` at write `write`: a page of the volume's kind, the same
    /// source page at every write (so that rewrites keep the chunk's size, and the space the
    /// moves shift can be compared with the prediction), stamped with the write.
    fn page(&self, v: usize, page: u64, write: u64) -> Vec<u8> {
        let source = if COMPRESSIBLE.contains(&v) { &self.compressible } else { &self.incompressible };
        let pages = (source.len() / PAGE) as u64;
        let at = ((page * 13 + v as u64 * 101) % pages) as usize * PAGE;
        let mut bytes = source[at..at + PAGE].to_vec();
        // The page's identity, so that a page read from elsewhere cannot pass as this one.
        // The write is stamped mixed, so that every write's stamp is eight bytes of the same
        // entropy and a rewrite keeps the page's compressed size (a plain counter starts as
        // zeros that compress away).
        let mixed = {
            let mut x = write.wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        bytes[..24].copy_from_slice(&[(v as u64).to_le_bytes(), page.to_le_bytes(), mixed.to_le_bytes()].concat());
        bytes
    }
}

/// (volume number, page) → the write each page last acknowledged.
type WriterLog = BTreeMap<(usize, u64), u64>;

/// Writes every page of volume number `v` (id `id`), 16 requests in flight.
fn write_all(addr: std::net::SocketAddr, v: usize, id: u32, data: &Data) -> WriterLog {
    let mut client = tundra_client::Client::connect(addr).expect("connect");
    let mut log = WriterLog::new();
    {
        let mut pending = Vec::new();
        for page in 0..VOLUME_PAGES {
            pending.push(client.submit_write_page(id, page, WriteMode::Auto, &data.page(v, page, 0)).expect("submit"));
            log.insert((v, page), 0);
            if pending.len() == 16 || page + 1 == VOLUME_PAGES {
                client.send().expect("send");
                for request in pending.drain(..) {
                    client.wait(request).expect("a write of the initial data");
                }
            }
        }
    }
    log
}

/// Every page of `log` read through node `node` must be the write the log names.
fn verify(cluster: &Cluster, node: u64, ids: &[u32], data: &Data, log: &WriterLog) -> Result<(), String> {
    let mut reader = tundra_client::Client::connect(cluster.member(node).native).map_err(|e| e.to_string())?;
    let entries: Vec<(&(usize, u64), &u64)> = log.iter().collect();
    for batch in entries.chunks(16) {
        let mut pending = Vec::new();
        for &(&(v, page), _) in batch {
            pending.push(reader.submit_read_page(ids[v], page).map_err(|e| e.to_string())?);
        }
        reader.send().map_err(|e| e.to_string())?;
        for (request, &(&(v, page), &write)) in pending.into_iter().zip(batch) {
            let reply = reader.wait(request).map_err(|e| format!("volume {v} page {page} via {node}: {e}"))?;
            let tundra_proto::Reply::Page(read) = reply else {
                return Err(format!("volume {v} page {page} via {node}: answered {reply:?}"));
            };
            if read != data.page(v, page, write) {
                return Err(format!("volume {v} page {page} through node {node} is not write {write}"));
            }
        }
    }
    Ok(())
}

struct Writer {
    log: WriterLog,
    /// Acknowledged writes, and when each phase of the run began.
    writes: u64,
}

/// Rewrites pages of every volume, one at a time, until `stop`; counts its writes in `done`.
fn writer(
    addr: std::net::SocketAddr,
    ids: Vec<u32>,
    data: Arc<Data>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Writer {
    let mut client = tundra_client::Client::connect(addr).expect("connect");
    let mut log = WriterLog::new();
    let mut write = 0u64;
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        write += 1;
        // At a set pace: the moves are checked against a prediction made before the writer
        // started, and the drives count a rewrite's old blocks until they are reused, so what
        // the writer changes between the two must not grow with the machine's speed (a writer
        // at 850 writes/s changed the plan by two moves).
        let due = started + Duration::from_secs_f64(write as f64 / WRITER_PACE);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // The compressible volumes only: a rewritten page's old blocks stay on the drive until
        // the store reuses them, and 8 KiB of incompressible data left so per write would move
        // the drives' ratios more than the moves being checked.
        let v = COMPRESSIBLE[(write as usize * 3) % COMPRESSIBLE.len()];
        let page = (write * 37) % VOLUME_PAGES;
        client.write_page(ids[v], page, WriteMode::Auto, &data.page(v, page, write)).expect("a write during rebalance");
        log.insert((v, page), write);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Writer { log, writes: write }
}

fn nodes(status: &Value) -> &Vec<Value> {
    status["nodes"].as_array().expect("nodes[]")
}

/// Each node's drive usage (logical, physical) as status reports it.
fn usage(status: &Value) -> BTreeMap<u64, (u64, u64)> {
    nodes(status)
        .iter()
        .map(|n| {
            let u = &n["usage"];
            let used = (
                u["logical_used_bytes"].as_u64().expect("logical"),
                u["physical_used_bytes"].as_u64().expect("physical"),
            );
            (n["id"].as_u64().expect("id"), used)
        })
        .collect()
}

/// The band around the cluster's average ratio, from status.
fn band(usage: &BTreeMap<u64, (u64, u64)>) -> (f64, f64, f64) {
    let (l, p) = usage.values().fold((0u64, 0u64), |(l, p), u| (l + u.0, p + u.1));
    let average = l as f64 / p as f64;
    (average * (1.0 - BAND), average, average * (1.0 + BAND))
}

fn ratio(u: (u64, u64)) -> f64 {
    u.0 as f64 / u.1 as f64
}

/// The physical bytes each node gains (and loses, negative) by `moves` (rebalance JSON).
fn shift(moves: &[Value]) -> BTreeMap<u64, i64> {
    let mut shift = BTreeMap::new();
    for m in moves {
        let bytes = m["physical_bytes"].as_i64().expect("physical bytes");
        *shift.entry(m["to"].as_u64().expect("to")).or_insert(0) += bytes;
        *shift.entry(m["from"].as_u64().expect("from")).or_insert(0) -= bytes;
    }
    shift
}

/// The physical bytes of each chunk each node holds, from status: node → (volume id, chunk) → bytes.
fn held_physical(status: &Value) -> BTreeMap<u64, BTreeMap<(u64, u64), i64>> {
    nodes(status)
        .iter()
        .map(|n| {
            let held = n["chunks"].as_array().expect("held chunks");
            let chunks = held
                .iter()
                .map(|c| {
                    let key = (c["volume_id"].as_u64().expect("volume id"), c["chunk"].as_u64().expect("chunk"));
                    (key, c["physical_bytes"].as_i64().expect("a chunk's physical bytes"))
                })
                .collect();
            (n["id"].as_u64().expect("id"), chunks)
        })
        .collect()
}

/// How much each chunk's physical size changed between two statuses on a replica that held it
/// in both: the writer's rewrites, which reach every replica alike (0 for a chunk no replica
/// held throughout).
fn chunk_drift(
    before: &BTreeMap<u64, BTreeMap<(u64, u64), i64>>,
    after: &BTreeMap<u64, BTreeMap<(u64, u64), i64>>,
) -> BTreeMap<(u64, u64), i64> {
    let mut drift = BTreeMap::new();
    for (node, held) in after {
        for (key, bytes) in held {
            if let Some(old) = before.get(node).and_then(|b| b.get(key)) {
                drift.entry(*key).or_insert(bytes - old);
            }
        }
    }
    drift
}

/// Five nodes configured with the band, the margin, the move pace and `extra` (more `[cluster]`
/// keys), holding the ten volumes written one after the other: skewed ratios (see the module
/// comment). `after_volume(v, cluster, ids)` runs once volume `v` is written. Answers the
/// cluster, the volumes' ids and the log of the initial writes.
fn skewed_cluster(
    data: &Data,
    extra: &str,
    test_started: Instant,
    mut after_volume: impl FnMut(usize, &Cluster, &[u32]),
) -> (Cluster, Vec<u32>, WriterLog) {
    let mut cluster = Cluster::of_size(5, |_| None, DRIVE);
    for member in &cluster.members {
        // Small devices: five nodes share the machine's disk.
        let mut config = std::fs::read_to_string(&member.config)
            .expect("config")
            .replace("volumes = \"64MiB\"", "volumes = \"16MiB\"");
        config.push_str(&format!(
            "rebalance_band_below = {BAND}\nrebalance_band_above = {BAND}\nrebalance_logical_margin = {LOGICAL_MARGIN}\n\
             move_bytes_per_sec = {MOVE_BYTES_PER_SEC}\n{extra}"
        ));
        std::fs::write(&member.config, config).expect("config");
    }
    cluster.start_all();
    println!("[{:.1} s] five nodes up", test_started.elapsed().as_secs_f64());
    let addr = cluster.member(1).addr();
    let mut ids = Vec::new();
    let mut log = WriterLog::new();
    for v in 0..VOLUMES {
        let name = format!("v{v}");
        let size = format!("{}KiB", VOLUME_PAGES * PAGE as u64 / 1024);
        succeeds(&["volume", "create", &name, "--size", &size, "--replicas", "3", "--addr", &addr]);
        let id = tundra_client::Client::connect(cluster.member(1).native)
            .expect("connect")
            .volume_lookup(&name)
            .expect("v")
            .id;
        ids.push(id);
        // Written before the next volume is placed, so placement counts it.
        log.extend(write_all(cluster.member(1).native, v, id, data));
        after_volume(v, &cluster, &ids);
    }
    println!("[{:.1} s] ten volumes written", test_started.elapsed().as_secs_f64());
    (cluster, ids, log)
}

/// Long enough for every node to report its usage and the sizes of the chunks it leads after
/// a change (sizes go every fifth one-second report round), with a commit to spare.
const REPORTS_SETTLE: Duration = Duration::from_secs(7);

/// One five-node cluster at a time: the tests of this file share two cores with the rest.
static ONE_CLUSTER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_cluster_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn compression_aware_rebalance_brings_every_node_into_the_band_under_writes() {
    let _one = one_cluster_at_a_time();
    let data = Arc::new(Data::load());
    let test_started = Instant::now();
    let (cluster, ids, mut log) = skewed_cluster(&data, "", test_started, |_, _, _| {});
    let addr = cluster.member(1).addr();
    let before = cluster.status(2);
    let used_before = usage(&before);
    let (low, average, high) = band(&used_before);
    println!("before: band [{low:.2}, {high:.2}] around {average:.2}");
    for (id, u) in &used_before {
        println!("  node {id}: ratio {:.2}, logical {} physical {}", ratio(*u), u.0, u.1);
    }
    let outside = used_before.values().filter(|u| ratio(**u) < low || ratio(**u) > high).count();
    assert!(outside > 0, "the data left every node inside the band already: {before:#}");

    // The prediction: the same plans carried out on the decision state, nothing moved.
    let out =
        succeeds(&["cluster", "rebalance", "--policy", "compression-aware", "--dry-run", "--json", "--addr", &addr]);
    let predicted: Value = serde_json::from_slice(&out.stdout).expect("dry run JSON");
    let simulated = predicted["simulated_moves"].as_array().expect("simulated moves").len();
    assert!(simulated > 0, "{predicted:#}");

    // The writer runs before, during and after the moves.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writing = {
        let (addr, ids, data, stop, done) =
            (cluster.member(3).native, ids.clone(), data.clone(), stop.clone(), done.clone());
        std::thread::spawn(move || writer(addr, ids, data, stop, done))
    };
    std::thread::sleep(Duration::from_secs(2));
    let idle_writes = done.load(Ordering::Relaxed);
    let started = Instant::now();
    let out = succeeds(&["cluster", "rebalance", "--policy", "compression-aware", "--json", "--addr", &addr]);
    let moving = started.elapsed();
    let moving_writes = done.load(Ordering::Relaxed) - idle_writes;
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let written = writing.join().expect("the writer");
    let report: Value = serde_json::from_slice(&out.stdout).expect("rebalance JSON");
    let moves = report["moves_made"].as_u64().expect("moves_made");
    println!(
        "rebalance: {moves} moves ({simulated} predicted), {} physical bytes moved in {:.1} s; the writer: {:.0} writes/s \
         before, {:.0} during the moves ({} writes in all)",
        report["physical_bytes_moved"],
        moving.as_secs_f64(),
        idle_writes as f64 / 2.0,
        moving_writes as f64 / moving.as_secs_f64(),
        written.writes,
    );
    assert!(moves > 0, "{report:#}");
    assert!(report["failed"].as_array().is_some_and(Vec::is_empty), "no move failed: {report:#}");
    assert!(moving_writes > 0, "the writer kept writing during the moves");

    // Once the writer stopped, a second pass plans from the sizes its rewrites left (usually
    // nothing to do); its moves count with the first's below. Plans come from the manager's
    // state, which holds a node's usage from its last report (every second) and a chunk's size
    // from its leader's (every five): the pass waits for reports taken after the last write,
    // else it plans from usage the rewrites have since changed.
    std::thread::sleep(REPORTS_SETTLE);
    let out = succeeds(&["cluster", "rebalance", "--policy", "compression-aware", "--json", "--addr", &addr]);
    let second: Value = serde_json::from_slice(&out.stdout).expect("rebalance JSON");
    println!("second pass: {} moves", second["moves_made"]);
    let mut all_moves = report["moves"].as_array().expect("moves").clone();
    all_moves.extend(second["moves"].as_array().expect("moves").iter().cloned());

    // Every page as the writer's log says, through every node.
    for (&key, &write) in &written.log {
        log.insert(key, write);
    }
    println!("[{:.1} s] rebalanced", test_started.elapsed().as_secs_f64());
    // Through the five nodes at once: each read goes to its chunk's leader, linearizably.
    std::thread::scope(|scope| {
        let (shared, ids, data, log) = (&cluster, &ids, &*data, &log);
        let checks: Vec<_> =
            (1..=5).map(|node| (node, scope.spawn(move || verify(shared, node, ids, data, log)))).collect();
        for (node, check) in checks {
            let result = check.join().expect("a check thread");
            result.unwrap_or_else(|e| panic!("through node {node}: {e}\n{}", cluster.logs()));
        }
    });
    println!("[{:.1} s] every page checked through every node", test_started.elapsed().as_secs_f64());
    // Twin: one altered log entry is caught.
    let mut wrong = log.clone();
    *wrong.values_mut().next().expect("a page") += 1;
    assert!(verify(&cluster, 4, &ids, &data, &wrong).is_err(), "the read-back check missed a wrong page");

    // Every node inside the band, as status shows it.
    let after = cluster.status(4);
    let used_after = usage(&after);
    let (low, average, high) = band(&used_after);
    println!("after: band [{low:.2}, {high:.2}] around {average:.2}");
    for (id, u) in &used_after {
        println!("  node {id}: ratio {:.2}", ratio(*u));
        assert!((low..=high).contains(&ratio(*u)), "node {id} ratio {:.2} outside the band: {after:#}", ratio(*u));
    }

    // The physical space each node freed or gained, against two predictions: the moves the
    // plans made, at the chunk sizes the plans counted (`planned`), and the dry run's simulation
    // from the starting state (`simulated`; printed beside, and its total compared, since a
    // rewrite during the run can turn a near tie the other way). Two measures of what a node
    // holds: the sum of its chunks' physical bytes (the drive's media bytes under the chunks'
    // blocks), within 1% and 16 KiB of `planned`; and its drive's physical usage, which also
    // counts the blocks the writer's rewrites freed and the drive has not reclaimed yet, within
    // 10% and 64 KiB plus a page for each write.
    let chunks_before = held_physical(&before);
    let chunks_after = held_physical(&after);
    let drift = chunk_drift(&chunks_before, &chunks_after);
    let planned = shift(&all_moves);
    let simulated_shift = shift(predicted["simulated_moves"].as_array().expect("simulated moves"));
    let mut table = String::from(
        "node  planned  simulated  chunks_actual  drive_actual  writer_kept_chunks  writer_moved_chunks\n",
    );
    for (id, u) in &used_after {
        let plan = planned.get(id).copied().unwrap_or(0);
        let sim = simulated_shift.get(id).copied().unwrap_or(0);
        let (held_before, held_after) = (&chunks_before[id], &chunks_after[id]);
        let chunks = held_after.values().sum::<i64>() - held_before.values().sum::<i64>();
        // The writer's share: the change of the chunks the node held throughout is counted out;
        // a chunk that moved to or from the node changed by up to its own drift between the
        // status before and the plan, or the plan and the status after.
        let kept: i64 = held_after.iter().filter_map(|(key, bytes)| held_before.get(key).map(|old| bytes - old)).sum();
        let moved_drift: i64 = held_after
            .keys()
            .filter(|key| !held_before.contains_key(*key))
            .chain(held_before.keys().filter(|key| !held_after.contains_key(*key)))
            .map(|key| drift.get(key).copied().unwrap_or(0).abs())
            .sum();
        let drive = u.1 as i64 - used_before[id].1 as i64;
        let line = format!("{id} {plan:+} {sim:+} {chunks:+} {drive:+} {kept:+} {moved_drift}");
        println!("physical change of node {line}");
        table.push_str(&line);
        table.push('\n');
        assert!((chunks - kept - plan).abs() <= plan.abs() / 100 + (16 << 10) + moved_drift, "node {line}\n{report:#}");
        let loose = plan.abs() / 10 + (64 << 10) + (written.writes * PAGE as u64) as i64;
        assert!((drive - plan).abs() <= loose, "node {line}\n{report:#}");
    }
    let moved = report["physical_bytes_moved"].as_i64().expect("bytes moved");
    let simulated_moved: i64 = predicted["simulated_moves"]
        .as_array()
        .expect("moves")
        .iter()
        .map(|m| m["physical_bytes"].as_i64().expect("bytes"))
        .sum();
    // One chunk's logical size bounds any chunk's physical bytes.
    let largest = VOLUME_PAGES as i64 * PAGE as i64;
    println!("physical bytes moved: {moved} (simulated {simulated_moved})");
    assert!(
        (moved - simulated_moved).abs() <= largest,
        "moved {moved}, simulated {simulated_moved}\nmoves made: {:#}\nsimulated: {:#}",
        report["moves"],
        predicted["simulated_moves"]
    );
    if let Ok(path) = std::env::var("TUNDRA_REBALANCE_RAW") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("raw file");
        writeln!(
            file,
            "loadavg={} real_data={} moves={moves} predicted_moves={simulated} physical_bytes_moved={} logical_bytes_moved={} \
             seconds={:.2} writes_per_sec_before={:.1} writes_per_sec_during={:.1}\n{table}",
            std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
            data.real,
            report["physical_bytes_moved"],
            report["logical_bytes_moved"],
            moving.as_secs_f64(),
            idle_writes as f64 / 2.0,
            moving_writes as f64 / moving.as_secs_f64(),
        )
        .expect("write raw file");
    }
}

#[test]
fn an_unknown_policy_is_refused_before_anything_moves() {
    // Port 1 on loopback: nothing is asked of any node.
    common::fails(
        &["cluster", "rebalance", "--policy", "size", "--addr", "127.0.0.1:1"],
        "write logical or compression-aware",
    );
}

/// How long the background rebalancer has, once the last volume is written, to bring every
/// node into the band; the twin with the loop off waits as long. Plans see a chunk's size once
/// its replicas have reported it (every few seconds), so the rounds' first moves may be made
/// on estimates: on a loaded machine 15 s was once too short. The test stops as soon as every
/// node is inside.
const BACKGROUND_WAIT: Duration = Duration::from_secs(30);

/// Every node's ratio inside the band, from status: `Ok` or the first node outside.
fn all_in_band(status: &Value) -> Result<(), String> {
    let used = usage(status);
    let (low, _, high) = band(&used);
    match used.iter().find(|(_, u)| !(low..=high).contains(&ratio(**u))) {
        None => Ok(()),
        Some((id, u)) => Err(format!("node {id} ratio {:.2} outside [{low:.2}, {high:.2}]", ratio(*u))),
    }
}

/// The background rebalancer's record as the manager's leader shows it in status.
fn background(status: &Value) -> &Value {
    &status["manager"]["background_rebalance"]
}

/// The writer of the tests below, running.
struct Running {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Writer>,
}

/// Starts the writer on the compressible volumes, which must all exist in `ids`.
fn start_writer(cluster: &Cluster, ids: &[u32], data: &Arc<Data>) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let (addr, ids, data, stopped) = (cluster.member(3).native, ids.to_vec(), data.clone(), stop.clone());
    Running { stop, handle: std::thread::spawn(move || writer(addr, ids, data, stopped, count)) }
}

/// The writer started once the compressible volumes exist, so that it writes while the last
/// volumes are placed and written (and the background rounds, if on, move chunks).
fn writer_from_the_last_compressible<'a>(
    running: &'a mut Option<Running>,
    data: &'a Arc<Data>,
) -> impl FnMut(usize, &Cluster, &[u32]) + 'a {
    move |v, cluster, ids| {
        if Some(&v) == COMPRESSIBLE.iter().max() {
            *running = Some(start_writer(cluster, ids, data));
        }
    }
}

/// Lets the writer run for up to [`BACKGROUND_WAIT`] more, asking status every second, and
/// stops it early once `done(status)`; answers the writer's log, the last status and how long
/// it waited.
fn stop_when(cluster: &Cluster, running: Running, done: impl Fn(&Value) -> bool) -> (Writer, Value, Duration) {
    let started = Instant::now();
    let last = loop {
        std::thread::sleep(Duration::from_secs(1));
        let status = cluster.status(2);
        if done(&status) || started.elapsed() >= BACKGROUND_WAIT {
            break status;
        }
    };
    let waited = started.elapsed();
    running.stop.store(true, Ordering::Relaxed);
    let written = running.handle.join().expect("the writer");
    assert!(written.writes > 0, "the writer wrote");
    (written, last, waited)
}

/// Seed 000 §4.2: the manager migrates chunks on its own while a writer keeps writing. Five
/// nodes with `rebalance_every = "2s"`, the skewed data of the test above, and no `tundra
/// cluster rebalance` at all. The writer starts once the compressible volumes exist, so the
/// rounds move chunks while it writes; within [`BACKGROUND_WAIT`] of the last volume's writes
/// every node's ratio is inside the band, the manager's status shows the background rounds' moves, and
/// every page checks against the writer's log through every node.
#[test]
fn the_managers_background_rounds_bring_every_node_into_the_band_under_writes() {
    let _one = one_cluster_at_a_time();
    let data = Arc::new(Data::load());
    let test_started = Instant::now();
    let extra = "rebalance_every = \"2s\"\nrebalance_policy = \"compression-aware\"\n";
    let mut running = None;
    let (cluster, ids, mut log) =
        skewed_cluster(&data, extra, test_started, writer_from_the_last_compressible(&mut running, &data));
    let running = running.expect("the writer started");
    let (written, last, ran) = stop_when(&cluster, running, |status| all_in_band(status).is_ok());
    println!(
        "[{:.1} s] in the band {:.1} s after the last volume ({} writes); background: {:#}",
        test_started.elapsed().as_secs_f64(),
        ran.as_secs_f64(),
        written.writes,
        background(&last)
    );
    all_in_band(&last).unwrap_or_else(|why| panic!("after {ran:?} of background rounds, {why}: {last:#}"));
    let record = background(&last);
    assert_eq!(record["every_ms"].as_u64(), Some(2000), "{record:#}");
    assert_eq!(record["policy"].as_str(), Some("compression-aware"), "{record:#}");
    assert!(record["moves_total"].as_u64().is_some_and(|moves| moves > 0), "no background move: {record:#}");
    assert!(record["last_round"]["started_unix_ms"].as_u64().is_some_and(|ms| ms > 0), "{record:#}");
    assert!(last["manager"]["chunks_sized"].as_u64().is_some_and(|n| n > 0), "no chunk size reported: {last:#}");

    for (&key, &write) in &written.log {
        log.insert(key, write);
    }
    std::thread::scope(|scope| {
        let (shared, ids, data, log) = (&cluster, &ids, &*data, &log);
        let checks: Vec<_> =
            (1..=5).map(|node| (node, scope.spawn(move || verify(shared, node, ids, data, log)))).collect();
        for (node, check) in checks {
            let result = check.join().expect("a check thread");
            result.unwrap_or_else(|e| panic!("through node {node}: {e}\n{}", cluster.logs()));
        }
    });
    // Twin: one altered log entry is caught.
    let mut wrong = log.clone();
    *wrong.values_mut().next().expect("a page") += 1;
    assert!(verify(&cluster, 4, &ids, &data, &wrong).is_err(), "the read-back check missed a wrong page");
    println!("[{:.1} s] every page checked through every node", test_started.elapsed().as_secs_f64());
}

/// Twin of the test above: the same cluster and writer with the background rounds off (the
/// default) leave the nodes outside the band for the whole wait, so the band reached above is
/// the background rounds' doing.
#[test]
fn without_background_rounds_the_nodes_stay_outside_the_band() {
    let _one = one_cluster_at_a_time();
    let data = Arc::new(Data::load());
    let test_started = Instant::now();
    let mut running = None;
    let (cluster, _, _) =
        skewed_cluster(&data, "", test_started, writer_from_the_last_compressible(&mut running, &data));
    let running = running.expect("the writer started");
    let (_, last, ran) = stop_when(&cluster, running, |status| all_in_band(status).is_ok());
    println!("[{:.1} s] waited {:.1} s", test_started.elapsed().as_secs_f64(), ran.as_secs_f64());
    assert!(ran >= BACKGROUND_WAIT, "the nodes came into the band without background rounds: {last:#}");
    assert!(all_in_band(&last).is_err(), "{last:#}");
    let record = background(&last);
    assert!(record["every_ms"].is_null(), "{record:#}");
    assert_eq!(record["rounds"].as_u64(), Some(0), "{record:#}");
}
