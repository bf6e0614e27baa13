//! The server against the real clients a host will use: fio's nbd engine (libnbd), qemu-io and
//! qemu-img (QEMU's own NBD client), nbdsh (libnbd from Python) and nbdfuse. Each runs as a
//! subprocess against a server in this process, so the test can look at the export directly.
//!
//! The tools come from scripts/install-deps; a missing one fails the test, naming that script.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use tundra_env::Rng;

/// Panics unless `tool` is on the PATH.
fn require(tool: &str) {
    let found = Command::new("which").arg(tool).output().is_ok_and(|out| out.status.success());
    assert!(found, "{tool} is not installed: run scripts/install-deps (it installs the NBD clients the tests use)");
}

/// Runs a command, requires success, and returns its output.
fn run(command: &mut Command) -> Output {
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

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// nbdsh runs `python3 -m nbd`, and the first python3 on the PATH may be one (pyenv, a
/// virtualenv) without the system's libnbd bindings; /usr/bin first finds the packaged one.
fn nbdsh() -> Command {
    require("nbdsh");
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new("nbdsh");
    command.env("PATH", format!("/usr/bin:{path}"));
    command
}

fn fio(uri: &str, args: &[&str]) -> Output {
    require("fio");
    let mut command = Command::new("fio");
    command.args(["--name=nbd", "--ioengine=nbd", &format!("--uri={uri}"), "--size=32m", "--verify_fatal=1"]);
    // No verify state files left in the working directory.
    command.arg("--verify_state_save=0");
    command.args(args);
    let out = run(&mut command);
    let text = stdout(&out);
    assert!(text.contains("err= 0"), "fio reported an error:\n{text}");
    out
}

#[test]
fn fio_random_writes_verify_at_every_compressibility() {
    let fixture = Fixture::start(32 * MIB);
    let uri = fixture.uri("vol");
    for percentage in ["0", "50", "90"] {
        fio(
            &uri,
            &[
                "--rw=randwrite",
                "--bsrange=4k-64k",
                "--iodepth=16",
                "--verify=crc32c",
                &format!("--buffer_compress_percentage={percentage}"),
                &format!("--randseed={}", 100 + percentage.len()),
            ],
        );
    }
    let stats = fixture.server.stats();
    assert!(stats.bytes_written >= 3 * 32 * MIB, "{stats:?}");
    assert!(stats.bytes_read >= 3 * 32 * MIB, "fio read everything back to verify: {stats:?}");
    assert_eq!((stats.error_replies, stats.protocol_errors), (0, 0));
}

/// A MemExport whose reads come back with one byte changed: fio must notice, or its passing
/// runs prove nothing.
struct Corrupting(tundra_nbd::mem::MemExport);

impl tundra_nbd::Export for Corrupting {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn preferred_block_size(&self) -> u32 {
        self.0.preferred_block_size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), tundra_nbd::ExportError> {
        self.0.read(offset, buf)?;
        buf[buf.len() / 2] ^= 1;
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), tundra_nbd::ExportError> {
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), tundra_nbd::ExportError> {
        self.0.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), tundra_nbd::ExportError> {
        self.0.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> Result<(), tundra_nbd::ExportError> {
        self.0.write_zeroes(offset, len, may_trim, fua)
    }
}

#[test]
fn fio_verify_catches_a_corrupted_read() {
    require("fio");
    let fixture = Fixture::start(MIB);
    let corrupting = std::sync::Arc::new(Corrupting(tundra_nbd::mem::MemExport::new(8 * MIB)));
    fixture.exports.insert("corrupting", "", corrupting);
    let out = Command::new("fio")
        .args(["--name=nbd", "--ioengine=nbd", &format!("--uri={}", fixture.uri("corrupting"))])
        .args(["--size=8m", "--rw=randwrite", "--bs=64k", "--verify=crc32c", "--verify_fatal=1"])
        .arg("--verify_state_save=0")
        .output()
        .expect("run fio");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "fio passed on corrupted reads:\n{text}");
    assert!(text.contains("verify"), "{text}");
}

#[test]
fn fio_trim_mixes_verify_and_trims_read_as_zeros() {
    let fixture = Fixture::start(32 * MIB);
    let uri = fixture.uri("vol");
    for rw in ["--rw=trimwrite", "--rw=randtrimwrite"] {
        fio(&uri, &[rw, "--bsrange=4k-64k", "--iodepth=8", "--verify=crc32c", "--randseed=5"]);
    }
    assert!(fixture.vol.contents().iter().any(|&b| b != 0));
    fio(&uri, &["--rw=randtrim", "--bs=64k", "--iodepth=8"]);
    assert!(fixture.vol.contents().iter().all(|&b| b == 0), "randtrim covers the whole range");
    let stats = fixture.server.stats();
    assert!(stats.requests_trim > 0 && stats.bytes_trimmed >= 3 * 32 * MIB, "{stats:?}");
    assert_eq!(stats.error_replies, 0);
}

#[test]
fn fio_parallel_jobs_over_several_connections() {
    let fixture = Fixture::start(32 * MIB);
    fio(
        &fixture.uri("vol"),
        &[
            "--rw=randrw",
            "--numjobs=4",
            "--size=8m",
            "--offset_increment=8m",
            "--bs=16k",
            "--iodepth=8",
            "--verify=crc32c",
            "--group_reporting",
        ],
    );
    assert!(fixture.server.stats().connections_negotiated >= 4);
}

#[test]
fn qemu_io_patterns_including_unaligned_and_fua() {
    require("qemu-io");
    let fixture = Fixture::start(32 * MIB);
    let commands = [
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
        "write -P 0xcd 1000 3000",
        "read -P 0xcd 1000 3000",
        "read -P 0 4000 1",
        "read -P 0 999 1",
        "write -P 0x33 1048575 3",
        "read -P 0x33 1048575 3",
        "write -f -P 0x44 2M 4k",
        "read -P 0x44 2M 4k",
        "aio_write -P 0x55 3M 8k",
        "aio_write -P 0x66 4M 8k",
        "aio_flush",
        "read -P 0x55 3M 8k",
        "read -P 0x66 4M 8k",
        "write -P 0x77 33554431 1",
        "read -P 0x77 33554431 1",
        "flush",
    ];
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw", &fixture.uri("vol")]);
    for line in commands {
        command.args(["-c", line]);
    }
    let out = run(&mut command);
    let text = stdout(&out);
    assert!(!text.contains("failed") && !text.contains("error"), "{text}");
    assert_eq!(fixture.vol.bytes_at(1000, 3000), vec![0xcd; 3000]);
    assert_eq!(fixture.vol.bytes_at(1048575, 3), vec![0x33; 3]);
    let calls = fixture.vol.calls();
    assert!(calls.trims >= 1 && calls.write_zeroes >= 2 && calls.flushes >= 1, "{calls:?}");
    assert!(calls.fua_writes >= 1, "write -f sends FUA: {calls:?}");
    assert_eq!(fixture.server.stats().error_replies, 0);

    // A pattern that does not match must fail the run, or the checks above prove nothing.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &fixture.uri("vol"), "-c", "read -P 0x99 0 4k"])
        .output()
        .expect("run qemu-io");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Pattern verification failed"));
}

#[test]
fn qemu_io_reports_errors_past_the_end() {
    require("qemu-io");
    let fixture = Fixture::start(MIB);
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &fixture.uri("vol"), "-c", "read 1M 4k", "-c", "read -P 0 0 4k"])
        .output()
        .expect("run qemu-io");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // QEMU checks the range itself against the size it was given.
    assert!(text.contains("Input/output error") || text.contains("out of range") || text.contains("failed"), "{text}");
    assert!(text.contains("read 4096/4096 bytes at offset 0"), "{text}");
}

