//! A plain file or a raw block device used as a [`BlockDevice`].
//!
//! This module owns everything between the trait and the operating system for real storage: it
//! opens the file or device (with `O_DIRECT` where the filesystem allows it, so data is not cached
//! twice, once by the kernel and once by the layers above), moves whole blocks with positional
//! I/O, and implements TRIM as thin provisioning: on a regular file it punches holes
//! (`FALLOC_FL_PUNCH_HOLE`), so that ext4 or xfs give the space back (seed 004 §3); on a block
//! device the same `fallocate` call makes the kernel issue a write-zeroes-with-unmap, which both
//! deallocates and guarantees that the range reads as zeros (a bare `BLKDISCARD` promises neither
//! on every drive). Where punching is not supported the range is overwritten with zeros instead,
//! because a trimmed block must read as zeros whatever the storage underneath.
//!
//! `O_DIRECT` requires block-aligned memory. Callers hand in ordinary `Vec`s, so unaligned buffers
//! go through a small aligned bounce buffer; aligned ones are used as they are.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{FallocateFlags, OFlags};
use rustix::io::Errno;

use crate::buf::BlockBuf;
use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Error, Lba, Result, Usage, check_io, check_range};

/// Whether a [`FileDevice`] bypasses the kernel's page cache with `O_DIRECT`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectIo {
    /// Use `O_DIRECT` if the filesystem accepts it, buffered I/O otherwise (tmpfs before Linux
    /// 6.6, some FUSE filesystems).
    #[default]
    Auto,
    /// Use `O_DIRECT` or fail to open.
    On,
    /// Always use buffered I/O.
    Off,
}

/// How to open or create a [`FileDevice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Whether to bypass the page cache; [`DirectIo::Auto`] by default.
    pub direct: DirectIo,
}

/// The largest bounce buffer one request allocates. Larger unaligned requests pass through it in
/// pieces, so memory stays small however big the request.
const BOUNCE_BYTES: usize = 256 * 1024;

/// What sits under the file descriptor; it decides how size and usage are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backing {
    RegularFile,
    BlockDevice,
}

/// What an open is for; it decides the open flags besides `O_DIRECT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Create,
    OpenFile,
    OpenBlockDevice,
}

/// A regular file or raw block device of 4 KiB blocks.
///
/// Positional reads and writes on a shared descriptor need no lock, so the device is shared
/// between threads as it is.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    block_count: u64,
    backing: Backing,
    direct: bool,
    /// Set once the filesystem refuses to punch holes, so later trims go straight to zero-filling.
    punch_unsupported: AtomicBool,
}

impl FileDevice {
    /// Creates a sparse file of `size_bytes` at `path`, with [`DirectIo::Auto`].
    pub fn create(path: impl AsRef<Path>, size_bytes: u64) -> Result<FileDevice> {
        FileDevice::create_with(path, size_bytes, FileOptions::default())
    }

