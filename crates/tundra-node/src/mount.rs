//! A volume as one file, through FUSE in the node's own process: the shortest path from a kernel
//! filesystem to the store on a machine whose kernel has no NBD client. A loop device over the
//! file makes it a block device for ext4; the kernel's requests reach [`Node::read_bytes`],
//! [`Node::write_bytes`], [`Node::zero_bytes`] and [`Node::flush`] on the node's threads with
//! no other process and no socket in between (NBD, through `nbdfuse`, crosses FUSE, a second
//! process and TCP). file_export.rs serves the file; this module binds it to a volume.
//!
//! What each request means there: `fsync` is a flush of the volume, whole pages in a zeroed
//! range are trimmed. The volume must not be written through NBD while it is mounted: the kernel
//! may cache what it read of the file.
//!
//! A replicated volume is never mounted on the store directly (its writes would reach this
//! replica alone, none of its chunks' Raft groups): a cluster node mounts it with a backend of
//! its own ([`Mount::start_backend`]; tundra-member's mount.rs), and [`Mount::start_with`]
//! refuses it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::file_export::{Errno, ExportBackend, ExportCounters, FileExport, Transport};
use crate::{Error, Node, Result, VolumeRef};

/// Threads serving one mount's requests through `/dev/fuse`.
pub const MOUNT_THREADS: usize = crate::file_export::EXPORT_THREADS;
/// Threads serving each CPU's queue of one mount's requests through io_uring.
pub const MOUNT_URING_THREADS_PER_QUEUE: usize = crate::file_export::URING_THREADS_PER_QUEUE;

/// What one mount served, for `tundra stats`.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct MountStats {
    pub volume: String,
    pub file: String,
    /// How requests arrive: "io_uring" (FUSE over io_uring) or "/dev/fuse".
    pub transport: String,
    /// Requests answered through io_uring.
    pub io_uring_requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub fsyncs: u64,
    pub zeroed_bytes: u64,
    pub errors: u64,
}

/// What the node keeps of a mount for its statistics (the mount itself holds the node).
pub(crate) struct Registered {
    volume: String,
    counters: Arc<ExportCounters>,
}

fn stats_of(counters: &ExportCounters, volume: &str, file: &Path) -> MountStats {
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    MountStats {
        volume: volume.to_string(),
        file: file.display().to_string(),
        transport: transport_name(counters).to_string(),
        io_uring_requests: get(&counters.io_uring_requests),
        reads: get(&counters.reads),
        writes: get(&counters.writes),
        bytes_read: get(&counters.bytes_read),
        bytes_written: get(&counters.bytes_written),
        fsyncs: get(&counters.fsyncs),
        zeroed_bytes: get(&counters.zeroed_bytes),
        errors: get(&counters.errors),
    }
}

/// "io_uring" or "/dev/fuse": how an export's requests arrive.
pub fn transport_name(counters: &ExportCounters) -> &'static str {
    if counters.io_uring.load(Ordering::Relaxed) { "io_uring" } else { "/dev/fuse" }
}

impl Node {
    /// Makes `check` the answer to whether a volume is one a cluster serves (a cluster node
    /// sets it when it starts): such a volume is never mounted on this node's store directly,
    /// whose writes would reach this replica alone and none of its chunks' Raft groups.
    pub fn set_cluster_volumes(&self, check: crate::node::ClusterVolumes) {
        *self.cluster_volumes.write() = Some(check);
    }

    /// Whether a cluster serves the volume `id` (never on a node alone).
    pub fn is_cluster_volume(&self, id: tundra_store::ids::VolumeId) -> bool {
        self.cluster_volumes.read().as_ref().is_some_and(|check| check(id))
    }

    /// What each mounted volume served, in file order.
    pub fn mount_stats(&self) -> Vec<MountStats> {
        self.mounts.lock().iter().map(|(file, r)| stats_of(&r.counters, &r.volume, file)).collect()
    }
}

/// A volume mounted as a file; unmounted by [`Mount::unmount`] (or when dropped).
pub struct Mount {
    volume: String,
    node: Arc<Node>,
    export: Option<FileExport>,
}

/// The volume as the exported file's bytes.
struct VolumeFile {
    node: Arc<Node>,
    volume: VolumeRef,
}

impl Mount {
    /// Mounts `volume` of `node` on `file`, which must exist and be a regular file (it is
    /// created empty if missing). A FUSE mount left there by a node that was killed is
    /// detached first.
    pub fn start(node: Arc<Node>, volume: &str, file: &Path) -> Result<Mount> {
        Mount::start_with(node, volume, file, Transport::Auto)
    }

