//! Pages written while the host was busy, chosen again when it is idle.
//!
//! Algorithm 1 (seed 000 §3.3.2) picks lz4 without running zstd when the host's CPU is over 20%
//! (line 2), and for a rewrite with few updates keeps the page's last algorithm. On 8 KiB pages
//! lz4 often saves no 4 KiB block, so a page written under load is stored raw, and a raw page's
//! rewrites keep "lz4" and stay raw: a database loaded on a busy host would keep most of its
//! pages uncompressed for ever. This pass remembers the pages whose encoding was decided
//! without a comparison, and when the host is idle compares both algorithms for a bounded
//! number of them, storing the page again where the comparison chooses another encoding. It
//! follows the shape of the partial-write pass (partial.rs): a set of pending pages taken a
//! batch at a time, each re-stored under its page lock only if its entry did not change since
//! it was read, at the LSN it had.
//!
//! The pending set is memory only, bounded at [`MAX_PENDING_PAGES`]; pages noted past that
//! are counted and left as they are (a restart forgets the set the same way). The pass runs
//! only below a CPU threshold the caller gives (Algorithm 1's own by default) and at most
//! `max_pages` pages a call, so the caller sets the rate.

use std::collections::HashSet;

use tundra_codec::{PageHistory, Reason, Selection};

use super::*;

/// Pages remembered at most (16 bytes each in the set, some 24 MiB with the table's overhead).
pub const MAX_PENDING_PAGES: usize = 1 << 20;

/// What the pass has done since the page path was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RechooseStats {
    /// Pages waiting to be chosen again.
    pub pending_pages: u64,
    /// Pages not remembered because the set was full.
    pub dropped_pages: u64,
    /// Pages compared again.
    pub examined_pages: u64,
    /// Pages stored again with another encoding.
    pub rewritten_pages: u64,
    /// 4 KiB-rounded bytes the rewritten pages took before, and take now.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Calls that found the host busy and did nothing.
    pub busy_passes: u64,
}

/// The pending set and the pass's counters.
#[derive(Default)]
pub(super) struct Pending {
    pages: HashSet<(ChunkId, PageNo)>,
    stats: RechooseStats,
}

impl Pending {
    /// Records how a page was just stored: to be chosen again (`revisit`) or not.
    pub fn note(&mut self, chunk: ChunkId, page: PageNo, revisit: bool) {
        if !revisit {
            self.pages.remove(&(chunk, page));
        } else if self.pages.len() < MAX_PENDING_PAGES {
            self.pages.insert((chunk, page));
        } else if !self.pages.contains(&(chunk, page)) {
            self.stats.dropped_pages += 1;
        }
    }

    fn take(&mut self, max_pages: usize) -> Vec<(ChunkId, PageNo)> {
        let batch: Vec<_> = self.pages.iter().take(max_pages).copied().collect();
        for key in &batch {
            self.pages.remove(key);
        }
        batch
    }
}

/// Whether a selection was made without comparing the algorithms in a way a comparison could
/// improve: lz4 because the host was busy, or a kept lz4 that saves no block (a raw page).
pub(super) fn worth_revisiting(selection: &Selection) -> bool {
    match selection.reason {
        Reason::CpuBusy => true,
        Reason::KeptLastAlgorithm => selection.page.encoding == tundra_codec::Encoding::Raw,
        Reason::Compared(_) => false,
    }
}

impl Pages {
    /// The pass: if the host is idle (CPU at or below `idle_below`, normally Algorithm 1's own
    /// busy threshold), compares lz4 and zstd for up to `max_pages` pending pages and stores
    /// each again whose chosen encoding differs from the stored one. Returns the counters after
    /// the call.
    pub fn rechoose(&self, max_pages: usize, idle_below: f64) -> Result<RechooseStats> {
        if self.software != SoftwareCompression::Auto || max_pages == 0 {
            return Ok(self.rechoose_stats());
        }
        if self.rechoose.lock().pages.is_empty() {
            return Ok(self.rechoose_stats());
        }
        if self.cpu_load()? > idle_below {
            self.rechoose.lock().stats.busy_passes += 1;
            return Ok(self.rechoose_stats());
        }
        let batch = self.rechoose.lock().take(max_pages);
        for (chunk, page) in batch {
            self.rechoose_one(chunk, page)?;
        }
        Ok(self.rechoose_stats())
    }

    pub fn rechoose_stats(&self) -> RechooseStats {
        let pending = self.rechoose.lock();
        RechooseStats { pending_pages: pending.pages.len() as u64, ..pending.stats }
    }

    fn rechoose_one(&self, chunk: ChunkId, page: PageNo) -> Result<()> {
        let Some(entry) = self.store.entry(chunk, page) else { return Ok(()) };
        if !matches!(entry.encoding, Encoding::Raw | Encoding::Lz4) || self.uncompressed(chunk) {
            return Ok(());
        }
        let Some(content) = self.read_page(chunk, page)? else { return Ok(()) };
        // Compared as for a first write on an idle host: both algorithms, Algorithm 1's rule.
        let selection = self.selector.select(&content, PageHistory::FirstWrite, 0.0).map_err(codec_error)?;
        let chosen = match selection.page.encoding {
            tundra_codec::Encoding::Raw => Encoding::Raw,
            tundra_codec::Encoding::Compressed(Algorithm::Lz4) => Encoding::Lz4,
            tundra_codec::Encoding::Compressed(Algorithm::Zstd) => Encoding::Zstd,
        };
        self.rechoose.lock().stats.examined_pages += 1;
        if chosen == entry.encoding {
            return Ok(());
        }
        // A write since the read would have changed the entry: then the pass has nothing to
        // do (the write decided the page's encoding, and noted it again if it must).
        let _one_writer = self.page_lock(chunk, page).lock();
        if self.store.entry(chunk, page) != Some(entry) {
            return Ok(());
        }
        let after = selection.page.bytes_4k() as u64;
        self.store_encoded(chunk, page, &content, selection.page, entry.lsn)?;
        let mut pending = self.rechoose.lock();
        pending.stats.rewritten_pages += 1;
        pending.stats.bytes_before += u64::from(entry.run.count) * tundra_device::BLOCK_SIZE_BYTES;
        pending.stats.bytes_after += after;
        Ok(())
    }
}
