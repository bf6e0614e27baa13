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
        while !self.shutdown.load(Ordering::SeqCst) {
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
