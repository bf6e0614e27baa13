//! A volume as one file, through FUSE in the node's own process: the shortest path from a kernel
//! filesystem to the store on a machine whose kernel has no NBD client. A loop device over the
//! file makes it a block device for ext4; the kernel's requests reach [`Node::read_bytes`],
//! [`Node::write_bytes`], [`Node::zero_bytes`] and [`Node::flush`] on the node's threads with
//! no other process and no socket in between (NBD, through `nbdfuse`, crosses FUSE, a second
//! process and TCP).
//!
//! The file is the mount point itself (FUSE may mount a regular file on a regular file): its
//! size is the volume's and it cannot grow or shrink. A loop device over it should use direct
//! I/O (`losetup --direct-io=on`) so that the host's page cache holds none of it (the database
//! and its filesystem cache what they need; the node has its own caches). Requests run on
//! several threads, each with its own clone of the FUSE channel; asynchronous direct I/O
//! (`FUSE_ASYNC_DIO`) lets a loop device keep many requests in flight. The volume must not be
//! written through NBD while it is mounted: the kernel may cache what it read of the file.
//!
//! What each request means: `read` and `write` are byte I/O (a write reaching past the end
//! writes what fits), `fsync` is a flush of the volume
//! (a write is durable once a later fsync returns, as on a disk with a volatile cache),
//! `fallocate` with `PUNCH_HOLE` or `ZERO_RANGE` zeroes the range (whole pages are trimmed:
//! this is how a loop device passes on discards and write-zeroes), and plain preallocation
//! inside the file is accepted and changes nothing.
//!
//! FUSE over io_uring (`/sys/module/fuse/parameters/enable_uring`) is not used: the `fuser`
//! crate (0.18) speaks FUSE only through reads and writes of `/dev/fuse`; it knows the
//! `FUSE_OVER_IO_URING` flag's name but has no transport for it.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BackgroundSession, Config as FuseConfig, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen,
    ReplyWrite, Request, SessionACL, WriteFlags,
};
use serde::Serialize;

use crate::{Error, Node, Result, VolumeRef};

/// Threads serving one mount's requests.
pub const MOUNT_THREADS: usize = 8;
/// The largest read or write the kernel sends in one request.
const MAX_REQUEST_BYTES: u32 = 1 << 20;
/// How long attributes stay valid in the kernel: the size never changes while mounted.
const ATTR_TTL: Duration = Duration::from_secs(3600);
/// How long unmounting waits for the file to be let go (a loop device detaches asynchronously).
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

/// `fallocate` modes (linux/falloc.h).
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// What one mount served, for `tundra stats`.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct MountStats {
    pub volume: String,
    pub file: String,
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
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    fsyncs: AtomicU64,
    zeroed_bytes: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn stats(&self, volume: &str, file: &Path) -> MountStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MountStats {
            volume: volume.to_string(),
            file: file.display().to_string(),
            reads: get(&self.reads),
            writes: get(&self.writes),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            fsyncs: get(&self.fsyncs),
            zeroed_bytes: get(&self.zeroed_bytes),
            errors: get(&self.errors),
        }
    }
}

impl Node {
    /// What each mounted volume served, in file order.
    pub fn mount_stats(&self) -> Vec<MountStats> {
        self.mounts.lock().iter().map(|(file, r)| r.counters.stats(&r.volume, file)).collect()
    }
}

/// A volume mounted as a file; unmounted by [`Mount::unmount`] (or when dropped).
pub struct Mount {
    file: PathBuf,
    volume: String,
    counters: Arc<Counters>,
    node: Arc<Node>,
    session: Option<BackgroundSession>,
}

/// The FUSE side: one regular file, inode 1, which is the volume.
struct VolumeFile {
    node: Arc<Node>,
    volume: VolumeRef,
    /// The owner and permissions of the file mounted on, which the mount keeps showing.
    uid: u32,
    gid: u32,
    perm: u16,
    counters: Arc<Counters>,
}

