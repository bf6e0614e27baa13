//! Something of a fixed size shown as one regular file through FUSE, served on threads of this
//! process: the piece `tundra mount` (a volume, mount.rs) and `tundra bench hashkv` (an emulated
//! drive under RocksDB's ext4) share. A loop device over the file makes it a block device for a
//! kernel filesystem with no other process and no socket in between.
//!
//! The file is the mount point itself (FUSE may mount a regular file on a regular file): its
//! size is the backend's and it cannot grow or shrink. A loop device over it should use direct
//! I/O (`losetup --direct-io=on`) so that the host's page cache holds none of it. Requests run
//! on [`EXPORT_THREADS`] threads, each with its own clone of the FUSE channel; asynchronous
//! direct I/O (`FUSE_ASYNC_DIO`) lets a loop device keep many requests in flight.
//!
//! What each request means: `read` and `write` are byte I/O (a write reaching past the end
//! writes what fits, one wholly past it is refused with `ENOSPC`), `fsync` is the backend's
//! flush (a write is durable once a later fsync returns, as on a disk with a volatile cache),
//! `fallocate` with `PUNCH_HOLE` or `ZERO_RANGE` zeroes the range (this is how a loop device
//! passes on discards and write-zeroes), and plain preallocation inside the file is accepted
//! and changes nothing.
//!
//! Two transports carry the requests. `fuser` mounts the file, negotiates with the kernel and
//! serves requests read from `/dev/fuse`, one system call to take a request and one to answer
//! it. Where the kernel offers FUSE over io_uring (Linux 6.14 and later, with
//! `/sys/module/fuse/parameters/enable_uring` set) and the export asks for it, `uring.rs` serves
//! them instead through rings of this process: one system call answers a request and waits for
//! the next, and the kernel hands a request to the queue of the CPU it was made on. `fuser`'s
//! thread then serves only what the kernel still sends through `/dev/fuse` (interrupts, and
//! whatever comes before the rings are registered).

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub use fuser::Errno;
use fuser::{
    BackgroundSession, Config as FuseConfig, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen,
    ReplyWrite, Request, SessionACL, WriteFlags,
};

mod uring;

/// Threads serving one file's requests through `/dev/fuse`.
pub const EXPORT_THREADS: usize = 8;
/// Threads serving each CPU's queue of one file's requests through io_uring: a request waits
/// for a free thread of its CPU's queue, and a thread serves one request at a time (an fsync
/// blocks it for a device flush).
pub const URING_THREADS_PER_QUEUE: usize = 4;
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

/// What a file shows: its bytes. Each call gets a range inside the file (the export clamps it)
/// and answers with an errno the kernel passes on; a backend reports errors the operator must
/// see itself.
pub trait ExportBackend: Send + Sync + 'static {
    /// The file's size in bytes.
    fn size(&self) -> u64;
    /// The block size `stat` shows.
    fn block_size(&self) -> u32;
    /// Fills `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno>;
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno>;
    /// Makes `len` bytes at `offset` read as zeros (trimming what it can).
    fn zero(&self, offset: u64, len: u64) -> Result<(), Errno>;
    /// Makes every write that returned durable.
    fn fsync(&self) -> Result<(), Errno>;
    /// Called on the serving thread before each request.
    fn on_request(&self) {}
}

/// How the kernel's requests reach an export's threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// FUSE over io_uring where the kernel offers it, `/dev/fuse` otherwise.
    #[default]
    Auto,
    /// `/dev/fuse` only.
    DevFuse,
}

/// What one exported file served.
#[derive(Default)]
pub struct ExportCounters {
    /// Whether requests come through io_uring (else through `/dev/fuse`).
    pub io_uring: AtomicBool,
    /// Requests answered through io_uring (all requests count, whatever their result).
    pub io_uring_requests: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub fsyncs: AtomicU64,
    pub zeroed_bytes: AtomicU64,
    pub errors: AtomicU64,
}

/// A backend mounted as a file; unmounted by [`FileExport::unmount`] (or when dropped).
pub struct FileExport {
    file: PathBuf,
    counters: Arc<ExportCounters>,
    session: Option<BackgroundSession>,
    /// The io_uring transport's threads, when it serves.
    ring: Option<uring::Ring>,
}

/// What both transports serve: one regular file, inode 1, and what each request does to it.
struct Served<B> {
    backend: Arc<B>,
    /// The owner and permissions of the file mounted on, which the mount keeps showing.
    uid: u32,
    gid: u32,
    perm: u16,
    counters: Arc<ExportCounters>,
}