    /// Creates a sparse file of `size_bytes`, a non-zero multiple of 4096, at `path`.
    ///
    /// An existing empty file is taken over; an existing non-empty file is refused with
    /// [`ErrorKind::Invalid`](crate::ErrorKind::Invalid) and left untouched, so that creating a
    /// device never destroys data.
    pub fn create_with(path: impl AsRef<Path>, size_bytes: u64, options: FileOptions) -> Result<FileDevice> {
        let path = path.as_ref();
        if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_SIZE_BYTES) {
            return Err(Error::invalid(format!(
                "cannot create {}: size {size_bytes} is not a non-zero multiple of {BLOCK_SIZE}",
                path.display()
            )));
        }
        let (file, direct) = open_file(path, options.direct, Purpose::Create)?;
        check_empty_regular_file(&file, path)?;
        file.set_len(size_bytes)
            .map_err(|e| Error::io(format!("sizing {} to {size_bytes} bytes", path.display()), e))?;
        sync_new_file(&file, path)?;
        let blocks = size_bytes / BLOCK_SIZE_BYTES;
        FileDevice::assemble(file, path, Backing::RegularFile, blocks, direct, options.direct)
    }

    /// Opens an existing regular file or raw block device, with [`DirectIo::Auto`].
    pub fn open(path: impl AsRef<Path>) -> Result<FileDevice> {
        FileDevice::open_with(path, FileOptions::default())
    }

    /// Opens an existing regular file, whose size must be a non-zero multiple of 4096, or a raw
    /// block device, whose size comes from `BLKGETSIZE64` (a tail shorter than a block is unused).
    ///
    /// A block device is opened exclusively (`O_EXCL`), so it fails if a filesystem on it is
    /// mounted or another program holds it that way.
    pub fn open_with(path: impl AsRef<Path>, options: FileOptions) -> Result<FileDevice> {
        let path = path.as_ref();
        let purpose = purpose_of(path)?;
        let (file, direct) = open_file(path, options.direct, purpose)?;
        let (backing, blocks) = measure(&file, path)?;
        FileDevice::assemble(file, path, backing, blocks, direct, options.direct)
    }

    /// True when I/O bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn assemble(
        file: File,
        path: &Path,
        backing: Backing,
        block_count: u64,
        direct: bool,
        mode: DirectIo,
    ) -> Result<FileDevice> {
        let mut device = FileDevice {
            file,
            path: path.to_path_buf(),
            block_count,
            backing,
            direct,
            punch_unsupported: AtomicBool::new(false),
        };
        device.confirm_direct(mode)?;
        Ok(device)
    }

    /// Some filesystems accept `O_DIRECT` at open and refuse it at the first I/O. One aligned read
    /// of block 0 tells; under [`DirectIo::Auto`] a refusal turns `O_DIRECT` off on the open
    /// descriptor (Linux allows that through `F_SETFL`) rather than failing later.
    fn confirm_direct(&mut self, mode: DirectIo) -> Result<()> {
        if !self.direct {
            return Ok(());
        }
        let mut probe = BlockBuf::zeroed(BLOCK_SIZE);
        match self.file.read_exact_at(&mut probe, 0) {
            Ok(()) => Ok(()),
            Err(e) if mode == DirectIo::Auto && e.raw_os_error() == Some(libc::EINVAL) => {
                rustix::fs::fcntl_getfl(&self.file)
                    .and_then(|flags| rustix::fs::fcntl_setfl(&self.file, flags - OFlags::DIRECT))
                    .map_err(|e| self.io_error("turning O_DIRECT off", e.into()))?;
                self.direct = false;
                Ok(())
            }
            Err(e) => Err(self.io_error("reading block 0 to check O_DIRECT", e)),
        }
    }

    /// Whether `buf` must pass through a bounce buffer: only `O_DIRECT` cares about alignment.
    fn needs_bounce(&self, buf: &[u8]) -> bool {
        self.direct && !buf.as_ptr().addr().is_multiple_of(BLOCK_SIZE)
    }

    /// Reads exactly `buf.len()` bytes at `offset`. The standard library retries short reads and
    /// `EINTR`; a read past the end of the file (someone truncated it) is an error, not zeros.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_error(&format!("reading {} bytes at offset {offset}", buf.len()), e))
    }

    /// Writes all of `data` at `offset`, retrying short writes and `EINTR`.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| self.io_error(&format!("writing {} bytes at offset {offset}", data.len()), e))
    }

    fn read_bounced(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut bounce = BlockBuf::zeroed(buf.len().min(BOUNCE_BYTES));
        let step = bounce.len();
        for (i, out) in buf.chunks_mut(step).enumerate() {
            let staged = &mut bounce[..out.len()];
            self.read_at(offset + (i * step) as u64, staged)?;
            out.copy_from_slice(staged);
        }
        Ok(())
    }

    fn write_bounced(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut bounce = BlockBuf::zeroed(data.len().min(BOUNCE_BYTES));
        let step = bounce.len();
        for (i, piece) in data.chunks(step).enumerate() {
            let staged = &mut bounce[..piece.len()];
            staged.copy_from_slice(piece);
            self.write_at(offset + (i * step) as u64, staged)?;
        }
        Ok(())
    }

    /// Frees `len` bytes at `offset` and makes them read as zeros, keeping the size unchanged.
    /// On a block device Linux implements this as write-zeroes with unmap, without a fallback.
    fn punch_hole(&self, offset: u64, len: u64) -> rustix::io::Result<()> {
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        rustix::fs::fallocate(&self.file, flags, offset, len)
    }

    /// The trim of last resort: overwrite the range with zeros, from an aligned buffer so that it
    /// works under `O_DIRECT` too.
    fn write_zeros(&self, offset: u64, len: u64) -> Result<()> {
        let zeros = BlockBuf::zeroed(len.min(BOUNCE_BYTES as u64) as usize);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(offset + done, &zeros[..n])?;
            done += n as u64;
        }
        Ok(())
    }

    /// Bytes the filesystem has allocated to the file, from one `fstat`.
    fn allocated_bytes(&self) -> io::Result<u64> {
        // `st_blocks` counts 512-byte units whatever the filesystem's block size.
        Ok(self.file.metadata()?.blocks() * 512)
    }

    /// Bytes of `start..end` the file has data for, walking its data extents (SEEK_DATA /
    /// SEEK_HOLE).
    fn data_bytes_between(&self, start: u64, end: u64) -> io::Result<u64> {
        use rustix::fs::{SeekFrom, seek};
        let mut total = 0;
        let mut at = start;
        while at < end {
            let data = match seek(&self.file, SeekFrom::Data(at)) {
                Ok(offset) => offset,
                Err(rustix::io::Errno::NXIO) => break,
                Err(e) => return Err(e.into()),
            };
            if data >= end {
                break;
            }
            let hole = seek(&self.file, SeekFrom::Hole(data))?;
            total += hole.min(end) - data;
            at = hole;
        }
        Ok(total)
    }

    fn io_error(&self, doing: &str, err: io::Error) -> Error {
        Error::io(format!("{doing} of {}", self.path.display()), err)
    }
}

