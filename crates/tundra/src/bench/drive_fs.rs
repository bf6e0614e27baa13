//! An emulated compressing drive under a kernel filesystem, for a peer that only knows files
//! (RocksDB in `tundra bench hashkv`): the drive is shown as one file through FUSE in this
//! process, a loop device makes that file a block device (4 KiB sectors, direct I/O, so the
//! host's page cache holds none of it), and ext4 is made and mounted on it with online discard,
//! so that deleted files give their physical space back to the drive as a filesystem on
//! PolarCSD would. This is the stack of `tundra mount` (crates/tundra-node/src/mount.rs) with the
//! node taken out: the FUSE requests go straight to a [`CsdDevice`], the same drive model and
//! media as the hash KV store's, with nothing of Tundra's volume layer in between.
//!
//! What the drive costs the host is measured two ways: the drive's own counters (deflate,
//! inflate and its background thread: the work PolarCSD does in hardware), and the whole CPU
//! time of the threads that serve the FUSE requests (those counters plus the drive's mapping,
//! its media system calls and the FUSE transport), read from `/proc/self/task/*/schedstat`.
//! The kernel's ext4, loop and FUSE work done in the peer's own threads stays the peer's, as it
//! would be on a real drive.
//!
//! Needs root (FUSE, losetup, mount) and `mkfs.ext4`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use fuser::{
    BackgroundSession, Config as FuseConfig, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen,
    ReplyWrite, Request, SessionACL, WriteFlags,
};
use tundra_device::csd::{CsdConfig, CsdDevice, CsdStats, FormatOptions};
use tundra_device::file::FileDevice;
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

/// Threads serving the FUSE requests (as `tundra mount`).
const FUSE_THREADS: usize = 8;
const MAX_REQUEST_BYTES: u32 = 1 << 20;
const ATTR_TTL: Duration = Duration::from_secs(3600);
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// The thread ids that served FUSE requests, for their CPU time.
#[derive(Default)]
struct ServingThreads {
    tids: Mutex<Vec<i32>>,
}