/// The `fuser` side.
struct ExportedFile<B> {
    served: Arc<Served<B>>,
    /// Whether to ask the kernel for FUSE over io_uring at `init`.
    want_uring: bool,
    /// Set at `init` if the kernel took that request.
    uring_granted: Arc<AtomicBool>,
}

impl FileExport {
    /// Mounts `backend` on `file`, which is created empty if missing and must be a regular file.
    /// A FUSE mount left there by a process that was killed is detached first. `fs_name` is
    /// what the mount table shows as its source.
    pub fn start<B: ExportBackend>(backend: Arc<B>, file: &Path, fs_name: &str) -> io::Result<FileExport> {
        FileExport::start_with(backend, file, fs_name, Transport::Auto)
    }

    /// [`FileExport::start`] with a choice of transport.
    pub fn start_with<B: ExportBackend>(
        backend: Arc<B>,
        file: &Path,
        fs_name: &str,
        transport: Transport,
    ) -> io::Result<FileExport> {
        clear_stale_mount(file)?;
        let metadata = match std::fs::metadata(file) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::File::create(file).map_err(|e| with_path(file, "creating", e))?;
                std::fs::metadata(file).map_err(|e| with_path(file, "reading", e))?
            }
            Err(e) => return Err(with_path(file, "reading", e)),
        };
        if !metadata.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file: an export mounts on a file", file.display()),
            ));
        }
        let counters = Arc::new(ExportCounters::default());
        let served = Arc::new(Served {
            backend,
            uid: metadata.uid(),
            gid: metadata.gid(),
            perm: (metadata.mode() & 0o7777) as u16,
            counters: counters.clone(),
        });
        let uring_granted = Arc::new(AtomicBool::new(false));
        let fs = ExportedFile {
            served: served.clone(),
            want_uring: transport == Transport::Auto,
            uring_granted: uring_granted.clone(),
        };
        let mut config = FuseConfig::default();
        config.mount_options = vec![
            MountOption::FSName(fs_name.to_string()),
            MountOption::Subtype("tundra".into()),
            MountOption::RW,
            MountOption::NoExec,
            MountOption::NoSuid,
        ];
        config.acl = SessionACL::Owner;
        // With the rings serving, these threads wait on /dev/fuse for what still comes there.
        config.n_threads = Some(EXPORT_THREADS);
        config.clone_fd = true;
        // Mounting includes the handshake (`init` below), so the transport is known here.
        let session = fuser::Session::new(fs, file, &config).map_err(|e| with_path(file, "mounting FUSE on", e))?;
        let ring = if uring_granted.load(Ordering::Acquire) {
            let ring = session
                .as_fd()
                .try_clone_to_owned()
                .and_then(|fd| uring::Ring::start(fd, served, URING_THREADS_PER_QUEUE));
            match ring {
                Ok(ring) => Some(ring),
                Err(e) => {
                    // The kernel keeps sending through /dev/fuse until every queue is registered.
                    eprintln!(
                        "tundra: {}: FUSE over io_uring not started ({e}); serving through /dev/fuse",
                        file.display()
                    );
                    None
                }
            }
        } else {
            None
        };
        counters.io_uring.store(ring.is_some(), Ordering::Relaxed);
        let session = session.spawn().map_err(|e| with_path(file, "starting FUSE threads for", e))?;
        Ok(FileExport { file: file.to_path_buf(), counters, session: Some(session), ring })
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    pub fn counters(&self) -> &Arc<ExportCounters> {
        &self.counters
    }

    /// Unmounts the file. While something holds it open (a loop device that is still
    /// attached) the unmount is retried for a while; then the mount is detached lazily, which
    /// leaves it served until the last user lets go, and this says so as an error.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else { return Ok(()) };
        let path = CString::new(self.file.as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} has a NUL byte", self.file.display()))
        })?;
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
                    return Err(io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        format!(
                            "{} stayed busy for {UNMOUNT_WAIT:?} (is a loop device still attached?): detached lazily",
                            self.file.display()
                        ),
                    ));
                }
                Some(libc::EINVAL | libc::ENOENT) => break, // not mounted any more
                _ => return Err(with_path(&self.file, "unmounting", error)),
            }
        }
        let ended = session.join().map_err(|e| with_path(&self.file, "ending the FUSE session of", e));
        // Unmounting ended the connection, which ends every ring thread's wait.
        if let Some(ring) = self.ring.take() {
            ring.join();
        }
        ended
    }
}

