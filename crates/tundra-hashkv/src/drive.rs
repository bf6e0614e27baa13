//! [`Drive`]: the compressing drive as the store uses it, counting the CPU time the store's
//! threads spend inside the drive's calls. The emulated drive compresses and decompresses on
//! the host's CPU, work a real drive with built-in compression does in its own hardware
//! (seed 001 §2), so the benchmark reports that share apart from the store's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tundra_device::csd::{CsdDevice, CsdStats};
use tundra_device::{BlockDevice, Lba, Result, Usage};

/// The drive, and the thread CPU time spent in its calls so far.
pub struct Drive {
    csd: Arc<CsdDevice>,
    cpu_ns: AtomicU64,
}

impl Drive {
    pub fn new(csd: Arc<CsdDevice>) -> Drive {
        Drive { csd, cpu_ns: AtomicU64::new(0) }
    }

    pub fn csd(&self) -> &Arc<CsdDevice> {
        &self.csd
    }

    pub fn stats(&self) -> CsdStats {
        self.csd.stats()
    }

    /// Thread CPU time spent inside the drive's read, write, trim and flush calls, in
    /// nanoseconds: compression, decompression, the drive's locks and its media system calls.
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_ns.load(Ordering::Relaxed)
    }

    fn metered<T>(&self, call: impl FnOnce(&CsdDevice) -> T) -> T {
        let before = thread_cpu_ns();
        let out = call(&self.csd);
        self.cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(before), Ordering::Relaxed);
        out
    }
}

impl BlockDevice for Drive {
    fn block_count(&self) -> u64 {
        self.csd.block_count()
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()> {
        self.metered(|d| d.read(lba, buf))
    }

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        self.metered(|d| d.write(lba, data))
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        self.metered(|d| d.trim(lba, block_count))
    }

    fn flush(&self) -> Result<()> {
        self.metered(|d| d.flush())
    }

    fn usage(&self) -> Usage {
        self.csd.usage()
    }
}

/// The calling thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> u64 {
    // SAFETY: clock_gettime writes into the zeroed timespec we own; the clock id is valid.
    let time = unsafe {
        let mut time: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time);
        time
    };
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}
