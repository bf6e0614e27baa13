//! A real `tundra serve` for the end-to-end tests: a fresh data directory and config of its own,
//! loopback ports found free, readiness awaited in a bounded loop, stopped by its PID. A node
//! still running when its [`Node`] is dropped (a test panicked) is killed, and its log printed.
//!
//! The NBD clients the tests drive come from scripts/install-deps; a missing one fails the test
//! with a message naming that script, as in crates/tundra-nbd/tests/clients.rs.
//!
//! A test declares `mod common;` and this file as `common_serve` (`#[path]`), since
//! common/mod.rs is shared with the other tests.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a node may take to start listening, and to stop after SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

pub const MIB: u64 = 1 << 20;

/// A data directory and everything a node needs to run on it; it outlives the node, so a test
/// can stop the node and start another on the same data.
pub struct Site {
    dir: TempDir,
    starts: std::cell::Cell<u32>,
}

impl Site {
    pub fn new() -> Site {
        Site { dir: tempfile::tempdir().expect("temp dir"), starts: std::cell::Cell::new(0) }
    }

    /// Where the node keeps its devices.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A scratch directory next to the data, removed with the site.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `tundra serve` on this site's data directory and waits until it answers on all
    /// three listeners. A port taken between choosing it and the node binding it is retried.
    pub fn start(&self) -> Node {
        self.start_with("")
    }

    /// [`Site::start`] with more keys under `[drive]` (e.g. `overcommit = true`).
    pub fn start_with(&self, drive_keys: &str) -> Node {
        self.start_on(drive_keys, None)
    }

    /// Starts the node again on the ports of `node`, which was killed: clients that
    /// reconnect to its address find the new one.
    pub fn restart_on_same_ports(&self, node: &Node) -> Node {
        self.start_on("", Some([node.native, node.nbd, node.metrics]))
    }

    fn start_on(&self, drive_keys: &str, fixed: Option<[SocketAddr; 3]>) -> Node {
        for _ in 0..5 {
            let n = self.starts.get() + 1;
            self.starts.set(n);
            let ports = fixed.unwrap_or_else(free_ports);
            let config = self.dir.path().join(format!("node-{n}.toml"));
            let text = format!(
                "data_dir = {data:?}\n\
                 [listen]\nnative = \"{native}\"\nnbd = \"{nbd}\"\nmetrics = \"{metrics}\"\n\
                 [drive]\nphysical = \"256MiB\"\n{drive_keys}\n\
                 [fast]\nvolumes = \"256MiB\"\n",
                data = self.data_dir().to_str().expect("utf-8 temp path"),
                native = ports[0],
                nbd = ports[1],
                metrics = ports[2],
            );
            std::fs::write(&config, text).expect("write config");
            let log = self.dir.path().join(format!("node-{n}.log"));
            let child = Command::new(env!("CARGO_BIN_EXE_tundra"))
                .arg("serve")
                .arg("--config")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("create log"))
                .spawn()
                .expect("run tundra serve");
            let mut node = Node {
                child: Some(child),
                native: ports[0],
                nbd: ports[1],
                metrics: ports[2],
                native_text: ports[0].to_string(),
                log,
                data_dir: self.data_dir(),
            };
            match node.wait_ready() {
                Ok(()) => return node,
                // Someone took a port in between: try others (or the same ones again, a moment
                // later, when they are fixed).
                Err(log) if log.contains("Address already in use") => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    continue;
                }
                Err(log) => panic!("tundra serve did not start:\n{log}"),
            }
        }
        panic!("tundra serve found no free ports in 5 attempts");
    }
}