impl Drop for FileExport {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

fn with_path(file: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", file.display()))
}

/// Detaches a FUSE mount on `file` whose server is gone (the file's `stat` fails with
/// `ENOTCONN`), as a process killed while mounted leaves it.
fn clear_stale_mount(file: &Path) -> io::Result<()> {
    match std::fs::metadata(file) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let path = CString::new(file.as_os_str().as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{} has a NUL byte", file.display()))
            })?;
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
                return Err(with_path(file, "detaching the stale mount on", io::Error::last_os_error()));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl<B: ExportBackend> Served<B> {
    fn attr(&self) -> FileAttr {
        let size = self.backend.size();
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
            blksize: self.backend.block_size(),
            flags: 0,
        }
    }

    /// The part of `len` bytes at `offset` inside the file.
    fn clamp(&self, offset: u64, len: u64) -> u64 {
        len.min(self.backend.size().saturating_sub(offset))
    }

    fn counted<T>(&self, result: Result<T, Errno>) -> Result<T, Errno> {
        if result.is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn getattr(&self, inode: u64) -> Result<FileAttr, Errno> {
        self.backend.on_request();
        if inode != u64::from(INodeNo::ROOT) {
            return Err(Errno::ENOENT);
        }
        Ok(self.attr())
    }

    /// No FUSE open flags (see the `fuser` side's `open`).
    fn open(&self) {
        self.backend.on_request();
    }

    /// Only what changes nothing is accepted: the size stays the backend's (a truncate to it
    /// is a no-op), owner, mode and times are not kept.
    fn setattr(&self, size: Option<u64>) -> Result<FileAttr, Errno> {
        self.backend.on_request();
        if size.is_some_and(|size| size != self.backend.size()) {
            return Err(Errno::EPERM);
        }
        Ok(self.attr())
    }

    /// Reads up to `buf.len()` bytes at `offset` into `buf`: the bytes read, fewer at the end.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        self.backend.on_request();
        let len = self.clamp(offset, buf.len() as u64) as usize;
        if len > 0 {
            self.counted(self.backend.read(offset, &mut buf[..len]))?;
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        Ok(len)
    }

    /// The file cannot grow. A write reaching past the end writes what fits and says so, as
    /// a block device's file does; one wholly past it is refused.
    fn write(&self, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        self.backend.on_request();
        let len = self.clamp(offset, data.len() as u64) as usize;
        if len == 0 {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Errno::ENOSPC);
        }
        self.counted(self.backend.write(offset, &data[..len]))?;
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
        Ok(len as u32)
    }

    fn fsync(&self) -> Result<(), Errno> {
        self.backend.on_request();
        self.counted(self.backend.fsync())?;
        self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn fallocate(&self, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        self.backend.on_request();
        let zeroes = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            Err(Errno::EOPNOTSUPP)
        } else if zeroes {
            self.zero(offset, length)
        } else if offset.saturating_add(length) > self.backend.size() {
            // Allocation past the end would grow the file.
            Err(Errno::ENOSPC)
        } else {
            Ok(())
        }
    }

    fn zero(&self, offset: u64, length: u64) -> Result<(), Errno> {
        let len = self.clamp(offset, length);
        if len == 0 {
            return Ok(());
        }
        self.counted(self.backend.zero(offset, len))?;
        self.counters.zeroed_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}

impl<B: ExportBackend> Filesystem for ExportedFile<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each is a request the kernel may refuse on an older ABI; the mount works without it.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_MAX_PAGES);
        let _ = config.set_max_write(MAX_REQUEST_BYTES);
        let _ = config.set_max_readahead(MAX_REQUEST_BYTES);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // Offered only where the kernel has it and `enable_uring` is set.
        if self.want_uring && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok() {
            self.uring_granted.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.served.getattr(u64::from(ino)) {
            Ok(attr) => reply.attr(&ATTR_TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

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
        match self.served.setattr(size) {
            Ok(attr) => reply.attr(&ATTR_TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    /// No FUSE open flags: a loop device opens the file with O_DIRECT, which bypasses the page
    /// cache anyway. Forcing direct I/O for every opener (`FOPEN_DIRECT_IO`, with parallel
    /// direct writes) measured slower under PostgreSQL through ext4 and a loop device: pgbench
    /// at 0.36x of NBD through nbdfuse with it (bench/results/2026-11-25-block-path); without
    /// it, 1.02x of NBD on a quieter machine (bench/results/2026-11-28-block-path).
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.served.open();
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
        let mut buf = vec![0u8; self.served.clamp(offset, u64::from(size)) as usize];
        match self.served.read(offset, &mut buf) {
            Ok(len) => reply.data(&buf[..len]),
            Err(errno) => reply.error(errno),
        }
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
        match self.served.write(offset, data) {
            Ok(len) => reply.written(len),
            Err(errno) => reply.error(errno),
        }
    }

    /// A close: nothing to make durable (fsync does that).
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.served.fsync() {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
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
        match self.served.fallocate(offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }
}