#[test]
fn qemu_img_info_convert_and_compare() {
    require("qemu-img");
    let fixture = Fixture::start(16 * MIB);
    let out = run(Command::new("qemu-img").args(["info", "--output=json", &fixture.uri("vol")]));
    assert!(stdout(&out).contains("\"virtual-size\": 16777216"), "{}", stdout(&out));

    // An image with data, zeros and holes, copied in and compared back.
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image.raw");
    let mut rng = Rng::new(3);
    let mut bytes = vec![0u8; 16 * MIB as usize];
    for chunk in bytes.chunks_mut(256 * 1024).step_by(3) {
        chunk[..100_000].copy_from_slice(&rng.bytes(100_000));
    }
    std::fs::write(&image, &bytes).expect("write image");
    let image = image.to_str().expect("utf-8 path");
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw", image, &fixture.uri("vol")]));
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", image, &fixture.uri("vol")]));
    assert_same(&fixture.vol.contents(), &bytes, "export after convert");
}

#[test]
fn nbdsh_sees_the_advertised_capabilities() {
    let fixture = Fixture::start(MIB);
    let script = r#"
assert h.get_size() == 1048576
assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero() and h.can_cache()
assert h.can_multi_conn()
assert not h.can_fast_zero() and not h.can_df() and not h.is_read_only()
assert h.get_block_size(nbd.SIZE_MINIMUM) == 1
assert h.get_block_size(nbd.SIZE_PREFERRED) == 16384
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 * 1024 * 1024
assert h.get_structured_replies_negotiated() == False
assert h.get_export_description() == "the test volume"
h.pwrite(b"\x42" * 10000, 12345, nbd.CMD_FLAG_FUA)
assert h.pread(10000, 12345) == b"\x42" * 10000
h.zero(5000, 12345, nbd.CMD_FLAG_NO_HOLE)
h.pwrite(b"\x17" * 4096, 30000)
h.trim(4096, 30000)
h.cache(4096, 0)
h.flush()
assert h.pread(5000, 12345) == bytes(5000)
print("ok")
"#;
    let out = run(nbdsh().args([
        "--opt-mode",
        "-c",
        "h.set_full_info(True)",
        "-u",
        &fixture.uri("vol"),
        "-c",
        "h.opt_go()",
        "-c",
        script,
    ]));
    assert!(stdout(&out).contains("ok"));
    assert!(fixture.vol.bytes_at(12345, 5000).iter().all(|&b| b == 0), "zeroed");
    assert!(fixture.vol.bytes_at(17345, 5000).iter().all(|&b| b == 0x42), "written");
    assert!(fixture.vol.bytes_at(30000, 4096).iter().all(|&b| b == 0), "trimmed");
}

