//! A volume's identity: ids never reused, requests bound to the volume they were made for, and
//! everything refused before the data directory is touched.

use std::sync::{Arc, Mutex};

use tundra_nbd::{ExportErrorKind, Exports};
use tundra_node::native::NodeService;
use tundra_node::nbd::NodeExports;
use tundra_node::{Config, Error, Node, WriteMode};
use tundra_proto::{Service, Status};
use tundra_store::volume::VolumeMode;

const MIB: u64 = 1 << 20;

fn config(dir: &std::path::Path, extra: &str) -> Config {
    let mut config = Config::parse(&format!(
        "[drive]\nphysical = \"64MiB\"\nlogical = \"128MiB\"\n[fast]\nvolumes = \"32MiB\"\n{extra}"
    ))
    .unwrap();
    config.data_dir = dir.join("data");
    config
}

/// Defect 1: a connection to a deleted volume must never read or change the volume created
/// after it (which used to get the same id), and must not be told its writes succeeded.
fn stale_connection_is_refused(write_back: &str) {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(
        Node::open(&config(dir.path(), &format!("[cache]\nwrite_back = \"{write_back}\"\n")), &mut |_| {}).unwrap(),
    );
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let heard = deleted.clone();
    node.on_volume_deleted(Box::new(move |name| heard.lock().unwrap().push(name.to_string())));
    let exports = NodeExports(node.clone());
    node.volume_create("victim", 4 * MIB, 8192, VolumeMode::Normal).unwrap();
    let victim_id = node.volume_by_name("victim").unwrap().volume.id.0;
    let stale = exports.lookup("victim").unwrap();
    stale.write(0, &[0x11; 8192], false).unwrap();
    stale.flush().unwrap();

    node.volume_delete("victim").unwrap();
    assert_eq!(*deleted.lock().unwrap(), ["victim"]);
    // Before any new volume exists: writes and flushes fail, they are not dropped silently.
    let write = stale.write(8192, &[0x22; 8192], false).unwrap_err();
    assert_eq!(write.kind(), ExportErrorKind::Shutdown, "{write}");
    assert!(write.message().contains("was deleted"), "{write}");
    assert_eq!(stale.flush().unwrap_err().kind(), ExportErrorKind::Shutdown);

    let secret = node.volume_create("secret", 4 * MIB, 8192, VolumeMode::Normal).unwrap();
    assert!(secret.volume.id.0 > victim_id, "volume id {victim_id} was given out again");
    let fresh = exports.lookup("secret").unwrap();
    fresh.write(0, &[0x5e; 16384], false).unwrap();

    let mut buf = vec![0u8; 8192];
    assert_eq!(stale.read(0, &mut buf).unwrap_err().kind(), ExportErrorKind::Shutdown);
    assert_eq!(buf, vec![0u8; 8192], "the stale connection saw data");
    assert_eq!(stale.write(0, &[0xba; 8192], false).unwrap_err().kind(), ExportErrorKind::Shutdown);
    assert_eq!(stale.write_zeroes(8192, 8192, true, false).unwrap_err().kind(), ExportErrorKind::Shutdown);
    assert_eq!(stale.trim(0, 8192, false).unwrap_err().kind(), ExportErrorKind::Shutdown);
    assert_eq!(stale.flush().unwrap_err().kind(), ExportErrorKind::Shutdown);
    node.flush(None).unwrap();
    let mut seen = vec![0u8; 16384];
    fresh.read(0, &mut seen).unwrap();
    assert!(seen.iter().all(|&b| b == 0x5e), "the stale connection changed the new volume");

    // A native client holding the old id gets NOT_FOUND on every volume request.
    let service = NodeService(node.clone());
    let mut out = Vec::new();
    let read = service.read_page(victim_id, 0, &mut out).unwrap_err();
    assert_eq!(read.code, Status::NotFound, "{}", read.message);
    let write = service.write_page(victim_id, 0, tundra_proto::WriteMode::Auto, &[0; 8192]).unwrap_err();
    assert_eq!(write.code, Status::NotFound);
    assert_eq!(service.flush(Some(victim_id)).unwrap_err().code, Status::NotFound);
    // A reference taken before the delete fails through the page protocol too.
    let held = node.volume_by_name("secret").unwrap();
    node.volume_delete("secret").unwrap();
    let mut page = vec![0u8; 8192];
    assert!(matches!(node.read_page(&held, 0, &mut page), Err(Error::Closed(_))));
    assert!(matches!(node.flush(Some(&held)), Err(Error::Closed(_))));
}

#[test]
fn a_connection_to_a_deleted_volume_never_reaches_the_next_one_with_write_back() {
    stale_connection_is_refused("64MiB");
}

#[test]
fn a_connection_to_a_deleted_volume_never_reaches_the_next_one_written_through() {
    stale_connection_is_refused("0");
}

