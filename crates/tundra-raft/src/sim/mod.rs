//! Deterministic simulation of a replicated cluster (ARCHITECTURE.md, "Replication"): three
//! nodes, one seed. The seed picks the run's faults (a "swarm": each seed turns different
//! ones on, at different rates), then drives a client that writes, trims and reads pages
//! through the leaders while the network loses, delays, reorders and duplicates messages,
//! links are cut and nodes lose power and restart. After every step the checkers run: each
//! store's invariants, every replica's content after each applied index against the others',
//! and every read against the model of acknowledged writes. At the end the faults stop, the
//! cluster must converge, every replica of a chunk must hold the same pages, and every page
//! must read as the model allows.
//!
//! Everything runs on one current-thread tokio runtime whose clock is paused (time jumps to
//! the next timer when every task waits), every random choice comes from the seed, and
//! openraft's election timeouts come from the seeded runtime generator: the same seed gives
//! the same run, which `same_seed_same_trace` checks byte for byte.
//!
//! [`moves`] runs the same faults, client and checks on four nodes, each chunk on three of
//! them, while a mover moves chunks' replicas back and forth.

mod check;
mod cluster;
mod manager;
#[cfg(test)]
mod move_tests;
mod moves;
mod net;
mod redo;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tundra_codec::PageSize;
use tundra_env::Rng;
use tundra_store::ids::{ChunkId, Lsn, PageNo};

use self::check::{Applied, Model, chunk_digest};
use self::cluster::{Cluster, PAGE_BYTES};
use self::net::{NetFaults, SimNet};
use crate::host::{Error, Host};
use crate::log::LogFault;
use crate::repair::RepairStats;

/// What one run is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub steps: u32,
    pub log_fault: LogFault,
    pub trace: bool,
    /// Repair of bad pages turned off on every node: the injected bug the twin test expects
    /// the checks to catch.
    pub repair_off: bool,
}

/// What one run (or many, added up) did and found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seeds: u64,
    pub steps: u64,
    pub messages_sent: u64,
    pub messages_lost: u64,
    pub messages_duplicated: u64,
    pub messages_blocked: u64,
    pub snapshots_sent: u64,
    pub snapshot_pieces: u64,
    /// Appends cut short by their byte cap (openraft told of a partial success).
    pub appends_cut: u64,
    pub partitions: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub log_records_lost_in_crashes: u64,
    pub pages_corrupted: u64,
    pub repair: RepairStats,
    pub writes_acked: u64,
    pub writes_unknown: u64,
    pub writes_refused_not_leader: u64,
    /// Heavy compressions of a chunk asked of its leader, and the pages their segments named.
    pub heavy_compressions: u64,
    pub heavy_pages: u64,
    pub reads_checked: u64,
    pub final_reads_checked: u64,
    pub apply_checks: u64,
    pub store_checks: u64,
    pub replica_comparisons: u64,
    pub log_records: u64,
    pub log_flushes: u64,
    /// Flushes of a node's Raft log the run made slow.
    pub log_flushes_stalled: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    /// What the mover did, in a run with moves (moves.rs); zero otherwise.
    pub moves: moves::MoveStats,
}

impl Report {
    pub fn add(&mut self, other: &Report) {
        self.seeds += other.seeds;
        self.steps += other.steps;
        self.messages_sent += other.messages_sent;
        self.messages_lost += other.messages_lost;
        self.messages_duplicated += other.messages_duplicated;
        self.messages_blocked += other.messages_blocked;
        self.snapshots_sent += other.snapshots_sent;
        self.snapshot_pieces += other.snapshot_pieces;
        self.appends_cut += other.appends_cut;
        self.partitions += other.partitions;
        self.crashes += other.crashes;
        self.restarts += other.restarts;
        self.log_records_lost_in_crashes += other.log_records_lost_in_crashes;
        self.pages_corrupted += other.pages_corrupted;
        add_repair(&mut self.repair, &other.repair);
        self.writes_acked += other.writes_acked;
        self.writes_unknown += other.writes_unknown;
        self.writes_refused_not_leader += other.writes_refused_not_leader;
        self.heavy_compressions += other.heavy_compressions;
        self.heavy_pages += other.heavy_pages;
        self.reads_checked += other.reads_checked;
        self.final_reads_checked += other.final_reads_checked;
        self.apply_checks += other.apply_checks;
        self.store_checks += other.store_checks;
        self.replica_comparisons += other.replica_comparisons;
        self.log_records += other.log_records;
        self.log_flushes += other.log_flushes;
        self.log_flushes_stalled += other.log_flushes_stalled;
        self.violations.extend(other.violations.iter().cloned());
        self.moves.add(&other.moves);
    }
}