impl BlockDevice for FileDevice {
    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()> {
        check_io(self.block_count, lba, buf.len())?;
        if self.needs_bounce(buf) {
            self.read_bounced(lba.byte_offset(), buf)
        } else {
            self.read_at(lba.byte_offset(), buf)
        }
    }

    /// The ranges in memory aligned as `O_DIRECT` needs go to the kernel together through
    /// io_uring (file_ring.rs); the others, or all of them where io_uring cannot be used, are
    /// read one after another.
    fn read_many(&self, reads: &mut [(Lba, &mut [u8])]) -> Result<()> {
        for (lba, buf) in reads.iter() {
            check_io(self.block_count, *lba, buf.len())?;
        }
        if reads.len() < 2 {
            return reads.iter_mut().try_for_each(|(lba, buf)| self.read(*lba, buf));
        }
        let mut together: Vec<(u64, &mut [u8])> = Vec::with_capacity(reads.len());
        for (lba, buf) in reads.iter_mut() {
            if self.needs_bounce(buf) || buf.is_empty() {
                self.read(*lba, buf)?;
            } else {
                together.push((lba.byte_offset(), &mut **buf));
            }
        }
        let count = together.len();
        let finish = |offset: u64, rest: &mut [u8]| self.file.read_exact_at(rest, offset);
        match crate::file_ring::read_all(self.file.as_raw_fd(), &mut together, finish) {
            Ok(crate::file_ring::Outcome::Read) => Ok(()),
            Ok(crate::file_ring::Outcome::Unavailable) => {
                together.iter_mut().try_for_each(|(offset, buf)| self.read_at(*offset, buf))
            }
            Err(e) => Err(self.io_error(&format!("reading {count} ranges through io_uring"), e)),
        }
    }

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        check_io(self.block_count, lba, data.len())?;
        if self.needs_bounce(data) {
            self.write_bounced(lba.byte_offset(), data)
        } else {
            self.write_at(lba.byte_offset(), data)
        }
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        check_range(self.block_count, lba, block_count)?;
        if block_count == 0 {
            // fallocate rejects an empty range; there is nothing to do anyway.
            return Ok(());
        }
        // Cannot overflow: the range lies inside the device, whose byte size fits in a u64.
        let (offset, len) = (lba.byte_offset(), block_count * BLOCK_SIZE_BYTES);
        if !self.punch_unsupported.load(Ordering::Relaxed) {
            match self.punch_hole(offset, len) {
                Ok(()) => return Ok(()),
                Err(e) if e == Errno::OPNOTSUPP || e == Errno::NOSYS => {
                    self.punch_unsupported.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    let doing = format!("punching a hole of {len} bytes at offset {offset}");
                    return Err(self.io_error(&doing, e.into()));
                }
            }
        }
        self.write_zeros(offset, len)
    }

    /// `fdatasync`. It also makes punched holes durable: the extent changes a punch makes are
    /// metadata needed to read the data back, which `fdatasync` writes on ext4 and xfs.
    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| self.io_error("syncing data", e))
    }

    /// For a regular file the mapped and physically used bytes are both what the filesystem has
    /// allocated (`st_blocks`), capped at the logical capacity since filesystem metadata such as
    /// extent-tree blocks may count too. A block device cannot tell which of its blocks hold data,
    /// so it reports itself as full: mapped and used equal the capacity. So does a file whose
    /// `fstat` fails, as `usage` has no way to return the error.
    fn usage(&self) -> Usage {
        let capacity = self.block_count * BLOCK_SIZE_BYTES;
        let used = match self.backing {
            Backing::RegularFile => self.allocated_bytes().unwrap_or(capacity).min(capacity),
            Backing::BlockDevice => capacity,
        };
        Usage {
            logical_capacity_bytes: capacity,
            mapped_bytes: used,
            physical_used_bytes: used,
            physical_capacity_bytes: capacity,
        }
    }

    fn mapped_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        match self.backing {
            Backing::RegularFile => {
                let start = lba.byte_offset();
                self.data_bytes_between(start, start + count * BLOCK_SIZE_BYTES).ok()
            }
            Backing::BlockDevice => Some(count * BLOCK_SIZE_BYTES),
        }
    }
}

