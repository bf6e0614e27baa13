//! A volume mounted as a file on a cluster node (`[[mount]]`, `tundra mount`). A replicated
//! volume's file reads and writes its bytes through its chunks' leaders, as NBD on this node
//! does (io.rs): each write is answered once a majority of the chunk's replicas hold it and the
//! leader applied it, so `fsync` has nothing left to do, and when a leader dies the file's
//! requests stall until another is elected rather than fail. The node's own volumes are mounted
//! on its store as on a node alone. Every node keeps a replicated volume in its store (so that
//! it can serve the volume's I/O), and a write there would reach this replica alone and none of
//! the chunk's Raft groups: tundra-node's mount refuses it, and this module never takes that
//! path for one.

use std::sync::Arc;

use tundra_node::VolumeRef;
use tundra_node::config::MountConfig;
use tundra_node::file_export::{Errno, ExportBackend};
use tundra_node::mount::Mount;

use crate::cluster::ClusterNode;
use crate::messages::Refusal;

/// A test-only hook: `TUNDRA_TEST_MOUNT_ON_STORE=1` leaves the node's check of replicated
/// volumes unset (`ClusterNode::start`), so a replicated volume is mounted on the node's store
/// as before replicated volumes had a mount of their own (the twin of `cluster_mount`'s check
/// that another node reads what the mount wrote). Unset in production.
pub(crate) fn on_store_for_test() -> bool {
    std::env::var("TUNDRA_TEST_MOUNT_ON_STORE").is_ok_and(|v| v == "1")
}

impl ClusterNode {
    /// Mounts a `[[mount]]` entry on this cluster node: a replicated volume through the
    /// cluster, any other as a node alone mounts it (created first as a node-local volume
    /// when it is missing and the entry gives a size).
    pub fn mount(self: &Arc<Self>, entry: &MountConfig) -> tundra_node::Result<Mount> {
        // The node's own answer (set in `ClusterNode::start`, not under the twin's hook).
        let replicated =
            self.node.volume_by_name(&entry.volume).ok().filter(|v| self.node.is_cluster_volume(v.volume.id));
        match replicated {
            Some(volume) => {
                if entry.creation()?.is_some_and(|(size, ..)| size != volume.volume.size_bytes) {
                    eprintln!(
                        "tundra: [[mount]] of {:?}: the replicated volume exists, so its size, page size and mode \
                         are its own, not the entry's",
                        entry.volume
                    );
                }
                let backend = Arc::new(ReplicatedFile { cluster: self.clone(), volume });
                Mount::start_backend(self.node.clone(), &entry.volume, &entry.file, entry.transport(), backend)
            }
            None => Mount::configured(self.node.clone(), entry),
        }
    }
}

/// A replicated volume's bytes as a mounted file's.
struct ReplicatedFile {
    cluster: Arc<ClusterNode>,
    volume: VolumeRef,
}

impl ReplicatedFile {
    /// Says a failed request on the node's log (the kernel sees only its errno) and gives the
    /// errno: `EINVAL` for a request that is wrong, `EIO` for one the cluster could not answer
    /// within its retries (no quorum for that long, or the volume deleted).
    fn failed(&self, what: &str, offset: u64, len: u64, refusal: Refusal) -> Errno {
        eprintln!(
            "tundra: FUSE {what} of replicated volume {:?} at {offset}+{len} failed: {refusal}",
            self.volume.volume.name
        );
        match refusal {
            Refusal::Invalid(_) => Errno::EINVAL,
            Refusal::NotLeader { .. } | Refusal::Unavailable(_) => Errno::EIO,
        }
    }
}

impl ExportBackend for ReplicatedFile {
    /// The size this node serves (the catalog's), fixed while the file is mounted.
    fn size(&self) -> u64 {
        self.cluster.served_bytes(self.volume.volume.id.0).unwrap_or(self.volume.volume.size_bytes)
    }

    fn block_size(&self) -> u32 {
        self.volume.volume.page_size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let len = buf.len() as u64;
        self.cluster.read_bytes(&self.volume, offset, buf).map_err(|r| self.failed("read", offset, len, r))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let len = data.len() as u64;
        self.cluster.write_bytes(&self.volume, offset, data).map_err(|r| self.failed("write", offset, len, r))
    }

    fn zero(&self, offset: u64, len: u64) -> Result<(), Errno> {
        self.cluster.zero_bytes(&self.volume, offset, len).map_err(|r| self.failed("zero", offset, len, r))
    }

    /// Every write was durable on a majority of its chunk's replicas when it was answered.
    fn fsync(&self) -> Result<(), Errno> {
        Ok(())
    }
}
