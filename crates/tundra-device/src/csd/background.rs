//! The drive's own work, done by a background thread (or, without one, by writers when it cannot
//! wait): garbage collection above a low watermark of free segments, the deferred compression
//! pass, and map checkpoints every so many sealed segments. The first error stops the thread and
//! fails the drive, which then refuses every request until it is reopened.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::{BLOCK_SIZE_BYTES, Result};

use super::{Shared, state};

impl Shared {
    /// Wakes the background thread when there is work for it, or does the work that cannot
    /// wait itself when there is no background thread.
    pub(super) fn after_append(&self) -> Result<()> {
        let (checkpoint_due, deferred) = {
            let state = self.state.lock();
            (state.sealed_since_checkpoint >= self.checkpoint_interval(), !state.deferred.is_empty())
        };
        if self.config.background {
            if checkpoint_due || deferred {
                self.wake.notify_all();
            }
            return Ok(());
        }
        if checkpoint_due {
            self.write_checkpoint()?;
        }
        Ok(())
    }

    /// Segments sealed between checkpoints: enough that checkpoint writes stay near a tenth of
    /// the segment writes, and the recovery scan stays bounded by the same number.
    fn checkpoint_interval(&self) -> u32 {
        if self.config.checkpoint_interval_segments > 0 {
            return self.config.checkpoint_interval_segments;
        }
        let checkpoint_bytes = self.geometry.checkpoint_blocks() * BLOCK_SIZE_BYTES;
        (10 * checkpoint_bytes / self.geometry.segment_bytes).clamp(16, 1024) as u32
    }

    /// The background thread: keeps free segments above a low watermark, compresses deferred
    /// blocks, and writes checkpoints when due. It stops at the first error, which the drive
    /// then reports to every caller.
    pub(super) fn background(&self) {
        super::cpu::mark_drive_thread();
        lower_priority();
        let mut counted = super::cpu::thread_cpu_ns();
        while !self.shutdown.load(Ordering::SeqCst) {
            let now = super::cpu::thread_cpu_ns();
            self.cpu.add_background(now.saturating_sub(counted));
            counted = now;
            {
                let mut state = self.state.lock();
                let idle = state.free.len() >= self.free_low_watermark()
                    && state.deferred.is_empty()
                    && state.sealed_since_checkpoint < self.checkpoint_interval();
                if idle {
                    self.wake.wait_for(&mut state, Duration::from_millis(50));
                }
            }
            if let Err(error) = self.background_pass() {
                let mut state = self.state.lock();
                state.failed.get_or_insert_with(|| format!("background work failed: {error}"));
                return;
            }
        }
    }

    fn background_pass(&self) -> Result<()> {
        while self.state.lock().free.len() < self.free_low_watermark() && !self.shutdown.load(Ordering::SeqCst) {
            if !self.gc_one()? {
                break;
            }
        }
        self.compress_deferred(256)?;
        if self.state.lock().sealed_since_checkpoint >= self.checkpoint_interval() {
            self.write_checkpoint()?;
        }
        Ok(())
    }

    /// Garbage collection starts in the background below this many free segments.
    fn free_low_watermark(&self) -> usize {
        let reserve = (self.geometry.segment_count - self.geometry.usable_segments) as usize;
        state::GC_RESERVE_SEGMENTS + reserve.div_ceil(2)
    }
}

/// The nice value of the drive's background thread, lower in priority than the host's threads:
/// a real drive's controller does this work beside the host, never instead of it, so on a
/// busy host the emulation yields the CPU to the database and its own work waits. Writers
/// still compress themselves when the drive runs out of room (`admit`), so a backlog never
/// makes a write fail.
const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority by [`BACKGROUND_NICE`]; best effort.
fn lower_priority() {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
    // SAFETY: setpriority on this thread's id; a failure only leaves the priority as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, tid, BACKGROUND_NICE);
    }
}
