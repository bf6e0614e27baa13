//! `tundra bench null-export` (hidden): the in-process FUSE export of `tundra mount` with the
//! least possible behind it, so that a measurement can tell what FUSE and the loop device cost
//! from what Tundra's store costs (bench/block-path's `fuse-null` step). The exported file is a
//! plain file on the host opened with `O_DIRECT` (tundra-device's `FileDevice`: one `pread` or
//! `pwrite` per request, `fdatasync` per fsync, discards punched as holes), or, with `--memory`,
//! blocks in memory (no media at all; a flush does nothing). Each request goes through the same
//! `FileExport` (crates/tundra-node/src/file_export.rs) as a mounted volume: same threads, same
//! FUSE init flags.
//!
//! It is a measuring instrument, not a product path: nothing is compressed, journalled or
//! checksummed, and the command is not listed in `tundra --help`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use tundra_device::file::FileDevice;
use tundra_device::mem::MemDevice;
use tundra_device::size::parse_size;
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};
use tundra_node::file_export::{Errno, ExportBackend, FileExport};

#[derive(Args)]
pub struct NullExportArgs {
    /// The file to mount the export on (created empty if missing).
    #[arg(long)]
    file: PathBuf,
    /// The exported file's size (a multiple of 4 KiB).
    #[arg(long)]
    size: String,
    /// The host file behind the export (created sparse at the size, opened with O_DIRECT).
    #[arg(long, conflicts_with = "memory", required_unless_present = "memory")]
    backing: Option<PathBuf>,
    /// Keep the blocks in memory instead of a host file.
    #[arg(long)]
    memory: bool,
}

/// The exported file's bytes: whole 4 KiB blocks of a device, partial ones by read-modify-write
/// (a loop device with 512-byte sectors may send them; ext4 on it does not). The drive file
/// of `tundra bench hashkv` (drive_fs.rs) serves its bytes the same way.
pub(super) struct DeviceFile {
    pub(super) device: Arc<dyn BlockDevice>,
    pub(super) size: u64,
}

fn eio(what: &str, offset: u64, e: impl std::fmt::Display) -> Errno {
    eprintln!("tundra: null export {what} at {offset}: {e}");
    Errno::EIO
}

fn is_aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(BLOCK_SIZE_BYTES) && len.is_multiple_of(BLOCK_SIZE)
}

impl DeviceFile {
    fn covering(offset: u64, len: usize) -> (u64, Vec<u8>, usize) {
        let first = offset / BLOCK_SIZE_BYTES;
        let end = (offset + len as u64).div_ceil(BLOCK_SIZE_BYTES);
        let blocks = vec![0u8; ((end - first) * BLOCK_SIZE_BYTES) as usize];
        (first, blocks, (offset - first * BLOCK_SIZE_BYTES) as usize)
    }

    pub(super) fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> tundra_device::Result<()> {
        if is_aligned(offset, buf.len()) {
            return self.device.read(Lba(offset / BLOCK_SIZE_BYTES), buf);
        }
        let (first, mut blocks, at) = Self::covering(offset, buf.len());
        self.device.read(Lba(first), &mut blocks)?;
        buf.copy_from_slice(&blocks[at..at + buf.len()]);
        Ok(())
    }

    pub(super) fn write_bytes(&self, offset: u64, data: &[u8]) -> tundra_device::Result<()> {
        if is_aligned(offset, data.len()) {
            return self.device.write(Lba(offset / BLOCK_SIZE_BYTES), data);
        }
        let (first, mut blocks, at) = Self::covering(offset, data.len());
        self.device.read(Lba(first), &mut blocks)?;
        blocks[at..at + data.len()].copy_from_slice(data);
        self.device.write(Lba(first), &blocks)
    }

    /// Whole blocks are trimmed, the partial blocks at either end written with zeros.
    pub(super) fn zero_bytes(&self, offset: u64, len: u64) -> tundra_device::Result<()> {
        let end = offset + len;
        let first_whole = offset.div_ceil(BLOCK_SIZE_BYTES);
        let end_whole = end / BLOCK_SIZE_BYTES;
        if first_whole >= end_whole {
            return self.write_bytes(offset, &vec![0u8; len as usize]);
        }
        if offset < first_whole * BLOCK_SIZE_BYTES {
            self.write_bytes(offset, &vec![0u8; (first_whole * BLOCK_SIZE_BYTES - offset) as usize])?;
        }
        self.device.trim(Lba(first_whole), end_whole - first_whole)?;
        if end > end_whole * BLOCK_SIZE_BYTES {
            self.write_bytes(end_whole * BLOCK_SIZE_BYTES, &vec![0u8; (end - end_whole * BLOCK_SIZE_BYTES) as usize])?;
        }
        Ok(())
    }
}

impl ExportBackend for DeviceFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        BLOCK_SIZE as u32
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.read_bytes(offset, buf).map_err(|e| eio("read", offset, e))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.write_bytes(offset, data).map_err(|e| eio("write", offset, e))
    }

    fn zero(&self, offset: u64, len: u64) -> Result<(), Errno> {
        self.zero_bytes(offset, len).map_err(|e| eio("zero", offset, e))
    }

    fn fsync(&self) -> Result<(), Errno> {
        self.device.flush().map_err(|e| eio("fsync", 0, e))
    }
}

pub fn run(args: NullExportArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    if size == 0 || !size.is_multiple_of(BLOCK_SIZE_BYTES) {
        bail!("--size {}: must be a positive multiple of 4 KiB", args.size);
    }
    let device: Arc<dyn BlockDevice> = match &args.backing {
        Some(path) => {
            let device = FileDevice::create(path, size)
                .with_context(|| format!("creating the backing file {}", path.display()))?;
            eprintln!("tundra: null export backed by {} (O_DIRECT: {})", path.display(), device.is_direct());
            Arc::new(device)
        }
        None => Arc::new(MemDevice::new(size / BLOCK_SIZE_BYTES)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("installing the signal handlers")?;
    }
    // As the node does for its mounts: the server of a filesystem's block device must be able
    // to allocate while the kernel reclaims memory by writing to that filesystem.
    if let Err(e) = rustix::process::configure_io_flusher_behavior(true) {
        eprintln!("tundra: warning: not an I/O flusher (prctl PR_SET_IO_FLUSHER: {e})");
    }
    let backend = Arc::new(DeviceFile { device, size });
    let export = FileExport::start(backend, &args.file, "tundra-null")
        .with_context(|| format!("mounting FUSE on {} (needs root and /dev/fuse)", args.file.display()))?;
    eprintln!("tundra: {} exported; ready; SIGTERM or Ctrl-C stops", args.file.display());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let counters = export.counters().clone();
    export.unmount().with_context(|| format!("unmounting {}", args.file.display()))?;
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "tundra: served {} reads, {} writes, {} fsyncs, {} errors; stopped cleanly",
        get(&counters.reads),
        get(&counters.writes),
        get(&counters.fsyncs),
        get(&counters.errors)
    );
    Ok(())
}
