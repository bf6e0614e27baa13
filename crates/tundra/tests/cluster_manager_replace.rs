//! The cluster manager survives a node's death (issue 15), with real processes on 127.0.0.1:
//! five `tundra serve`, the manager's members the three lowest ids, `[cluster]
//! manager_replace_after = "5s"` on every node.
//!
//! - A member that is not the leader is killed with kill -9: the leader gives its place to an
//!   up node, so the voters are three live nodes again (`tundra cluster status --json`, which
//!   also shows the replacement). Then the leader itself is killed: the new leader replaces it
//!   too, and the manager still answers (a rebalance dry run, planned from its state) with two
//!   of its first three members dead, where without the replacements it would have no quorum.
//!   Both killed nodes are started again: the one started as it is retires its member
//!   (`manager.retired`, and it says so in its log); the other is started with
//!   `TUNDRA_TEST_KEEP_EX_MEMBER=1`, so its stale member keeps running and campaigning, which
//!   the retirement oracle must catch (its twin), and the group must not mind: its voters and
//!   its term stay as they were. A new volume is placed and its page reads back.
//! - The twin of the replacement: with `TUNDRA_TEST_MEMBER_REPLACE=off` a member killed stays
//!   a voter, and the oracle that the voters are live nodes fails.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::io::Write;
use std::time::{Duration, Instant};

use common::succeeds;
use common_cluster::Cluster;
use tundra_proto::WriteMode;

const DRIVE: &str = "physical = \"256MiB\"";
const REPLACE_AFTER: &str = "5s";
/// How long the voters may take to be live nodes again after a kill: the 5 s of silence, an
/// election when the leader died, a round, the new member's catch-up, with room for a loaded
/// machine.
const REPLACED_WAIT: Duration = Duration::from_secs(30);
/// How long the twin waits: more than twice `manager_replace_after` and a round.
const TWIN_WAIT: Duration = Duration::from_secs(13);
/// How long a returning ex-member runs while the group is watched.
const WATCH: Duration = Duration::from_secs(6);

/// Five nodes with `manager_replace_after` set, and `env` (test hooks) on every node.
fn cluster(env: &[(&str, &str)]) -> Cluster {
    let mut cluster = Cluster::of_size(5, |_| None, DRIVE);
    for member in &cluster.members {
        let mut config = std::fs::OpenOptions::new().append(true).open(&member.config).expect("open config");
        writeln!(config, "manager_replace_after = \"{REPLACE_AFTER}\"").expect("write config");
    }
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.start_all();
    cluster
}

