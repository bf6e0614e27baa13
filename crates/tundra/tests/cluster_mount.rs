//! A replicated volume mounted as a file on a cluster node, with real processes on 127.0.0.1:
//! three `tundra serve`, one of them (not the chunk's leader) restarted with a `[[mount]]` of the
//! volume in its config. A real PostgreSQL table file written into the mounted file and fsynced
//! reads back identical over NBD through the two other nodes; then the chunk's leader is killed
//! with kill -9, a second piece written through the file meanwhile lands (a stall, not an
//! error), and the third node reads it back.
//!
//! The twin (`TUNDRA_TEST_MOUNT_ON_STORE=1`: the volume mounted on the node's store, as a node
//! alone mounts its volumes, which is how a cluster node mounted it before it had a mount of its
//! own) writes that node's replica alone, none of the chunk's Raft group, and the check that
//! the other nodes read what the mount wrote fails.
//!
//! The real file is the first 4 MiB of a PostgreSQL table's heap (`target/realdata/flights.heap`,
//! made by scripts/pg-real-table) when there is one, else of the `tundra` binary; with
//! `TUNDRA_REQUIRE_REALDATA=1` (as scripts/test runs it) a missing heap fails the test. Needs
//! root and /dev/fuse, as mounting does; skipped without them.

mod common;
#[path = "common/cluster.rs"]
mod common_cluster;
#[path = "common/links.rs"]
mod common_links;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{realdata_heap, succeeds};
use common_cluster::{Cluster, nbdcopy};

const VOLUME_BYTES: u64 = 64 << 20;
/// Where the second piece, written while the leader is dead, goes in the volume.
const SECOND_AT: u64 = 32 << 20;

fn can_mount() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/dev/fuse").exists()
}

/// The real bytes the test writes: 4 MiB of a PostgreSQL heap, or of the tundra binary.
fn real_bytes() -> Vec<u8> {
    match realdata_heap(4 << 20) {
        Some((heap, bytes)) => {
            println!("input: the PostgreSQL heap {} (its first 4 MiB)", heap.display());
            bytes[..4 << 20].to_vec()
        }
        None => {
            println!("input: the tundra binary's first 4 MiB (no target/realdata/flights.heap)");
            std::fs::read(env!("CARGO_BIN_EXE_tundra")).expect("read the tundra binary")[..4 << 20].to_vec()
        }
    }
}

/// Detaches the mount at `file` if the test ends with the mounting node killed (a panic), so
/// that no stale FUSE mount outlives the test's directory.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if let Ok(path) = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2 on a path this test mounted; failing (nothing mounted) is fine.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// `len` bytes at `offset` of the volume as node `id` serves it over NBD.
fn read_through(cluster: &Cluster, id: u64, offset: u64, len: usize) -> Vec<u8> {
    let out = cluster.path().join(format!("read-{id}-{offset}"));
    nbdcopy(&[&cluster.member(id).uri("shared"), out.to_str().expect("utf-8 path")]);
    let bytes = std::fs::read(&out).expect("read the copy");
    std::fs::remove_file(&out).expect("remove the copy");
    bytes[offset as usize..offset as usize + len].to_vec()
}

/// Writes `bytes` at `offset` of the mounted file and fsyncs it.
fn write_through_mount(file: &Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(file).expect("open the mounted file");
    f.write_all_at(bytes, offset).expect("write the mounted file");
    f.sync_all().expect("fsync the mounted file");
}

/// The scenario with `env` given to every node. Answers the cluster (to stop), the mount's
/// guard, and whether each node other than the mounting one read back what the mount wrote.
fn run(env: &[(&str, &str)]) -> (Cluster, Unmount, Result<(), String>) {
    let mut cluster = Cluster::new(|_| None);
    cluster.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    cluster.start_all();
    succeeds(&[
        "volume",
        "create",
        "shared",
        "--size",
        "64MiB",
        "--replicas",
        "3",
        "--addr",
        &cluster.member(1).addr(),
    ]);
    let leader = cluster.leader(1, "shared");
    let mounting = [2, 3, 1].into_iter().find(|&id| id != leader).expect("a node that does not lead");
    let reader = [1, 2, 3].into_iter().find(|&id| id != leader && id != mounting).expect("a third node");
    println!("chunk leader: node {leader}; node {mounting} mounts the volume; node {reader} reads");

    let file = cluster.path().join("shared.file");
    let guard = Unmount(file.clone());
    cluster.stop(mounting);
    let config = cluster.member(mounting).config.clone();
    let mut text = std::fs::read_to_string(&config).expect("read the config");
    text.push_str(&format!("\n[[mount]]\nvolume = \"shared\"\nfile = {:?}\n", file.to_str().expect("utf-8 path")));
    std::fs::write(&config, text).expect("write the config");
    cluster.start(mounting);
    let started = Instant::now();
    while std::fs::metadata(&file).map_or(0, |m| m.len()) != VOLUME_BYTES {
        assert!(started.elapsed() < Duration::from_secs(30), "no mount:\n{}", cluster.member(mounting).log_text());
        std::thread::sleep(Duration::from_millis(50));
    }

    let bytes = real_bytes();
    write_through_mount(&file, 0, &bytes);
    for id in [leader, reader] {
        if read_through(&cluster, id, 0, bytes.len()) != bytes {
            return (cluster, guard, Err(format!("node {id} does not read what node {mounting}'s mount wrote")));
        }
    }

    cluster.kill9(leader);
    let second = &bytes[..1 << 20];
    let started = Instant::now();
    write_through_mount(&file, SECOND_AT, second);
    println!("a 1 MiB write and fsync through the mount with the leader dead: {:?}", started.elapsed());
    if read_through(&cluster, reader, SECOND_AT, second.len()) != second {
        return (cluster, guard, Err(format!("node {reader} does not read what the mount wrote after the failover")));
    }
    (cluster, guard, Ok(()))
}

#[test]
fn a_replicated_volume_mounted_on_one_node_reads_back_through_the_others() {
    if !can_mount() {
        eprintln!("skipped: mounting needs root and /dev/fuse");
        return;
    }
    let (mut cluster, _guard, result) = run(&[]);
    result.unwrap_or_else(|why| panic!("{why}\n{}", cluster.logs()));
    let mounting = (1..=3).find(|&id| cluster.member(id).log_text().contains("mounted on")).expect("the mounting node");
    assert!(
        cluster.member(mounting).log_text().contains("replicated: every write through its chunk's leader"),
        "the node says how it mounted the volume"
    );
    cluster.stop(mounting);
}

#[test]
fn twin_a_mount_on_the_store_writes_one_replica_alone() {
    if !can_mount() {
        eprintln!("skipped: mounting needs root and /dev/fuse");
        return;
    }
    let (mut cluster, _guard, result) = run(&[("TUNDRA_TEST_MOUNT_ON_STORE", "1")]);
    let why = result.expect_err("the other nodes read the bytes of a mount that bypassed the Raft group");
    println!("the twin is caught: {why}");
    let mounting = (1..=3).find(|&id| cluster.member(id).log_text().contains("mounted on")).expect("the mounting node");
    cluster.stop(mounting);
}
