//! Placements that no volume came to use are forgotten (issue 15, tundra-member's
//! abandoned.rs), with three real `tundra serve` processes on 127.0.0.1. The cluster manager
//! counts each placed chunk against its nodes' space; `manager.chunks` in `tundra cluster
//! status --json` is how many it holds.
//!
//! - A creation the cluster cannot hold (placed part way, then refused) and a resize it cannot
//!   hold give their placements back at once: the manager holds the chunks of the volumes that
//!   exist and no more. The twin (`TUNDRA_TEST_KEEP_PLACEMENTS=coordinator`) keeps them, and
//!   the check fails.
//! - A creation whose coordinator stops right after placing (`TUNDRA_TEST_CREATE_STOP_AFTER_PLACE`,
//!   as if killed there) leaves its placements; the manager's leader forgets them once they
//!   have been unreported and named by no catalog for `TUNDRA_TEST_ABANDONED_AFTER_MS` (3 s
//!   here, 5 minutes in production; an hour in the tests of rule 1), and a volume of the same size is then created and used.
//!   The twin (`=leader`) never forgets them, and the check fails.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::time::{Duration, Instant};

use common::{fails, succeeds, tundra};
use common_cluster::Cluster;
use tundra_proto::WriteMode;

/// Drives with room for five 1 GiB chunks each (placement counts a new chunk at its whole size,
/// up to 75% of the drive with its overhead).
const DRIVE: &str = "physical = \"8GiB\"\nlogical = \"16GiB\"";
const PAGE: usize = 8192;
/// The grace the manager's leader gives a placement in the tests of rule 2, and in those of
/// rule 1 (so that rule 2 cannot hide what rule 1 left).
const ABANDONED_AFTER_MS: &str = "3000";
const NEVER_MS: &str = "3600000";
/// How long the leader may take to forget: the grace, a report round, the catalogs.
const FORGET_WAIT: Duration = Duration::from_secs(30);
/// How long the twin waits for what never comes.
const TWIN_WAIT: Duration = Duration::from_secs(12);

fn three(abandoned_after_ms: &str, env: &[(&str, &str)]) -> Cluster {
    let mut cluster = Cluster::of_size(3, |_| None, DRIVE);
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.env.push(("TUNDRA_TEST_ABANDONED_AFTER_MS".into(), abandoned_after_ms.into()));
    cluster.env.push(("TUNDRA_TEST_CREATE_STOP_AFTER_PLACE".into(), "stopped".into()));
    cluster.start_all();
    cluster
}

/// How many chunks the manager holds, asked of node 1.
fn manager_chunks(cluster: &Cluster) -> u64 {
    let status = cluster.status(1);
    status["manager"]["chunks"].as_u64().unwrap_or_else(|| panic!("manager.chunks: {status:#}"))
}

fn create(cluster: &Cluster, name: &str, size: &str) {
    let addr = cluster.member(1).addr();
    succeeds(&["volume", "create", name, "--size", size, "--replicas", "3", "--addr", &addr]);
}

/// Writes and reads back a page of each chunk of `name` through node 2.
fn used(cluster: &Cluster, name: &str, chunks: u64) {
    let mut client = tundra_client::Client::connect(cluster.member(2).native).expect("connect");
    let volume = client.volume_lookup(name).expect("lookup").id;
    for chunk in 0..chunks {
        let page = chunk * ((1 << 30) / PAGE as u64) + 3;
        let mut bytes = format!("{name} page {page} ").repeat(PAGE / 8).into_bytes();
        bytes.truncate(PAGE);
        client.write_page(volume, page, WriteMode::Auto, &bytes).expect("write");
        assert_eq!(client.read_page(volume, page).expect("read"), bytes, "page {page} of {name}");
    }
}

/// Refused creations and resizes leave the manager holding only the chunks of the volumes
/// that exist, checked after each (the resize first, or the creation).
fn refusals_give_back(cluster: &Cluster, resize_first: bool) -> Result<(), String> {
    let addr = cluster.member(1).addr();
    create(cluster, "kept", "1GiB");
    if manager_chunks(cluster) != 1 {
        return Err(format!("a volume of one chunk: the manager holds {}", manager_chunks(cluster)));
    }
    let resize = || fails(&["volume", "resize", "kept", "--size", "12GiB", "--addr", &addr], "cannot hold");
    let create_big =
        || fails(&["volume", "create", "big", "--size", "12GiB", "--replicas", "3", "--addr", &addr], "cannot hold");
    let refusals: [(&str, &dyn Fn() -> String); 2] = if resize_first {
        [("resize", &resize), ("creation", &create_big)]
    } else {
        [("creation", &create_big), ("resize", &resize)]
    };
    for (what, refused) in refusals {
        refused();
        let held = manager_chunks(cluster);
        if held != 1 {
            return Err(format!(
                "the manager holds {held} chunks after the refused {what}, for one volume of one chunk"
            ));
        }
    }
    // The room is there: a volume that fits is created and used.
    create(cluster, "fits", "2GiB");
    used(cluster, "fits", 2);
    Ok(())
}

#[test]
fn refused_creations_and_resizes_give_their_placements_back() {
    let cluster = three(NEVER_MS, &[]);
    refusals_give_back(&cluster, false).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    assert_eq!(manager_chunks(&cluster), 3, "kept and fits");
}

#[test]
fn twin_a_coordinator_that_keeps_its_placements_is_caught() {
    for resize_first in [false, true] {
        let cluster = three(NEVER_MS, &[("TUNDRA_TEST_KEEP_PLACEMENTS", "coordinator")]);
        let why = refusals_give_back(&cluster, resize_first).expect_err("rule 1 off: the placements stay");
        eprintln!("twin caught: {why}");
    }
}

/// A creation stopped after placing: its placements are forgotten within `wait`, and a volume
/// as large is then created and used.
fn abandoned_forgotten(cluster: &Cluster, wait: Duration) -> Result<(), String> {
    let addr = cluster.member(1).addr();
    let out = tundra(&["volume", "create", "stopped", "--size", "3GiB", "--replicas", "3", "--addr", &addr]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("test hook"), "the hook stops the creation: {stderr}");
    assert_eq!(manager_chunks(cluster), 3, "the stopped creation's placements are held");
    let started = Instant::now();
    while manager_chunks(cluster) != 0 {
        if started.elapsed() > wait {
            return Err(format!("the manager still holds {} abandoned chunks after {wait:?}", manager_chunks(cluster)));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("abandoned placements forgotten after {:?}", started.elapsed());
    create(cluster, "after", "3GiB");
    used(cluster, "after", 3);
    if manager_chunks(cluster) != 3 {
        return Err(format!("one volume of three chunks: the manager holds {}", manager_chunks(cluster)));
    }
    Ok(())
}

#[test]
fn the_managers_leader_forgets_what_a_stopped_coordinator_placed() {
    let cluster = three(ABANDONED_AFTER_MS, &[]);
    abandoned_forgotten(&cluster, FORGET_WAIT).unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    assert!(cluster.logs().contains("forgot the placement of chunk"), "the leader says what it forgot");
}

#[test]
fn twin_a_leader_that_never_forgets_is_caught() {
    let cluster = three(ABANDONED_AFTER_MS, &[("TUNDRA_TEST_KEEP_PLACEMENTS", "leader")]);
    let why = abandoned_forgotten(&cluster, TWIN_WAIT).expect_err("rule 2 off: the placements stay");
    eprintln!("twin caught: {why}");
}
