//! The local page path on top of the store: "compress, then apply" for writes, with Algorithm 1
//! choosing lz4 or zstd per page (seed 000 §3.3.2), and "read, decompress, verify" for reads,
//! through a bounded cache of decompressed pages. A replicated deployment runs the write half on
//! the leader only and ships the image.
//!
//! A write to part of a page (the none mode of seed 000 §3.2.3) reads and decompresses the page,
//! merges the new bytes and stores the page raw. Beyond the paper, such pages are remembered and
//! [`Pages::recompress_partial`] compresses them again once no partial write is pending, so a
//! database that writes in pieces does not leave its pages uncompressed for ever.
//!
//! Beyond the paper too, pages Algorithm 1 stored as lz4 without comparing because the host was
//! busy (line 2 of the algorithm) are remembered, and [`Pages::rechoose`] compares lz4 and zstd
//! for them once the host is idle (rechoose.rs): on 8 KiB pages lz4 often saves no 4 KiB
//! block, so such pages would otherwise stay raw.
//!
//! A [`SoftwareCompression`] policy, fixed when the path is built, can replace Algorithm 1 by one
//! algorithm or by none, for every whole page of a mode normal volume: the software-layer
//! configurations that seed 000 §5.3 (Figure 13) compares.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tundra_codec::{Algorithm, EncodedPage, HeavyConfig, PageCodec, PageHistory, PageSize, SegmentCache, Selector};

use crate::cache::{CacheStats, PageCache};
use crate::command::{HeavyPage, PagePut, StoreCommand};
use crate::ids::{ChunkId, Lsn, PageNo};
use crate::index::Encoding;
use crate::store::{HEAVY_HEADER_BYTES, PageImage, Store, page_checksum};
use crate::{Error, Result};

/// Where the CPU utilisation that Algorithm 1 looks at comes from.
pub enum CpuLoad {
    /// A fixed value, for tests and for tools that assume an idle or a busy host.
    Fixed(f64),
    /// Whatever the environment's gauge says: the real host's, or a simulated one.
    Gauge(Arc<dyn tundra_env::CpuGauge>),
}

/// How the software layer compresses the whole pages of mode normal volumes. Pages of mode none
/// volumes and partial writes are stored raw whatever the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SoftwareCompression {
    /// Algorithm 1 chooses lz4 or zstd per page (seed 000 §3.3.2); a write that names an
    /// algorithm (or raw) gets it.
    #[default]
    Auto,
    /// Every page with lz4, stored raw when that saves no 4 KiB block.
    Lz4,
    /// Every page with zstd, stored raw when that saves no 4 KiB block.
    Zstd,
    /// Every page stored raw: compression is left to the drive alone.
    Off,
}

impl SoftwareCompression {
    /// The name used in configuration files and stats.
    pub fn name(self) -> &'static str {
        match self {
            SoftwareCompression::Auto => "auto",
            SoftwareCompression::Lz4 => "lz4",
            SoftwareCompression::Zstd => "zstd",
            SoftwareCompression::Off => "off",
        }
    }

    /// The encoding every page gets whatever the writer asked: `None` under `Auto`, else
    /// `Some(algorithm)`, where `Some(None)` is raw.
    pub fn forced(self) -> Option<Option<Algorithm>> {
        match self {
            SoftwareCompression::Auto => None,
            SoftwareCompression::Lz4 => Some(Some(Algorithm::Lz4)),
            SoftwareCompression::Zstd => Some(Some(Algorithm::Zstd)),
            SoftwareCompression::Off => Some(None),
        }
    }
}

/// What a whole-page write asks for, before the policy has its say.
#[derive(Clone, Copy, Debug)]
enum Wanted {
    /// Algorithm 1, with the page's history.
    Select(PageHistory),
    /// This algorithm, or raw.
    Fixed(Option<Algorithm>),
}

/// What [`Pages::check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub pages: u64,
    pub referenced_bytes: u64,
    pub device_mapped_bytes: u64,
    /// One line per problem; empty when the store is clean.
    pub damaged: Vec<String>,
}