impl Site {
    /// Runs `tundra serve` on this site's data directory expecting it to refuse to start
    /// (exit status 1 within a bound); returns what it printed.
    pub fn start_refused(&self) -> String {
        let ports = free_ports();
        let config = self.dir.path().join("refused.toml");
        let text = format!("[listen]\nnative = \"{}\"\nnbd = \"{}\"\nmetrics = \"{}\"\n", ports[0], ports[1], ports[2]);
        std::fs::write(&config, text).expect("write config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tundra"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(self.data_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tundra serve");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("a second tundra serve on {} did not refuse to start", self.data_dir().display());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
        assert_eq!(status.code(), Some(1), "tundra serve should have refused to start:\n{stderr}");
        stderr
    }
}

/// Three distinct loopback ports that were free a moment ago (`common::free_addrs`).
fn free_ports() -> [SocketAddr; 3] {
    let addrs = crate::common::free_addrs(3);
    [addrs[0], addrs[1], addrs[2]]
}

/// A port nothing listens on (free a moment ago).
pub fn unused_addr() -> SocketAddr {
    free_ports()[0]
}

/// A running `tundra serve`.
pub struct Node {
    child: Option<Child>,
    pub native: SocketAddr,
    pub nbd: SocketAddr,
    pub metrics: SocketAddr,
    /// The native address as the CLI's `--addr` takes it.
    native_text: String,
    log: PathBuf,
    pub data_dir: PathBuf,
}

const NBDMAGIC: [u8; 8] = 0x4e42444d41474943u64.to_be_bytes();

impl Node {
    /// Waits until the native protocol answers a ping, the NBD port sends its greeting and the
    /// metrics port accepts; on an early exit or a timeout, returns the log.
    fn wait_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child_mut().try_wait().expect("wait for tundra serve") {
                self.child = None;
                return Err(format!("exited with {status}:\n{}", self.log()));
            }
            if self.probe() {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!("not ready after {START_TIMEOUT:?}:\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn probe(&self) -> bool {
        let timeout = Duration::from_millis(500);
        let native = tundra_client::Client::connect(self.native).and_then(|mut c| c.ping(b"ready?")).is_ok();
        let nbd = TcpStream::connect_timeout(&self.nbd, timeout).is_ok_and(|mut stream| {
            let _ = stream.set_read_timeout(Some(timeout));
            let mut magic = [0u8; 8];
            stream.read_exact(&mut magic).is_ok() && magic == NBDMAGIC
        });
        native && nbd && TcpStream::connect_timeout(&self.metrics, timeout).is_ok()
    }

    fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("the node has been stopped")
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("the node has been stopped").id() as i32
    }

    /// What the node wrote to standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The NBD URI of a volume.
    pub fn uri(&self, volume: &str) -> String {
        format!("nbd://{}/{volume}", self.nbd)
    }

    /// A native protocol connection.
    pub fn client(&self) -> tundra_client::Client {
        tundra_client::Client::connect(self.native).expect("connect to the native protocol")
    }

    /// `ARGS --addr NATIVE`, for the `tundra` commands that talk to a running node.
    pub fn with_addr<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = args.to_vec();
        all.extend(["--addr", self.native_text.as_str()]);
        all
    }

    /// `tundra volume create NAME --size SIZE --page-size PAGE --mode MODE` through the CLI.
    pub fn create_volume(&self, name: &str, size: &str, page_size: &str, mode: &str) {
        let args = ["volume", "create", name, "--size", size, "--page-size", page_size, "--mode", mode];
        let out = crate::common::tundra(&self.with_addr(&args));
        assert!(
            out.status.success(),
            "tundra {args:?} failed: {}\nnode log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Panics unless the process runs and answers a ping.
    #[track_caller]
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child_mut().try_wait().expect("wait") {
            panic!("tundra serve exited with {status}:\n{}", self.log());
        }
        let echo = self.client().ping(b"alive?").expect("ping");
        assert_eq!(echo, b"alive?");
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) with the PID of our own child, which has not been reaped yet (we hold
        // its Child and only wait through it), so the PID cannot name another process.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}): {}", self.pid(), std::io::Error::last_os_error());
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child_mut().try_wait().expect("wait") {
                self.child = None;
                return Some(status);
            }
            if started.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; the node must stop cleanly, with exit status 0, within a bound. Returns its log.
    pub fn stop(self) -> String {
        self.stop_with(libc::SIGTERM)
    }

    /// `signal` (SIGTERM or SIGINT); as [`Node::stop`].
    pub fn stop_with(mut self, signal: i32) -> String {
        self.signal(signal);
        let Some(status) = self.wait_exit(STOP_TIMEOUT) else {
            panic!("tundra serve did not stop within {STOP_TIMEOUT:?} of signal {signal}:\n{}", self.log());
        };
        let log = self.log();
        assert!(status.success(), "tundra serve exited with {status} after signal {signal}:\n{log}");
        log
    }

    /// SIGKILL: the node gets no chance to checkpoint.
    pub fn kill9(mut self) {
        self.kill9_keep_ports();
    }

    /// [`Node::kill9`], keeping this value for its ports ([`Site::restart_on_same_ports`]).
    pub fn kill9_keep_ports(&mut self) {
        self.signal(libc::SIGKILL);
        let status = self.wait_exit(STOP_TIMEOUT).expect("SIGKILL ends the node");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // Only a test that did not stop its node gets here, usually by panicking.
        let _ = child.kill();
        let _ = child.wait();
        if std::thread::panicking() {
            eprintln!("--- tundra serve log ({}) ---\n{}", self.data_dir.display(), self.log());
        }
    }
}

/// Panics unless `tool` is on the PATH.
pub fn require(tool: &str) {
    let found = Command::new("which").arg(tool).output().is_ok_and(|out| out.status.success());
    assert!(found, "{tool} is not installed: run scripts/install-deps (it installs the NBD clients the tests use)");
}

/// A command for `tool` (which must be installed), run in `dir` so that nothing it leaves
/// behind (fio's state files) lands in the source tree. /usr/bin comes first on the PATH: nbdsh
/// runs `python3 -m nbd`, and the first python3 (pyenv, a virtualenv) may lack libnbd.
pub fn tool(tool: &str, dir: &Path) -> Command {
    require(tool);
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new(tool);
    command.current_dir(dir).env("PATH", format!("/usr/bin:{path}")).stdin(Stdio::null());
    command
}

/// Runs a command, requires success, and returns its output.
#[track_caller]
pub fn run(command: &mut Command) -> Output {
    let out = command.output().unwrap_or_else(|error| panic!("cannot run {command:?}: {error}"));
    assert!(
        out.status.success(),
        "{command:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Compares byte images, reporting the first difference instead of printing megabytes.
#[track_caller]
pub fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    if let Some(offset) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {offset}: {} instead of {}", actual[offset], expected[offset]);
    }
}