/// The `manager` object of the status asked of `asked` once the manager has a leader and its
/// state holds every node (a state still empty is rebuilt only once every node answers).
fn manager(cluster: &Cluster, asked: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let manager = cluster.status(asked)["manager"].clone();
        if manager["leader"].as_u64().is_some() && manager["nodes"].as_array().is_some_and(|n| n.len() == 5) {
            return manager;
        }
        assert!(started.elapsed() < REPLACED_WAIT, "no manager leader: {manager:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn voters(manager: &serde_json::Value) -> Vec<u64> {
    manager["members"].as_array().map_or(Vec::new(), |m| m.iter().filter_map(serde_json::Value::as_u64).collect())
}

/// The oracle: within `wait`, node `asked`'s status shows a manager with a leader whose voters
/// are three nodes, none of them in `dead`, and no learner left. Answers the manager object.
fn live_voters(cluster: &Cluster, asked: u64, dead: &[u64], wait: Duration) -> Result<serde_json::Value, String> {
    let started = Instant::now();
    loop {
        let manager = cluster.status(asked)["manager"].clone();
        let members = voters(&manager);
        let learners = manager["learners"].as_array().map_or(0, Vec::len);
        if manager["leader"].as_u64().is_some()
            && members.len() == 3
            && !members.iter().any(|m| dead.contains(m))
            && learners == 0
        {
            return Ok(manager);
        }
        if started.elapsed() >= wait {
            return Err(format!("voters {members:?} with {dead:?} dead after {wait:?}: {manager:#}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// [`live_voters`], once the leader also records that it replaced `replaced`: the record is
/// kept just after the voter change commits, so a status taken in between shows the new
/// voters and the record before.
fn voters_after_replacing(cluster: &Cluster, asked: u64, dead: &[u64], replaced: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let manager =
            live_voters(cluster, asked, dead, REPLACED_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
        if manager["last_replacement"]["replaced"] == replaced || started.elapsed() >= REPLACED_WAIT {
            return manager;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The oracle of a returning ex-member: node `id` wrote `manager.retired` and said why.
fn retired(cluster: &Cluster, id: u64, wait: Duration) -> Result<(), String> {
    let mark = cluster.path().join(format!("node{id}")).join("manager.retired");
    let started = Instant::now();
    loop {
        let said = cluster.member(id).log_text().contains("is no longer a member of the manager");
        if mark.exists() && said {
            return Ok(());
        }
        if started.elapsed() >= wait {
            return Err(format!("node {id}: manager.retired {}, said so {said}", mark.exists()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_manager_replaces_dead_members_and_a_returning_one_retires() {
    let mut cluster = cluster(&[]);
    let first = manager(&cluster, 5);
    assert_eq!(voters(&first), vec![1, 2, 3], "{first:#}");
    assert_eq!(first["replace_after_ms"], 5000, "{first:#}");
    let leader = first["leader"].as_u64().expect("leader");

    // A member that does not lead dies.
    let follower = (1..=3).find(|&n| n != leader).expect("a member that does not lead");
    let started = Instant::now();
    cluster.kill9(follower);
    let after_one = voters_after_replacing(&cluster, 5, &[follower], follower);
    println!(
        "member {follower} killed: voters {:?} after {:.1} s",
        voters(&after_one),
        started.elapsed().as_secs_f64()
    );
    let replaced = &after_one["last_replacement"];
    assert_eq!(replaced["replaced"], follower, "{after_one:#}");
    assert_eq!(replaced["by"], 4, "the lowest up node that is not a member: {after_one:#}");

    // Then the leader dies: two of the first three members are dead.
    let leader = after_one["leader"].as_u64().expect("leader");
    let started = Instant::now();
    cluster.kill9(leader);
    let dead = [follower, leader];
    let after_two = voters_after_replacing(&cluster, 5, &dead, leader);
    println!("leader {leader} killed: voters {:?} after {:.1} s", voters(&after_two), started.elapsed().as_secs_f64());
    assert_eq!(after_two["last_replacement"]["replaced"], leader, "{after_two:#}");
    let addr5 = cluster.member(5).addr();
    // A decision from the manager's state, which needs its quorum.
    succeeds(&["cluster", "rebalance", "--dry-run", "--addr", &addr5]);

    // Both come back: the leader as it is, the first one keeping its stale member (the twin of
    // the retirement oracle), which must not disturb the group.
    cluster.start(leader);
    cluster.env = vec![("TUNDRA_TEST_KEEP_EX_MEMBER".into(), "1".into())];
    cluster.start(follower);
    cluster.env.clear();
    retired(&cluster, leader, REPLACED_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    let settled =
        live_voters(&cluster, 5, &dead, REPLACED_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    std::thread::sleep(WATCH);
    assert!(
        retired(&cluster, follower, Duration::ZERO).is_err(),
        "the twin: an ex-member kept running must fail the retirement oracle"
    );
    let watched =
        live_voters(&cluster, 5, &dead, Duration::ZERO).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    assert_eq!(voters(&watched), voters(&settled), "{settled:#} then {watched:#}");
    assert_eq!(watched["term"], settled["term"], "an ex-member moved the term: {settled:#} then {watched:#}");
    assert_eq!(watched["leader"], settled["leader"], "{settled:#} then {watched:#}");

    // Placement still works: every node answers, and the manager places a new volume.
    succeeds(&["volume", "create", "after", "--size", "16MiB", "--replicas", "3", "--addr", &addr5]);
    let mut client = tundra_client::Client::connect(cluster.member(5).native).expect("connect");
    let volume = client.volume_lookup("after").expect("lookup").id;
    let page = vec![7u8; 8192];
    client.write_page(volume, 3, WriteMode::Auto, &page).expect("write");
    assert!(client.read_page(volume, 3).expect("read") == page);
}

#[test]
fn without_the_replacement_a_dead_member_stays_a_voter() {
    let mut cluster = cluster(&[("TUNDRA_TEST_MEMBER_REPLACE", "off")]);
    let first = manager(&cluster, 5);
    let leader = first["leader"].as_u64().expect("leader");
    let follower = (1..=3).find(|&n| n != leader).expect("a member that does not lead");
    cluster.kill9(follower);
    let outcome = live_voters(&cluster, 5, &[follower], TWIN_WAIT);
    assert!(outcome.is_err(), "the oracle passed with the replacement off: {outcome:?}");
    assert!(voters(&manager(&cluster, 5)).contains(&follower));
}