thread_local! {
    static NOTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl ServingThreads {
    fn note(&self) {
        if !NOTED.with(|n| n.replace(true)) {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            self.tids.lock().expect("the thread list").push(tid);
        }
    }

    /// Their CPU time so far, user and system, in nanoseconds (the scheduler's exact sum).
    fn cpu_ns(&self) -> u64 {
        let tids = self.tids.lock().expect("the thread list").clone();
        tids.iter()
            .filter_map(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
            .sum()
    }
}

/// The FUSE side: one regular file, inode 1, which is the drive's logical space.
struct DriveFile {
    csd: Arc<CsdDevice>,
    size: u64,
    threads: Arc<ServingThreads>,
}

fn eio(what: &str, offset: u64, e: impl std::fmt::Display) -> Errno {
    eprintln!("tundra bench: drive file {what} at {offset}: {e}");
    Errno::EIO
}

impl DriveFile {
    fn attr(&self) -> FileAttr {
        let now = SystemTime::now();
        FileAttr {
            ino: INodeNo::ROOT,
            size: self.size,
            blocks: self.size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::RegularFile,
            perm: 0o600,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLOCK_SIZE as u32,
            flags: 0,
        }
    }

    /// Reads `buf.len()` bytes at `offset`, whole blocks straight into `buf` when aligned.
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> tundra_device::Result<()> {
        if offset.is_multiple_of(BLOCK_SIZE_BYTES) && buf.len().is_multiple_of(BLOCK_SIZE) {
            return self.csd.read(Lba(offset / BLOCK_SIZE_BYTES), buf);
        }
        let first = offset / BLOCK_SIZE_BYTES;
        let end = (offset + buf.len() as u64).div_ceil(BLOCK_SIZE_BYTES);
        let mut blocks = vec![0u8; ((end - first) * BLOCK_SIZE_BYTES) as usize];
        self.csd.read(Lba(first), &mut blocks)?;
        let at = (offset - first * BLOCK_SIZE_BYTES) as usize;
        buf.copy_from_slice(&blocks[at..at + buf.len()]);
        Ok(())
    }

    /// Writes `data` at `offset`; partial blocks by read-modify-write (ext4 on a loop device
    /// with 4 KiB sectors never sends them).
    fn write_bytes(&self, offset: u64, data: &[u8]) -> tundra_device::Result<()> {
        if offset.is_multiple_of(BLOCK_SIZE_BYTES) && data.len().is_multiple_of(BLOCK_SIZE) {
            return self.csd.write(Lba(offset / BLOCK_SIZE_BYTES), data);
        }
        let first = offset / BLOCK_SIZE_BYTES;
        let end = (offset + data.len() as u64).div_ceil(BLOCK_SIZE_BYTES);
        let mut blocks = vec![0u8; ((end - first) * BLOCK_SIZE_BYTES) as usize];
        self.csd.read(Lba(first), &mut blocks)?;
        let at = (offset - first * BLOCK_SIZE_BYTES) as usize;
        blocks[at..at + data.len()].copy_from_slice(data);
        self.csd.write(Lba(first), &blocks)
    }

    /// Zeroes a byte range: whole blocks are trimmed, partial ones written with zeros.
    fn zero_bytes(&self, offset: u64, len: u64) -> tundra_device::Result<()> {
        let end = offset + len;
        let first_whole = offset.div_ceil(BLOCK_SIZE_BYTES);
        let end_whole = end / BLOCK_SIZE_BYTES;
        if first_whole >= end_whole {
            return self.write_bytes(offset, &vec![0u8; len as usize]);
        }
        if offset < first_whole * BLOCK_SIZE_BYTES {
            self.write_bytes(offset, &vec![0u8; (first_whole * BLOCK_SIZE_BYTES - offset) as usize])?;
        }
        self.csd.trim(Lba(first_whole), end_whole - first_whole)?;
        if end > end_whole * BLOCK_SIZE_BYTES {
            self.write_bytes(end_whole * BLOCK_SIZE_BYTES, &vec![0u8; (end - end_whole * BLOCK_SIZE_BYTES) as usize])?;
        }
        Ok(())
    }
}

impl Filesystem for DriveFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_MAX_PAGES);
        let _ = config.set_max_write(MAX_REQUEST_BYTES);
        let _ = config.set_max_readahead(MAX_REQUEST_BYTES);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.threads.note();
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        reply.attr(&ATTR_TTL, &self.attr());
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
        self.threads.note();
        if size.is_some_and(|size| size != self.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&ATTR_TTL, &self.attr());
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.threads.note();
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
        self.threads.note();
        let len = u64::from(size).min(self.size.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; len];
        if len > 0
            && let Err(e) = self.read_bytes(offset, &mut buf)
        {
            return reply.error(eio("read", offset, e));
        }
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
        self.threads.note();
        let len = (data.len() as u64).min(self.size.saturating_sub(offset)) as usize;
        if len == 0 {
            return reply.error(Errno::ENOSPC);
        }
        match self.write_bytes(offset, &data[..len]) {
            Ok(()) => reply.written(len as u32),
            Err(e) => reply.error(eio("write", offset, e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.threads.note();
        match self.csd.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(eio("fsync", 0, e)),
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
        self.threads.note();
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) == 0 {
            return if offset.saturating_add(length) > self.size { reply.error(Errno::ENOSPC) } else { reply.ok() };
        }
        let len = length.min(self.size.saturating_sub(offset));
        match if len == 0 { Ok(()) } else { self.zero_bytes(offset, len) } {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(eio("zero", offset, e)),
        }
    }
}

/// A drive with ext4 mounted on it; everything is taken down by [`DriveFs::close`] (or, as
/// well as it can, when dropped).
pub struct DriveFs {
    csd: Arc<CsdDevice>,
    threads: Arc<ServingThreads>,
    file: PathBuf,
    mount_point: PathBuf,
    loop_device: Option<String>,
    mounted: bool,
    session: Option<BackgroundSession>,
}

fn run(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

impl DriveFs {
    /// Formats a drive of `logical` and `physical` bytes on a new media file `dir/NAME.img`,
    /// shows it as `dir/NAME.file`, makes ext4 on it and mounts that on `dir/NAME` (created).
    pub fn create(dir: &Path, name: &str, logical: u64, physical: u64) -> Result<DriveFs> {
        let options = FormatOptions::new(logical, physical);
        let media_path = dir.join(format!("{name}.img"));
        super::hashkv::preallocate(&media_path, options.geometry().context("the drive's geometry")?.total_bytes())?;
        let media = FileDevice::open(&media_path).with_context(|| format!("opening {}", media_path.display()))?;
        let csd = CsdDevice::format(Arc::new(media), &options, CsdConfig::default()).context("formatting the drive")?;
        let mut fs = DriveFs::serve(Arc::new(csd), dir, name)?;
        let device = fs.loop_device.clone().expect("attached by serve");
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-E", "nodiscard,lazy_itable_init=1"])
            .arg(&device))?;
        fs.mount()?;
        Ok(fs)
    }

    /// Shows the drive as a file and attaches a loop device to it.
    fn serve(csd: Arc<CsdDevice>, dir: &Path, name: &str) -> Result<DriveFs> {
        let file = dir.join(format!("{name}.file"));
        std::fs::File::create(&file).with_context(|| format!("creating {}", file.display()))?;
        let mount_point = dir.join(name);
        std::fs::create_dir_all(&mount_point)?;
        let threads = Arc::new(ServingThreads::default());
        let fs = DriveFile { csd: csd.clone(), size: csd.block_count() * BLOCK_SIZE_BYTES, threads: threads.clone() };
        let mut config = FuseConfig::default();
        config.mount_options = vec![
            MountOption::FSName("tundra-bench-drive".into()),
            MountOption::RW,
            MountOption::NoExec,
            MountOption::NoSuid,
        ];
        config.acl = SessionACL::Owner;
        config.n_threads = Some(FUSE_THREADS);
        config.clone_fd = true;
        let session = fuser::Session::new(fs, &file, &config)
            .with_context(|| format!("mounting FUSE on {} (needs root and /dev/fuse)", file.display()))?;
        let session = session.spawn().context("starting the FUSE threads")?;
        let mut drive_fs = DriveFs {
            csd,
            threads,
            file: file.clone(),
            mount_point,
            loop_device: None,
            mounted: false,
            session: Some(session),
        };
        let device = run(Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on", "--sector-size", "4096"])
            .arg(&file))
        .context("attaching a loop device to the drive's file")?;
        drive_fs.loop_device = Some(device);
        Ok(drive_fs)
    }

    fn mount(&mut self) -> Result<()> {
        let device = self.loop_device.clone().expect("attached");
        run(Command::new("mount")
            .args(["-t", "ext4", "-o", "noatime,discard,noinit_itable"])
            .arg(&device)
            .arg(&self.mount_point))?;
        self.mounted = true;
        Ok(())
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    pub fn stats(&self) -> CsdStats {
        self.csd.stats()
    }

    pub fn csd(&self) -> &CsdDevice {
        &self.csd
    }

    /// CPU time of the threads that served the drive's FUSE requests, plus the drive's
    /// background thread, in nanoseconds.
    pub fn serving_cpu_ns(&self) -> u64 {
        self.threads.cpu_ns() + self.csd.stats().cpu.background_thread_ns
    }

    /// The drive's own counters: deflate, inflate and its background thread.
    pub fn codec_cpu_ns(&self) -> u64 {
        self.csd.stats().cpu.total_ns()
    }

    /// Unmounts ext4, detaches the loop device, ends the FUSE session and closes the drive.
    pub fn close(mut self) -> Result<()> {
        self.take_down()?;
        let csd = self.csd.clone();
        drop(self);
        match Arc::into_inner(csd) {
            Some(csd) => csd.close().context("closing the drive"),
            None => Ok(()),
        }
    }

    fn take_down(&mut self) -> Result<()> {
        if self.mounted {
            run(Command::new("umount").arg(&self.mount_point))?;
            self.mounted = false;
        }
        if let Some(device) = self.loop_device.take() {
            run(Command::new("losetup").arg("-d").arg(&device))?;
        }
        let Some(session) = self.session.take() else { return Ok(()) };
        let path = CString::new(self.file.as_os_str().as_bytes()).context("a NUL in the path")?;
        // A loop device detaches asynchronously: the file stays busy for a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EBUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Some(libc::EINVAL | libc::ENOENT) => break,
                _ => {
                    // SAFETY: as above.
                    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                    bail!("unmounting {}: {error}", self.file.display());
                }
            }
        }
        session.join().context("ending the FUSE session")?;
        Ok(())
    }
}

impl Drop for DriveFs {
    fn drop(&mut self) {
        if let Err(e) = self.take_down() {
            eprintln!("tundra bench: taking down the drive's filesystem: {e:#}");
        }
    }
}