/// libnbd sends many requests on one connection at once and matches replies by cookie: a slow
/// read at offset 0 is overtaken by the others, each of which returns its own data; a write and
/// a read of one range sent together still keep their order; after a flush everything is there.
#[test]
fn nbdsh_concurrent_requests_complete_out_of_order_with_the_right_data() {
    let fixture = Fixture::start(MIB);
    for i in 0..16u64 {
        tundra_nbd::Export::write(&*fixture.vol, i * 65536, &[i as u8 + 1; 65536], false).expect("fill");
    }
    fixture.vol.delay_at(0, Some(Duration::from_millis(500)));
    let script = r#"
order = []
def done(cookie):
    def callback(error):
        assert error.value == 0, error.value
        order.append(cookie)
        return 1
    return callback
bufs = {}
for i in range(16):
    bufs[i] = nbd.Buffer(65536)
    h.aio_pread(bufs[i], i * 65536, completion=done(i))
while h.aio_in_flight() > 0:
    h.poll(-1)
assert sorted(order) == list(range(16)), order
assert order[-1] == 0, "the slow read is answered last: %r" % order
for i in range(16):
    assert bufs[i].to_bytearray() == bytes([i + 1]) * 65536, i
w = nbd.Buffer.from_bytearray(bytearray(b"\x99" * 4096))
r = nbd.Buffer(4096)
h.aio_pwrite(w, 65536 * 3, completion=done(100))
h.aio_pread(r, 65536 * 3, completion=done(101))
while h.aio_in_flight() > 0:
    h.poll(-1)
assert r.to_bytearray() == b"\x99" * 4096
h.flush()
print("ok", order)
"#;
    let out = run(nbdsh().args(["-u", &fixture.uri("vol"), "-c", script]));
    assert!(stdout(&out).contains("ok"), "{}", stdout(&out));
    let stats = fixture.server.stats();
    assert!(stats.replies_out_of_order >= 15, "{stats:?}");
    assert!(fixture.vol.calls().max_concurrent >= 2, "{:?}", fixture.vol.calls());
}