    /// [`Mount::start`] with a choice of transport.
    pub fn start_with(node: Arc<Node>, volume: &str, file: &Path, transport: Transport) -> Result<Mount> {
        let volume_ref = node.volume_by_name(volume)?;
        if node.is_cluster_volume(volume_ref.volume.id) {
            return Err(Error::Invalid(format!(
                "volume {volume:?} is replicated: its writes go through its chunks' Raft groups, not this \
                 node's store alone, so it is mounted through the cluster (a [[mount]] in the config of one \
                 of its nodes, or `tundra mount` with that config)"
            )));
        }
        let backend = Arc::new(VolumeFile { node: node.clone(), volume: volume_ref });
        Mount::start_backend(node, volume, file, transport, backend)
    }

    /// Mounts `backend` as the file of `volume` on `file`, counted in `node`'s statistics as
    /// that volume's mount: how a cluster mounts a replicated volume, whose bytes it reads and
    /// writes through the chunks' leaders.
    pub fn start_backend<B: ExportBackend>(
        node: Arc<Node>,
        volume: &str,
        file: &Path,
        transport: Transport,
        backend: Arc<B>,
    ) -> Result<Mount> {
        let export =
            FileExport::start_with(backend, file, &format!("tundra:{volume}"), transport).map_err(|e| {
                match e.kind() {
                    std::io::ErrorKind::InvalidInput => Error::Invalid(e.to_string()),
                    _ => Error::Io(e.to_string()),
                }
            })?;
        let registered = Registered { volume: volume.to_string(), counters: export.counters().clone() };
        node.mounts.lock().insert(file.to_path_buf(), registered);
        Ok(Mount { volume: volume.to_string(), node, export: Some(export) })
    }

    /// A `[[mount]]` of the configuration: its volume created first if it is missing and the
    /// entry gives a size, then mounted.
    pub fn configured(node: Arc<Node>, config: &crate::config::MountConfig) -> Result<Mount> {
        if node.volume_by_name(&config.volume).is_err()
            && let Some((size, page_size, mode)) = config.creation()?
        {
            node.volume_create(&config.volume, size, page_size, mode)?;
        }
        Mount::start_with(node, &config.volume, &config.file, config.transport())
    }

    pub fn file(&self) -> &Path {
        self.export.as_ref().map_or(Path::new(""), FileExport::file)
    }

    pub fn volume(&self) -> &str {
        &self.volume
    }

    pub fn stats(&self) -> MountStats {
        match &self.export {
            Some(export) => stats_of(export.counters(), &self.volume, export.file()),
            None => MountStats { volume: self.volume.clone(), ..MountStats::default() },
        }
    }

    /// Unmounts the file. While something holds it open (a loop device that is still
    /// attached) the unmount is retried for a while; then the mount is detached lazily, which
    /// leaves it served until the last user lets go, and this says so as an error.
    pub fn unmount(mut self) -> Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<()> {
        let Some(export) = self.export.take() else { return Ok(()) };
        self.node.mounts.lock().remove(export.file());
        export.unmount().map_err(|e| Error::Io(e.to_string()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

fn errno(e: &Error) -> Errno {
    match e {
        Error::Invalid(_) => Errno::EINVAL,
        Error::NotFound(_) => Errno::ENOENT,
        Error::Exists(_) => Errno::EEXIST,
        Error::NoSpace(_) => Errno::ENOSPC,
        Error::Corrupted(_) | Error::Io(_) => Errno::EIO,
        Error::Closed(_) => Errno::ESHUTDOWN,
        Error::Busy(_) => Errno::EAGAIN,
    }
}

impl VolumeFile {
    /// Reports an error the operator must see on the node's log.
    fn failed(&self, what: &str, offset: u64, len: u64, e: &Error) -> Errno {
        if matches!(e, Error::Corrupted(_) | Error::Io(_)) {
            eprintln!("tundra: FUSE {what} of volume {:?} at {offset}+{len} failed: {e}", self.volume.volume.name);
        }
        errno(e)
    }
}

impl ExportBackend for VolumeFile {
    fn size(&self) -> u64 {
        self.volume.volume.size_bytes
    }

    fn block_size(&self) -> u32 {
        self.volume.volume.page_size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), Errno> {
        self.node.read_bytes(&self.volume, offset, buf).map_err(|e| self.failed("read", offset, buf.len() as u64, &e))
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), Errno> {
        self.node
            .write_bytes(&self.volume, offset, data)
            .map_err(|e| self.failed("write", offset, data.len() as u64, &e))
    }

    fn zero(&self, offset: u64, len: u64) -> std::result::Result<(), Errno> {
        self.node.zero_bytes(&self.volume, offset, len).map_err(|e| self.failed("zero", offset, len, &e))
    }

    fn fsync(&self) -> std::result::Result<(), Errno> {
        self.node.flush(Some(&self.volume)).map_err(|e| self.failed("fsync", 0, 0, &e))
    }
}
