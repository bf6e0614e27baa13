//! `tundra serve` processes forming a cluster on 127.0.0.1 (three unless a test asks for
//! more), for the end-to-end tests: each with its own data directory and config (`[cluster]`
//! naming all of them), ports found
//! free, readiness awaited in a bounded loop, stopped by PID (kill -9 where a test crashes a
//! node), and killed when the test ends, whatever happens. With [`Cluster::with_faulty_links`]
//! every peer link goes through a proxy of common/links.rs that a test can cut.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::common_links::Links;

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One node's addresses and files.
pub struct Member {
    pub id: u64,
    pub native: SocketAddr,
    pub nbd: SocketAddr,
    pub config: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Member {
    /// `--addr` for the CLI.
    pub fn addr(&self) -> String {
        self.native.to_string()
    }

    pub fn uri(&self, volume: &str) -> String {
        format!("nbd://{}/{volume}", self.nbd)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A cluster of nodes 1 to N.
pub struct Cluster {
    pub dir: TempDir,
    pub members: Vec<Member>,
    /// How long a node may take to answer after it is started (30 s unless changed; a node
    /// with a large drive takes longer to set up).
    pub start_timeout: Duration,
    /// The proxies on the peer links, when the cluster was made with them.
    pub links: Option<Links>,
    /// Environment variables every node is started with (test-only hooks).
    pub env: Vec<(String, String)>,
}

impl Cluster {
    /// Writes the configs of three nodes; `key_of(id)` is each node's cluster key (None: no
    /// key). Nothing is started.
    pub fn new(key_of: impl Fn(u64) -> Option<String>) -> Cluster {
        Cluster::with_drive(key_of, "physical = \"256MiB\"")
    }

    /// [`Cluster::new`] with `drive` as the body of every node's `[drive]` section.
    pub fn with_drive(key_of: impl Fn(u64) -> Option<String>, drive: &str) -> Cluster {
        Cluster::build(3, key_of, drive, false)
    }

    /// [`Cluster::with_drive`] of `count` nodes.
    pub fn of_size(count: usize, key_of: impl Fn(u64) -> Option<String>, drive: &str) -> Cluster {
        Cluster::build(count, key_of, drive, false)
    }

    /// [`Cluster::new`] with every peer link through a fault-injecting proxy: each node's
    /// config names the other nodes at the addresses of its own proxies to them (it still
    /// listens on its own address), so `links` can cut what one node sends another.
    pub fn with_faulty_links(key_of: impl Fn(u64) -> Option<String>) -> Cluster {
        Cluster::build(3, key_of, "physical = \"256MiB\"", true)
    }

    fn build(count: usize, key_of: impl Fn(u64) -> Option<String>, drive: &str, faulty_links: bool) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let addrs = crate::common::free_addrs(count * 3);
        let peer_addrs: Vec<SocketAddr> = (0..count).map(|i| addrs[i * 3]).collect();
        let links = faulty_links.then(|| Links::start(&peer_addrs));
        let mut members = Vec::new();
        for i in 0..count {
            let id = i as u64 + 1;
            // Node `id` listens on its own address and dials the others where it is told to.
            let peers: Vec<String> = (1..=count as u64)
                .map(|other| {
                    let addr = match &links {
                        Some(links) if other != id => links.addr(id, other),
                        _ => peer_addrs[other as usize - 1],
                    };
                    format!("\"{other}@{addr}\"")
                })
                .collect();
            let data = dir.path().join(format!("node{id}"));
            let key_line = match key_of(id) {
                Some(key) => {
                    let path = dir.path().join(format!("key{id}"));
                    std::fs::write(&path, key).expect("write key");
                    format!("key_file = {:?}\n", path.to_str().expect("utf-8 path"))
                }
                None => String::new(),
            };
            let text = format!(
                "data_dir = {data:?}\n[listen]\nnative = \"{native}\"\nnbd = \"{nbd}\"\nmetrics = \"\"\n\
                 [drive]\n{drive}\n[fast]\nvolumes = \"64MiB\"\n\
                 [cluster]\nnode_id = {id}\npeers = [{peers}]\n{key_line}",
                data = data.to_str().expect("utf-8 path"),
                native = addrs[i * 3 + 1],
                nbd = addrs[i * 3 + 2],
                peers = peers.join(", "),
            );
            let config = dir.path().join(format!("node{id}.toml"));
            std::fs::write(&config, text).expect("write config");
            members.push(Member {
                id,
                native: addrs[i * 3 + 1],
                nbd: addrs[i * 3 + 2],
                config,
                log: dir.path().join(format!("node{id}.log")),
                child: None,
            });
        }
        Cluster { dir, members, start_timeout: START_TIMEOUT, links, env: Vec::new() }
    }

    /// Starts every node and waits until each answers a ping.
    pub fn start_all(&mut self) {
        let count = self.members.len() as u64;
        for id in 1..=count {
            self.spawn(id);
        }
        for id in 1..=count {
            self.wait_ready(id);
        }
    }

    /// Starts node `id` (again) on its data directory and waits until it answers.
    pub fn start(&mut self, id: u64) {
        self.spawn(id);
        self.wait_ready(id);
    }

    fn spawn(&mut self, id: u64) {
        let env = self.env.clone();
        let member = &mut self.members[id as usize - 1];
        assert!(member.child.is_none(), "node {id} runs already");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&member.log).expect("open log");
        let child = Command::new(env!("CARGO_BIN_EXE_tundra"))
            .arg("serve")
            .arg("--config")
            .arg(&member.config)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run tundra serve");
        member.child = Some(child);
    }

    fn wait_ready(&mut self, id: u64) {
        let started = Instant::now();
        let limit = self.start_timeout;
        let member = &mut self.members[id as usize - 1];
        loop {
            if let Some(status) = member.child.as_mut().expect("started").try_wait().expect("wait") {
                member.child = None;
                panic!("node {id} exited with {status}:\n{}", member.log_text());
            }
            if tundra_client::Client::connect(member.native).and_then(|mut c| c.ping(b"ready?")).is_ok() {
                return;
            }
            assert!(started.elapsed() < limit, "node {id} not ready:\n{}", member.log_text());
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// kill -9 of node `id`.
    pub fn kill9(&mut self, id: u64) {
        let member = &mut self.members[id as usize - 1];
        let mut child = member.child.take().expect("node runs");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// Stops node `id` as an operator does (SIGTERM) and waits for it to exit: its stores are
    /// closed, so every apply is durable in them. Panics if it takes more than 30 s.
    #[allow(dead_code)]
    pub fn stop(&mut self, id: u64) {
        let member = &mut self.members[id as usize - 1];
        let mut child = member.child.take().expect("node runs");
        let pid = i32::try_from(child.id()).expect("a pid");
        // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM to node {id}");
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "node {id} stopped with {status}:\n{}", member.log_text());
                return;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node {id} did not stop within 30 s of SIGTERM:\n{}", member.log_text());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.members[id as usize - 1].child.as_ref().map(Child::id)
    }

    pub fn member(&self, id: u64) -> &Member {
        &self.members[id as usize - 1]
    }

    /// `tundra cluster status --json` asked of node `id`.
    pub fn status(&self, id: u64) -> serde_json::Value {
        let out = crate::common::tundra(&["cluster", "status", "--json", "--addr", &self.member(id).addr()]);
        assert!(out.status.success(), "cluster status failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status is JSON")
    }

    /// The leader of the first chunk of `volume`, as node `asked` reports it, once there is one.
    pub fn leader(&self, asked: u64, volume: &str) -> u64 {
        let started = Instant::now();
        loop {
            let status = self.status(asked);
            let chunk = status["chunks"].as_array().and_then(|c| c.iter().find(|c| c["volume"] == volume).cloned());
            if let Some(leader) = chunk.and_then(|c| c["leader"].as_u64()) {
                return leader;
            }
            assert!(started.elapsed() < START_TIMEOUT, "no leader for {volume}: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until node `asked` reports every node up and every replica of every chunk at its
    /// leader's commit index (for up to a minute); returns that status.
    #[allow(dead_code)]
    pub fn caught_up(&self, asked: u64) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.status(asked);
            let all_up = status["nodes"].as_array().is_some_and(|n| n.iter().all(|n| n["up"] == true));
            let synced = status["chunks"].as_array().is_some_and(|chunks| {
                chunks.iter().all(|c| {
                    c["lag"] == 0
                        && c["replica_applied"].as_object().is_some_and(|r| r.values().all(|a| a == &c["commit_index"]))
                })
            });
            if all_up && synced {
                return status;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "not caught up: {status:#}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The logs of every node, for a failing test's message.
    pub fn logs(&self) -> String {
        self.members.iter().map(|m| format!("--- node {} ---\n{}", m.id, m.log_text())).collect()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs `nbdcopy` with `args`; panics with its message when it fails.
#[track_caller]
pub fn nbdcopy(args: &[&str]) {
    let out = std::process::Command::new("nbdcopy")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("nbdcopy: {e} (install it with scripts/install-deps: libnbd-bin)"));
    assert!(out.status.success(), "nbdcopy {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The bytes of write number `write` to 8 KiB page `page`, as the writers of the cluster tests
/// write them: each page's every write tells itself apart.
pub fn page_content(page: u64, write: u64) -> Vec<u8> {
    const PAGE: usize = 8192;
    let mut bytes = format!("page {page} write {write} ").repeat(PAGE / 16).into_bytes();
    bytes.resize(PAGE, b'.');
    bytes
}

/// The pages a writer wrote and the write number each last acknowledged.
pub type WriterLog = std::collections::BTreeMap<u64, u64>;

/// Every page of `log` read through node `id` must hold its last acknowledged write
/// ([`page_content`]).
pub fn verify_log(cluster: &Cluster, id: u64, volume: u32, log: &WriterLog) -> Result<(), String> {
    let mut reader = tundra_client::Client::connect(cluster.member(id).native).map_err(|e| e.to_string())?;
    for (&page, &write) in log {
        let read = reader.read_page(volume, page).map_err(|e| format!("page {page} through node {id}: {e}"))?;
        if read != page_content(page, write) {
            let head = String::from_utf8_lossy(&read[..read.len().min(40)]).into_owned();
            return Err(format!("page {page} through node {id} is {head:?}, not write {write}"));
        }
    }
    Ok(())
}
