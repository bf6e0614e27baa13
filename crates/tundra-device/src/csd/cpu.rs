//! The host CPU the emulated drive spends on what PolarCSD does in hardware (seed 000 §3.2.2):
//! its background thread (garbage collection, deferred compression, checkpoints), deflate in the
//! threads that write (inline mode, or deferred blocks compressed to make room) and inflate in
//! the threads that read. A real compressing drive costs the host none of it, so the node
//! reports it apart from its own software's CPU.
//!
//! Time is the calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), taken around whole
//! batches of blocks, not around each block, so the clock costs well under a percent of what it
//! measures. Nothing here is saved on the media: the counters start at zero with every open.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// Set on the drive's background thread, whose whole CPU time is counted on its own.
    static ON_DRIVE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// This thread's CPU time in nanoseconds (0 if the clock cannot be read).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if status != 0 {
        return 0;
    }
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// Marks the calling thread as the drive's background thread.
pub(crate) fn mark_drive_thread() {
    ON_DRIVE_THREAD.with(|flag| flag.set(true));
}

/// The drive's CPU counters, shared by its handles and threads.
#[derive(Default)]
pub(crate) struct CpuCounters {
    background_thread_ns: AtomicU64,
    host_deflate_ns: AtomicU64,
    host_inflate_ns: AtomicU64,
    deflated_blocks: AtomicU64,
    inflated_blocks: AtomicU64,
}

/// What the drive's emulation cost the host's CPU since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriveCpu {
    /// CPU time of the drive's background thread: garbage collection, deferred compression,
    /// checkpoints.
    pub background_thread_ns: u64,
    /// Deflate in the threads that write (inline compression; deferred blocks compressed by a
    /// writer to make room).
    pub host_deflate_ns: u64,
    /// Inflate in the threads that read.
    pub host_inflate_ns: u64,
    /// Blocks compressed, on any thread.
    pub deflated_blocks: u64,
    /// Blocks decompressed.
    pub inflated_blocks: u64,
}

impl DriveCpu {
    /// All of it: what a hardware drive would take off the host.
    pub fn total_ns(&self) -> u64 {
        self.background_thread_ns + self.host_deflate_ns + self.host_inflate_ns
    }
}

/// What a measured batch was.
#[derive(Clone, Copy)]
pub(crate) enum Work {
    Deflate,
    Inflate,
}

impl CpuCounters {
    /// Runs `f` on `blocks` blocks, counting its CPU time as `work` unless this is the drive's
    /// own thread (whose time is counted whole).
    pub(crate) fn measure<T>(&self, work: Work, blocks: usize, f: impl FnOnce() -> T) -> T {
        if blocks == 0 {
            return f();
        }
        let on_drive = ON_DRIVE_THREAD.with(Cell::get);
        let started = if on_drive { 0 } else { thread_cpu_ns() };
        let result = f();
        let (time, count) = match work {
            Work::Deflate => (&self.host_deflate_ns, &self.deflated_blocks),
            Work::Inflate => (&self.host_inflate_ns, &self.inflated_blocks),
        };
        count.fetch_add(blocks as u64, Ordering::Relaxed);
        if !on_drive {
            time.fetch_add(thread_cpu_ns().saturating_sub(started), Ordering::Relaxed);
        }
        result
    }

    /// [`CpuCounters::measure`] for work that ran since `started` (from [`thread_cpu_ns`]), for
    /// loops that return early on errors.
    pub(crate) fn measured(&self, work: Work, blocks: usize, started: u64) {
        let on_drive = ON_DRIVE_THREAD.with(Cell::get);
        let (time, count) = match work {
            Work::Deflate => (&self.host_deflate_ns, &self.deflated_blocks),
            Work::Inflate => (&self.host_inflate_ns, &self.inflated_blocks),
        };
        count.fetch_add(blocks as u64, Ordering::Relaxed);
        if !on_drive {
            time.fetch_add(thread_cpu_ns().saturating_sub(started), Ordering::Relaxed);
        }
    }

    /// Adds CPU time of the background thread.
    pub(crate) fn add_background(&self, ns: u64) {
        self.background_thread_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> DriveCpu {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        DriveCpu {
            background_thread_ns: get(&self.background_thread_ns),
            host_deflate_ns: get(&self.host_deflate_ns),
            host_inflate_ns: get(&self.host_inflate_ns),
            deflated_blocks: get(&self.deflated_blocks),
            inflated_blocks: get(&self.inflated_blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_timed_on_host_threads_and_counted_on_the_drive_thread() {
        let counters = CpuCounters::default();
        let spin = || (0..2_000_000u64).fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(b));
        std::hint::black_box(counters.measure(Work::Deflate, 3, spin));
        let host = counters.snapshot();
        assert_eq!(host.deflated_blocks, 3);
        assert!(host.host_deflate_ns > 0, "{host:?}");
        std::thread::scope(|s| {
            s.spawn(|| {
                mark_drive_thread();
                std::hint::black_box(counters.measure(Work::Inflate, 2, spin));
            });
        });
        let after = counters.snapshot();
        assert_eq!(after.inflated_blocks, 2);
        assert_eq!(after.host_inflate_ns, 0, "the drive thread's time is counted whole, not per batch");
        assert_eq!(after.total_ns(), host.host_deflate_ns);
    }
}
