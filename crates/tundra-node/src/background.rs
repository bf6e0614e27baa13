//! The node's periodic upkeep: once a second the write-back cache is written to the store,
//! replicas' deferred applies are made durable, redo is folded into pages (and records past the
//! redo cache leave memory for their log slots), pages that partial writes left raw are
//! compressed again, and, when the host is idle, a bounded number of pages written while it was
//! busy are chosen again (tundra-store's rechoose.rs); every 50 ms the page images small commits
//! left for later are written to their blocks, and each store checkpoints if its journal asks
//! for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Result;
use crate::node::Node;

impl Node {
    /// Background work, called about once a second: writes the write-back cache to the store
    /// (so unflushed writes are at most about a second old), checkpoints when the journal is
    /// half full, compresses pages partial writes left raw (as the software setting says:
    /// never when it is off).
    pub fn background(&self) -> Result<()> {
        self.flush_dirty()?;
        self.fold_redo(crate::redo::FOLD_PAGES_PER_PASS)?;
        self.spill_redo()?;
        // A replica's applies are deferred (their Raft log replays them after a crash): synced
        // here, so a restart replays at most about a second of them.
        self.data.sync()?;
        self.fast.sync()?;
        self.checkpoint_if_wanted()?;
        for pages in self.paths.values() {
            pages.recompress_partial()?;
            pages.rechoose(self.rechoose_pages, self.rechoose_idle_below)?;
        }
        Ok(())
    }

    /// Writes the page images small commits left for later (the fast store's write-behind,
    /// tundra-store's `Unwritten`), then checkpoints each store whose journal asks for one.
    /// Cheap when there is nothing to do; the background loop calls it every 50 ms, since
    /// commits that carry their page images (a WAL write and its fsync) fill a third of the
    /// log's ring in well under a second, and until the next checkpoint further commits flush
    /// the data device instead.
    pub fn checkpoint_if_wanted(&self) -> Result<()> {
        self.data.write_unwritten()?;
        self.fast.write_unwritten()?;
        self.data.maybe_checkpoint()?;
        self.fast.maybe_checkpoint()?;
        Ok(())
    }
}

/// Runs `node.background()` every `period` until `stop` is set, and the stores' checkpoints
/// when their journals want one every 50 ms; errors are reported to `log`.
pub fn background_loop(node: &Node, period: Duration, stop: &AtomicBool, log: &dyn Fn(&str)) {
    // A checkpoint that fails fails again 50 ms later: said once, until it succeeds or fails
    // otherwise.
    let mut checkpoint_failure: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut waited = Duration::ZERO;
        while waited < period && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            waited += Duration::from_millis(50);
            match node.checkpoint_if_wanted() {
                Ok(()) => checkpoint_failure = None,
                Err(e) => {
                    let message = format!("a checkpoint failed: {e}");
                    if checkpoint_failure.as_ref() != Some(&message) {
                        log(&message);
                        checkpoint_failure = Some(message);
                    }
                }
            }
        }
        if let Err(e) = node.background() {
            log(&format!("background work failed: {e}"));
        }
    }
}
