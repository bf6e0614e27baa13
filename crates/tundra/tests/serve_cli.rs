//! The node binary end to end: `tundra serve` as a process, with its own data directory, driven
//! by the real NBD clients a host uses (fio's nbd engine, qemu-io and qemu-img, nbdsh, nbdfuse),
//! by the native Rust client, and by the `tundra volume`, `stats` and `fsck` commands. Restarts,
//! SIGTERM and SIGKILL included.
//!
//! The NBD clients come from scripts/install-deps; a missing one fails the test, naming that
//! script.

mod common;
#[allow(dead_code)]
#[path = "common/serve.rs"]
mod common_serve;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{fails, fails_once, succeeds, tundra};
use common_serve::*;
use tundra_env::Rng;
use tundra_proto::{Status, VolumeMode, VolumeSpec, WriteMode};

/// Runs qemu-io on a volume with one `-c` per command; every command must succeed (a pattern
/// that does not match prints "Pattern verification failed" and fails the test).
#[track_caller]
fn qemu_io(node: &Node, dir: &Path, volume: &str, commands: &[String]) -> String {
    let mut command = tool("qemu-io", dir);
    command.args(["-f", "raw", &node.uri(volume)]);
    for line in commands {
        command.args(["-c", line]);
    }
    let out = run(&mut command);
    let text = text(&out);
    assert!(!text.contains("failed") && !text.contains("error"), "qemu-io on {volume}:\n{text}");
    text
}

fn strings(commands: &[&str]) -> Vec<String> {
    commands.iter().map(|c| c.to_string()).collect()
}

/// One fio job with the nbd engine on a volume; it must finish with no error and every block it
/// wrote must verify.
#[track_caller]
fn fio(node: &Node, dir: &Path, volume: &str, args: &[&str]) -> String {
    let mut command = tool("fio", dir);
    command.args([
        "--name=nbd",
        "--ioengine=nbd",
        &format!("--uri={}", node.uri(volume)),
        "--iodepth=8",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        // A flush at the end: what the job wrote is then in the store, not only in the node's
        // write-back cache, when the test looks at the stats.
        "--end_fsync=1",
    ]);
    command.args(args);
    let out = run(&mut command);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("err= 0"), "fio on {volume} {args:?} reported an error:\n{text}");
    assert!(text.contains("READ:"), "fio on {volume} {args:?} read nothing back to verify:\n{text}");
    text
}

/// `tundra fsck --data-dir DIR` on a stopped node: exit 0 and "clean".
#[track_caller]
fn fsck_clean(data_dir: &Path) {
    let dir = data_dir.to_str().expect("utf-8 path");
    let out = succeeds(&["fsck", "--data-dir", dir]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("clean") && stdout.contains(" 0 problem(s)"), "{stdout}");
    let out = succeeds(&["fsck", "--data-dir", dir, "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck --json is JSON");
    assert_eq!(report["clean"], true, "{report}");
}

/// `tundra volume list --json`.
fn volume_list(node: &Node) -> serde_json::Value {
    let out = succeeds(&node.with_addr(&["volume", "list", "--json"]));
    serde_json::from_slice(&out.stdout).expect("volume list --json is JSON")
}

/// `tundra stats --json`.
fn stats(node: &Node) -> serde_json::Value {
    let out = succeeds(&node.with_addr(&["stats", "--json"]));
    serde_json::from_slice(&out.stdout).expect("stats --json is JSON")
}

/// One volume's entry in `tundra stats --json`.
fn volume_stats<'a>(stats: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    stats["volumes"]
        .as_array()
        .and_then(|volumes| volumes.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no volume {name} in {stats}"))
}

#[test]
fn fio_verifies_writes_and_trims_on_compressed_and_uncompressed_volumes() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("pages", "24MiB", "8KiB", "normal");
    node.create_volume("wal", "16MiB", "8KiB", "none");
    let dir = site.scratch();
    // Whole aligned pages through Algorithm 1, from incompressible to very compressible, each
    // run rewriting the pages of the one before.
    for (percentage, seed) in [("0", "1"), ("50", "2"), ("90", "3")] {
        fio(
            &node,
            dir,
            "pages",
            &[
                "--rw=randwrite",
                "--bs=8k",
                "--size=8m",
                &format!("--buffer_compress_percentage={percentage}"),
                &format!("--randseed={seed}"),
            ],
        );
    }
    // Trims between writes: a trimmed page reads as zeros, a rewritten one verifies.
    fio(&node, dir, "pages", &["--rw=randtrimwrite", "--bs=8k", "--size=8m", "--buffer_compress_percentage=50"]);
    // Pieces of pages (half pages, then anything from 512 bytes): merged into their page and
    // stored raw, the none path.
    fio(
        &node,
        dir,
        "pages",
        &["--rw=randwrite", "--bs=4k", "--offset=8m", "--size=4m", "--buffer_compress_percentage=50"],
    );
    fio(
        &node,
        dir,
        "pages",
        &[
            "--rw=randwrite",
            "--bsrange=512-12k",
            "--blockalign=512",
            "--offset=12m",
            "--size=4m",
            "--buffer_compress_percentage=50",
        ],
    );
    // The uncompressed volume, on the fast device.
    // (fio 3.33 issues only the trims of a trimwrite job that has an --offset: keep it at 0.)
    fio(&node, dir, "wal", &["--rw=randtrimwrite", "--bsrange=4k-64k", "--size=4m"]);
    fio(
        &node,
        dir,
        "wal",
        &["--rw=randwrite", "--bs=8k", "--offset=4m", "--size=8m", "--buffer_compress_percentage=50"],
    );

    let stats = stats(&node);
    let pages = volume_stats(&stats, "pages");
    assert!(pages["lz4_pages"].as_u64().unwrap() + pages["zstd_pages"].as_u64().unwrap() > 0, "{pages}");
    let wal = volume_stats(&stats, "wal");
    assert_eq!(wal["raw_pages"], wal["pages"], "{wal}");
    let log = node.stop();
    assert!(!log.contains("failed"), "{log}");
    fsck_clean(&site.data_dir());
}

