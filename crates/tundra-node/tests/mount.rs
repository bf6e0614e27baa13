//! A volume mounted as a file through FUSE in the node's process (mount.rs): written and read
//! through the file directly, and through a loop device with ext4 on it as a database host uses
//! it; the data is there after an unmount and a remount, and after the node itself is closed
//! and opened again. Each runs over both transports: `/dev/fuse`, and FUSE over io_uring where
//! the kernel offers it (`/sys/module/fuse/parameters/enable_uring`, which scripts/test turns
//! on where it can); where it does not, the io_uring runs check that the mount falls back.
//!
//! Needs root (mount, losetup) and /dev/fuse; `e2fsprogs` and `util-linux` provide mkfs.ext4
//! and losetup (scripts/install-deps).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use tundra_env::Rng;
use tundra_node::file_export::Transport;
use tundra_node::mount::Mount;
use tundra_node::{Config, Node};
use tundra_store::volume::VolumeMode;

const MIB: u64 = 1 << 20;

fn require_root() {
    assert!(rustix_is_root(), "the mount tests need root (FUSE mounts, losetup)");
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: the kernel's FUSE module must be loaded");
}

fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Whether the kernel offers FUSE over io_uring to servers that ask.
fn kernel_offers_uring() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y")
}

/// Mounts with `transport` and checks the transport the mount got.
fn mounted(node: &Arc<Node>, volume: &str, file: &Path, transport: Transport) -> Mount {
    let mount = Mount::start_with(node.clone(), volume, file, transport).unwrap();
    let expected = if transport == Transport::Auto && kernel_offers_uring() { "io_uring" } else { "/dev/fuse" };
    assert_eq!(mount.stats().transport, expected, "the transport of a mount asked for {transport:?}");
    mount
}

fn config(dir: &Path) -> Config {
    let mut config = Config::parse(
        r#"
        [drive]
        physical = "256MiB"
        logical = "512MiB"
        [fast]
        volumes = "64MiB"
        "#,
    )
    .unwrap();
    config.data_dir = dir.join("data");
    config
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Reads, writes, fsync and fallocate through the file itself: unaligned pieces, whole pages,
/// zeroed ranges, a write past the end refused; all of it there after unmount and remount.
#[test]
fn the_file_reads_and_writes_and_keeps_its_data_across_remounts() {
    file_round_trip(Transport::DevFuse);
}

#[test]
fn the_file_reads_and_writes_and_keeps_its_data_across_remounts_over_io_uring() {
    file_round_trip(Transport::Auto);
}

fn file_round_trip(transport: Transport) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::open(&config(dir.path()), &mut |_| {}).unwrap());
    node.volume_create("vol", 16 * MIB, 8192, VolumeMode::Normal).unwrap();
    let file = dir.path().join("vol.file");
    let mount = mounted(&node, "vol", &file, transport);
    let mut rng = Rng::new(3);
    let mut model = vec![0u8; 16 * MIB as usize];
    {
        let f = OpenOptions::new().read(true).write(true).open(&file).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 16 * MIB, "the file's size is the volume's");
        for _ in 0..200 {
            let offset = rng.below(16 * MIB - 70_000);
            let len = 1 + rng.below(65_536) as usize;
            let data: Vec<u8> = (0..len).map(|i| (offset as usize + i) as u8 ^ 0x5a).collect();
            f.write_all_at(&data, offset).unwrap();
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
        }
        f.sync_all().unwrap();
        // Punch a hole (whole pages and pieces) as a loop device passes on a discard.
        let (hole_at, hole_len) = (3 * 8192 + 100, 5 * 8192);
        rustix::fs::fallocate(
            &f,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            hole_at,
            hole_len,
        )
        .unwrap();
        model[hole_at as usize..(hole_at + hole_len) as usize].fill(0);
        // A write reaching past the end writes what fits; one past it is refused.
        assert_eq!(f.write_at(&[1u8; 10], 16 * MIB - 5).unwrap(), 5, "the file cannot grow");
        model[(16 * MIB - 5) as usize..].fill(1);
        assert!(f.write_at(&[1u8; 10], 16 * MIB).is_err() || f.metadata().unwrap().len() == 16 * MIB);
        f.sync_all().unwrap();
        let mut back = vec![0u8; model.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == model, "read back through the file");
    }
    let stats = node.stats();
    assert_eq!(stats.mounts.len(), 1);
    assert!(stats.mounts[0].writes >= 200 && stats.mounts[0].fsyncs >= 2, "{:?}", stats.mounts);
    assert!(stats.mounts[0].zeroed_bytes >= 5 * 8192);
    let answered = stats.mounts[0].io_uring_requests;
    if stats.mounts[0].transport == "io_uring" {
        assert!(answered >= stats.mounts[0].writes + stats.mounts[0].fsyncs, "the rings answered: {:?}", stats.mounts);
    } else {
        assert_eq!(answered, 0, "no ring, no requests through one");
    }
    mount.unmount().unwrap();
    assert!(node.stats().mounts.is_empty(), "an unmounted file leaves the statistics");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "the file underneath is the empty one again");
    // The node closed and opened again: the data is on its devices.
    drop(node);
    let node = Arc::new(Node::open(&config(dir.path()), &mut |_| {}).unwrap());
    let mount = mounted(&node, "vol", &file, transport);
    let mut back = vec![0u8; model.len()];
    std::fs::File::open(&file).unwrap().read_exact_at(&mut back, 0).unwrap();
    assert!(back == model, "read back after a remount on a reopened node");
    mount.unmount().unwrap();
    assert!(node.check().unwrap().iter().all(|(_, r)| r.damaged.is_empty()));
}

