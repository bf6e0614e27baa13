//! A volume's identity never repeats: a client still holding a deleted volume (an NBD
//! connection, a native client's id) gets a clear error for every request and can never read or
//! change a volume created after it, even one with the same name, across restarts too.

use std::sync::{Arc, Mutex};

use tundra_nbd::{ExportErrorKind, Exports};
use tundra_node::nbd::NodeExports;
use tundra_node::{Config, Error, Node, WriteMode};
use tundra_store::volume::VolumeMode;

fn config(dir: &std::path::Path) -> Config {
    let mut config = Config::parse(
        r#"
        [drive]
        physical = "64MiB"
        logical = "128MiB"
        [fast]
        volumes = "32MiB"
        "#,
    )
    .unwrap();
    config.data_dir = dir.join("data");
    config
}

fn open(config: &Config) -> Arc<Node> {
    Arc::new(Node::open(config, &mut |_| {}).unwrap())
}

/// The reproduction: `victim` is held by a client, deleted, and `secret` created in its place.
/// Through the stale reference, reads, writes, zeroes and flushes of the bytes path and of the
/// page path all fail with the closed kind, and `secret` never changes.
#[test]
fn a_deleted_volume_is_never_reached_through_a_stale_reference() {
    for mode in [VolumeMode::Normal, VolumeMode::None] {
        let dir = tempfile::tempdir().unwrap();
        let node = open(&config(dir.path()));
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
    let node = open(&config(dir.path()));
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

/// Ids survive deletion, checkpoints and restarts: the highest id deleted and checkpointed
/// away is still never given again, on either store.
#[test]
fn ids_are_never_reused_across_checkpoints_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut given = Vec::new();
    for round in 0..3 {
        let node = open(&config);
        let mode = if round % 2 == 0 { VolumeMode::Normal } else { VolumeMode::None };
        let volume = node.volume_create("v", 4 << 20, 8192, mode).unwrap();
        assert!(given.iter().all(|&id| id < volume.volume.id.0), "id {} given again: {given:?}", volume.volume.id.0);
        given.push(volume.volume.id.0);
        node.volume_delete("v").unwrap();
        // A clean close checkpoints both stores: the deleted volume is in no checkpoint.
        node.close().unwrap();
    }
}