/// Opens `path` for reading and writing, with `O_DIRECT` as `mode` asks. Returns the file and
/// whether `O_DIRECT` is on.
fn open_file(path: &Path, mode: DirectIo, purpose: Purpose) -> Result<(File, bool)> {
    let open = |direct: bool| {
        let mut flags = if direct { libc::O_DIRECT } else { 0 };
        if purpose == Purpose::OpenBlockDevice {
            // On a block device O_EXCL without O_CREAT means an exclusive claim: it fails with
            // EBUSY while a filesystem on the device is mounted.
            flags |= libc::O_EXCL;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(purpose == Purpose::Create);
        options.custom_flags(flags).open(path).map(|file| (file, direct))
    };
    let opened = match mode {
        DirectIo::Off => open(false),
        DirectIo::On => open(true),
        // Filesystems without O_DIRECT support (tmpfs before Linux 6.6) refuse it with EINVAL.
        DirectIo::Auto => match open(true) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false),
            other => other,
        },
    };
    let (file, direct) = opened.map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    lock_exclusively(&file, path)?;
    Ok((file, direct))
}

/// Takes an exclusive advisory lock for as long as the file is open, so that two processes
/// never drive the same image at once (each would overwrite the other's metadata).
fn lock_exclusively(file: &File, path: &Path) -> Result<()> {
    match lock_exclusive_waiting(file) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::invalid(format!("{} is in use by another process", path.display()))),
        Err(e) => Err(Error::io(format!("locking {}", path.display()), e)),
    }
}

/// How long [`lock_exclusive_waiting`] waits for another holder to let go.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes an exclusive `flock` on `file`, held for as long as it stays open; `Ok(false)` if
/// someone else still holds it after [`LOCK_WAIT`]. A lock is waited for, not refused at once,
/// because a holder may be on its way out: a child process spawned by any thread of this one
/// holds copies of its descriptors, locks included, from its fork until its exec, and a process
/// that is stopping lets go when it exits. A process that keeps running keeps the lock.
pub fn lock_exclusive_waiting(file: &File) -> io::Result<bool> {
    use rustix::fs::{FlockOperation, flock};
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(true),
            Err(Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Decides how to open an existing `path`, refusing anything but a regular file or a block
/// device before opening it: opening a directory, FIFO or character device for writing fails
/// obscurely or has side effects. [`measure`] checks again on the open descriptor.
fn purpose_of(path: &Path) -> Result<Purpose> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(format!("examining {}", path.display()), e))?;
    let file_type = meta.file_type();
    if file_type.is_block_device() {
        Ok(Purpose::OpenBlockDevice)
    } else if file_type.is_file() {
        Ok(Purpose::OpenFile)
    } else {
        Err(not_a_device(path))
    }
}