/// The path a database host uses: a loop device over the file, ext4 on it, files written and
/// synced, everything taken down, then mounted again and the files read back.
#[test]
fn ext4_on_a_loop_device_over_the_file_survives_unmount_and_remount() {
    ext4_round_trip(Transport::DevFuse);
}

#[test]
fn ext4_on_a_loop_device_over_the_file_survives_unmount_and_remount_over_io_uring() {
    ext4_round_trip(Transport::Auto);
}

fn ext4_round_trip(transport: Transport) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::open(&config(dir.path()), &mut |_| {}).unwrap());
    node.volume_create("fsvol", 64 * MIB, 8192, VolumeMode::Normal).unwrap();
    let file = dir.path().join("fsvol.file");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut rng = Rng::new(11);
    let contents: Vec<Vec<u8>> = (0..6).map(|i| rng.bytes(100_000 + i * 77_777)).collect();
    for round in 0..2 {
        let mount = mounted(&node, "fsvol", &file, transport);
        let loop_dev = run(Command::new("losetup").args(["-f", "--show", "--direct-io=on"]).arg(&file));
        if round == 0 {
            run(Command::new("mkfs.ext4").args(["-q", "-F", &loop_dev]));
        }
        run(Command::new("mount").arg(&loop_dev).arg(&mnt));
        for (i, data) in contents.iter().enumerate() {
            let path = mnt.join(format!("f{i}"));
            if round == 0 {
                std::fs::write(&path, data).unwrap();
            } else {
                assert!(std::fs::read(&path).unwrap() == *data, "file {i} after remount");
            }
        }
        run(&mut Command::new("sync"));
        let served = mount.stats();
        if served.transport == "io_uring" {
            assert!(served.io_uring_requests >= served.writes && served.writes > 0, "the rings answered: {served:?}");
        }
        run(Command::new("umount").arg(&mnt));
        run(Command::new("losetup").args(["-d", &loop_dev]));
        mount.unmount().unwrap();
    }
    let stats = node.stats();
    assert!(stats.volumes.iter().any(|v| v.name == "fsvol" && v.space.pages > 0));
    drop(node);
    let fsck = Node::open(&config(dir.path()), &mut |_| {}).unwrap().check().unwrap();
    assert!(fsck.iter().all(|(_, r)| r.damaged.is_empty()));
}

/// A `[[mount]]` entry with a size creates its volume; one without refers to a volume that
/// must exist; bad entries are refused when the configuration is read.
#[test]
fn configured_mounts_create_their_volume_and_bad_entries_are_refused() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    let file = dir.path().join("made.file");
    let text = format!(
        "[[mount]]\nvolume = \"made\"\nfile = \"{}\"\nsize = \"8MiB\"\npage_size = \"16KiB\"\nmode = \"none\"\n",
        file.display()
    );
    config.mount = Config::parse(&text).unwrap().mount;
    let node = Arc::new(Node::open(&config, &mut |_| {}).unwrap());
    let mount = Mount::configured(node.clone(), &config.mount[0]).unwrap();
    let volume = node.volume_by_name("made").unwrap();
    assert_eq!((volume.volume.size_bytes, volume.volume.page_size), (8 * MIB, 16384));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 8 * MIB);
    mount.unmount().unwrap();
    let missing = Config::parse(&format!("[[mount]]\nvolume = \"absent\"\nfile = \"{}\"\n", file.display())).unwrap();
    assert!(Mount::configured(node.clone(), &missing.mount[0]).is_err(), "no size: the volume must exist");
    for bad in [
        "[[mount]]\nvolume = \"v\"\nfile = \"/tmp/x\"\nsize = \"lots\"\n",
        "[[mount]]\nvolume = \"v\"\nfile = \"/tmp/x\"\nsize = \"1MiB\"\npage_size = \"4KiB\"\n",
        "[[mount]]\nvolume = \"v\"\nfile = \"/tmp/x\"\nsize = \"1MiB\"\nmode = \"fast\"\n",
        "[[mount]]\nvolume = \"v\"\nfile = \"/tmp/x\"\n[[mount]]\nvolume = \"w\"\nfile = \"/tmp/x\"\n",
        "[[mount]]\nvolume = \"v\"\n",
    ] {
        assert!(Config::parse(bad).is_err(), "accepted: {bad}");
    }
    let on_a_directory = Mount::start(node, "made", dir.path());
    assert!(on_a_directory.is_err(), "a volume mounts on a regular file only");
}

/// A volume a cluster serves is never mounted on the store directly: its writes would reach
/// this replica alone (tundra-member mounts it through the chunks' leaders). Refused before
/// anything is mounted, so this needs no root; the node's own volumes still mount.
#[test]
fn a_volume_the_cluster_serves_is_refused_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::open(&config(dir.path()), &mut |_| {}).unwrap());
    let replicated = node.volume_create("replicated", 8 * MIB, 8192, VolumeMode::Normal).unwrap().volume.id;
    node.volume_create("own", 8 * MIB, 8192, VolumeMode::Normal).unwrap();
    node.set_cluster_volumes(Box::new(move |id| id == replicated));
    let file = dir.path().join("replicated.file");
    let refused =
        Mount::start(node.clone(), "replicated", &file).err().expect("a replicated volume mounted on the store");
    assert!(refused.to_string().contains("is replicated"), "{refused}");
    assert!(!std::fs::exists(&file).unwrap(), "nothing was made for a refused mount");
    assert!(!node.is_cluster_volume(node.volume_by_name("own").unwrap().volume.id));
}