/// Counts of what the page path did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    pub written_lz4: u64,
    pub written_zstd: u64,
    pub written_raw: u64,
    pub reads: u64,
}

/// Pages in and out of a [`Store`].
pub struct Pages {
    store: Arc<Store>,
    selector: Selector,
    codec: PageCodec,
    page_size: PageSize,
    cpu: CpuLoad,
    written_lz4: AtomicU64,
    written_zstd: AtomicU64,
    written_raw: AtomicU64,
    reads: AtomicU64,
    cache: Mutex<PageCache>,
    /// Writes to one page are serialised, so that a partial write's read-merge-write never
    /// loses a concurrent write.
    page_locks: Vec<Mutex<()>>,
    /// Pages stored raw by partial writes, waiting to be compressed again.
    partial_raw: Mutex<HashSet<(ChunkId, PageNo)>>,
    /// Pages Algorithm 1 stored without comparing the algorithms, waiting to be chosen again
    /// when the host is idle (rechoose.rs).
    rechoose: Mutex<rechoose::Pending>,
    /// Decompressed heavy segments by first block, each with the nonce of the segment it holds.
    segments: Mutex<(SegmentCache, std::collections::HashMap<u64, u64>)>,
    heavy: HeavyConfig,
    software: SoftwareCompression,
    /// Names heavy segments for the cache of decompressed segments (see `next_segment_nonce`).
    nonces: Mutex<tundra_env::Rng>,
}

/// Decompressed heavy segments kept for the next read.
const SEGMENT_CACHE_SEGMENTS: usize = 16;
/// Pages in one heavy segment at most: about 512 KiB of input.
const HEAVY_GROUP_BYTES: usize = 512 * 1024;

/// What [`Pages::heavy_compress`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeavyReport {
    pub pages: u64,
    pub segments: u64,
    /// 4 KiB-rounded bytes the pages took before, and take now.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Stripes of the per-page write locks.
const PAGE_LOCK_STRIPES: usize = 64;
/// Pages cached by default: 64 MiB of 16 KiB pages.
pub const DEFAULT_CACHE_PAGES: usize = 4096;