fn add_repair(total: &mut RepairStats, other: &RepairStats) {
    total.scrub_passes += other.scrub_passes;
    total.pages_scrubbed += other.pages_scrubbed;
    total.bad_found_by_scrub += other.bad_found_by_scrub;
    total.bad_found_by_reads += other.bad_found_by_reads;
    total.pages_repaired += other.pages_repaired;
    total.unrepairable += other.unrepairable;
    total.repairs_deferred += other.repairs_deferred;
    total.bad_found_by_snapshots += other.bad_found_by_snapshots;
}

/// The faults one seed turns on, and how often.
#[derive(Clone, Copy, Debug)]
struct Swarm {
    net: NetFaults,
    crash: f64,
    partition: f64,
    /// Chance per step that a page's stored bytes go bad on one replica.
    corrupt: f64,
    /// The client also asks for heavy compression of whole chunks. Drawn apart from the run's
    /// random numbers, so a seed without it runs as it did before heavy compression existed.
    heavy: bool,
    /// Chance per flush that a node's Raft log syncs 5 to 60 ms slower (a busy device): a
    /// leader's entries then reach the followers long before its own copy is durable. Drawn
    /// apart from the run's random numbers too.
    stalls: f64,
    /// Appends cut to one entry each (openraft asked for more is told of a partial success), as
    /// a cluster's appends are cut to their byte cap. Drawn apart from the run's random numbers.
    one_entry_appends: bool,
}

impl Swarm {
    fn draw(rng: &mut Rng, seed: u64) -> Swarm {
        let net = NetFaults {
            loss: *rng.pick(&[0.0, 0.01, 0.05, 0.15]),
            duplicate: *rng.pick(&[0.0, 0.02, 0.1]),
            delay_max_ms: *rng.pick(&[1, 5, 20, 45]),
        };
        let (crash, partition) = (*rng.pick(&[0.0, 0.03, 0.08]), *rng.pick(&[0.0, 0.03, 0.08]));
        let heavy = Rng::new(seed ^ 0x4e61_7679).chance(0.5);
        let stalls = *Rng::new(seed ^ 0x5374_616c).pick(&[0.0, 0.0, 0.1, 0.3]);
        let one_entry_appends = Rng::new(seed ^ 0x4170_7065).chance(0.3);
        Swarm { net, crash, partition, corrupt: *rng.pick(&[0.0, 0.05, 0.15]), heavy, stalls, one_entry_appends }
    }
}

const NODES: u64 = 3;
const CHUNKS: u32 = 2;
const PAGES_PER_CHUNK: u64 = 6;
/// How long the client waits for an answer before it counts the write's outcome unknown.
const OP_TIMEOUT: Duration = Duration::from_millis(800);

/// Runs one seed on a fresh current-thread runtime with a paused clock.
pub fn run_seed(seed: u64, options: Options) -> Report {
    crate::runtime::seed_thread_rng(seed ^ 0x005e_ed0f_7af7);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(simulate(seed, options))
}

async fn simulate(seed: u64, options: Options) -> Report {
    let mut rng = Rng::new(seed);
    let swarm = Swarm::draw(&mut rng, seed);
    let net = SimNet::new(rng.fork(), swarm.net, options.trace);
    net.note(|| format!("seed {seed} swarm {swarm:?}"));
    let applied = Arc::new(Mutex::new(Applied::default()));
    let mut cluster =
        Cluster::build(&mut rng, net.clone(), NODES, CHUNKS, options.log_fault, applied.clone(), options.repair_off)
            .await;
    for node in &cluster.nodes {
        node.log.set_stalls(Rng::new(seed ^ 0x5374_616c ^ node.id), swarm.stalls);
    }
    if swarm.one_entry_appends || options.log_fault == LogFault::AppendClaimsAll {
        cluster.set_append_bytes(1);
    }
    let mut report = Report { seeds: 1, ..Report::default() };
    let mut model = Model::default();
    let mut sequence = 0u64;
    for step in 0..options.steps {
        report.steps += 1;
        inject_faults(&mut cluster, &mut rng, &swarm, &mut report).await;
        operate(&cluster, &mut rng, &swarm, &mut model, &mut sequence, &mut report).await;
        tokio::time::sleep(Duration::from_millis(rng.range(1..60))).await;
        check_stores(&cluster, &mut report);
        note_leaders(&cluster, step);
    }
    converge(&mut cluster, &mut model, &mut report).await;
    finish_run(cluster, &net, &applied, &mut report).await;
    report
}