fn not_a_device(path: &Path) -> Error {
    Error::invalid(format!("{} is neither a regular file nor a block device", path.display()))
}

/// Refuses to create a device over anything but an empty regular file, before changing it.
fn check_empty_regular_file(file: &File, path: &Path) -> Result<()> {
    let meta = file.metadata().map_err(|e| Error::io(format!("examining {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "cannot create a device at {}: it is not a regular file (open a block device instead)",
            path.display()
        )));
    }
    if meta.len() != 0 {
        return Err(Error::invalid(format!(
            "cannot create a device at {}: the file exists and holds {} bytes",
            path.display(),
            meta.len()
        )));
    }
    Ok(())
}

/// Makes a newly created file's size and directory entry durable, so that a device created and
/// later flushed is still there after a crash.
fn sync_new_file(file: &File, path: &Path) -> Result<()> {
    file.sync_all().map_err(|e| Error::io(format!("syncing new file {}", path.display()), e))?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), e))
}

/// Tells what `file` is and how many blocks it holds.
fn measure(file: &File, path: &Path) -> Result<(Backing, u64)> {
    let meta = file.metadata().map_err(|e| Error::io(format!("examining {}", path.display()), e))?;
    let file_type = meta.file_type();
    if file_type.is_block_device() {
        let bytes =
            block_device_size(file).map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))?;
        let blocks = bytes / BLOCK_SIZE_BYTES;
        if blocks == 0 {
            return Err(Error::invalid(format!(
                "block device {} holds {bytes} bytes, less than one block",
                path.display()
            )));
        }
        return Ok((Backing::BlockDevice, blocks));
    }
    if !file_type.is_file() {
        return Err(not_a_device(path));
    }
    let len = meta.len();
    if len == 0 || len % BLOCK_SIZE_BYTES != 0 {
        return Err(Error::invalid(format!(
            "{} holds {len} bytes, not a non-zero multiple of {BLOCK_SIZE}",
            path.display()
        )));
    }
    Ok((Backing::RegularFile, len / BLOCK_SIZE_BYTES))
}

