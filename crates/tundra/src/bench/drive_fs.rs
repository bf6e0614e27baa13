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

use super::null_export::DeviceFile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use tundra_device::csd::{CsdConfig, CsdDevice, CsdStats, FormatOptions};
use tundra_device::file::FileDevice;
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice};
use tundra_node::file_export::{Errno, ExportBackend, FileExport};

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
    file: DeviceFile,
    threads: Arc<ServingThreads>,
}

fn eio(what: &str, offset: u64, e: impl std::fmt::Display) -> Errno {
    eprintln!("tundra bench: drive file {what} at {offset}: {e}");
    Errno::EIO
}

impl ExportBackend for DriveFile {
    fn size(&self) -> u64 {
        self.file.size
    }

    fn block_size(&self) -> u32 {
        BLOCK_SIZE as u32
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.file.read_bytes(offset, buf).map_err(|e| eio("read", offset, e))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.file.write_bytes(offset, data).map_err(|e| eio("write", offset, e))
    }

    fn zero(&self, offset: u64, len: u64) -> Result<(), Errno> {
        self.file.zero_bytes(offset, len).map_err(|e| eio("zero", offset, e))
    }

    fn fsync(&self) -> Result<(), Errno> {
        self.file.device.flush().map_err(|e| eio("fsync", 0, e))
    }

    fn on_request(&self) {
        self.threads.note();
    }
}

/// A drive with ext4 mounted on it; everything is taken down by [`DriveFs::close`] (or, as
/// well as it can, when dropped).
pub struct DriveFs {
    csd: Arc<CsdDevice>,
    threads: Arc<ServingThreads>,
    mount_point: PathBuf,
    loop_device: Option<String>,
    mounted: bool,
    export: Option<FileExport>,
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
        let device: Arc<dyn tundra_device::BlockDevice> = csd.clone();
        let size = csd.block_count() * BLOCK_SIZE_BYTES;
        let backend = Arc::new(DriveFile { file: DeviceFile { device, size }, threads: threads.clone() });
        let export = FileExport::start(backend, &file, "tundra-bench-drive")
            .with_context(|| format!("mounting FUSE on {} (needs root and /dev/fuse)", file.display()))?;
        let mut drive_fs =
            DriveFs { csd, threads, mount_point, loop_device: None, mounted: false, export: Some(export) };
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
        if let Some(export) = self.export.take() {
            export.unmount().context("unmounting the drive's file")?;
        }
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