/// The end of a run: what the apply checker and the hosts counted and found, added to
/// `report`, then the cluster stopped and the network's counts and trace taken.
async fn finish_run(mut cluster: Cluster, net: &SimNet, applied: &Mutex<Applied>, report: &mut Report) {
    {
        let applied = applied.lock();
        report.apply_checks = applied.checks;
        report.violations.extend(applied.violations.iter().cloned());
    }
    for node in &cluster.nodes {
        if let Some(host) = &node.host {
            let stats = host.log().stats();
            report.log_records += stats.records;
            report.log_flushes += stats.flushes;
            add_repair(&mut report.repair, &host.repair_stats());
            report.appends_cut += host.appends_cut();
        }
    }
    report.appends_cut += cluster.appends_cut_before;
    report.log_flushes_stalled = cluster.nodes.iter().map(|n| n.log.stalled()).sum();
    for before in &cluster.repair_before {
        add_repair(&mut report.repair, before);
    }
    report.moves.forgotten_at_start = cluster.forgotten_at_start;
    let counts = net.counts();
    (report.messages_sent, report.messages_lost) = (counts.sent, counts.lost);
    (report.messages_duplicated, report.messages_blocked) = (counts.duplicated, counts.blocked);
    report.snapshots_sent = counts.snapshots;
    report.snapshot_pieces = counts.snapshot_pieces;
    cluster.shutdown().await;
    report.trace = net.take_trace();
}

/// At most one node is down at a time and at most one is cut off, so a majority can always
/// form again once the client waits.
async fn inject_faults(cluster: &mut Cluster, rng: &mut Rng, swarm: &Swarm, report: &mut Report) {
    let down: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| !cluster.is_up(i)).collect();
    if let Some(&i) = down.first() {
        if rng.chance(0.3) {
            cluster.net.note(|| format!("restart node {}", i + 1));
            match cluster.start(i).await {
                Ok(()) => report.restarts += 1,
                Err(e) => report.violations.push(format!("node {} failed to restart: {e}", i + 1)),
            }
        }
    } else if rng.chance(swarm.crash) {
        let i = rng.below(cluster.nodes.len() as u64) as usize;
        let lost = cluster.crash(i, rng).await;
        cluster.net.note(|| format!("crash node {} losing {lost} log records", i + 1));
        report.crashes += 1;
        report.log_records_lost_in_crashes += lost as u64;
    }
    cut_or_heal(cluster, rng, swarm, report);
    if rng.chance(swarm.corrupt) {
        corrupt_one_replica(cluster, rng, report);
    }
}

/// Heals the network's cut with chance 0.3 if one node is cut off, or else cuts a node off
/// with the swarm's chance (at most one node cut off at a time).
fn cut_or_heal(cluster: &mut Cluster, rng: &mut Rng, swarm: &Swarm, report: &mut Report) {
    if cluster.net.is_cut() {
        if rng.chance(0.3) {
            cluster.net.note(|| "heal".into());
            cluster.net.heal();
        }
    } else if rng.chance(swarm.partition) {
        let alone = rng.range(1..cluster.nodes.len() as u64 + 1);
        cluster.net.note(|| format!("cut node {alone} off"));
        for other in (1..=cluster.nodes.len() as u64).filter(|&n| n != alone) {
            cluster.net.cut(alone, other);
        }
        report.partitions += 1;
    }
}

/// Makes a page's stored bytes bad on one running replica, if every other replica's copy of
/// the page is good as far as the simulation knows (one bad copy at a time, so that a good one
/// is always left to repair from). A replica that is down may hold a bad copy from before its
/// crash, so none is corrupted while a node is down.
fn corrupt_one_replica(cluster: &mut Cluster, rng: &mut Rng, report: &mut Report) {
    let i = rng.below(cluster.nodes.len() as u64) as usize;
    let chunk = *rng.pick(&cluster.chunks);
    let page = PageNo(rng.below(PAGES_PER_CHUNK) as u32);
    if (0..cluster.nodes.len()).any(|j| !cluster.is_up(j)) {
        return;
    }
    let others_good = cluster.nodes.iter().enumerate().filter(|&(j, _)| j != i).all(|(_, node)| {
        let host = node.host.as_ref().expect("every node is up");
        cluster::sound(host, chunk, page)
    });
    if !others_good {
        return;
    }
    if let Some(entry) = cluster.corrupt(i, chunk, page, rng) {
        cluster.net.note(|| format!("corrupt node {} g{} page {} lsn {}", i + 1, chunk.0, page.0, entry.lsn.0));
        report.pages_corrupted += 1;
    }
}