impl Mount {
    /// Mounts `volume` of `node` on `file`, which must exist and be a regular file (it is
    /// created empty if missing). A FUSE mount left there by a node that was killed is
    /// detached first.
    pub fn start(node: Arc<Node>, volume: &str, file: &Path) -> Result<Mount> {
        let volume_ref = node.volume_by_name(volume)?;
        clear_stale_mount(file)?;
        let metadata = match std::fs::metadata(file) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::File::create(file).map_err(|e| io_error(file, "creating", e))?;
                std::fs::metadata(file).map_err(|e| io_error(file, "reading", e))?
            }
            Err(e) => return Err(io_error(file, "reading", e)),
        };
        if !metadata.is_file() {
            return Err(Error::Invalid(format!("{} is not a regular file: a volume mounts on a file", file.display())));
        }
        let counters = Arc::new(Counters::default());
        let fs = VolumeFile {
            node: node.clone(),
            volume: volume_ref,
            uid: metadata.uid(),
            gid: metadata.gid(),
            perm: (metadata.mode() & 0o7777) as u16,
            counters: counters.clone(),
        };
        let mut config = FuseConfig::default();
        config.mount_options = vec![
            MountOption::FSName(format!("tundra:{volume}")),
            MountOption::Subtype("tundra".into()),
            MountOption::RW,
            MountOption::NoExec,
            MountOption::NoSuid,
        ];
        config.acl = SessionACL::Owner;
        config.n_threads = Some(MOUNT_THREADS);
        config.clone_fd = true;
        let session = fuser::Session::new(fs, file, &config).map_err(|e| io_error(file, "mounting FUSE on", e))?;
        let session = session.spawn().map_err(|e| io_error(file, "starting FUSE threads for", e))?;
        let registered = Registered { volume: volume.to_string(), counters: counters.clone() };
        node.mounts.lock().insert(file.to_path_buf(), registered);
        Ok(Mount { file: file.to_path_buf(), volume: volume.to_string(), counters, node, session: Some(session) })
    }

    /// A `[[mount]]` of the configuration: its volume created first if it is missing and the
    /// entry gives a size, then mounted.
    pub fn configured(node: Arc<Node>, config: &crate::config::MountConfig) -> Result<Mount> {
        if node.volume_by_name(&config.volume).is_err()
            && let Some((size, page_size, mode)) = config.creation()?
        {
            node.volume_create(&config.volume, size, page_size, mode)?;
        }
        Mount::start(node, &config.volume, &config.file)
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    pub fn volume(&self) -> &str {
        &self.volume
    }

    pub fn stats(&self) -> MountStats {
        self.counters.stats(&self.volume, &self.file)
    }

    /// Unmounts the file. While something holds it open (a loop device that is still
    /// attached) the unmount is retried for a while; then the mount is detached lazily, which
    /// leaves it served until the last user lets go, and this says so as an error.
    pub fn unmount(mut self) -> Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<()> {
        let Some(session) = self.session.take() else { return Ok(()) };
        self.node.mounts.lock().remove(&self.file);
        let path = CString::new(self.file.as_os_str().as_bytes())
            .map_err(|_| Error::Invalid(format!("{} has a NUL byte", self.file.display())))?;
        let deadline = Instant::now() + UNMOUNT_WAIT;
        loop {
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EBUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Some(libc::EBUSY) => {
                    // SAFETY: as above.
                    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                    return Err(Error::Io(format!(
                        "{} stayed busy for {UNMOUNT_WAIT:?} (is a loop device still attached?): detached lazily",
                        self.file.display()
                    )));
                }
                Some(libc::EINVAL | libc::ENOENT) => break, // not mounted any more
                _ => return Err(io_error(&self.file, "unmounting", error)),
            }
        }
        session.join().map_err(|e| io_error(&self.file, "ending the FUSE session of", e))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

fn io_error(file: &Path, what: &str, e: io::Error) -> Error {
    Error::Io(format!("{what} {}: {e}", file.display()))
}

/// Detaches a FUSE mount on `file` whose server is gone (the file's `stat` fails with
/// `ENOTCONN`), as a node killed while mounted leaves it.
fn clear_stale_mount(file: &Path) -> Result<()> {
    match std::fs::metadata(file) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let path = CString::new(file.as_os_str().as_bytes())
                .map_err(|_| Error::Invalid(format!("{} has a NUL byte", file.display())))?;
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
                return Err(io_error(file, "detaching the stale mount on", io::Error::last_os_error()));
            }
            Ok(())
        }
        _ => Ok(()),
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
    fn attr(&self) -> FileAttr {
        let size = self.volume.volume.size_bytes;
        let now = SystemTime::now();
        FileAttr {
            ino: INodeNo::ROOT,
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::RegularFile,
            perm: self.perm,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.volume.volume.page_size,
            flags: 0,
        }
    }

    /// Reports an error the operator must see on the node's log and counts it.
    fn failed(&self, what: &str, offset: u64, len: u64, e: &Error) -> Errno {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        if matches!(e, Error::Corrupted(_) | Error::Io(_)) {
            eprintln!("tundra: FUSE {what} of volume {:?} at {offset}+{len} failed: {e}", self.volume.volume.name);
        }
        errno(e)
    }

    /// The part of `len` bytes at `offset` inside the file.
    fn clamp(&self, offset: u64, len: u64) -> u64 {
        len.min(self.volume.volume.size_bytes.saturating_sub(offset))
    }

    fn zero(&self, offset: u64, length: u64) -> std::result::Result<(), Errno> {
        let len = self.clamp(offset, length);
        if len == 0 {
            return Ok(());
        }
        self.node.zero_bytes(&self.volume, offset, len).map_err(|e| self.failed("zero", offset, len, &e))?;
        self.counters.zeroed_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}