#[test]
fn qemu_io_patterns_unaligned_discard_and_zeroes_on_every_kind_of_volume() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("v8", "32MiB", "8KiB", "normal");
    node.create_volume("v16", "32MiB", "16KiB", "normal");
    node.create_volume("raw", "32MiB", "8KiB", "none");
    let commands = strings(&[
        "write -P 0xab 0 64k",
        "read -P 0xab 0 64k",
        "discard 0 64k",
        "read -P 0 0 64k",
        "write -P 0x11 64k 64k",
        "write -z 64k 64k",
        "read -P 0 64k 64k",
        "write -P 0x22 128k 64k",
        "write -z -u 128k 64k",
        "read -P 0 128k 64k",
        // Unaligned: inside one page, across pages, a single byte.
        "write -P 0xcd 1000 3000",
        "read -P 0xcd 1000 3000",
        "read -P 0 4000 1",
        "read -P 0 999 1",
        "write -P 0x33 1048575 3",
        "read -P 0x33 1048575 3",
        "write -P 0x34 200000 50000",
        "discard 210000 20000",
        "read -P 0x34 200000 10000",
        "read -P 0 210000 20000",
        "read -P 0x34 230000 20000",
        "write -f -P 0x44 2M 4k",
        "read -P 0x44 2M 4k",
        "read -P 0 2052k 4k",
        "aio_write -P 0x55 3M 8k",
        "aio_write -P 0x66 4M 8k",
        "aio_flush",
        "read -P 0x55 3M 8k",
        "read -P 0x66 4M 8k",
        "write -P 0x77 33554431 1",
        "read -P 0x77 33554431 1",
        "flush",
    ]);
    for volume in ["v8", "v16", "raw"] {
        qemu_io(&node, site.scratch(), volume, &commands);
    }
    // A pattern that does not match must fail the run, or the checks above prove nothing.
    let out = tool("qemu-io", site.scratch()).args(["-f", "raw", &node.uri("v8"), "-c", "read -P 0x99 0 4k"]).output();
    assert!(text(&out.expect("run qemu-io")).contains("Pattern verification failed"));

    // qemu-img sees the volume's size, copies an image with data, zeros and holes in and
    // compares it back.
    let out = run(tool("qemu-img", site.scratch()).args(["info", "--output=json", &node.uri("v16")]));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("qemu-img info JSON");
    assert_eq!(info["virtual-size"], 32 * MIB, "{info}");
    let image = site.scratch().join("image.raw");
    let mut bytes = vec![0u8; 4 * MIB as usize];
    let mut rng = Rng::new(3);
    for (i, chunk) in bytes.chunks_mut(96 * 1024).enumerate() {
        match i % 3 {
            0 => chunk[..50_000].copy_from_slice(&rng.bytes(50_000)),
            1 => chunk.iter_mut().enumerate().for_each(|(j, b)| *b = (j % 251) as u8),
            _ => {}
        }
    }
    std::fs::write(&image, &bytes).expect("write image");
    let image = image.to_str().expect("utf-8 path");
    for volume in ["v8", "raw"] {
        let uri = node.uri(volume);
        run(tool("qemu-img", site.scratch()).args(["convert", "-n", "-f", "raw", "-O", "raw", image, &uri]));
        // compare checks the whole of the larger volume: the rest must read as zeros too, so
        // start from a clean volume.
        run(tool("qemu-io", site.scratch()).args(["-f", "raw", &uri, "-c", "write -z 4M 28M"]));
        run(tool("qemu-img", site.scratch()).args(["compare", "-f", "raw", "-F", "raw", image, &uri]));
    }
    node.stop();
    fsck_clean(&site.data_dir());
}

