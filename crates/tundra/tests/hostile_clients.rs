//! A real `tundra serve` against clients that try to exhaust it: write requests that announce
//! 32 MiB and never send it, thousands of connections that never speak, and a connection held
//! on a volume that is then deleted. The node's memory, threads and descriptors stay bounded,
//! and a valid client is served throughout.
//!
//! `TUNDRA_IDLE_CONNECTIONS=N` sets how many silent connections the second test holds open
//! (default 1,500, three times the node's cap; the figure is 5,000).

// Each test file uses some of the shared helpers.
#[allow(dead_code)]
mod common;
#[allow(dead_code)]
#[path = "common/serve.rs"]
mod common_serve;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common_serve::Site;

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_GO: u32 = 7;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const ESHUTDOWN: u32 = 108;

/// A minimal NBD client: fixed newstyle, NBD_OPT_GO, simple replies.
struct Nbd {
    stream: TcpStream,
}

impl Nbd {
    fn go(addr: SocketAddr, export: &str) -> Nbd {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut nbd = Nbd { stream };
        let mut greeting = [0u8; 18];
        nbd.stream.read_exact(&mut greeting).expect("greeting");
        nbd.send(&3u32.to_be_bytes());
        let mut data = (export.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        let mut option = IHAVEOPT.to_be_bytes().to_vec();
        option.extend_from_slice(&OPT_GO.to_be_bytes());
        option.extend_from_slice(&(data.len() as u32).to_be_bytes());
        option.extend_from_slice(&data);
        nbd.send(&option);
        loop {
            let mut header = [0u8; 20];
            nbd.stream.read_exact(&mut header).expect("option reply");
            let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(header[16..20].try_into().unwrap());
            let mut body = vec![0u8; len as usize];
            nbd.stream.read_exact(&mut body).unwrap();
            match reply_type {
                1 => return nbd,
                3 => continue,
                other => panic!("GO {export}: reply type {other:#x}: {}", String::from_utf8_lossy(&body)),
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn request(&mut self, command: u16, offset: u64, length: u32, payload: &[u8]) {
        let mut header = REQUEST_MAGIC.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&command.to_be_bytes());
        header.extend_from_slice(&7u64.to_be_bytes());
        header.extend_from_slice(&offset.to_be_bytes());
        header.extend_from_slice(&length.to_be_bytes());
        header.extend_from_slice(payload);
        self.send(&header);
    }

    /// The error of the next simple reply (0 for success).
    fn reply(&mut self) -> u32 {
        let mut reply = [0u8; 16];
        self.stream.read_exact(&mut reply).expect("reply");
        u32::from_be_bytes(reply[4..8].try_into().unwrap())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.request(CMD_WRITE, offset, data.len() as u32, data);
        self.reply()
    }

    fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        self.request(CMD_READ, offset, len as u32, &[]);
        match self.reply() {
            0 => {
                let mut data = vec![0u8; len];
                self.stream.read_exact(&mut data).expect("read payload");
                Ok(data)
            }
            error => Err(error),
        }
    }

    /// True once the server has closed the connection.
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

/// One field of /proc/PID/status in KiB (VmRSS, VmHWM).
fn status_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn count_entries(path: String) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// 64 connections each announce a 32 MiB write and send none of it (2 GiB if buffers were
/// sized from headers): the node's resident memory stays under 256 MiB and a valid client is
/// served while they are held.
#[test]
fn stalled_32_mib_writes_hold_no_memory() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("db", "256MiB", "8KiB", "normal");
    let before_kib = status_kib(node.pid(), "VmRSS");
    let mut stalled: Vec<Nbd> = (0..64).map(|_| Nbd::go(node.nbd, "db")).collect();
    for nbd in &mut stalled {
        // The header only: the payload never comes.
        nbd.request(CMD_WRITE, 0, 32 << 20, &[]);
    }
    let mut valid = Nbd::go(node.nbd, "db");
    let page: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(valid.write(8192, &page), 0);
    assert_eq!(valid.read(8192, 8192), Ok(page));
    std::thread::sleep(Duration::from_millis(500));
    let rss_kib = status_kib(node.pid(), "VmRSS");
    let peak_kib = status_kib(node.pid(), "VmHWM");
    println!(
        "node resident memory: {before_kib} KiB before, {rss_kib} KiB with 64 stalled 32 MiB writes (peak {peak_kib} KiB)"
    );
    assert!(peak_kib < 256 * 1024, "the node's peak resident memory is {peak_kib} KiB");
    drop(stalled);
    node.stop();
}

/// Thousands of connections that never speak (three times the node's cap of 512 by default):
/// the node keeps its threads and descriptors bounded, and a valid client gets through.
#[test]
fn thousands_of_idle_connections_never_lock_out_a_valid_client() {
    let count: usize = std::env::var("TUNDRA_IDLE_CONNECTIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_500);
    let site = Site::new();
    let node = site.start();
    node.create_volume("db", "64MiB", "8KiB", "normal");
    let mut idle = Vec::with_capacity(count);
    for _ in 0..count {
        idle.push(TcpStream::connect(node.nbd).expect("connect an idle client"));
    }
    let threads = || count_entries(format!("/proc/{}/task", node.pid()));
    let fds = || count_entries(format!("/proc/{}/fd", node.pid()));
    // Every connection is accepted (and the oldest closed) before the valid client comes.
    eventually("the idle connections are taken in", || threads() < 600 && idle.len() == count);
    let mut valid = Nbd::go(node.nbd, "db");
    assert_eq!(valid.write(0, &[5u8; 8192]), 0);
    assert_eq!(valid.read(0, 8192), Ok(vec![5u8; 8192]));
    let (threads, fds) = (threads(), fds());
    println!("{count} idle connections held open: the node runs {threads} threads and holds {fds} descriptors");
    assert!(threads < 600, "{threads} threads");
    assert!(fds < 1200, "{fds} descriptors");
    drop(idle);
    node.stop();
}

/// A connection on a volume that is deleted is closed; a request already on its way gets
/// ESHUTDOWN, never another volume's data.
#[test]
fn deleting_a_volume_closes_its_nbd_connections() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("victim", "16MiB", "8KiB", "normal");
    let mut stale = Nbd::go(node.nbd, "victim");
    assert_eq!(stale.write(0, &[1u8; 8192]), 0);
    common::succeeds(&node.with_addr(&["volume", "delete", "victim"]));
    node.create_volume("secret", "16MiB", "8KiB", "normal");
    let mut secret = Nbd::go(node.nbd, "secret");
    assert_eq!(secret.write(0, &[0x5e; 8192]), 0);
    // The node closed the stale connection; a request sent anyway gets ESHUTDOWN or nothing.
    stale.request(CMD_READ, 0, 8192, &[]);
    let mut reply = [0u8; 16];
    if stale.stream.read_exact(&mut reply).is_ok() {
        assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), ESHUTDOWN);
    }
    assert!(stale.closed(), "the deleted volume's connection stays open");
    assert_eq!(secret.read(0, 8192), Ok(vec![0x5e; 8192]));
    assert!(node.log().contains("closed its 1 NBD connection"), "{}", node.log());
    node.stop();
}