impl Filesystem for VolumeFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each is a request the kernel may refuse on an older ABI; the mount works without it.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_MAX_PAGES);
        let _ = config.set_max_write(MAX_REQUEST_BYTES);
        let _ = config.set_max_readahead(MAX_REQUEST_BYTES);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        reply.attr(&ATTR_TTL, &self.attr());
    }

    /// Only what changes nothing is accepted: the size stays the volume's (a truncate to it is
    /// a no-op), owner, mode and times are not kept.
    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if size.is_some_and(|size| size != self.volume.volume.size_bytes) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&ATTR_TTL, &self.attr());
    }

    /// No FUSE open flags: a loop device opens the file with O_DIRECT, which bypasses the page
    /// cache anyway. Forcing direct I/O for every opener (`FOPEN_DIRECT_IO`, with parallel
    /// direct writes) measured slower under PostgreSQL through ext4 and a loop device: pgbench
    /// at 0.36x of NBD through nbdfuse with it (bench/results/2026-11-25-block-path), 0.64x
    /// without (bench/results/2026-11-25-block-path-mount).
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.clamp(offset, u64::from(size)) as usize;
        let mut buf = vec![0u8; len];
        if len > 0
            && let Err(e) = self.node.read_bytes(&self.volume, offset, &mut buf)
        {
            return reply.error(self.failed("read", offset, len as u64, &e));
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        reply.data(&buf);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The file is the volume: it cannot grow. A write reaching past the end writes what fits
        // and says so, as a block device's file does; one wholly past it is refused.
        let len = self.clamp(offset, data.len() as u64) as usize;
        if len == 0 {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            return reply.error(Errno::ENOSPC);
        }
        if let Err(e) = self.node.write_bytes(&self.volume, offset, &data[..len]) {
            return reply.error(self.failed("write", offset, len as u64, &e));
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
        reply.written(len as u32);
    }

    /// A close: nothing to make durable (fsync does that).
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.node.flush(Some(&self.volume)) {
            Ok(()) => {
                self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
                reply.ok()
            }
            Err(e) => reply.error(self.failed("fsync", 0, 0, &e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let zeroes = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        let result = if mode & !known != 0 {
            Err(Errno::EOPNOTSUPP)
        } else if zeroes {
            self.zero(offset, length)
        } else if offset.saturating_add(length) > self.volume.volume.size_bytes {
            // Allocation past the end would grow the file.
            Err(Errno::ENOSPC)
        } else {
            Ok(())
        };
        match result {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }
}