#[test]
fn nbdsh_lists_exports_and_is_refused_unknown_ones() {
    let fixture = Fixture::start(MIB);
    let script = r#"
found = []
h.opt_list(lambda name, description: found.append((name, description)))
assert sorted(found) == [("small", ""), ("vol", "the test volume")], found
h.set_export_name("nope")
try:
    h.opt_info()
    raise AssertionError("an unknown export must fail")
except nbd.Error as e:
    print("unknown:", e.string)
h.set_export_name("small")
h.opt_go()
assert h.get_size() == 65536
print("ok")
"#;
    let uri = format!("nbd://{}", fixture.addr());
    let out = run(nbdsh().args(["--opt-mode", "-u", &uri, "-c", script]));
    assert!(stdout(&out).contains("ok"), "{}", stdout(&out));
}

#[test]
fn nbdsh_bad_requests_get_the_right_errno_and_the_connection_continues() {
    let fixture = Fixture::start(MIB);
    // Strict mode off, libnbd sends what it would otherwise refuse client-side.
    let script = r#"
import errno
h.set_strict_mode(0)
size = h.get_size()
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
h.pwrite(b"ok" * 256, 0)
assert h.pread(512, 0) == b"ok" * 256
print("ok")
"#;
    let out = run(nbdsh().args(["-u", &fixture.uri("vol"), "-c", script]));
    assert!(stdout(&out).contains("ok"));
    let stats = fixture.server.stats();
    assert_eq!((stats.error_replies, stats.protocol_errors), (19, 0), "{stats:?}");
    assert_eq!(fixture.vol.bytes_at(0, 512), b"ok".repeat(256));
    assert!(fixture.vol.bytes_at(512, MIB as usize - 512).iter().all(|&b| b == 0), "no refused write landed");
}

#[test]
fn nbdfuse_file_reads_and_writes_through_the_kernel() {
    require("nbdfuse");
    let fixture = Fixture::start(8 * MIB);
    let dir = tempfile::tempdir().expect("tempdir");
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).expect("mkdir");
    let pidfile = dir.path().join("pid");
    let mut child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&mountpoint)
        .arg(fixture.uri("vol"))
        .spawn()
        .expect("run nbdfuse");
    let mount = Mount { mountpoint: mountpoint.clone() };
    let started = Instant::now();
    while !pidfile.exists() {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("nbdfuse exited with {status} before mounting (is /dev/fuse available?)");
        }
        assert!(started.elapsed() < Duration::from_secs(20), "nbdfuse did not mount in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let file = mountpoint.join("nbd");
    assert_eq!(std::fs::metadata(&file).expect("stat").len(), 8 * MIB);
    let data = Rng::new(9).bytes(3 * MIB as usize + 123);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut handle = std::fs::OpenOptions::new().write(true).open(&file).expect("open");
        handle.seek(SeekFrom::Start(777)).expect("seek");
        handle.write_all(&data).expect("write");
        handle.sync_all().expect("fsync");
    }
    let read = std::fs::read(&file).expect("read");
    assert_same(&read[777..777 + data.len()], &data, "file read back");
    assert_same(&fixture.vol.bytes_at(777, data.len()), &data, "export");
    drop(mount);
    let status = child.wait().expect("wait");
    assert!(status.success(), "nbdfuse exited with {status}");
    assert!(fixture.vol.calls().flushes >= 1, "fsync reached the export");
}

/// Unmounts on drop, so that a failing test leaves no mount behind.
struct Mount {
    mountpoint: std::path::PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        for unmount in [&["fusermount3", "-u"][..], &["umount"][..]] {
            let status = Command::new(unmount[0]).args(&unmount[1..]).arg(&self.mountpoint).status();
            if status.is_ok_and(|status| status.success()) {
                return;
            }
        }
        let _ = Path::new(&self.mountpoint);
    }
}
