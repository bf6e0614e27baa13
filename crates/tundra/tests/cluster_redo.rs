//! A replicated volume's redo stream end to end: three `tundra serve` processes, a volume
//! created with `--replicas 3`, a writer appending batches of redo over the native protocol
//! (tundra-client) and reading pages at LSNs, the redo group's leader killed with kill -9,
//! the appends going on through another node, and every acknowledged record's effect read back
//! with GET_PAGE_AT_LSN; then the killed node restarted and its replica of the redo group seen
//! caught up. Every page read is compared with a model that keeps each page's versions.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::time::{Duration, Instant};

use common::{fails, succeeds};
use common_cluster::Cluster;
use tundra_env::{Rng, seed_from_env};
use tundra_proto::{AppendOutcome, LATEST_LSN, ReadAt, RedoAppend};
use tundra_redo::codec::encode_record;
use tundra_redo::{Payload, RedoRecord};
use tundra_store::ids::Lsn;

const PAGE: usize = 8192;
const PAGES: u64 = 12;
/// How long an append may take through a failover before the test gives up.
const FAILOVER: Duration = Duration::from_secs(60);

/// Every version of every page the writer made, by LSN.
struct Model {
    versions: Vec<Vec<(u64, Vec<u8>)>>,
}

impl Model {
    fn new() -> Model {
        Model { versions: vec![Vec::new(); PAGES as usize] }
    }

    fn at(&self, page: u64, lsn: u64) -> Vec<u8> {
        let versions = &self.versions[page as usize];
        versions.iter().rev().find(|(at, _)| *at <= lsn).map_or_else(|| vec![0; PAGE], |(_, page)| page.clone())
    }

    fn apply(&mut self, record: &RedoRecord) {
        let mut page = self.at(record.page, record.lsn.0);
        match &record.payload {
            Payload::Image(image) => page.copy_from_slice(image),
            Payload::Ranges(ranges) => {
                for (offset, bytes) in ranges {
                    page[*offset as usize..*offset as usize + bytes.len()].copy_from_slice(bytes);
                }
            }
        }
        self.versions[record.page as usize].push((record.lsn.0, page));
    }
}

fn batch(rng: &mut Rng, first_lsn: u64) -> Vec<RedoRecord> {
    (0..1 + rng.below(4))
        .map(|i| {
            let page = rng.below(PAGES);
            let payload = if rng.chance(0.1) {
                Payload::Image((0..PAGE).map(|b| (b as u64 * 7 + first_lsn + i) as u8).collect())
            } else {
                let len = 1 + rng.below(100);
                Payload::Ranges(vec![(rng.below(PAGE as u64 - len) as u32, rng.bytes(len as usize))])
            };
            RedoRecord { lsn: Lsn(first_lsn + i), page, payload }
        })
        .collect()
}

/// The writer: appends through the first node of `order` that answers, moving on to the next
/// when one fails (its connection died with its node). A batch sent again after an answer was
/// lost is in the stream already when the answer is `Gap` at or past its end.
struct Writer {
    volume: u32,
    client: Option<(u64, tundra_client::Client)>,
}