#[test]
fn volume_ids_survive_checkpoint_and_reopen_without_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    {
        let node = Node::open(&config, &mut |_| {}).unwrap();
        node.volume_create("a", MIB, 8192, VolumeMode::Normal).unwrap();
        let b = node.volume_create("b", MIB, 8192, VolumeMode::None).unwrap();
        assert_eq!(b.volume.id.0, 2);
        node.volume_delete("b").unwrap();
        node.close().unwrap();
    }
    let node = Node::open(&config, &mut |_| {}).unwrap();
    // The highest id was on the fast store and was deleted; the new volume goes on the drive.
    let c = node.volume_create("c", MIB, 8192, VolumeMode::Normal).unwrap();
    assert_eq!(c.volume.id.0, 3, "id 2 was given out again after a checkpoint and reopen");
}

/// Each bad setting is refused with a message naming it, and the data directory is not created.
#[test]
fn bad_configs_are_refused_before_the_data_directory_is_created() {
    let memory = tundra_node::config::physical_memory().expect("/proc/meminfo");
    let huge_logical = format!("{}MiB", memory / MIB * 1200);
    let cases = [
        ("[listen]\nnbd = \"nonsense\"\n".to_string(), "[listen] nbd"),
        ("[listen]\nnative = \"127.0.0.1:99999\"\n".to_string(), "[listen] native"),
        ("[cache]\nwrite_back = \"16TiB\"\n".to_string(), "write_back"),
        ("[cache]\nwrite_back = \"lots\"\n".to_string(), "write_back"),
        (format!("[cache]\npages = {}\n", memory), "[cache] pages"),
        (format!("[drive]\nphysical = \"64MiB\"\nlogical = \"{huge_logical}\"\n"), "drive's map"),
        // The default logical size (twice the physical) is checked against memory too.
        ("[drive]\nphysical = \"4096TiB\"\n".to_string(), "drive's map"),
        ("[fast]\nvolumes = \"6TiB\"\n".to_string(), "is free"),
    ];
    for (text, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let result = Config::parse(&text).and_then(|mut config| {
            config.data_dir = data.clone();
            Node::open(&config, &mut |_| {}).map(|_| ())
        });
        let message = result.expect_err(&text).to_string();
        assert!(message.contains(needle), "{text}: {message}");
        assert!(!data.exists(), "{text}: {} was created", data.display());
    }
}

#[test]
fn a_held_lock_says_a_node_is_running() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let _node = Node::open(&config, &mut |_| {}).unwrap();
    let message = Node::open(&config, &mut |_| {}).err().expect("a second node opened").to_string();
    assert!(message.contains("a node is already running on"), "{message}");
    assert!(message.contains("--data-dir"), "{message}");
}

#[test]
fn names_with_control_characters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::open(&config(dir.path(), ""), &mut |_| {}).unwrap();
    for name in ["tab\there", "new\nline", "\u{1b}[2Jclear", ""] {
        let error = node.volume_create(name, MIB, 8192, VolumeMode::Normal).unwrap_err();
        assert!(matches!(error, Error::Invalid(_)), "{name:?}: {error}");
        assert!(!error.to_string().chars().any(char::is_control), "{error}");
    }
    assert!(node.volumes().is_empty());
}

#[test]
fn overcommit_is_refused_in_bytes_unless_configured() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::open(&config(dir.path(), ""), &mut |_| {}).unwrap();
    node.volume_create("half", 64 * MIB, 8192, VolumeMode::Normal).unwrap();
    let error = node.volume_create("big", 100 * MIB, 8192, VolumeMode::Normal).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, Error::NoSpace(_)), "{message}");
    assert!(message.contains("64.00 MiB free"), "{message}");
    assert!(message.contains("overcommit = true") && !message.contains("pages of 4 KiB"), "{message}");
    let error = node.volume_create("wal", 40 * MIB, 16384, VolumeMode::None).unwrap_err().to_string();
    assert!(error.contains("[fast]"), "{error}");
    assert!(node.volume_resize("half", 200 * MIB).is_err());
    drop(node);

    let mut over = config(dir.path(), "");
    over.drive.overcommit = true;
    let node = Node::open(&over, &mut |_| {}).unwrap();
    node.volume_create("big", 100 * MIB, 8192, VolumeMode::Normal).unwrap();
    // The journal's checkpoint limit is never overcommitted, and says so in bytes.
    let error = node.volume_create("huge", 1 << 40, 8192, VolumeMode::Normal).unwrap_err().to_string();
    assert!(error.contains("left") && error.contains("MiB") && !error.contains("pages of 4 KiB"), "{error}");
}