/// The size in bytes of a block device, from the `BLKGETSIZE64` ioctl.
fn block_device_size(file: &File) -> io::Result<u64> {
    // _IOR(0x12, 114, size_t) in <linux/fs.h>; rustix computes the encoding for each architecture.
    const BLKGETSIZE64: rustix::ioctl::Opcode = rustix::ioctl::opcode::read::<usize>(0x12, 114);
    // SAFETY: BLKGETSIZE64 reads nothing from user memory and writes one u64, the size in bytes,
    // which is exactly the output type given to the getter.
    let size = unsafe {
        let getter = rustix::ioctl::Getter::<BLKGETSIZE64, u64>::new();
        rustix::ioctl::ioctl(file, getter)
    };
    Ok(size?)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::ErrorKind;
    use crate::conformance::{self, block_content};

    fn options(direct: DirectIo) -> FileOptions {
        FileOptions { direct }
    }

    fn run_conformance(direct: DirectIo) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let next = Cell::new(0);
        conformance::run_all(&|blocks| {
            next.set(next.get() + 1);
            let path = dir.path().join(format!("device-{}", next.get()));
            let device = FileDevice::create_with(path, blocks * BLOCK_SIZE_BYTES, options(direct));
            Box::new(device.expect("create a file device"))
        });
    }

    #[test]
    fn conformance_direct_auto() {
        run_conformance(DirectIo::Auto);
    }

    #[test]
    fn conformance_buffered() {
        run_conformance(DirectIo::Off);
    }

    fn expect_invalid<T: std::fmt::Debug>(result: Result<T>, what: &str) {
        match result {
            Err(e) if e.kind() == ErrorKind::Invalid => {}
            other => panic!("{what}: expected an invalid-request error, got {other:?}"),
        }
    }

    fn read_blocks(dev: &FileDevice, lba: u64, count: usize) -> Vec<u8> {
        let mut buf = vec![0xA5; count * BLOCK_SIZE];
        dev.read(Lba(lba), &mut buf).expect("read");
        buf
    }

    #[test]
    fn trim_punches_holes_and_frees_space() {
        for direct in [DirectIo::Auto, DirectIo::Off] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let dev = FileDevice::create_with(dir.path().join("dev"), 1 << 20, options(direct)).expect("create");
            let before = dev.usage().physical_used_bytes;
            let data: Vec<u8> = (0..64).flat_map(|i| block_content(i, 3)).collect();
            dev.write(Lba(16), &data).expect("write");
            dev.flush().expect("flush");
            let written = dev.usage().physical_used_bytes;
            assert!(written >= before + 256 * 1024, "{direct:?}: {before} -> {written}");
            dev.trim(Lba(16), 64).expect("trim");
            dev.flush().expect("flush");
            let trimmed = dev.usage().physical_used_bytes;
            assert!(trimmed <= before, "{direct:?}: punching freed nothing: {written} -> {trimmed}");
            assert!(read_blocks(&dev, 16, 64).iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn trim_writes_zeros_where_punching_is_unsupported() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let dev = FileDevice::create(dir.path().join("dev"), 1 << 20).expect("create");
        // Pretend the filesystem refused to punch, as one without hole support would.
        dev.punch_unsupported.store(true, Ordering::Relaxed);
        let data: Vec<u8> = (0..100).flat_map(|i| block_content(i, 1)).collect();
        dev.write(Lba(0), &data).expect("write");
        dev.trim(Lba(10), 80).expect("trim");
        let after = read_blocks(&dev, 0, 100);
        assert_eq!(&after[..10 * BLOCK_SIZE], &data[..10 * BLOCK_SIZE]);
        assert!(after[10 * BLOCK_SIZE..90 * BLOCK_SIZE].iter().all(|&b| b == 0));
        assert_eq!(&after[90 * BLOCK_SIZE..], &data[90 * BLOCK_SIZE..]);
    }

    #[test]
    fn aligned_and_unaligned_buffers_of_many_blocks() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let dev = FileDevice::create(dir.path().join("dev"), 4 << 20).expect("create");
        // Larger than the bounce buffer, so an unaligned request passes through it in pieces.
        let len = 300 * BLOCK_SIZE;
        let data: Vec<u8> = (0..300).flat_map(|i| block_content(i, 2)).collect();
        let mut memory = BlockBuf::zeroed(len + BLOCK_SIZE);
        memory[512..512 + len].copy_from_slice(&data);
        dev.write(Lba(1), &memory[512..512 + len]).expect("unaligned write");
        dev.read(Lba(1), &mut memory[..len]).expect("aligned read");
        assert_eq!(&memory[..len], &data[..]);
        dev.write(Lba(700), &memory[..len]).expect("aligned write");
        memory.fill(0);
        dev.read(Lba(700), &mut memory[512..512 + len]).expect("unaligned read");
        assert_eq!(&memory[512..512 + len], &data[..]);
    }

    #[test]
    fn reopen_keeps_data() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("dev");
        let data: Vec<u8> = (0..4).flat_map(|i| block_content(i + 40, i + 1)).collect();
        {
            let dev = FileDevice::create(&path, 64 * BLOCK_SIZE_BYTES).expect("create");
            dev.write(Lba(30), &data).expect("write");
            dev.flush().expect("flush");
        }
        let dev = FileDevice::open(&path).expect("reopen");
        assert_eq!(dev.block_count(), 64);
        assert_eq!(read_blocks(&dev, 30, 4), data);
        let second = FileDevice::open(&path).expect_err("an open image is locked");
        assert!(second.message().contains("in use"), "{second}");
        drop(dev);
        let buffered = FileDevice::open_with(&path, options(DirectIo::Off)).expect("reopen");
        assert!(!buffered.is_direct());
        assert_eq!(read_blocks(&buffered, 30, 4), data);
    }

    /// A holder that lets go within the wait (as a spawned child does at its exec) is waited
    /// for; one that keeps the file open is refused after the wait.
    #[test]
    fn a_lock_released_during_the_wait_is_taken() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("dev");
        let holder = FileDevice::create(&path, 64 * BLOCK_SIZE_BYTES).expect("create");
        let started = std::time::Instant::now();
        let refused = FileDevice::open(&path).expect_err("held for longer than the wait");
        assert!(refused.message().contains("in use"), "{refused}");
        assert!(started.elapsed() >= LOCK_WAIT, "refused after {:?}", started.elapsed());
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(LOCK_WAIT / 4);
            drop(holder);
        });
        let started = std::time::Instant::now();
        let taken = FileDevice::open(&path).expect("taken once the holder let go");
        assert!(started.elapsed() < LOCK_WAIT, "taken after {:?}", started.elapsed());
        letting_go.join().expect("the holder's thread");
        drop(taken);
    }

    #[test]
    fn open_rejects_sizes_that_are_not_whole_blocks() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let odd = dir.path().join("odd");
        std::fs::write(&odd, vec![1u8; 5000]).expect("write file");
        expect_invalid(FileDevice::open(&odd), "a 5000-byte file");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("write file");
        expect_invalid(FileDevice::open(&empty), "an empty file");
        expect_invalid(FileDevice::open(dir.path()), "a directory");
    }

    #[test]
    fn create_refuses_bad_sizes_and_existing_data() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fresh = dir.path().join("fresh");
        expect_invalid(FileDevice::create(&fresh, 5000), "size 5000");
        expect_invalid(FileDevice::create(&fresh, 0), "size 0");
        assert!(!fresh.exists(), "a refused create left a file behind");

        let existing = dir.path().join("existing");
        std::fs::write(&existing, vec![7u8; 8192]).expect("write file");
        expect_invalid(FileDevice::create(&existing, 8192), "an existing non-empty file");
        assert_eq!(std::fs::read(&existing).expect("read file"), vec![7u8; 8192]);

        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("write file");
        let dev = FileDevice::create(&empty, 8192).expect("create over an empty file");
        assert_eq!(dev.block_count(), 2);
    }

    #[test]
    fn io_errors_name_the_path() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let missing = dir.path().join("missing");
        let error = FileDevice::open(&missing).expect_err("opening a missing file");
        assert_eq!(error.kind(), ErrorKind::Io);
        assert!(error.message().contains("missing"), "{error}");
    }

    #[test]
    fn direct_on_either_works_or_fails_to_open() {
        let dir = tempfile::tempdir().expect("temporary directory");
        match FileDevice::create_with(dir.path().join("dev"), 1 << 16, options(DirectIo::On)) {
            Ok(dev) => {
                assert!(dev.is_direct());
                dev.write(Lba(3), &block_content(1, 3)).expect("write");
                assert_eq!(read_blocks(&dev, 3, 1), block_content(1, 3));
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::Io, "{e}"),
        }
    }

    /// Runs only when `TUNDRA_TEST_BLOCK_DEVICE` names a block device, whose contents it
    /// destroys (a loop device over a sparse file will do).
    #[test]
    fn block_device_from_environment() {
        let Some(path) = std::env::var_os("TUNDRA_TEST_BLOCK_DEVICE") else {
            return;
        };
        let dev = FileDevice::open(&path).expect("open the block device");
        let n = dev.block_count();
        assert!(n >= 64, "the test needs at least 64 blocks");
        let data: Vec<u8> = (0..8).flat_map(|i| block_content(i + 9, 3)).collect();
        dev.write(Lba(n - 8), &data).expect("write the last blocks");
        dev.flush().expect("flush");
        assert_eq!(read_blocks(&dev, n - 8, 8), data);
        dev.trim(Lba(n - 6), 4).expect("trim");
        let after = read_blocks(&dev, n - 8, 8);
        assert_eq!(&after[..2 * BLOCK_SIZE], &data[..2 * BLOCK_SIZE]);
        assert!(after[2 * BLOCK_SIZE..6 * BLOCK_SIZE].iter().all(|&b| b == 0));
        assert_eq!(&after[6 * BLOCK_SIZE..], &data[6 * BLOCK_SIZE..]);
        assert_eq!(dev.usage().mapped_bytes, n * BLOCK_SIZE_BYTES);
        let second = FileDevice::open(&path).expect_err("a second exclusive open");
        assert_eq!(second.kind(), ErrorKind::Io, "{second}");
    }
}