#[test]
fn nbdsh_bad_requests_get_clean_errors_and_the_node_stays_up() {
    let site = Site::new();
    let mut node = site.start();
    node.create_volume("vol", "16MiB", "8KiB", "normal");
    node.create_volume("wal", "8MiB", "8KiB", "none");
    // Strict mode off, libnbd sends what it would otherwise refuse itself.
    let script = r#"
import errno
h.set_strict_mode(0)
size = h.get_size()
assert size == 16 * 1024 * 1024, size
assert h.get_block_size(nbd.SIZE_PREFERRED) == 8192
def expect(errnum, call, *args):
    try:
        call(*args)
    except nbd.Error as e:
        assert e.errno == errno.errorcode[errnum], (call.__name__, args[1:], e.errno, e.string)
        # After every refusal, a valid request still succeeds on the same connection.
        assert h.pread(1, 0) == b"\0"
        return
    raise AssertionError("%s %r should fail" % (call.__name__, args[1:]))
big = 32 * 1024 * 1024 + 1
expect(errno.EINVAL, h.pread, 4096, size - 100)
expect(errno.EINVAL, h.pread, 1, size)
expect(errno.ENOSPC, h.pwrite, b"x" * 4096, size - 100)
expect(errno.ENOSPC, h.pwrite, b"x" * 8192, size)
expect(errno.EINVAL, h.trim, 4096, size - 100)
expect(errno.ENOSPC, h.zero, 4096, size - 100)
expect(errno.EINVAL, h.cache, 4096, size)
expect(errno.EINVAL, h.pread, 0, 0)
expect(errno.EINVAL, h.pwrite, b"", 0)
expect(errno.EINVAL, h.trim, 0, 0)
expect(errno.EINVAL, h.zero, 0, 0)
expect(errno.EINVAL, h.pwrite, b"x" * 512, 0, 0x80)
expect(errno.EINVAL, h.pread, 512, 0, 0x100)
expect(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_DF)
expect(errno.EINVAL, h.zero, 512, 0, nbd.CMD_FLAG_FAST_ZERO)
expect(errno.EINVAL, h.trim, 512, 0, nbd.CMD_FLAG_NO_HOLE)
expect(errno.EINVAL, h.pwrite, b"x" * 512, 0, nbd.CMD_FLAG_NO_HOLE)
expect(errno.EINVAL, h.pread, big, 0)
expect(errno.EINVAL, h.pwrite, b"y" * big, 0)
expect(errno.ENOSPC, h.zero, size + 1, 0)
# No refused write landed.
assert h.pread(8192, size - 8192) == bytes(8192)
assert h.pread(8192, 0) == bytes(8192)
h.pwrite(b"ok" * 256, 0)
assert h.pread(512, 0) == b"ok" * 256
print("ok")
"#;
    let out = run(tool("nbdsh", site.scratch()).args(["-u", &node.uri("vol"), "-c", script]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    node.assert_alive();

    // An export that does not exist is refused at connect, cleanly; then listing and a normal
    // connection work.
    let out = tool("nbdsh", site.scratch())
        .args(["-u", &node.uri("nope"), "-c", "h.pread(512, 0)"])
        .output()
        .expect("run nbdsh");
    assert!(!out.status.success(), "connecting to a missing export must fail");
    assert!(text(&out).contains("nope"), "{}", text(&out));
    let script = r#"
found = []
h.opt_list(lambda name, description: found.append((name, description)))
assert sorted(found) == [
    ("vol", "Tundra volume, compressed, 8192-byte pages"),
    ("wal", "Tundra volume, uncompressed, 8192-byte pages"),
], found
h.set_export_name("nope")
try:
    h.opt_go()
    raise AssertionError("an unknown export must fail")
except nbd.Error as e:
    print("unknown:", e.string)
h.set_export_name("vol")
h.opt_go()
assert h.pread(512, 0) == b"ok" * 256
h.pwrite(b"\x42" * 10000, 12345, nbd.CMD_FLAG_FUA)
h.zero(5000, 12345)
h.flush()
assert h.pread(5000, 12345) == bytes(5000)
assert h.pread(5000, 17345) == b"\x42" * 5000
print("ok")
"#;
    let uri = format!("nbd://{}", node.nbd);
    let out = run(tool("nbdsh", site.scratch()).args(["--opt-mode", "-u", &uri, "-c", script]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"), "{}", text(&out));

    // Garbage on either port ends that connection only.
    for addr in [node.nbd, node.native] {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let _ = stream.write_all(&[0xff; 4096]);
        let mut sink = Vec::new();
        match stream.read_to_end(&mut sink) {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(error) => panic!("the node did not close a connection sending garbage to {addr}: {error}"),
        }
    }
    node.assert_alive();
    let out = run(tool("nbdsh", site.scratch()).args(["-u", &node.uri("vol"), "-c", "print(h.pread(4, 0))"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("okok"));
    node.stop();
    fsck_clean(&site.data_dir());
}

/// Writes by several clients at once, three connections per volume and fio's jobs beside
/// them, interleaved so that neighbouring pieces of one page come from different connections.
#[test]
fn concurrent_connections_to_two_volumes_keep_every_write() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("a", "8MiB", "8KiB", "normal");
    node.create_volume("b", "8MiB", "16KiB", "none");
    let dir = site.scratch();
    const WRITERS: u64 = 3;
    // (offset, length, pattern) of every write, per volume.
    let plan = |volume: u64, writer: u64| -> Vec<(u64, u64, u64)> {
        let pattern = 0x10 * (volume + 1) + writer;
        let small = (0..48).map(|i| ((i * WRITERS + writer) * 4096, 4096, pattern));
        let large = (0..6).map(|i| (MIB + (i * WRITERS + writer) * 65536, 65536, pattern));
        small.chain(large).collect()
    };
    let mut children = Vec::new();
    for (v, volume) in ["a", "b"].into_iter().enumerate() {
        for writer in 0..WRITERS {
            let mut command = tool("qemu-io", dir);
            command.args(["-f", "raw", &node.uri(volume)]);
            for (offset, length, pattern) in plan(v as u64, writer) {
                command.args(["-c", &format!("write -P {pattern:#x} {offset} {length}")]);
            }
            command.stdout(std::process::Stdio::null());
            children.push((format!("qemu-io writer {writer} on {volume}"), command.spawn().expect("run qemu-io")));
        }
        // Two fio jobs, each its own connection, on the upper half of the volume.
        let mut command = tool("fio", dir);
        command.args([
            "--name=nbd",
            "--ioengine=nbd",
            &format!("--uri={}", node.uri(volume)),
            "--rw=randwrite",
            "--bsrange=4k-32k",
            "--offset=4m",
            "--size=1m",
            "--offset_increment=2m",
            "--numjobs=2",
            "--iodepth=4",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output=/dev/null",
        ]);
        children.push((format!("fio on {volume}"), command.spawn().expect("run fio")));
    }
    for (what, mut child) in children {
        let status = child.wait().expect("wait");
        assert!(status.success(), "{what} exited with {status}");
    }
    for (v, volume) in ["a", "b"].into_iter().enumerate() {
        let mut reads: Vec<String> = (0..WRITERS)
            .flat_map(|writer| plan(v as u64, writer))
            .map(|(offset, length, pattern)| format!("read -P {pattern:#x} {offset} {length}"))
            .collect();
        let end = MIB + 6 * WRITERS * 65536;
        reads.push(format!("read -P 0 {} {}", 48 * WRITERS * 4096, MIB - 48 * WRITERS * 4096));
        reads.push(format!("read -P 0 {end} {}", 4 * MIB - end));
        qemu_io(&node, dir, volume, &reads);
    }
    node.stop();
    fsck_clean(&site.data_dir());
}

/// What the restart tests write and read back on a volume of each kind.
fn restart_writes() -> Vec<(&'static str, Vec<String>, Vec<String>)> {
    let writes = |p: u8| {
        vec![
            format!("write -P {p:#x} 0 1M"),
            format!("write -P {:#x} 1000 3000", p + 1),
            format!("write -P {:#x} 2M 256k", p + 2),
            "discard 2M 64k".to_string(),
            format!("write -P {:#x} 3M 8k", p + 3),
            "write -z 3M 4k".to_string(),
            format!("write -P {:#x} 8388607 1", p + 4),
            "flush".to_string(),
        ]
    };
    let reads = |p: u8| {
        vec![
            format!("read -P {p:#x} 0 1000"),
            format!("read -P {:#x} 1000 3000", p + 1),
            format!("read -P {p:#x} 4000 1044576"),
            "read -P 0 1M 1M".to_string(),
            "read -P 0 2M 64k".to_string(),
            format!("read -P {:#x} 2112k 192k", p + 2),
            "read -P 0 3M 4k".to_string(),
            format!("read -P {:#x} 3076k 4k", p + 3),
            format!("read -P {:#x} 8388607 1", p + 4),
        ]
    };
    vec![("pg", writes(0x10), reads(0x10)), ("big", writes(0x30), reads(0x30)), ("wal", writes(0x50), reads(0x50))]
}

fn create_restart_volumes(node: &Node) {
    node.create_volume("pg", "8MiB", "8KiB", "normal");
    node.create_volume("big", "8MiB", "16KiB", "normal");
    node.create_volume("wal", "8MiB", "8KiB", "none");
}

#[test]
fn restart_after_sigterm_keeps_volumes_and_data_and_fsck_is_clean() {
    let site = Site::new();
    let node = site.start();
    create_restart_volumes(&node);
    for (volume, writes, reads) in restart_writes() {
        qemu_io(&node, site.scratch(), volume, &writes);
        qemu_io(&node, site.scratch(), volume, &reads);
    }
    // SIGTERM finds clients connected: an idle native connection, an NBD connection in its
    // handshake, and fio writing to another volume. The node still stops at once and cleanly.
    node.create_volume("busy", "16MiB", "8KiB", "normal");
    let volumes = volume_list(&node);
    let mut idle = node.client();
    idle.ping(b"idle").expect("ping");
    let handshake = TcpStream::connect(node.nbd).expect("connect to NBD");
    let mut busy = tool("fio", site.scratch())
        .args(["--name=busy", "--ioengine=nbd", &format!("--uri={}", node.uri("busy"))])
        .args(["--rw=randwrite", "--bsrange=512-64k", "--size=16m", "--iodepth=8", "--time_based", "--runtime=30"])
        .args(["--verify_state_save=0", "--output=/dev/null"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run fio");
    let started = Instant::now();
    while volume_stats(&stats(&node), "busy")["pages"].as_u64() < Some(50) {
        assert!(started.elapsed() < Duration::from_secs(20), "fio wrote nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = node.stop();
    assert!(log.contains("stopped cleanly"), "{log}");
    let status = busy.wait().expect("wait for fio");
    assert!(!status.success(), "fio cannot finish a 30 s run on a node that stopped");
    let error = idle.ping(b"idle").expect_err("the node is gone");
    assert!(error.is_connection_lost(), "{error}");
    drop(handshake);
    fsck_clean(&site.data_dir());

    let node = site.start();
    assert_eq!(volume_list(&node), volumes, "the volumes after a restart");
    for (volume, _, reads) in restart_writes() {
        qemu_io(&node, site.scratch(), volume, &reads);
    }
    node.stop();
    fsck_clean(&site.data_dir());
}

#[test]
fn kill_9_after_acknowledged_writes_loses_nothing() {
    let site = Site::new();
    let node = site.start();
    create_restart_volumes(&node);
    for (volume, writes, _) in restart_writes() {
        qemu_io(&node, site.scratch(), volume, &writes);
    }
    // FUA writes, whole and partial pages, with no flush after them.
    let fua = strings(&["write -f -P 0x5a 4M 1M", "write -f -P 0x5b 5M 64k", "write -f -P 0x5c 6000 100"]);
    qemu_io(&node, site.scratch(), "pg", &fua);
    // And through the native protocol, then one flush.
    let mut client = node.client();
    let pg = client.volume_lookup("pg").expect("lookup");
    let page = vec![0x6eu8; 8192];
    for index in 800..810 {
        client.write_page(pg.id, index, WriteMode::Auto, &page).expect("write page");
    }
    client.flush(Some(pg.id)).expect("flush");
    drop(client);
    node.kill9();

    // fsck recovers the data directory on its own.
    fsck_clean(&site.data_dir());
    let node = site.start();
    for (volume, _, reads) in restart_writes() {
        let mut reads = reads;
        if volume == "pg" {
            // The FUA write at 6000 lies inside the first pattern's range.
            reads.retain(|r| !r.contains(" 4000 "));
            reads.extend(strings(&[
                "read -P 0x10 4000 2000",
                "read -P 0x5c 6000 100",
                "read -P 0x10 6100 1042476",
                "read -P 0x5a 4M 1M",
                "read -P 0x5b 5M 64k",
            ]));
        }
        qemu_io(&node, site.scratch(), volume, &reads);
    }
    let mut client = node.client();
    for index in 800..810 {
        assert_eq!(client.read_page(pg.id, index).expect("read page"), page, "page {index}");
    }
    drop(client);
    node.stop();
    fsck_clean(&site.data_dir());
}

/// Compressible page contents: text with a counter, different per page.
fn page_content(index: u64, page_size: usize) -> Vec<u8> {
    let mut page = Vec::with_capacity(page_size);
    let mut line = 0u64;
    while page.len() < page_size {
        page.extend_from_slice(
            format!("page {index:06} line {line:05}|2013-01-01|UA|EWR|IAH|{}\n", line % 97).as_bytes(),
        );
        line += 1;
    }
    page.truncate(page_size);
    page
}

#[track_caller]
fn expect_status<T: std::fmt::Debug>(
    result: tundra_client::Result<T>,
    status: Status,
    client: &mut tundra_client::Client,
) {
    match result {
        Err(error) => {
            assert_eq!(error.status(), Some(status), "{error}");
            assert!(!error.is_connection_lost(), "{error}");
            assert!(!error.to_string().is_empty());
        }
        Ok(value) => panic!("expected {status:?}, got {value:?}"),
    }
    assert_eq!(client.ping(b"still there").expect("ping after an error"), b"still there");
}

#[test]
fn native_client_pages_in_every_mode_trim_flush_heavy_stats_and_errors() {
    let site = Site::new();
    let node = site.start();
    let mut client = node.client();
    let spec = |name: &str, size_mib: u64, page_size: u32, mode: VolumeMode| VolumeSpec {
        name: name.into(),
        size_bytes: size_mib * MIB,
        page_size,
        mode,
    };
    let vol = client.volume_create(&spec("db", 8, 8192, VolumeMode::Normal)).expect("create db");
    let wide = client.volume_create(&spec("wide", 8, 16384, VolumeMode::Normal)).expect("create wide");
    let wal = client.volume_create(&spec("wal", 4, 8192, VolumeMode::None)).expect("create wal");
    assert_eq!((vol.page_size, vol.size_bytes, vol.mode), (8192, 8 * MIB, VolumeMode::Normal));
    assert_eq!(client.volume_lookup("wide").expect("lookup"), wide);
    let names: Vec<String> = client.volume_list().expect("list").into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["db", "wide", "wal"]);

    // Pages in each write mode, on each volume, read back.
    for info in [&vol, &wide, &wal] {
        let page_size = info.page_size as usize;
        for (i, mode) in WriteMode::ALL.into_iter().enumerate() {
            for index in (i as u64 * 8)..(i as u64 * 8 + 8) {
                client.write_page(info.id, index, mode, &page_content(index, page_size)).expect("write page");
            }
        }
        for index in 0..32 {
            assert_eq!(client.read_page(info.id, index).expect("read page"), page_content(index, page_size));
        }
        assert_eq!(client.read_page(info.id, 100).expect("unwritten page"), vec![0; page_size]);
    }
    // Pipelined: sixteen writes, then sixteen reads, in flight together.
    let ids: Vec<_> = (40..56)
        .map(|index| client.submit_write_page(vol.id, index, WriteMode::Auto, &page_content(index, 8192)).unwrap())
        .collect();
    for id in ids {
        client.wait(id).expect("pipelined write");
    }
    let ids: Vec<_> = (40..56).map(|index| (index, client.submit_read_page(vol.id, index).unwrap())).collect();
    for (index, id) in ids {
        match client.wait(id).expect("pipelined read") {
            tundra_proto::Reply::Page(bytes) => assert_eq!(bytes, page_content(index, 8192), "page {index}"),
            other => panic!("{other:?}"),
        }
    }

    // Trim, flush.
    client.trim(vol.id, 4, 8).expect("trim");
    for index in 4..12 {
        assert_eq!(client.read_page(vol.id, index).expect("read"), vec![0; 8192], "trimmed page {index}");
    }
    assert_eq!(client.read_page(vol.id, 3).expect("read"), page_content(3, 8192));
    assert_eq!(client.read_page(vol.id, 12).expect("read"), page_content(12, 8192));
    client.flush(Some(vol.id)).expect("flush one volume");
    client.flush(None).expect("flush all");

    // Heavy compression of a range: fewer bytes, the same pages.
    let heavy = client.heavy_compress(vol.id, 40, 16).expect("heavy compress");
    assert!(heavy.pages > 0 && heavy.segments > 0, "{heavy:?}");
    assert!(heavy.bytes_after < heavy.bytes_before, "{heavy:?}");
    for index in 40..56 {
        assert_eq!(client.read_page(vol.id, index).expect("read heavy page"), page_content(index, 8192));
    }

    // Stats as JSON, for the node and for one volume.
    let all: serde_json::Value = serde_json::from_str(&client.stats(None).expect("stats")).expect("JSON");
    let db: serde_json::Value = serde_json::from_str(&client.stats(Some(vol.id)).expect("stats")).expect("JSON");
    assert_eq!(db["name"], "db");
    assert_eq!(db["pages"], 32 - 8 + 16, "{db}");
    assert!(db["heavy_pages"].as_u64().unwrap() > 0, "{db}");
    assert!(db["lz4_pages"].as_u64().unwrap() > 0 && db["zstd_pages"].as_u64().unwrap() > 0, "{db}");
    assert!(db["raw_pages"].as_u64().unwrap() > 0, "WriteMode::None stores raw: {db}");
    assert!(db["page_write"]["count"].as_u64().unwrap() >= 48, "{db}");
    assert_eq!(volume_stats(&all, "wal")["raw_pages"], 32, "{all}");
    assert!(all["software_ratio"].as_f64().unwrap() > 1.0, "{all}");

    // Errors come back with their status and the connection goes on.
    expect_status(client.read_page(999, 0), Status::NotFound, &mut client);
    expect_status(client.write_page(999, 0, WriteMode::Auto, &[0; 8192]), Status::NotFound, &mut client);
    expect_status(client.write_page(vol.id, 0, WriteMode::Auto, &[1; 4096]), Status::Invalid, &mut client);
    expect_status(client.write_page(wide.id, 0, WriteMode::Lz4, &[1; 8192]), Status::Invalid, &mut client);
    expect_status(client.read_page(vol.id, 1024), Status::Invalid, &mut client);
    expect_status(client.write_page(vol.id, 1024, WriteMode::Auto, &[1; 8192]), Status::Invalid, &mut client);
    expect_status(client.trim(vol.id, 1020, 8), Status::Invalid, &mut client);
    expect_status(client.heavy_compress(wal.id, 0, 4), Status::Invalid, &mut client);
    expect_status(client.volume_lookup("nope"), Status::NotFound, &mut client);
    expect_status(client.volume_create(&spec("db", 8, 8192, VolumeMode::Normal)), Status::Exists, &mut client);
    expect_status(client.volume_create(&spec("odd", 8, 4096, VolumeMode::Normal)), Status::Invalid, &mut client);
    expect_status(client.volume_resize("db", 4 * MIB), Status::Invalid, &mut client);
    expect_status(client.volume_delete("nope"), Status::NotFound, &mut client);
    expect_status(client.stats(Some(999)), Status::NotFound, &mut client);
    // Nothing the refused requests touched changed.
    assert_eq!(client.read_page(vol.id, 0).expect("read"), page_content(0, 8192));
    assert_eq!(client.read_page(wide.id, 0).expect("read"), page_content(0, 16384));
    assert_eq!(client.volume_lookup("db").expect("lookup"), vol);

    // The same pages through NBD, both ways.
    client.write_page(vol.id, 20, WriteMode::Zstd, &[0x5c; 8192]).expect("write");
    qemu_io(&node, site.scratch(), "db", &strings(&["read -P 0x5c 160k 8k", "write -P 0x6d 168k 8k"]));
    assert_eq!(client.read_page(vol.id, 21).expect("read"), vec![0x6d; 8192]);

    // A deleted volume is gone for both protocols.
    client.volume_delete("wide").expect("delete");
    expect_status(client.read_page(wide.id, 0), Status::NotFound, &mut client);
    drop(client);
    node.stop();
    fsck_clean(&site.data_dir());
}

/// One HTTP/1.0 GET on the metrics port: (status line, body).
fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to metrics");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP head and body");
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// The value of one sample line `NAME{LABELS} VALUE` in the metrics text.
fn sample(text: &str, series: &str) -> f64 {
    let line = text
        .lines()
        .find(|line| line.split_whitespace().next() == Some(series))
        .unwrap_or_else(|| panic!("no {series} in the metrics:\n{text}"));
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad line {line}"))
}

#[test]
fn stats_json_and_prometheus_metrics_after_compressible_writes() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("pg", "16MiB", "8KiB", "normal");
    node.create_volume("wal", "8MiB", "8KiB", "none");
    let writes = strings(&["write -P 0xab 0 4M", "write -P 0xcd 4M 1M", "read -P 0xab 0 1M"]);
    qemu_io(&node, site.scratch(), "pg", &writes);
    qemu_io(&node, site.scratch(), "wal", &writes);

    let stats = stats(&node);
    let pg = volume_stats(&stats, "pg");
    assert_eq!((pg["mode"].as_str(), pg["device"].as_str()), (Some("normal"), Some("drive")), "{pg}");
    assert_eq!(pg["pages"], 5 * 128, "{pg}");
    assert!(pg["software_ratio"].as_f64().unwrap() > 1.0, "{pg}");
    assert!(pg["page_write"]["count"].as_u64().unwrap() >= 640 && pg["page_read"]["count"].as_u64().unwrap() >= 128);
    let wal = volume_stats(&stats, "wal");
    assert_eq!((wal["mode"].as_str(), wal["device"].as_str()), (Some("none"), Some("fast")), "{wal}");
    assert_eq!(wal["pages"], 5 * 128, "{wal}");
    assert_eq!(wal["raw_pages"], wal["pages"], "{wal}");
    assert_eq!(wal["software_ratio"].as_f64(), Some(1.0), "{wal}");
    assert!(stats["software_ratio"].as_f64().unwrap() > 1.0, "{stats}");
    assert_eq!(stats["compressed"]["pages"], 5 * 128, "mode none volumes are not counted: {stats}");
    // The configuration the node runs with, printed at start and reported with the figures.
    assert_eq!(stats["configuration"]["software_compression"], "auto", "{stats}");
    assert_eq!(stats["configuration"]["drive_compression"], "on", "{stats}");
    assert!(node.log().contains("compression: software auto"), "{}", node.log());

    // The same figures for one volume, and the text forms.
    let out = succeeds(&node.with_addr(&["volume", "stats", "pg", "--json"]));
    let one: serde_json::Value = serde_json::from_slice(&out.stdout).expect("volume stats --json");
    assert_eq!((&one["name"], &one["pages"]), (&pg["name"], &pg["pages"]));
    let out = succeeds(&node.with_addr(&["stats"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("volume pg"));
    let out = succeeds(&node.with_addr(&["volume", "stats", "wal"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("volume wal"));
    // Heavy compression from the command line: every written page of pg; a volume of mode
    // none is refused.
    let out = succeeds(&node.with_addr(&["volume", "heavy-compress", "pg"]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("640 pages into"), "{said}");
    fails(&node.with_addr(&["volume", "heavy-compress", "wal"]), "never compressed");
    assert_eq!(volume_stats(&crate::stats(&node), "pg")["heavy_pages"], 640);

    let (status, body) = http_get(node.metrics, "/metrics");
    assert!(status.contains("200"), "{status}");
    for volume in ["pg", "wal"] {
        let writes = sample(&body, &format!("tundra_page_write_seconds_count{{volume=\"{volume}\"}}"));
        let reads = sample(&body, &format!("tundra_page_read_seconds_count{{volume=\"{volume}\"}}"));
        assert!(writes >= 640.0 && reads >= 128.0, "{volume}: {writes} writes, {reads} reads");
    }
    assert!(sample(&body, "tundra_software_ratio") > 1.0);
    assert_eq!(sample(&body, "tundra_logical_bytes"), (5 * MIB) as f64);
    assert!(body.contains("tundra_flush_seconds"), "{body}");
    let (status, _) = http_get(node.metrics, "/other");
    assert!(status.contains("404"), "{status}");
    // Ctrl-C stops the node as SIGTERM does.
    node.stop_with(libc::SIGINT);
    fsck_clean(&site.data_dir());
}

#[test]
fn volume_commands_refuse_bad_requests_and_change_nothing() {
    let site = Site::new();
    let node = site.start();
    let out = succeeds(&node.with_addr(&["volume", "list"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no volumes"));
    node.create_volume("one", "8MiB", "8KiB", "normal");
    node.create_volume("log", "4MiB", "16KiB", "none");
    let before = volume_list(&node);
    assert_eq!(before.as_array().map(Vec::len), Some(2), "{before}");
    let refused: [(&[&str], &str); 14] = [
        (&["volume", "create", "one", "--size", "8MiB"], "a volume named \"one\" exists"),
        (&["volume", "create", "one", "--size", "16MiB", "--mode", "none"], "exists"),
        (&["volume", "create", "two", "--size", "abc"], "\"abc\" is not a size"),
        (&["volume", "create", "two", "--size", "1.5XB"], "unknown size suffix"),
        (&["volume", "create", "two", "--size", "12345"], "not a non-zero multiple of the page size"),
        (&["volume", "create", "two", "--size", "0"], "not a non-zero multiple of the page size"),
        (&["volume", "create", "two", "--size", "8MiB", "--page-size", "4KiB"], "pages are 8KiB or 16KiB"),
        (&["volume", "create", "two", "--size", "8MiB", "--mode", "zip"], "--mode zip"),
        (&["volume", "create", "two", "--size", "64GiB"], "left and this volume needs 64.00 GiB"),
        // Past the drive's 512 MiB of logical space: refused in bytes, saying how to allow it.
        (&["volume", "create", "two", "--size", "600MiB"], "504.00 MiB free for this volume"),
        (&["volume", "resize", "one", "--size", "600MiB"], "overcommit = true"),
        (&["volume", "create", "tab\there", "--size", "8MiB"], "control character"),
        (&["volume", "resize", "one", "--size", "4MiB"], "shrinking it to 4.00 MiB would drop data"),
        (&["volume", "resize", "nope", "--size", "16MiB"], "no volume named \"nope\""),
    ];
    for (args, needle) in refused {
        fails_once(&node.with_addr(args), needle);
        assert_eq!(volume_list(&node), before, "after tundra {args:?}");
    }
    let long = "x".repeat(65);
    fails(&node.with_addr(&["volume", "create", &long, "--size", "8MiB"]), "64 bytes");
    assert_eq!(volume_list(&node), before);
    fails(&node.with_addr(&["volume", "delete", "nope"]), "no volume named \"nope\"");
    fails(&node.with_addr(&["volume", "stats", "nope"]), "no volume named \"nope\"");
    // A node that is not there.
    let nowhere = unused_addr().to_string();
    let message = fails_once(&["volume", "list", "--addr", &nowhere], "is `tundra serve` running?");
    assert_eq!(message.matches("refused").count(), 1, "the reason said once: {message}");
    fails(&["stats", "--addr", &nowhere], "is `tundra serve` running?");
    // A malformed command line is the parser's: exit status 2.
    let out = tundra(&node.with_addr(&["volume", "create", "two"]));
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(volume_list(&node), before);
    // The running node's directory is locked: no second node, no fsck.
    let refused = site.start_refused();
    assert!(refused.contains("a node is already running on"), "{refused}");
    assert!(refused.contains("--data-dir") && !refused.contains("invalid request"), "{refused}");
    let dir = site.data_dir();
    fails(&["fsck", "--data-dir", dir.to_str().expect("utf-8 path")], "a node is already running on");
    assert_eq!(volume_list(&node), before);

    // What is allowed works: growing, then deleting.
    let out = succeeds(&node.with_addr(&["volume", "resize", "one", "--size", "16MiB"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("16.00 MiB"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = run(tool("qemu-img", site.scratch()).args(["info", "--output=json", &node.uri("one")]));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("qemu-img info JSON");
    assert_eq!(info["virtual-size"], 16 * MIB, "a new connection sees the new size: {info}");
    succeeds(&node.with_addr(&["volume", "delete", "one"]));
    let after = volume_list(&node);
    assert_eq!(
        after.as_array().map(|v| v.iter().map(|v| v["name"].clone()).collect::<Vec<_>>()),
        Some(vec!["log".into()])
    );
    node.stop();
    fsck_clean(&site.data_dir());
}

/// Unmounts on drop, so that a failing test leaves no mount behind, then ends nbdfuse.
struct FuseMount {
    mountpoint: std::path::PathBuf,
    child: std::process::Child,
}

impl FuseMount {
    fn unmount(&self) -> bool {
        for unmount in [&["fusermount3", "-u"][..], &["fusermount", "-u"][..], &["umount"][..]] {
            let status = Command::new(unmount[0]).args(&unmount[1..]).arg(&self.mountpoint).output();
            if status.is_ok_and(|out| out.status.success()) {
                return true;
            }
        }
        false
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.unmount();
            let started = Instant::now();
            while self.child.try_wait().ok().flatten().is_none() && started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn nbdfuse_file_on_a_volume_reads_and_writes_through_the_kernel() {
    let site = Site::new();
    let node = site.start();
    node.create_volume("fuse", "8MiB", "8KiB", "normal");
    let mountpoint = site.scratch().join("mnt");
    std::fs::create_dir(&mountpoint).expect("mkdir");
    let pidfile = site.scratch().join("nbdfuse.pid");
    let child = tool("nbdfuse", site.scratch())
        .arg("-P")
        .arg(&pidfile)
        .arg(&mountpoint)
        .arg(node.uri("fuse"))
        .spawn()
        .expect("run nbdfuse");
    let mut mount = FuseMount { mountpoint: mountpoint.clone(), child };
    let started = Instant::now();
    while !pidfile.exists() {
        if let Some(status) = mount.child.try_wait().expect("wait") {
            panic!("nbdfuse exited with {status} before mounting (is /dev/fuse available?)");
        }
        assert!(started.elapsed() < Duration::from_secs(20), "nbdfuse did not mount in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let file = mountpoint.join("nbd");
    assert_eq!(std::fs::metadata(&file).expect("stat").len(), 8 * MIB);
    let data = Rng::new(9).bytes(3 * MIB as usize + 123);
    {
        use std::io::{Seek, SeekFrom};
        let mut handle = std::fs::OpenOptions::new().write(true).open(&file).expect("open");
        handle.seek(SeekFrom::Start(777)).expect("seek");
        handle.write_all(&data).expect("write");
        handle.sync_all().expect("fsync");
    }
    let read = std::fs::read(&file).expect("read");
    assert_same(&read[777..777 + data.len()], &data, "file read back");
    assert!(mount.unmount(), "unmounting {}", mountpoint.display());
    let status = mount.child.wait().expect("wait for nbdfuse");
    assert!(status.success(), "nbdfuse exited with {status}");

    // The volume holds the bytes, seen from another client.
    let mut image = vec![0u8; 8 * MIB as usize];
    image[777..777 + data.len()].copy_from_slice(&data);
    let path = site.scratch().join("expected.raw");
    std::fs::write(&path, &image).expect("write image");
    let path = path.to_str().expect("utf-8 path");
    run(tool("qemu-img", site.scratch()).args(["compare", "-f", "raw", "-F", "raw", path, &node.uri("fuse")]));
    drop(mount);
    node.stop();
    fsck_clean(&site.data_dir());
}

/// A second node on another directory but the running node's ports is refused before it
/// sets anything up; so is every bad setting.
#[test]
fn a_refused_start_sets_nothing_up() {
    let site = Site::new();
    let node = site.start();
    let other = site.scratch().join("other-data");
    let config = site.scratch().join("same-ports.toml");
    std::fs::write(
        &config,
        format!("[listen]\nnative = \"{}\"\nnbd = \"{}\"\nmetrics = \"\"\n", node.native, node.nbd),
    )
    .expect("write config");
    let (config, other) = (config.to_str().expect("utf-8"), other.to_str().expect("utf-8"));
    fails(&["serve", "--config", config, "--data-dir", other], "is another node running?");
    assert!(!Path::new(other).exists(), "a directory was set up for a node that could not listen");
    let bad = site.scratch().join("bad.toml");
    for (text, needle) in [
        ("[listen]\nnbd = \"nonsense\"\n", "[listen] nbd = \"nonsense\" is not an address"),
        ("[cache]\nwrite_back = \"16TiB\"\n", "more than half of this machine's"),
        ("[drive]\nphysical = \"8TiB\"\nlogical = \"4096TiB\"\n", "7 bytes per 4 KiB block"),
    ] {
        std::fs::write(&bad, text).expect("write config");
        fails(&["serve", "--config", bad.to_str().expect("utf-8"), "--data-dir", other], needle);
        assert!(!Path::new(other).exists(), "{text}: the data directory was created");
    }
    node.stop();
}

/// With `overcommit = true` under [drive], a volume beyond the drive's logical space is
/// created, and both the command and the node's log warn about it.
#[test]
fn overcommit_is_an_explicit_choice_with_a_warning() {
    let site = Site::new();
    let node = site.start_with("overcommit = true");
    let out = succeeds(&node.with_addr(&["volume", "create", "big", "--size", "600MiB"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warning") && stderr.contains("600.00 MiB of the 512.00 MiB"), "{stderr}");
    assert!(node.log().contains("overcommits the drive's logical space"), "{}", node.log());
    node.stop();
}

/// Through a real NBD client: a connection to a volume that is deleted, then
/// replaced by a new volume, is closed by the node (a request already on its way gets
/// ESHUTDOWN, any later one finds the connection gone), and never sees or changes the new
/// volume's data.
#[test]
fn a_connection_to_a_deleted_volume_never_reaches_its_successor() {
    let site = Site::new();
    let mut node = site.start();
    node.create_volume("victim", "8MiB", "8KiB", "normal");
    let tundra_bin = env!("CARGO_BIN_EXE_tundra");
    let script = format!(
        r#"
import errno, subprocess
def tundra(*args):
    subprocess.run([{tundra_bin:?}, *args, "--addr", {addr:?}], check=True, capture_output=True)
def expect_shutdown(call, *args):
    try:
        call(*args)
    except nbd.Error as e:
        closed = e.errno == "ENOTCONN" or "CLOSED" in e.string
        assert e.errno == "ESHUTDOWN" or closed, (call.__name__, e.errno, e.string)
        return
    raise AssertionError("%s on a deleted volume succeeded" % call.__name__)
h.pwrite(b"v" * 8192, 0)
h.flush()
tundra("volume", "delete", "victim")
expect_shutdown(h.pwrite, b"w" * 8192, 8192)
expect_shutdown(h.flush)
tundra("volume", "create", "secret", "--size", "8MiB")
s = nbd.NBD()
s.connect_uri({secret:?})
s.pwrite(b"S" * 16384, 0)
s.flush()
expect_shutdown(h.pread, 8192, 0)
expect_shutdown(h.pwrite, b"x" * 8192, 0)
expect_shutdown(h.zero, 8192, 8192)
expect_shutdown(h.flush)
assert s.pread(16384, 0) == b"S" * 16384, "the old connection changed the new volume"
print("ok")
"#,
        addr = node.native.to_string(),
        secret = node.uri("secret"),
    );
    let out = run(tool("nbdsh", site.scratch()).args(["-u", &node.uri("victim"), "-c", &script]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    let list = volume_list(&node);
    assert_eq!(list[0]["name"], "secret");
    assert!(list[0]["id"].as_u64() > Some(1), "the deleted volume's id was given again: {list}");
    node.assert_alive();
    node.stop();
    fsck_clean(&site.data_dir());
}

/// Whether something is mounted on `path` (read from the mount table: a dead FUSE mount too).
fn is_mounted(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mounts").expect("read the mount table");
    let target = path.to_str().expect("utf-8 path");
    table.lines().any(|line| line.split(' ').nth(1) == Some(target))
}

/// `[[mount]]`: the node creates the volume and shows it as a file; writes through the file and
/// an fsync are durable, stats count them, SIGTERM unmounts before the node stops cleanly, and
/// after a restart the file shows the same bytes. Needs root and /dev/fuse, as mounting does.
#[test]
fn a_configured_mount_serves_the_volume_as_a_file_and_is_unmounted_on_stop() {
    let site = Site::new();
    let file = site.scratch().join("vol.file");
    let mount = format!(
        "[[mount]]\nvolume = \"filevol\"\nfile = {:?}\nsize = \"16MiB\"\npage_size = \"8KiB\"\n",
        file.to_str().expect("utf-8 path")
    );
    let mut rng = Rng::new(21);
    let data = rng.bytes(3 << 20);
    for round in 0..2 {
        let node = site.start_with(&mount);
        let started = Instant::now();
        // The mount table shows the file as soon as the kernel has it; the node says so once
        // the mount's transport is set up, a moment later.
        while !is_mounted(&file) || !node.log().contains("mounted on") {
            assert!(started.elapsed() < Duration::from_secs(20), "not mounted:\n{}", node.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&file).expect("open the volume's file");
        assert_eq!(f.metadata().expect("stat").len(), 16 << 20);
        use std::os::unix::fs::FileExt;
        if round == 0 {
            f.write_all_at(&data, 12345).expect("write through the file");
            f.sync_all().expect("fsync through the file");
            let stats = stats(&node);
            let m = &stats["mounts"][0];
            assert_eq!(m["volume"], "filevol", "{stats}");
            assert!(m["bytes_written"].as_u64() >= Some(3 << 20) && m["fsyncs"].as_u64() >= Some(1), "{stats}");
        }
        let mut back = vec![0u8; data.len()];
        f.read_exact_at(&mut back, 12345).expect("read through the file");
        assert_same(&back, &data, "the file's bytes");
        drop(f);
        let log = node.stop();
        assert!(log.contains("unmounted") && log.contains("stopped cleanly"), "{log}");
        assert!(!is_mounted(&file), "the node left its mount behind");
        fsck_clean(&site.data_dir());
    }
}

#[test]
fn tundra_mount_refuses_bad_arguments_before_starting() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8 path");
    fails(&["mount", "v", "/tmp/never-mounted", "--data-dir", data, "--size", "lots"], "size");
    fails(&["mount", "v", "/tmp/never-mounted", "--data-dir", data, "--size", "1MiB", "--page-size", "4KiB"], "8KiB");
    fails(&["mount", "v", "/tmp/never-mounted", "--data-dir", data, "--size", "1MiB", "--mode", "fast"], "mode");
    assert!(!dir.path().join("data").exists(), "nothing set up");
}