/// A page's content: its write's sequence number first, then rows of text the codecs
/// compress, some pages better than others.
fn content(sequence: u64) -> Vec<u8> {
    let mut rng = Rng::new(sequence);
    let mut page = sequence.to_le_bytes().to_vec();
    let words = ["tundra", "chunk", "replica", "leader", "page", "north", "frost", "lichen"];
    while page.len() < PageSize::Kib8.bytes() {
        let row = format!("{:06} {} {} {}\n", rng.below(1_000_000), rng.pick(&words), rng.pick(&words), rng.next_u32());
        page.extend_from_slice(row.as_bytes());
    }
    page.truncate(PageSize::Kib8.bytes());
    page
}

fn value_of(page: &[u8]) -> u64 {
    u64::from_le_bytes(page[..8].try_into().expect("a page is longer than 8 bytes"))
}

/// One client operation through the current leader, checked against the model.
async fn operate(
    cluster: &Cluster,
    rng: &mut Rng,
    swarm: &Swarm,
    model: &mut Model,
    sequence: &mut u64,
    report: &mut Report,
) {
    let chunk = *rng.pick(&cluster.chunks);
    let page = PageNo(rng.below(PAGES_PER_CHUNK) as u32);
    let Some(leader) = cluster.leader(chunk) else { return };
    let kind = rng.below(10);
    if swarm.heavy && kind == 9 && rng.chance(0.3) {
        // Heavy compression of the whole chunk: no page changes content, so the model does
        // not either; a page written meanwhile keeps its write (the store's `put_heavy`).
        report.heavy_compressions += 1;
        match tokio::time::timeout(OP_TIMEOUT, leader.heavy_compress(chunk, PageNo(0), PAGES_PER_CHUNK as u32)).await {
            Ok(Ok(done)) => report.heavy_pages += done.pages,
            Ok(Err(Error::Invalid(why))) => report.violations.push(format!("a heavy compression was refused: {why}")),
            Ok(Err(_)) | Err(_) => {}
        }
        return;
    }
    if kind < 3 {
        // A read that fails or times out checks nothing: it may have met a deposed leader.
        if let Ok(Ok(read)) = tokio::time::timeout(OP_TIMEOUT, leader.read_page(chunk, page)).await {
            report.reads_checked += 1;
            if let Err(why) = model.read(chunk, page, read.as_deref().map(value_of)) {
                report.violations.push(why);
            }
        }
        return;
    }
    *sequence += 1;
    let value = (kind != 9).then_some(*sequence);
    model.sent(chunk, page, value);
    let write = async {
        match value {
            // The write's sequence number is its request id: the proposal is answered by the
            // leader's state machine as it applies the entry (AppliedRequests::wait).
            Some(v) => leader.write_pages_once(chunk, &[(page, content(v), Lsn(v))], v, false).await,
            None => leader.trim_pages(chunk, vec![page]).await,
        }
    };
    match tokio::time::timeout(OP_TIMEOUT, write).await {
        Ok(Ok(())) => {
            report.writes_acked += 1;
            model.acked(chunk, page);
        }
        Ok(Err(Error::NotLeader { .. })) => {
            report.writes_refused_not_leader += 1;
            model.failed(chunk, page);
        }
        Ok(Err(Error::Invalid(why))) => report.violations.push(format!("a valid write was refused: {why}")),
        Ok(Err(_)) | Err(_) => report.writes_unknown += 1,
    }
}

fn check_stores(cluster: &Cluster, report: &mut Report) {
    for host in cluster.nodes.iter().filter_map(|n| n.host.as_ref()) {
        report.store_checks += 1;
        if let Err(problem) = host.store().check_invariants() {
            report.violations.push(format!("node {}: {problem}", host.id()));
        }
        if let Err(e) = host.store().maybe_checkpoint() {
            report.violations.push(format!("node {}: checkpoint failed: {e}", host.id()));
        }
    }
}

fn note_leaders(cluster: &Cluster, step: u32) {
    let mut line = format!("step {step}");
    for &chunk in &cluster.chunks {
        for host in cluster.nodes.iter().filter_map(|n| n.host.as_ref()) {
            if let Ok(raft) = host.raft(chunk) {
                let m = raft.metrics().borrow().clone();
                line += &format!(
                    " g{}n{}:t{}l{:?}a{:?}",
                    chunk.0,
                    host.id(),
                    m.current_term,
                    m.current_leader,
                    m.last_applied.map(|id| id.index)
                );
            }
        }
    }
    cluster.net.note(|| line);
}