impl Pages {
    /// The page path for the volumes of `store` whose pages are `page_size` long.
    pub fn new(
        store: Arc<Store>,
        page_size: PageSize,
        selector: Selector,
        codec: PageCodec,
        cpu: CpuLoad,
    ) -> Result<Pages> {
        Ok(Pages {
            store,
            selector,
            codec,
            page_size,
            cpu,
            written_lz4: AtomicU64::new(0),
            written_zstd: AtomicU64::new(0),
            written_raw: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            cache: Mutex::new(PageCache::new(DEFAULT_CACHE_PAGES)),
            page_locks: (0..PAGE_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            partial_raw: Mutex::new(HashSet::new()),
            rechoose: Mutex::new(rechoose::Pending::default()),
            segments: Mutex::new((SegmentCache::new(SEGMENT_CACHE_SEGMENTS), std::collections::HashMap::new())),
            heavy: HeavyConfig::default(),
            software: SoftwareCompression::Auto,
            nonces: Mutex::new(tundra_env::Rng::new(clock_seed())),
        })
    }

    /// This path with `policy` deciding how whole pages are compressed (default: Algorithm 1).
    pub fn with_software_compression(mut self, policy: SoftwareCompression) -> Pages {
        self.software = policy;
        self
    }

    /// This path with its heavy segments' nonces drawn from `seed` instead of the clock, so
    /// that a simulated run writes the same bytes every time.
    pub fn with_nonce_seed(self, seed: u64) -> Pages {
        *self.nonces.lock() = tundra_env::Rng::new(seed);
        self
    }

    /// A number that names one heavy segment for the cache of decompressed segments, which is
    /// keyed by the segment's first block: a segment written later to the same blocks (in this
    /// run or, with the cache empty, after a restart that reuses them) must not hit the cached
    /// one. 64 random bits make a repeat as unlikely as a checksum collision, and the page's
    /// checksum would still turn such a hit into an error, never wrong data.
    fn next_segment_nonce(&self) -> u64 {
        self.nonces.lock().next_u64()
    }

    pub fn software_compression(&self) -> SoftwareCompression {
        self.software
    }

    /// True when the pages of `chunk`'s volume are never compressed (mode none).
    fn uncompressed(&self, chunk: ChunkId) -> bool {
        self.store.volume(chunk.volume()).is_some_and(|v| v.mode == crate::volume::VolumeMode::None)
    }

    /// Algorithm 1's view of a page about to be rewritten: `update_fraction` of it changed
    /// since its last write (None: unknown, the choice is made again).
    fn history(&self, chunk: ChunkId, page: PageNo, update_fraction: Option<f64>) -> PageHistory {
        match self.store.entry(chunk, page) {
            None => PageHistory::FirstWrite,
            Some(entry) => PageHistory::Rewrite {
                last_algorithm: if entry.encoding == Encoding::Zstd { Algorithm::Zstd } else { Algorithm::Lz4 },
                update_fraction: update_fraction.unwrap_or(1.0),
            },
        }
    }

    /// Encodes a whole page: raw on a volume of mode none; otherwise as the policy forces, or
    /// as the writer asked under `Auto`. `cpu` caches the CPU utilisation for a batch.
    /// Compression that saves no 4 KiB block stores the page raw.
    fn encode_whole(
        &self,
        chunk: ChunkId,
        content: &[u8],
        wanted: Wanted,
        cpu: &mut Option<f64>,
    ) -> Result<EncodedPage> {
        self.encode_noting(chunk, content, wanted, cpu).map(|(page, _)| page)
    }

    /// [`Pages::encode_whole`], also saying whether Algorithm 1 chose without comparing the two
    /// algorithms in a way worth revisiting (rechoose.rs): lz4 because the host was busy, or a
    /// raw page's assumed lz4 kept for a rewrite.
    fn encode_noting(
        &self,
        chunk: ChunkId,
        content: &[u8],
        wanted: Wanted,
        cpu: &mut Option<f64>,
    ) -> Result<(EncodedPage, bool)> {
        if self.uncompressed(chunk) {
            return Ok((raw(content), false));
        }
        let wanted = self.software.forced().map_or(wanted, Wanted::Fixed);
        match wanted {
            Wanted::Fixed(None) => Ok((raw(content), false)),
            Wanted::Fixed(Some(algorithm)) => Ok((self.codec.encode(algorithm, content).map_err(codec_error)?, false)),
            Wanted::Select(history) => {
                let cpu = match *cpu {
                    Some(cpu) => cpu,
                    None => *cpu.insert(self.cpu_load()?),
                };
                let selection = self.selector.select(content, history, cpu).map_err(codec_error)?;
                let revisit = rechoose::worth_revisiting(&selection);
                Ok((selection.page, revisit))
            }
        }
    }

    /// Replaces the page cache with one of `pages` pages (0 turns caching off).
    pub fn set_cache_pages(&self, pages: usize) {
        *self.cache.lock() = PageCache::new(pages);
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.lock().stats()
    }

    fn page_lock(&self, chunk: ChunkId, page: PageNo) -> &Mutex<()> {
        &self.page_locks[self.stripe(chunk, page)]
    }

    /// Stores an image of `content` and gives the page's cached copy, if the cache holds one,
    /// the new content (see `forget_written`). The change follows the index install, so a
    /// reader that cached the old version before the install is undone by it.
    fn apply(&self, chunk: ChunkId, page: PageNo, image: PageImage, lsn: Lsn, content: &[u8]) -> Result<()> {
        self.store.apply(&StoreCommand::PutPages { chunk, pages: vec![PagePut { page, image, lsn }] })?;
        self.cache.lock().replace((chunk, page), || Arc::from(content));
        Ok(())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Refuses a page whose length or volume does not match this page path.
    fn check_page(&self, chunk: ChunkId, content_len: usize) -> Result<()> {
        let volume = self
            .store
            .volume(chunk.volume())
            .ok_or_else(|| Error::invalid(format!("no volume {}", chunk.volume().0)))?;
        if volume.page_size as usize != self.page_size.bytes() || content_len != self.page_size.bytes() {
            return Err(Error::invalid(format!(
                "a page of {content_len} bytes for volume {:?} of {}-byte pages, through a path for {}",
                volume.name, volume.page_size, self.page_size
            )));
        }
        Ok(())
    }

    /// Compresses a page with the algorithm Algorithm 1 picks (or the one the policy forces)
    /// and stores it. `update_fraction` is the database layer's estimate of how much of the
    /// page changed since its last write (None when it has no estimate: the choice is made
    /// again). Returns how the page was stored: raw when compression saves no block, the
    /// policy is off or the volume is of mode none.
    pub fn write_page(
        &self,
        chunk: ChunkId,
        page: PageNo,
        content: &[u8],
        lsn: Lsn,
        update_fraction: Option<f64>,
    ) -> Result<Encoding> {
        self.check_page(chunk, content.len())?;
        let _one_writer = self.page_lock(chunk, page).lock();
        self.partial_raw.lock().remove(&(chunk, page));
        let wanted = Wanted::Select(self.history(chunk, page, update_fraction));
        let (encoded, revisit) = self.encode_noting(chunk, content, wanted, &mut None)?;
        let stored = self.store_encoded(chunk, page, content, encoded, lsn)?;
        self.rechoose.lock().note(chunk, page, revisit);
        Ok(stored)
    }

    /// Writes several whole pages of one chunk with one journal commit (a write-back cache's
    /// flush): each is compressed as [`Pages::write_page`] would (Algorithm 1 or the policy's
    /// algorithm, or raw on a volume of mode none), then all are stored together. Each item is
    /// (page, content, lsn, update fraction); pages must be distinct.
    pub fn write_pages(&self, chunk: ChunkId, pages: &[(PageNo, &[u8], Lsn, Option<f64>)]) -> Result<()> {
        // Every page's writer lock, taken in stripe order so that two batches cannot deadlock.
        let mut stripes: Vec<usize> = pages.iter().map(|&(page, ..)| self.stripe(chunk, page)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let _writers: Vec<_> = stripes.iter().map(|&i| self.page_locks[i].lock()).collect();
        let (command, counters, revisits) = self.encode_batch(chunk, pages)?;
        self.store.apply(&command)?;
        self.forget_written(chunk, pages);
        for counter in counters {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        // After `forget`, which dropped these pages from the set: how each was just stored.
        let mut rechoose = self.rechoose.lock();
        for (&(page, ..), revisit) in pages.iter().zip(revisits) {
            rechoose.note(chunk, page, revisit);
        }
        Ok(())
    }

    /// The leader's half of [`Pages::write_pages`] (seed 000 §3.2.1, Figure 4 step 1): the
    /// pages compressed as `write_pages` would, into the [`StoreCommand::PutPages`] a Raft
    /// leader proposes, so that Algorithm 1 runs once and every replica applies these bytes.
    /// Nothing is stored; the caller serialises writes to a page (a Raft group's log does).
    pub fn encode_pages(&self, chunk: ChunkId, pages: &[(PageNo, &[u8], Lsn, Option<f64>)]) -> Result<StoreCommand> {
        Ok(self.encode_batch(chunk, pages)?.0)
    }

    /// Encodes whole pages of one chunk into one command, with the counter each page is
    /// counted under once stored and whether Algorithm 1 chose it without a comparison worth
    /// revisiting (rechoose.rs).
    fn encode_batch(
        &self,
        chunk: ChunkId,
        pages: &[(PageNo, &[u8], Lsn, Option<f64>)],
    ) -> Result<(StoreCommand, Vec<&AtomicU64>, Vec<bool>)> {
        for &(_, content, _, _) in pages {
            self.check_page(chunk, content.len())?;
        }
        let mut cpu = None;
        let mut images = Vec::with_capacity(pages.len());
        let mut counters = Vec::with_capacity(pages.len());
        let mut revisits = Vec::with_capacity(pages.len());
        for &(page, content, lsn, update_fraction) in pages {
            let wanted = Wanted::Select(self.history(chunk, page, update_fraction));
            let (encoded, revisit) = self.encode_noting(chunk, content, wanted, &mut cpu)?;
            let (image, counter) = self.image(chunk, page, content, encoded);
            images.push(PagePut { page, image, lsn });
            counters.push(counter);
            revisits.push(revisit);
        }
        Ok((StoreCommand::PutPages { chunk, pages: images }, counters, revisits))
    }

    /// Applies a command through `apply` (the store's, or a replica's marked apply) and then
    /// forgets the cached copies of the pages it changed, so that a reader on this path never
    /// sees a page older than the store holds. The one way a replicated command reaches a
    /// replica that also serves reads.
    pub fn apply_command(&self, command: &StoreCommand, apply: impl FnOnce(&StoreCommand) -> Result<()>) -> Result<()> {
        apply(command)?;
        self.forget(command);
        Ok(())
    }

    /// Drops what the page cache and the partial-write list hold of the pages `command` names
    /// (all of a chunk's, for a command that names no pages).
    pub fn forget(&self, command: &StoreCommand) {
        let Some(chunk) = command.chunk() else { return };
        let pages: Vec<PageNo> = match command {
            StoreCommand::PutPages { pages, .. } => pages.iter().map(|put| put.page).collect(),
            StoreCommand::TrimPages { pages, .. } => pages.clone(),
            StoreCommand::PutHeavy { pages, .. } => pages.iter().map(|heavy| heavy.page).collect(),
            _ => Vec::new(),
        };
        self.forget_pages(chunk, pages.into_iter().map(|page| (page, None)));
    }

    /// [`Pages::forget`] after this path stored `written` (whole pages of `chunk`, the page
    /// writers' locks held): a page the cache holds gets its new content instead of being
    /// dropped. A page read to merge a piece of a write into it (the write-back cache merging a
    /// filesystem's block into a larger page) is then found for the next piece, as a redo log's
    /// tail page is written piece by piece, one flush after another, and a read of the device
    /// per piece is spared. A page the cache does not hold stays out: writes alone do not fill
    /// it. Under the cache's lock after the install, so a reader that loaded the page's older
    /// version does not cache it (`remember` checks the entry).
    fn forget_written(&self, chunk: ChunkId, written: &[(PageNo, &[u8], Lsn, Option<f64>)]) {
        self.forget_pages(chunk, written.iter().map(|&(page, content, ..)| (page, Some(content))));
    }

    /// Takes `pages` of `chunk` out of the partial-write list and the rechoose set, and out of
    /// the cache, or, with their new content, gives a cached copy that content.
    fn forget_pages<'a>(&self, chunk: ChunkId, pages: impl Iterator<Item = (PageNo, Option<&'a [u8]>)>) {
        let mut partial = self.partial_raw.lock();
        let mut cache = self.cache.lock();
        let mut rechoose = self.rechoose.lock();
        for (page, content) in pages {
            partial.remove(&(chunk, page));
            match content {
                Some(content) => cache.replace((chunk, page), || Arc::from(content)),
                None => cache.invalidate((chunk, page)),
            }
            rechoose.note(chunk, page, false);
        }
    }

    /// Drops every cached page: after a chunk was replaced whole (a snapshot installed).
    pub fn forget_all(&self) {
        let pages = self.cache.lock().capacity();
        *self.cache.lock() = PageCache::new(pages);
        self.partial_raw.lock().clear();
        *self.rechoose.lock() = rechoose::Pending::default();
        *self.segments.lock() = (SegmentCache::new(SEGMENT_CACHE_SEGMENTS), std::collections::HashMap::new());
    }

    /// The host's CPU utilisation for Algorithm 1, in [0, 1].
    fn cpu_load(&self) -> Result<f64> {
        let fraction = match &self.cpu {
            CpuLoad::Fixed(fraction) => *fraction,
            CpuLoad::Gauge(gauge) => gauge.busy_fraction().map_err(Error::invalid)?,
        };
        Ok(fraction.clamp(0.0, 1.0))
    }

    /// The image the store keeps of a page the codec has encoded, and the counter of pages
    /// stored that way (counted once the store holds it).
    fn image(&self, chunk: ChunkId, page: PageNo, content: &[u8], encoded: EncodedPage) -> (PageImage, &AtomicU64) {
        let (encoding, counter) = match encoded.encoding {
            tundra_codec::Encoding::Raw => (Encoding::Raw, &self.written_raw),
            tundra_codec::Encoding::Compressed(Algorithm::Lz4) => (Encoding::Lz4, &self.written_lz4),
            tundra_codec::Encoding::Compressed(Algorithm::Zstd) => (Encoding::Zstd, &self.written_zstd),
        };
        (PageImage { encoding, bytes: encoded.data, checksum: page_checksum(chunk, page, content) }, counter)
    }

    /// Stores a page the codec has encoded, and counts how it was stored.
    fn store_encoded(
        &self,
        chunk: ChunkId,
        page: PageNo,
        content: &[u8],
        encoded: EncodedPage,
        lsn: Lsn,
    ) -> Result<Encoding> {
        let (image, counter) = self.image(chunk, page, content, encoded);
        let encoding = image.encoding;
        self.apply(chunk, page, image, lsn, content)?;
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(encoding)
    }

    /// Compresses a page with `algorithm` (None: raw), whatever Algorithm 1 would say, and
    /// stores it: for writers that choose, and for measuring one algorithm against another.
    /// A policy other than `Auto` still has the last word, and a volume of mode none is
    /// stored raw.
    pub fn write_page_with(
        &self,
        chunk: ChunkId,
        page: PageNo,
        content: &[u8],
        lsn: Lsn,
        algorithm: Option<Algorithm>,
    ) -> Result<()> {
        self.check_page(chunk, content.len())?;
        let _one_writer = self.page_lock(chunk, page).lock();
        self.partial_raw.lock().remove(&(chunk, page));
        self.rechoose.lock().note(chunk, page, false);
        let encoded = self.encode_whole(chunk, content, Wanted::Fixed(algorithm), &mut None)?;
        self.store_encoded(chunk, page, content, encoded, lsn).map(|_| ())
    }

    fn stripe(&self, chunk: ChunkId, page: PageNo) -> usize {
        let hash = chunk.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(page.0).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (hash % PAGE_LOCK_STRIPES as u64) as usize
    }

    /// Removes a page: it reads as absent from now on. Trims go through here, not the store,
    /// so that the page cache forgets the page.
    pub fn trim_page(&self, chunk: ChunkId, page: PageNo) -> Result<()> {
        let _one_writer = self.page_lock(chunk, page).lock();
        self.partial_raw.lock().remove(&(chunk, page));
        self.rechoose.lock().note(chunk, page, false);
        self.store.apply(&StoreCommand::TrimPages { chunk, pages: vec![page] })?;
        self.cache.lock().invalidate((chunk, page));
        Ok(())
    }

    pub fn counts(&self) -> PageCounts {
        PageCounts {
            written_lz4: self.written_lz4.load(Ordering::Relaxed),
            written_zstd: self.written_zstd.load(Ordering::Relaxed),
            written_raw: self.written_raw.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
        }
    }
}

/// A page stored as is.
fn raw(content: &[u8]) -> EncodedPage {
    EncodedPage { encoding: tundra_codec::Encoding::Raw, data: content.to_vec() }
}

/// A seed for the nonces of a real run: the clock and a process-wide count, so that runs differ
/// (nonces must not repeat across restarts; see `Pages::next_segment_nonce`) and so do two
/// page paths made in the same instant.
fn clock_seed() -> u64 {
    static PATHS: AtomicU64 = AtomicU64::new(0);
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    clock ^ PATHS.fetch_add(1, Ordering::Relaxed).rotate_left(48)
}

/// Codec errors from stored bytes are corruption; from a caller's input, invalid requests. The
/// message is the codec's own, without its kind: the store's error names the kind once.
fn codec_error(error: tundra_codec::Error) -> Error {
    match error.kind() {
        tundra_codec::ErrorKind::Corrupted => Error::corrupted(error.message()),
        _ => Error::invalid(error.message()),
    }
}

mod check;
mod heavy;
mod partial;
mod read;
mod rechoose;

pub use heavy::HeavyPlan;
pub use rechoose::RechooseStats;
#[cfg(test)]
mod tests;