impl Writer {
    fn append(&mut self, cluster: &Cluster, order: &[u64], prev: u64, records: &[RedoRecord]) {
        let end = records.last().expect("a batch has records").lsn.0;
        let mut bytes = Vec::new();
        for record in records {
            encode_record(record, &mut bytes);
        }
        let append = RedoAppend {
            volume: self.volume,
            writer_epoch: 1,
            prev_lsn: prev,
            end_lsn: end,
            record_count: records.len() as u32,
            records: &bytes,
        };
        let started = Instant::now();
        let mut next = 0;
        loop {
            if self.client.is_none() {
                let id = order[next % order.len()];
                next += 1;
                if let Ok(client) = tundra_client::Client::connect(cluster.member(id).native) {
                    self.client = Some((id, client));
                }
            }
            if let Some((id, client)) = &mut self.client {
                match client.append_redo(&append) {
                    Ok(AppendOutcome::Ok { durable_lsn }) => {
                        assert_eq!(durable_lsn, end, "the durable LSN after a batch through node {id}");
                        return;
                    }
                    Ok(AppendOutcome::Gap { expected_prev_lsn })
                        if expected_prev_lsn >= end && expected_prev_lsn > prev =>
                    {
                        assert_eq!(expected_prev_lsn, end, "a resent batch found a stream past it");
                        return;
                    }
                    Ok(other) => panic!("batch ({prev}, {end}] through node {id}: {other:?}\n{}", cluster.logs()),
                    Err(_) => self.client = None,
                }
            }
            assert!(started.elapsed() < FAILOVER, "batch ({prev}, {end}] never appended:\n{}", cluster.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Reads every page at `lsn` through node `via` and compares each with the model; a version
/// folded away (TOO_OLD) is allowed below the newest LSN. Returns how many pages it compared,
/// or the first difference.
fn compare_pages(
    cluster: &Cluster,
    via: u64,
    volume: u32,
    model: &Model,
    lsn: u64,
    newest: u64,
) -> Result<usize, String> {
    let mut client = tundra_client::Client::connect(cluster.member(via).native).expect("connect");
    let mut checked = 0;
    for page in 0..PAGES {
        let at = ReadAt { request_lsn: lsn, not_modified_since: 0, lease: None };
        match client.get_page_at_lsn(volume, page, at) {
            Ok(served) => {
                let want_lsn = if lsn == LATEST_LSN { newest } else { lsn };
                if served.served_lsn != want_lsn {
                    return Err(format!("page {page} at {lsn} through node {via} served at {}", served.served_lsn));
                }
                if served.data != model.at(page, want_lsn) {
                    return Err(format!(
                        "page {page} at LSN {want_lsn} through node {via} differs from the acknowledged records"
                    ));
                }
                checked += 1;
            }
            Err(tundra_client::Error::TooOld { .. }) if lsn < newest => {}
            Err(e) => return Err(format!("page {page} at {lsn} through node {via}: {e}")),
        }
    }
    Ok(checked)
}

#[track_caller]
fn check_pages(cluster: &Cluster, via: u64, volume: u32, model: &Model, lsn: u64, newest: u64) -> usize {
    compare_pages(cluster, via, volume, model, lsn, newest).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()))
}

fn redo_leader(cluster: &Cluster, asked: u64, volume: &str) -> u64 {
    let started = Instant::now();
    loop {
        let status = cluster.status(asked);
        let group = status["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == volume).cloned());
        if let Some(leader) = group.and_then(|g| g["leader"].as_u64()) {
            return leader;
        }
        assert!(started.elapsed() < FAILOVER, "no redo leader for {volume}: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn acknowledged_redo_survives_the_kill_of_its_leader() {
    let seed = seed_from_env(14);
    let mut rng = Rng::new(seed);
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    succeeds(&["volume", "create", "wal", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volume = tundra_client::Client::connect(cluster.member(1).native)
        .and_then(|mut c| c.volume_lookup("wal"))
        .expect("look the volume up")
        .id;
    let mut model = Model::new();
    let mut writer = Writer { volume, client: None };
    let mut lsn = 0u64;
    let mut append = |cluster: &Cluster, order: &[u64], model: &mut Model, lsn: &mut u64, rng: &mut Rng| {
        let records = batch(rng, *lsn + 1);
        writer.append(cluster, order, *lsn, &records);
        for record in &records {
            model.apply(record);
        }
        *lsn = records.last().expect("records").lsn.0;
    };
    for _ in 0..40 {
        append(&cluster, &[1, 2, 3], &mut model, &mut lsn, &mut rng);
    }
    let before = lsn;
    assert_eq!(check_pages(&cluster, 2, volume, &model, LATEST_LSN, lsn), PAGES as usize);

    let leader = redo_leader(&cluster, 1, "wal");
    // A reader's lease, taken and renewed through a node that does not lead: it lives on the
    // leader, and holds LSN_min at the reader's LSN there.
    let reader_node = (1..=3).find(|&id| id != leader).expect("another node");
    let mut reader = tundra_client::Client::connect(cluster.member(reader_node).native).expect("connect");
    let lease = reader.register_reader(volume, 7, lsn).expect("register a reader");
    let renewed = reader.renew_reader(volume, lease.lease_id, lsn).expect("renew the lease");
    assert_eq!(renewed.lsn_min, lsn, "the lease holds LSN_min at the reader's LSN");
    cluster.kill9(leader);
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    // The writer's connection may be to the dead node: it moves on to the survivors.
    for _ in 0..40 {
        append(&cluster, &survivors, &mut model, &mut lsn, &mut rng);
    }
    for &via in &survivors {
        assert_eq!(check_pages(&cluster, via, volume, &model, LATEST_LSN, lsn), PAGES as usize);
        check_pages(&cluster, via, volume, &model, before, lsn);
    }
    // The new leader has no leases: the reader hears that its lease is gone and resyncs.
    let mut reader = tundra_client::Client::connect(cluster.member(survivors[0]).native).expect("connect");
    let renewal = reader.renew_reader(volume, lease.lease_id, lsn);
    assert!(matches!(renewal, Err(tundra_client::Error::LeaseLost { .. })), "{renewal:?}");
    let mut status = tundra_client::Client::connect(cluster.member(survivors[0]).native)
        .and_then(|mut c| c.redo_status(volume))
        .expect("redo status");
    assert_eq!(status.durable_lsn, lsn, "{status:?}");

    // The killed node comes back, catches up from the group's log and serves the same pages.
    cluster.start(leader);
    let started = Instant::now();
    loop {
        let report = cluster.status(leader);
        let group = report["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == "wal").cloned());
        if group.as_ref().is_some_and(|g| {
            g["lag"] == 0
                && g["replica_applied"].as_object().is_some_and(|r| r.values().all(|a| a == &g["commit_index"]))
        }) {
            break;
        }
        assert!(started.elapsed() < FAILOVER, "the restarted node never caught up: {report:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    append(&cluster, &[leader], &mut model, &mut lsn, &mut rng);
    assert_eq!(check_pages(&cluster, leader, volume, &model, LATEST_LSN, lsn), PAGES as usize);
    status = tundra_client::Client::connect(cluster.member(leader).native)
        .and_then(|mut c| c.redo_status(volume))
        .expect("redo status");
    assert_eq!(status.durable_lsn, lsn, "{status:?}");
    // A replicated volume that takes redo takes no page writes.
    let refused = tundra_client::Client::connect(cluster.member(leader).native)
        .and_then(|mut c| c.write_page(volume, 0, tundra_proto::WriteMode::Auto, &[0; PAGE]));
    assert!(refused.is_err_and(|e| e.to_string().contains("takes redo")), "a page write to a redo volume");

    // The oracle's twin: a model that lacks the newest acknowledged record must differ from
    // what the cluster serves.
    let newest = &model.versions.iter().enumerate().max_by_key(|(_, v)| v.last().map_or(0, |l| l.0)).expect("pages").0;
    let mut lacking = Model { versions: model.versions.clone() };
    lacking.versions[*newest].pop();
    assert!(
        compare_pages(&cluster, leader, volume, &lacking, LATEST_LSN, lsn).is_err(),
        "a lost acknowledged record went unnoticed"
    );
}

/// Every replica's purged index of the redo group of `volume`, as `tundra cluster status` on
/// node `asked` shows it (0 for nothing purged), with the group's commit index.
fn redo_purged(cluster: &Cluster, asked: u64, volume: &str) -> (Vec<u64>, u64) {
    let report = cluster.status(asked);
    let group = report["redo"]
        .as_array()
        .and_then(|r| r.iter().find(|g| g["volume"] == volume).cloned())
        .unwrap_or_else(|| panic!("no redo group of {volume}: {report:#}"));
    let purged = group["replica_purged"]
        .as_object()
        .expect("replica_purged")
        .values()
        .map(|v| v.as_u64().unwrap_or(0))
        .collect();
    (purged, group["commit_index"].as_u64().unwrap_or(0))
}

/// The redo group's log is purged on every replica behind what every voter holds, never past
/// a voter that is down: a follower killed while hundreds more batches commit catches up from
/// the log when it returns (the log still holds what it lacks), and every page reads back.
#[test]
fn the_redo_log_is_purged_only_behind_every_voter() {
    let mut rng = Rng::new(seed_from_env(15));
    let mut cluster = Cluster::new(|_| None);
    cluster.start_all();
    succeeds(&["volume", "create", "log", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volume = tundra_client::Client::connect(cluster.member(1).native)
        .and_then(|mut c| c.volume_lookup("log"))
        .expect("look the volume up")
        .id;
    let mut model = Model::new();
    let mut writer = Writer { volume, client: None };
    let mut lsn = 0u64;
    let mut append = |cluster: &Cluster, order: &[u64], model: &mut Model, lsn: &mut u64, rng: &mut Rng| {
        let records = batch(rng, *lsn + 1);
        writer.append(cluster, order, *lsn, &records);
        for record in &records {
            model.apply(record);
        }
        *lsn = records.last().expect("records").lsn.0;
    };
    let wait_purged = |cluster: &Cluster, above: &[u64]| -> Vec<u64> {
        let started = Instant::now();
        loop {
            let (purged, commit) = redo_purged(cluster, 1, "log");
            if purged.len() == 3 && purged.iter().zip(above).all(|(p, a)| p > a) {
                return purged;
            }
            assert!(started.elapsed() < FAILOVER, "purged {purged:?} (commit {commit}), wanted past {above:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // 256 entries to a mark, 64 kept behind what all hold: 400 batches purge every replica.
    for _ in 0..400 {
        append(&cluster, &[1, 2, 3], &mut model, &mut lsn, &mut rng);
    }
    let first = wait_purged(&cluster, &[0, 0, 0]);
    println!("after 400 batches: purged {first:?}");

    // A follower down: the others keep at least what it holds.
    let leader = redo_leader(&cluster, 1, "log");
    let down = (1..=3).find(|&id| id != leader).expect("a follower");
    let (_, held_when_killed) = redo_purged(&cluster, leader, "log");
    cluster.kill9(down);
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != down).collect();
    for _ in 0..400 {
        append(&cluster, &survivors, &mut model, &mut lsn, &mut rng);
    }
    std::thread::sleep(Duration::from_secs(2));
    let report = cluster.status(leader);
    let group =
        report["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == "log").cloned()).expect("group");
    for id in &survivors {
        let purged = group["replica_purged"][id.to_string()].as_u64().unwrap_or(0);
        assert!(
            purged <= held_when_killed,
            "node {id} purged to {purged} while node {down} held no more than {held_when_killed}: {group:#}"
        );
    }

    // It returns and catches up from the log; then purging moves on past where it stopped.
    cluster.start(down);
    let started = Instant::now();
    loop {
        let report = cluster.status(down);
        let group = report["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == "log").cloned());
        if group.as_ref().is_some_and(|g| {
            g["lag"] == 0
                && g["replica_applied"].as_object().is_some_and(|r| r.values().all(|a| a == &g["commit_index"]))
        }) {
            break;
        }
        assert!(started.elapsed() < FAILOVER, "the restarted node never caught up: {report:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    for _ in 0..100 {
        append(&cluster, &[1, 2, 3], &mut model, &mut lsn, &mut rng);
    }
    let after = wait_purged(&cluster, &[held_when_killed; 3]);
    println!("after the follower's return and 100 more: purged {after:?}");
    assert_eq!(check_pages(&cluster, down, volume, &model, LATEST_LSN, lsn), PAGES as usize);
}

/// The durable LSN of volume `volume`'s stream on node `id` itself (its own replica's, from
/// its stats; 0 when it has no stream).
fn local_durable_lsn(cluster: &Cluster, id: u64, volume: &str) -> u64 {
    let text = tundra_client::Client::connect(cluster.member(id).native)
        .and_then(|mut c| c.stats(None))
        .unwrap_or_else(|e| panic!("stats of node {id}: {e}"));
    let stats: serde_json::Value = serde_json::from_str(&text).expect("stats are JSON");
    let volumes = stats["volumes"].as_array().unwrap_or_else(|| panic!("no volumes in {stats:#}"));
    let found = volumes.iter().find(|v| v["name"] == volume).unwrap_or_else(|| panic!("no {volume} in {stats:#}"));
    found["redo"]["durable_lsn"].as_u64().unwrap_or(0)
}

/// Waits until every replica of `volume`'s redo group holds `lsn` in its own stream.
fn replicas_hold(cluster: &Cluster, replicas: &[u64], volume: &str, lsn: u64) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let held: Vec<(u64, u64)> = replicas.iter().map(|&id| (id, local_durable_lsn(cluster, id, volume))).collect();
        if held.iter().all(|&(_, at)| at == lsn) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!("the replicas' own streams end at {held:?}; the writer's last batch ends at {lsn}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The replica set of `volume`'s redo group in `tundra cluster status`.
fn redo_replicas(cluster: &Cluster, asked: u64, volume: &str) -> Vec<u64> {
    let report = cluster.status(asked);
    let group = report["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == volume).cloned());
    let group = group.unwrap_or_else(|| panic!("no redo group of {volume}: {report:#}"));
    group["replicas"].as_array().expect("replicas").iter().filter_map(serde_json::Value::as_u64).collect()
}

/// Which replica of the redo group a drain takes, and whether its log is purged first.
#[derive(Clone, Copy)]
struct Drained {
    /// The group's leader (else a follower).
    leader: bool,
    /// 400 batches first, and a wait until every replica purged its log, so that the new
    /// replica is built from a copy of a replica's stream, not from the log (else 40 batches).
    purged: bool,
}

/// Drains a replica of a redo group while the writer appends; `bug` is the copy's injected
/// fault. Answers the drained node, the writer's model and last LSN, and how many batches it
/// appended during the drain.
fn drain_a_redo_replica(bug: Option<&str>, drained: Drained) -> (Cluster, u32, u64, Model, u64, usize) {
    let mut rng = Rng::new(seed_from_env(16));
    let mut cluster = Cluster::of_size(4, |_| None, "physical = \"256MiB\"");
    if let Some(bug) = bug {
        cluster.env.push(("TUNDRA_TEST_REDO_COPY_BUG".into(), bug.into()));
    }
    cluster.start_all();
    succeeds(&["volume", "create", "log", "--size", "16MiB", "--replicas", "3", "--addr", &cluster.member(1).addr()]);
    let volume = tundra_client::Client::connect(cluster.member(1).native)
        .and_then(|mut c| c.volume_lookup("log"))
        .expect("look the volume up")
        .id;
    let replicas = redo_replicas(&cluster, 1, "log");
    assert_eq!(replicas.len(), 3, "a one-chunk volume's redo group on three of four nodes");
    let mut model = Model::new();
    let mut writer = Writer { volume, client: None };
    let mut lsn = 0u64;
    // 256 entries to a mark, 64 kept behind what all hold: 400 batches purge every replica,
    // so a new replica cannot catch up from the log alone.
    for _ in 0..if drained.purged { 400 } else { 40 } {
        let records = batch(&mut rng, lsn + 1);
        writer.append(&cluster, &replicas, lsn, &records);
        records.iter().for_each(|r| model.apply(r));
        lsn = records.last().expect("records").lsn.0;
    }
    let started = Instant::now();
    while drained.purged && redo_purged(&cluster, 1, "log").0.iter().filter(|&&p| p > 0).count() < 3 {
        assert!(started.elapsed() < FAILOVER, "the redo log was never purged");
        std::thread::sleep(Duration::from_millis(200));
    }
    let leader = redo_leader(&cluster, 1, "log");
    let drained = match drained.leader {
        true => leader,
        false => *replicas.iter().find(|&&id| id != leader).expect("a follower"),
    };
    let via = *replicas.iter().find(|&&id| id != drained).expect("another replica");

    // The writer appends through `via` while the drain runs.
    let drain = {
        let (program, addr) = (env!("CARGO_BIN_EXE_tundra"), cluster.member(via).addr());
        std::thread::spawn(move || {
            std::process::Command::new(program)
                .args(["cluster", "drain", &drained.to_string(), "--addr", &addr])
                .output()
                .expect("run the drain")
        })
    };
    let mut during = 0;
    while !drain.is_finished() {
        let records = batch(&mut rng, lsn + 1);
        writer.append(&cluster, &[via], lsn, &records);
        records.iter().for_each(|r| model.apply(r));
        lsn = records.last().expect("records").lsn.0;
        during += 1;
    }
    let out = drain.join().expect("the drain");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}\n{}", String::from_utf8_lossy(&out.stderr), cluster.logs());
    assert!(text.contains("moved the redo stream of \"log\""), "{text}");
    for _ in 0..20 {
        let records = batch(&mut rng, lsn + 1);
        writer.append(&cluster, &[via], lsn, &records);
        records.iter().for_each(|r| model.apply(r));
        lsn = records.last().expect("records").lsn.0;
    }
    (cluster, volume, drained, model, lsn, during)
}

/// What both drain tests check once the drain ended: the writer appended during it, three
/// replicas hold the redo group without the drained node, each one's own stream ends at the
/// writer's last batch `lsn`, and the drained node holds no stream. Answers node 1's status and
/// the replicas.
fn drained_of_redo(cluster: &Cluster, drained: u64, during: usize, lsn: u64) -> (serde_json::Value, Vec<u64>) {
    assert!(during > 0, "the writer appended nothing during the drain");
    let status = cluster.status(1);
    let replicas = redo_replicas(cluster, 1, "log");
    assert_eq!(replicas.len(), 3, "{status:#}");
    assert!(!replicas.contains(&drained), "{status:#}");
    replicas_hold(cluster, &replicas, "log", lsn).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    assert_eq!(local_durable_lsn(cluster, drained, "log"), 0, "the drained node still has its stream");
    (status, replicas)
}

/// A drain moves a node's redo replica: the new replica is built from a copy of a replica's
/// stream (the group's log was purged), the writer appends throughout, and afterwards the
/// drained node holds nothing, every replica's own stream holds every acknowledged batch, and
/// every page reads back through every node.
#[test]
fn a_drain_moves_a_redo_replica_built_from_a_copy_of_the_stream() {
    let (cluster, volume, drained, model, lsn, during) =
        drain_a_redo_replica(None, Drained { leader: false, purged: true });
    println!("the writer appended {during} batches during the drain");
    let (status, _) = drained_of_redo(&cluster, drained, during, lsn);
    let node = status["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == drained).cloned());
    assert_eq!(node.expect("the drained node")["chunks"].as_array().map(Vec::len), Some(0), "{status:#}");
    for id in 1..=4 {
        assert_eq!(check_pages(&cluster, id, volume, &model, LATEST_LSN, lsn), PAGES as usize);
        check_pages(&cluster, id, volume, &model, lsn - 20, lsn);
    }
}

/// A drain of the node that leads the volume's redo group while the writer appends through
/// another replica: the leader makes the voters the set without itself, steps down once that
/// committed, and the others elect a leader among themselves. Afterwards the drained node
/// holds no redo replica and no stream, every replica's own stream ends at the writer's last
/// acknowledged batch, and every page reads back through every node. (The twin of this check
/// is `a_copy_without_its_last_batch_is_caught`.)
#[test]
fn a_drain_of_the_redo_leader_moves_its_replica_and_loses_nothing() {
    let (cluster, volume, drained, model, lsn, during) =
        drain_a_redo_replica(None, Drained { leader: true, purged: false });
    println!("the writer appended {during} batches during the drain of the redo leader");
    let (status, replicas) = drained_of_redo(&cluster, drained, during, lsn);
    let leader = redo_leader(&cluster, 1, "log");
    assert!(replicas.contains(&leader) && leader != drained, "led by {leader}: {status:#}");
    for id in 1..=4 {
        assert_eq!(check_pages(&cluster, id, volume, &model, LATEST_LSN, lsn), PAGES as usize);
    }
}

/// Twin: a copy that leaves out its stream's last batch is caught by the same check (the new
/// replica's own stream stops short of the writer's acknowledged batches).
#[test]
fn a_copy_without_its_last_batch_is_caught() {
    let (cluster, _, _, _, lsn, _) =
        drain_a_redo_replica(Some("drop-last-batch"), Drained { leader: false, purged: true });
    let replicas = redo_replicas(&cluster, 1, "log");
    assert!(replicas_hold(&cluster, &replicas, "log", lsn).is_err(), "the short copy went unnoticed");
}

/// The redo group of `volume` as every node's catalog holds it, once settled: every node's
/// status lists no move of a redo replica under way and the same three replicas, and exactly
/// those nodes hold a stream of their own; the replicas. Waits up to 10 s.
fn redo_settled(cluster: &Cluster, nodes: u64, volume: &str) -> Result<Vec<u64>, String> {
    let started = Instant::now();
    loop {
        let groups: Vec<serde_json::Value> = (1..=nodes)
            .map(|id| {
                let status = cluster.status(id);
                let group = status["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == volume).cloned());
                group.unwrap_or(serde_json::Value::Null)
            })
            .collect();
        let sets: Vec<Vec<u64>> = groups
            .iter()
            .map(|g| g["replicas"].as_array().into_iter().flatten().filter_map(serde_json::Value::as_u64).collect())
            .collect();
        let moving: Vec<&serde_json::Value> = groups.iter().map(|g| &g["moving"]).collect();
        let streams: Vec<u64> = (1..=nodes).filter(|&id| local_durable_lsn(cluster, id, volume) > 0).collect();
        let agreed = sets.iter().all(|s| *s == sets[0]) && sets[0].len() == 3;
        if moving.iter().all(|m| m.is_null()) && agreed && streams == sets[0] {
            return Ok(sets[0].clone());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "not settled: the catalogs' redo replicas {sets:?}, moves under way {moving:?}, nodes with a stream \
                 {streams:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Four nodes whose coordinators of redo moves stop at `stop_at` as if they died
/// (`TUNDRA_TEST_REDO_MOVE_STOP`), with settling of redo moves off when not `settle`; volume
/// `log`'s redo group on three of them with 30 batches appended; then `tundra cluster move
/// --redo` of a follower's replica to the fourth node, which fails half done and leaves the
/// move in every catalog. Answers the cluster, the writer's state, the old replicas, the
/// source and the target.
fn abandoned_redo_move(stop_at: &str, settle: bool) -> (Cluster, Writer, Model, u64, Vec<u64>, u64, u64) {
    let mut env = vec![("TUNDRA_TEST_REDO_MOVE_STOP".to_string(), stop_at.to_string())];
    if !settle {
        env.push(("TUNDRA_TEST_REDO_SETTLE".into(), "off".into()));
    }
    let (cluster, writer, model, lsn, replicas) = redo_on_three_of_four(env);
    let addr = cluster.member(1).addr();
    let leader = redo_leader(&cluster, 1, "log");
    let source = *replicas.iter().find(|&&id| id != leader).expect("a follower");
    let target = (1..=4).find(|id| !replicas.contains(id)).expect("a fourth node");
    let (from, to) = (source.to_string(), target.to_string());
    let args = ["cluster", "move", "--volume", "log", "--redo", "--from", &from, "--to", &to, "--addr", &addr];
    fails(&args, &format!("stopped {stop_at}"));
    for id in 1..=4 {
        let status = cluster.status(id);
        let group = status["redo"].as_array().and_then(|r| r.iter().find(|g| g["volume"] == "log").cloned());
        let moving = group.map(|g| g["moving"].clone()).unwrap_or_default();
        assert_eq!(moving, serde_json::json!({ "from": source, "to": target }), "node {id}: {status:#}");
    }
    (cluster, writer, model, lsn, replicas, source, target)
}

/// Four nodes started with `env`, volume `log`'s redo group on three of them with 30 batches
/// appended. Answers the cluster, the writer's state, the last LSN and the redo replicas.
fn redo_on_three_of_four(env: Vec<(String, String)>) -> (Cluster, Writer, Model, u64, Vec<u64>) {
    let mut rng = Rng::new(seed_from_env(17));
    let mut cluster = Cluster::of_size(4, |_| None, "physical = \"256MiB\"");
    cluster.env = env;
    cluster.start_all();
    let addr = cluster.member(1).addr();
    succeeds(&["volume", "create", "log", "--size", "16MiB", "--replicas", "3", "--addr", &addr]);
    let volume = tundra_client::Client::connect(cluster.member(1).native)
        .and_then(|mut c| c.volume_lookup("log"))
        .expect("look the volume up")
        .id;
    let replicas = redo_replicas(&cluster, 1, "log");
    let mut model = Model::new();
    let mut writer = Writer { volume, client: None };
    let mut lsn = 0u64;
    for _ in 0..30 {
        let records = batch(&mut rng, lsn + 1);
        writer.append(&cluster, &replicas, lsn, &records);
        records.iter().for_each(|r| model.apply(r));
        lsn = records.last().expect("records").lsn.0;
    }
    (cluster, writer, model, lsn, replicas)
}

/// Appends 20 more batches through `order`, then checks that every replica's own stream ends
/// at the writer's last batch and that every page reads back through every node.
fn append_and_check(cluster: &Cluster, writer: &mut Writer, model: &mut Model, lsn: &mut u64, order: &[u64]) {
    let mut rng = Rng::new(seed_from_env(18));
    for _ in 0..20 {
        let records = batch(&mut rng, *lsn + 1);
        writer.append(cluster, order, *lsn, &records);
        records.iter().for_each(|r| model.apply(r));
        *lsn = records.last().expect("records").lsn.0;
    }
    replicas_hold(cluster, order, "log", *lsn).unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    for id in 1..=4 {
        assert_eq!(check_pages(cluster, id, writer.volume, model, LATEST_LSN, *lsn), PAGES as usize);
    }
}

/// A redo move whose coordinator died after the target caught up as a learner (before the
/// voter change) stays in every catalog until the next drain, move or rebalance step (here a
/// rebalance's dry run) settles it: the target is not a voter, so it is rolled back, the
/// learner removed and its stream dropped. Bad `cluster move --redo` requests are refused
/// with clear errors and change nothing.
#[test]
fn a_redo_move_whose_coordinator_died_before_the_voter_change_is_rolled_back() {
    let (cluster, mut writer, mut model, mut lsn, replicas, source, target) =
        abandoned_redo_move("after-catch-up", true);
    let addr = cluster.member(1).addr();
    succeeds(&["cluster", "rebalance", "--policy", "logical", "--dry-run", "--addr", &addr]);
    let settled = redo_settled(&cluster, 4, "log").unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    assert_eq!(settled, replicas, "rolled back to the old replicas");
    append_and_check(&cluster, &mut writer, &mut model, &mut lsn, &replicas);

    // Refusals, each leaving the group as it was.
    let (from, to) = (source.to_string(), target.to_string());
    let other = replicas.iter().find(|&&id| id != source).expect("another replica").to_string();
    let refused = |volume: &str, from: &str, to: &str, needle: &str| {
        let args = ["cluster", "move", "--volume", volume, "--redo", "--from", from, "--to", to, "--addr", &addr];
        fails(&args, needle);
    };
    refused("nope", &from, &to, "no replicated volume is named \"nope\"");
    refused("log", &to, &from, &format!("node {target} holds no replica of volume \"log\"'s redo stream"));
    refused("log", &from, &other, &format!("node {other} already holds a replica of volume \"log\"'s redo stream"));
    refused("log", &from, "9", "node 9 is not a member of this cluster");
    refused("log", &from, &from, "to itself");
    let neither =
        common::tundra(&["cluster", "move", "--volume", "log", "--from", &from, "--to", &to, "--addr", &addr]);
    let text = String::from_utf8_lossy(&neither.stderr);
    assert!(!neither.status.success() && text.contains("--chunk"), "a move of neither a chunk nor redo: {text}");
    assert_eq!(redo_settled(&cluster, 4, "log").expect("unchanged"), replicas);
}

/// A redo move whose coordinator died after the voter change committed (before the source
/// dropped its replica and the catalogs learned the set) is finished by the next settling:
/// the target is a voter, so the source drops its stream and every catalog takes the new set.
#[test]
fn a_redo_move_whose_coordinator_died_after_the_voter_change_is_finished() {
    let (cluster, mut writer, mut model, mut lsn, replicas, source, target) = abandoned_redo_move("after-voters", true);
    let addr = cluster.member(1).addr();
    succeeds(&["cluster", "rebalance", "--policy", "logical", "--dry-run", "--addr", &addr]);
    let settled = redo_settled(&cluster, 4, "log").unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    let mut expected: Vec<u64> = replicas.iter().copied().filter(|&id| id != source).chain([target]).collect();
    expected.sort_unstable();
    assert_eq!(settled, expected, "finished: the target in the source's place");
    append_and_check(&cluster, &mut writer, &mut model, &mut lsn, &expected);
}

/// Twin: with redo moves left unsettled (as before they were settled), the same step leaves
/// the move in the catalogs and the learner's stream on the target, and the check fails.
#[test]
fn an_unsettled_redo_move_is_caught() {
    let (cluster, ..) = abandoned_redo_move("after-catch-up", false);
    let addr = cluster.member(1).addr();
    succeeds(&["cluster", "rebalance", "--policy", "logical", "--dry-run", "--addr", &addr]);
    let unsettled = redo_settled(&cluster, 4, "log");
    assert!(unsettled.is_err(), "a redo move left in the catalogs passed as settled: {unsettled:?}");
}

/// A redo move whose coordinator stopped (after the learner caught up, before the voter
/// change) and whose process is then killed with SIGKILL is settled by that node's own start:
/// its catalog lists the move, and it settles it once its peers are connected (rolled back,
/// the target not being a voter), with no drain, move or rebalance step asked of anyone.
#[test]
fn a_killed_coordinator_settles_its_redo_move_when_it_starts_again() {
    let (mut cluster, mut writer, mut model, mut lsn, replicas, ..) = abandoned_redo_move("after-catch-up", true);
    cluster.kill9(1);
    cluster.start(1);
    let settled = redo_settled(&cluster, 4, "log").unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    assert_eq!(settled, replicas, "rolled back to the old replicas");
    append_and_check(&cluster, &mut writer, &mut model, &mut lsn, &replicas);
}

/// Twin: with settling off, the restarted coordinator leaves the move in the catalogs, and
/// the same check fails.
#[test]
fn a_killed_coordinator_that_does_not_settle_is_caught() {
    let (mut cluster, ..) = abandoned_redo_move("after-catch-up", false);
    cluster.kill9(1);
    cluster.start(1);
    let unsettled = redo_settled(&cluster, 4, "log");
    assert!(unsettled.is_err(), "a redo move left in the catalogs passed as settled: {unsettled:?}");
}

/// A redo replica moves back and forth between two nodes, each time to a node that held one
/// before (its log of the group forgotten when it was dropped, its vote kept): from a
/// follower to the fourth node, back, and to the fourth node again, with batches appended
/// and every page checked through every node after each move; then the node that now holds
/// the replica a second time is killed with kill -9 and restarted, and the appends and checks
/// go on. Enough batches first that every replica's log of the group is purged behind a mark
/// (one every 256 entries, 64 kept behind). With `keep_log` (the twin's bug,
/// `TUNDRA_TEST_FORGET_KEEPS_LOG`) dropped replicas keep their Raft logs. Answers a move that
/// failed; a wrong page or stream panics.
fn redo_move_back(keep_log: bool) -> Result<(), String> {
    let env = if keep_log { vec![("TUNDRA_TEST_FORGET_KEEPS_LOG".into(), "1".into())] } else { Vec::new() };
    let (mut cluster, mut writer, mut model, mut lsn, replicas) = redo_on_three_of_four(env);
    let mut rng = Rng::new(seed_from_env(19));
    for _ in 0..360 {
        let records = batch(&mut rng, lsn + 1);
        writer.append(&cluster, &replicas, lsn, &records);
        records.iter().for_each(|r| model.apply(r));
        lsn = records.last().expect("records").lsn.0;
    }
    // The nodes purge their redo logs behind every voter once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let (purged, _) = redo_purged(&cluster, 1, "log");
    assert!(purged.iter().all(|&p| p > 0), "every replica's log was purged: {purged:?}");
    let addr = cluster.member(1).addr();
    let leader = redo_leader(&cluster, 1, "log");
    let source = *replicas.iter().find(|&&id| id != leader).expect("a follower");
    let target = (1..=4).find(|id| !replicas.contains(id)).expect("a fourth node");
    let mut set = replicas.clone();
    for (from, to) in [(source, target), (target, source), (source, target)] {
        let (f, t) = (from.to_string(), to.to_string());
        let out = common::tundra(&[
            "cluster", "move", "--volume", "log", "--redo", "--from", &f, "--to", &t, "--addr", &addr,
        ]);
        if !out.status.success() {
            return Err(format!("the move from {from} to {to} failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        set = set.iter().copied().filter(|&id| id != from).chain([to]).collect();
        set.sort_unstable();
        let settled = redo_settled(&cluster, 4, "log")?;
        assert_eq!(settled, set, "after the move from node {from} to node {to}");
        append_and_check(&cluster, &mut writer, &mut model, &mut lsn, &set);
    }
    cluster.kill9(target);
    cluster.start(target);
    append_and_check(&cluster, &mut writer, &mut model, &mut lsn, &set);
    Ok(())
}

#[test]
fn a_redo_replica_moves_back_to_nodes_that_held_it() {
    redo_move_back(false).unwrap_or_else(|e| panic!("{e}"));
}

/// Twin: dropped redo replicas that keep their Raft logs (as before a replica could move
/// back) make the same run fail: the node taking the replica back starts it from a log purged
/// past what its dropped stream held.
#[test]
fn a_dropped_redo_replica_that_keeps_its_log_is_caught() {
    let outcome = redo_move_back(true);
    println!("with the logs kept: {outcome:?}");
    assert!(outcome.is_err(), "moving back with stale logs passed the checks");
}