/// The faults stop; every node runs; within a bound of simulated time every group must have
/// a leader whose log every replica applied, every replica must hold the same pages, and
/// every page must read as the model allows.
async fn converge(cluster: &mut Cluster, model: &mut Model, report: &mut Report) {
    cluster.net.heal();
    cluster.net.set_faults(NetFaults { loss: 0.0, duplicate: 0.0, delay_max_ms: 1 });
    for i in 0..cluster.nodes.len() {
        if !cluster.is_up(i) {
            if let Err(e) = cluster.start(i).await {
                report.violations.push(format!("node {} failed to restart: {e}", i + 1));
                return;
            }
            report.restarts += 1;
        }
    }
    let mut converged = Vec::new();
    for &chunk in &cluster.chunks.clone() {
        if settled(cluster, chunk).await {
            converged.push(chunk);
        } else {
            report.violations.push(format!("chunk {} did not converge within 60 simulated seconds", chunk.0));
        }
    }
    // The background scrub runs throughout; one more pass on every node, now that every
    // replica applied everything, bounds the time bad copies left from the faults can last.
    for host in cluster.nodes.iter().filter_map(|n| n.host.clone()) {
        host.scrub_pass(Duration::ZERO).await;
    }
    for chunk in converged {
        let hosts: Vec<_> = cluster.nodes.iter().filter_map(|n| n.host.clone()).collect();
        let contents: Vec<Vec<String>> = hosts.iter().map(|h| replica_content(h, chunk)).collect();
        for (host, content) in hosts.iter().zip(&contents).skip(1) {
            report.replica_comparisons += 1;
            if *content != contents[0] {
                report.violations.push(format!("chunk {}: node {} differs from node 1", chunk.0, host.id()));
            }
        }
        let digests: Vec<String> = hosts.iter().map(|h| format!("{:08x}", chunk_digest(h.store(), chunk))).collect();
        cluster.net.note(|| format!("final g{} digests {}", chunk.0, digests.join(" ")));
    }
    final_reads(cluster, model, report).await;
}

/// Every page the model knows, read through its chunk's leader once the run converged.
async fn final_reads(cluster: &Cluster, model: &mut Model, report: &mut Report) {
    for (chunk, page) in model.pages() {
        let Some(leader) = cluster.leader(chunk) else { continue };
        match leader.read_page(chunk, page).await {
            Ok(read) => {
                report.final_reads_checked += 1;
                if let Err(why) = model.read(chunk, page, read.as_deref().map(value_of)) {
                    report.violations.push(format!("after convergence: {why}"));
                }
            }
            Err(e) => report.violations.push(format!("after convergence, a read failed: {e}")),
        }
    }
}

/// Waits until one node leads `chunk` and every replica applied its whole log.
async fn settled(cluster: &Cluster, chunk: ChunkId) -> bool {
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(leader) = cluster.leader(chunk) else { continue };
        let Ok(raft) = leader.raft(chunk) else { continue };
        let last = raft.metrics().borrow().last_log_index;
        let all =
            cluster.nodes.iter().filter_map(|n| n.host.as_ref()).all(|host| {
                host.raft(chunk).is_ok_and(|r| r.metrics().borrow().last_applied.map(|id| id.index) == last)
            });
        if all {
            return true;
        }
    }
    false
}

/// A replica's logical content of a chunk, placement aside: each page's encoding, stored
/// length, checksum, LSN and the crc of its stored bytes (a heavy page's: of its content).
fn replica_content(host: &Host, chunk: ChunkId) -> Vec<String> {
    let store = host.store();
    let path = host.pages_of(chunk);
    store
        .chunk_entries(chunk)
        .into_iter()
        .map(|(page, entry)| {
            // A page's image as stored; a heavy page's content, read from its segment: bytes
            // of a segment that no page points at (a page written since it was made) can go
            // bad without changing any page, and no check reads them.
            let bytes = match entry.encoding {
                tundra_store::index::Encoding::Heavy => {
                    path.read_page(chunk, page).ok().flatten().map(|b| crc32c::crc32c(&b))
                }
                _ => store.read_image(chunk, page).ok().flatten().map(|(_, b)| crc32c::crc32c(&b)),
            };
            format!(
                "{} {:?} {} {:08x} {} {bytes:?}",
                page.0, entry.encoding, entry.stored_len, entry.checksum, entry.lsn.0
            )
        })
        .collect()
}

/// Page bytes of the simulated volume.
const _: () = assert!(PAGE_BYTES as usize == 8192);