/// The protocols send the class as a status: the message says what happened once, with the
/// system's reason where there is one.
#[test]
fn errors_name_their_reason_once() {
    let full = Error::from(tundra_device::Error::drive_full("the drive has no free segment"));
    assert_eq!(full.message(), "the drive has no free segment");
    let io = std::io::Error::from_raw_os_error(5);
    let failed = Error::from(tundra_device::Error::io("reading block 7", io));
    assert!(matches!(failed, Error::Io(_)));
    assert_eq!(failed.message().matches("reading block 7").count(), 1, "{failed}");
    assert!(failed.message().contains("os error 5"), "{failed}");
    let invalid = Error::from(tundra_store::Error::invalid("no volume 3"));
    assert_eq!(invalid.to_string(), "no volume 3");
}

/// The reproduction: `victim` is held by a client, deleted, and `secret` created in its place.
/// Through the stale reference, reads, writes, zeroes and flushes of the bytes path and of the
/// page path all fail with the closed kind, and `secret` never changes.
#[test]
fn a_deleted_volume_is_never_reached_through_a_stale_reference() {
    for mode in [VolumeMode::Normal, VolumeMode::None] {
        let dir = tempfile::tempdir().unwrap();
        let node = Arc::new(Node::open(&config(dir.path(), ""), &mut |_| {}).unwrap());
        let deleted = Arc::new(Mutex::new(Vec::<String>::new()));
        let heard = deleted.clone();
        node.on_volume_deleted(Box::new(move |name| heard.lock().unwrap().push(name.to_string())));

        let victim = node.volume_create("victim", 4 << 20, 8192, mode).unwrap();
        node.write_bytes(&victim, 0, &[0x11; 8192]).unwrap();
        node.volume_delete("victim").unwrap();
        assert_eq!(*deleted.lock().unwrap(), ["victim"]);

        // Before anything replaces it: writes and flushes are refused, not dropped silently.
        let closed = |result: Result<(), Error>| matches!(result, Err(Error::Closed(m)) if m.contains("was deleted"));
        assert!(closed(node.write_bytes(&victim, 0, &[0x22; 8192])), "{mode:?}");
        assert!(closed(node.flush(Some(&victim))));

        let secret = node.volume_create("secret", 4 << 20, 8192, mode).unwrap();
        assert_ne!(secret.volume.id, victim.volume.id, "a deleted volume's id was given again");
        node.write_bytes(&secret, 0, &[0x5e; 8192]).unwrap();
        node.flush(Some(&secret)).unwrap();

        let mut buf = vec![0u8; 8192];
        assert!(closed(node.read_bytes(&victim, 0, &mut buf)));
        assert!(closed(node.write_bytes(&victim, 0, &[0x22; 8192])));
        assert!(closed(node.zero_bytes(&victim, 0, 8192)));
        assert!(closed(node.flush(Some(&victim))));
        assert!(closed(node.read_page(&victim, 0, &mut buf)));
        assert!(closed(node.write_page(&victim, 0, WriteMode::Auto { update_fraction: None }, &[0x22; 8192])));
        assert!(closed(node.trim_pages(&victim, 0, 1)));
        // A native client holding the old id finds no volume.
        assert!(matches!(node.volume(victim.volume.id), Err(Error::NotFound(_))));

        node.flush(None).unwrap();
        node.read_bytes(&secret, 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0x5e), "secret changed through the stale reference ({mode:?})");
        node.close().unwrap();
    }
}

/// The same through the NBD export a connection holds: every request gets the shutdown kind
/// (`ESHUTDOWN` on the wire), and the export of the new volume is unaffected.
#[test]
fn a_stale_nbd_export_answers_shutdown_and_never_serves_the_new_volume() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::open(&config(dir.path(), ""), &mut |_| {}).unwrap());
    let exports = NodeExports(node.clone());
    node.volume_create("victim", 4 << 20, 8192, VolumeMode::Normal).unwrap();
    let stale = exports.lookup("victim").unwrap();
    stale.write(0, &[0x11; 8192], false).unwrap();
    node.volume_delete("victim").unwrap();
    node.volume_create("secret", 4 << 20, 8192, VolumeMode::Normal).unwrap();
    let fresh = exports.lookup("secret").unwrap();
    fresh.write(0, &[0x5e; 8192], true).unwrap();

    let shutdown = |kind: ExportErrorKind| kind == ExportErrorKind::Shutdown;
    let mut buf = vec![0u8; 8192];
    assert!(shutdown(stale.read(0, &mut buf).unwrap_err().kind()));
    assert!(shutdown(stale.write(0, &[0x22; 8192], false).unwrap_err().kind()));
    assert!(shutdown(stale.flush().unwrap_err().kind()));
    assert!(shutdown(stale.trim(0, 8192, false).unwrap_err().kind()));
    assert!(shutdown(stale.write_zeroes(0, 8192, true, false).unwrap_err().kind()));
    fresh.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5e));
}
