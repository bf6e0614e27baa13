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
//! A [`SoftwareCompression`] policy, fixed when the path is built, can replace Algorithm 1 by one
//! algorithm or by none, for every whole page of a mode normal volume: the software-layer
//! configurations that seed 000 §5.3 (Figure 13) compares.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tundra_codec::{
    Algorithm, CpuSampler, EncodedPage, HeavyConfig, PageCodec, PageHistory, PageSize, SegmentCache, Selector,
};

use crate::cache::{CacheStats, PageCache};
use crate::ids::{ChunkId, Lsn, PageNo};
use crate::index::Encoding;
use crate::store::{HEAVY_HEADER_BYTES, PageImage, Store, page_checksum};
use crate::{Error, Result};

/// Where the CPU utilisation that Algorithm 1 looks at comes from.
pub enum CpuLoad {
    /// Sampled from /proc/stat at each write.
    Sampled(Mutex<CpuSampler>),
    /// A fixed value, for tests and for tools that assume an idle or a busy host.
    Fixed(f64),
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
    /// Decompressed heavy segments by first block, each with the nonce of the segment it holds.
    segments: Mutex<(SegmentCache, std::collections::HashMap<u64, u64>)>,
    heavy: HeavyConfig,
    software: SoftwareCompression,
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
            segments: Mutex::new((SegmentCache::new(SEGMENT_CACHE_SEGMENTS), std::collections::HashMap::new())),
            heavy: HeavyConfig::default(),
            software: SoftwareCompression::Auto,
        })
    }

    /// This path with `policy` deciding how whole pages are compressed (default: Algorithm 1).
    pub fn with_software_compression(mut self, policy: SoftwareCompression) -> Pages {
        self.software = policy;
        self
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
        if self.uncompressed(chunk) {
            return Ok(raw(content));
        }
        let wanted = self.software.forced().map_or(wanted, Wanted::Fixed);
        match wanted {
            Wanted::Fixed(None) => Ok(raw(content)),
            Wanted::Fixed(Some(algorithm)) => self.codec.encode(algorithm, content).map_err(codec_error),
            Wanted::Select(history) => {
                let cpu = match *cpu {
                    Some(cpu) => cpu,
                    None => *cpu.insert(self.cpu_load()?),
                };
                Ok(self.selector.select(content, history, cpu).map_err(codec_error)?.page)
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

    /// Stores an image and drops the page's cached copy. The drop follows the index install, so
    /// a reader that cached the old version before the install is undone by it.
    fn apply(&self, chunk: ChunkId, page: PageNo, image: &PageImage, lsn: Lsn) -> Result<()> {
        self.store.apply_write(chunk, page, image, lsn)?;
        self.cache.lock().invalidate((chunk, page));
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
        let encoded = self.encode_whole(chunk, content, wanted, &mut None)?;
        self.store_encoded(chunk, page, content, encoded, lsn)
    }

    /// Writes several whole pages of one chunk with one journal commit (a write-back cache's
    /// flush): each is compressed as [`Pages::write_page`] would (Algorithm 1 or the policy's
    /// algorithm, or raw on a volume of mode none), then all are stored together. Each item is
    /// (page, content, lsn, update fraction); pages must be distinct.
    pub fn write_pages(&self, chunk: ChunkId, pages: &[(PageNo, &[u8], Lsn, Option<f64>)]) -> Result<()> {
        for &(_, content, _, _) in pages {
            self.check_page(chunk, content.len())?;
        }
        // Every page's writer lock, taken in stripe order so that two batches cannot deadlock.
        let mut stripes: Vec<usize> = pages.iter().map(|&(page, ..)| self.stripe(chunk, page)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let _writers: Vec<_> = stripes.iter().map(|&i| self.page_locks[i].lock()).collect();
        let mut cpu = None;
        let mut images = Vec::with_capacity(pages.len());
        let mut counters = Vec::with_capacity(pages.len());
        for &(page, content, lsn, update_fraction) in pages {
            let wanted = Wanted::Select(self.history(chunk, page, update_fraction));
            let encoded = self.encode_whole(chunk, content, wanted, &mut cpu)?;
            let (image, counter) = self.image(chunk, page, content, encoded);
            images.push((page, image, lsn));
            counters.push(counter);
        }
        self.store.apply_writes(chunk, &images)?;
        {
            let mut partial = self.partial_raw.lock();
            let mut cache = self.cache.lock();
            for &(page, ..) in pages {
                partial.remove(&(chunk, page));
                cache.invalidate((chunk, page));
            }
        }
        for counter in counters {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The host's CPU utilisation for Algorithm 1, in [0, 1].
    fn cpu_load(&self) -> Result<f64> {
        let fraction = match &self.cpu {
            CpuLoad::Sampled(sampler) => sampler.lock().sample().map_err(|e| Error::invalid(e.to_string()))?,
            CpuLoad::Fixed(fraction) => *fraction,
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
        self.apply(chunk, page, &image, lsn)?;
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(image.encoding)
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
        let encoded = self.encode_whole(chunk, content, Wanted::Fixed(algorithm), &mut None)?;
        self.store_encoded(chunk, page, content, encoded, lsn).map(|_| ())
    }

    /// Writes `bytes` at `offset` inside a page (the none mode): the page is read, decompressed,
    /// merged and stored raw, and remembered for [`Pages::recompress_partial`]. A page that does
    /// not exist yet reads as zeros.
    pub fn write_partial(&self, chunk: ChunkId, page: PageNo, offset: usize, bytes: &[u8], lsn: Lsn) -> Result<()> {
        let end = offset.checked_add(bytes.len()).filter(|&end| end <= self.page_size.bytes() && !bytes.is_empty());
        let Some(end) = end else {
            return Err(Error::invalid(format!(
                "{} bytes at offset {offset} do not fit in a page of {}",
                bytes.len(),
                self.page_size
            )));
        };
        let _one_writer = self.page_lock(chunk, page).lock();
        let mut content = match self.read_page(chunk, page)? {
            Some(content) => content,
            None => vec![0u8; self.page_size.bytes()],
        };
        content[offset..end].copy_from_slice(bytes);
        self.store_encoded(chunk, page, &content, raw(&content), lsn)?;
        self.partial_raw.lock().insert((chunk, page));
        Ok(())
    }

    /// Compresses again, with Algorithm 1 or the policy's algorithm, the pages that partial
    /// writes left raw. Returns how many it compressed; none when the policy is off.
    pub fn recompress_partial(&self) -> Result<usize> {
        let pending: Vec<(ChunkId, PageNo)> = self.partial_raw.lock().drain().collect();
        if self.software == SoftwareCompression::Off {
            return Ok(0);
        }
        let mut done = 0;
        for (chunk, page) in pending {
            let Some(content) = self.read_page(chunk, page)? else { continue };
            let Some(entry) = self.store.entry(chunk, page) else { continue };
            let compressible =
                self.store.volume(chunk.volume()).is_some_and(|v| v.mode == crate::volume::VolumeMode::Normal);
            if entry.encoding != Encoding::Raw || !compressible {
                continue;
            }
            // A full write since would have cleared the page from the set; a partial write
            // re-adds it. Writing the content read is safe under the page lock only if the page
            // did not change in between, which the entry check below ensures.
            let _one_writer = self.page_lock(chunk, page).lock();
            if self.store.entry(chunk, page) != Some(entry) {
                continue;
            }
            let encoded = self.encode_whole(chunk, &content, Wanted::Select(PageHistory::FirstWrite), &mut None)?;
            if encoded.encoding != tundra_codec::Encoding::Raw {
                self.store_encoded(chunk, page, &content, encoded, entry.lsn)?;
                done += 1;
            }
        }
        Ok(done)
    }

    /// Reads a page back, decompressed and verified against its checksum; `None` if the page
    /// does not exist. A mismatch is a corruption error, never wrong data.
    pub fn read_page(&self, chunk: ChunkId, page: PageNo) -> Result<Option<Vec<u8>>> {
        if let Some(cached) = self.cache.lock().get((chunk, page)) {
            self.reads.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(cached.to_vec()));
        }
        let Some((entry, content)) = self.load(chunk, page)? else { return Ok(None) };
        self.remember(chunk, page, entry, || Arc::from(content.as_slice()));
        Ok(Some(content))
    }

    /// [`Pages::read_page`] without copying the page out of the cache: a reader that wants
    /// part of a page, or copies it somewhere anyway, saves a copy and an allocation.
    pub fn read_page_shared(&self, chunk: ChunkId, page: PageNo) -> Result<Option<Arc<[u8]>>> {
        if let Some(cached) = self.cache.lock().get((chunk, page)) {
            self.reads.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(cached));
        }
        let Some((entry, content)) = self.load(chunk, page)? else { return Ok(None) };
        let content: Arc<[u8]> = Arc::from(content);
        self.remember(chunk, page, entry, || content.clone());
        Ok(Some(content))
    }

    /// Reads a page from the store, decompresses and verifies it.
    fn load(&self, chunk: ChunkId, page: PageNo) -> Result<Option<(crate::index::PageEntry, Vec<u8>)>> {
        let Some((entry, stored)) = self.store.read_image(chunk, page)? else { return Ok(None) };
        let encoding = match entry.encoding {
            Encoding::Heavy => None,
            Encoding::Raw => Some(tundra_codec::Encoding::Raw),
            Encoding::Lz4 => Some(tundra_codec::Encoding::Compressed(Algorithm::Lz4)),
            Encoding::Zstd => Some(tundra_codec::Encoding::Compressed(Algorithm::Zstd)),
        };
        let content = match encoding {
            None => self.heavy_page(&entry, &stored)?,
            // A raw page is its stored bytes: no copy.
            Some(tundra_codec::Encoding::Raw) if stored.len() == self.page_size.bytes() => stored,
            Some(encoding) => self.codec.decode(encoding, &stored, self.page_size).map_err(codec_error)?,
        };
        if page_checksum(chunk, page, &content) != entry.checksum {
            return Err(Error::corrupted(format!("page {} of chunk {} fails its checksum", page.0, chunk.0)));
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(Some((entry, content)))
    }

    /// Caches a page just read, if what was read is still the page's current version (see
    /// `apply`).
    fn remember(
        &self,
        chunk: ChunkId,
        page: PageNo,
        entry: crate::index::PageEntry,
        content: impl FnOnce() -> Arc<[u8]>,
    ) {
        let mut cache = self.cache.lock();
        if self.store.entry(chunk, page) == Some(entry) {
            cache.insert((chunk, page), content());
        }
    }

    /// Checks the whole store offline (what `tundra fsck` reports): every page is read from the
    /// device, decompressed and verified against its checksum, bypassing the cache; the allocator
    /// was already rebuilt from the index when the store opened, which proves no block is used
    /// twice; and the data device must hold no more mapped blocks than the pages reference (more
    /// would be leaked physical space). Pages of volumes of another page size are counted in
    /// the referenced bytes but read by their own path's check.
    pub fn check(&self) -> Result<CheckReport> {
        self.store.release_freed()?;
        if self.store.trim_policy() == crate::store::TrimPolicy::Deferred {
            // Runs are reused untrimmed under this policy: free blocks may still be mapped.
            self.store.trim_unused()?;
        }
        let mut report = CheckReport::default();
        for (chunk, page, entry) in self.store.entries() {
            report.referenced_bytes += u64::from(entry.run.count) * tundra_device::BLOCK_SIZE_BYTES;
            if self.store.volume(chunk.volume()).is_some_and(|v| v.page_size as usize != self.page_size.bytes()) {
                continue;
            }
            report.pages += 1;
            self.cache.lock().invalidate((chunk, page));
            if let Err(error) = self.read_page(chunk, page) {
                report.damaged.push(format!("chunk {} page {}: {error}", chunk.0, page.0));
            }
        }
        // Pages whose journal record is damaged are not in the index; they read as errors.
        for (chunk, page, why) in self.store.damaged_pages() {
            if self.store.volume(chunk.volume()).is_some_and(|v| v.page_size as usize == self.page_size.bytes()) {
                report.damaged.push(format!("chunk {} page {}: {why}", chunk.0, page.0));
            }
        }
        report.device_mapped_bytes = self.store.data_device().usage().mapped_bytes;
        if report.device_mapped_bytes > report.referenced_bytes {
            report.damaged.push(format!(
                "the data device maps {} bytes but pages reference only {}: leaked space",
                report.device_mapped_bytes, report.referenced_bytes
            ));
        }
        Ok(report)
    }

    /// One page of a heavy segment, from the cache of decompressed segments when this segment
    /// (same first block and nonce) was decompressed before.
    fn heavy_page(&self, entry: &crate::index::PageEntry, stored: &[u8]) -> Result<Vec<u8>> {
        let header = &stored[..HEAVY_HEADER_BYTES];
        let frame_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let page_count = usize::from(u16::from_le_bytes(header[4..6].try_into().expect("2 bytes")));
        let nonce = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let index = usize::from(entry.stored_len);
        if HEAVY_HEADER_BYTES + frame_len > stored.len() || index >= page_count {
            return Err(Error::corrupted("a heavy segment header that does not fit its blocks"));
        }
        let key = entry.run.first_lba().0;
        let cached = {
            let mut guard = self.segments.lock();
            let (cache, nonces) = &mut *guard;
            if nonces.get(&key) == Some(&nonce) { cache.get(key) } else { None }
        };
        let segment = match cached {
            Some(segment) => segment,
            None => {
                let frame = &stored[HEAVY_HEADER_BYTES..HEAVY_HEADER_BYTES + frame_len];
                let segment =
                    tundra_codec::heavy::decompress_segment(frame, self.page_size, page_count).map_err(codec_error)?;
                let segment = Arc::new(segment);
                let mut guard = self.segments.lock();
                let (cache, nonces) = &mut *guard;
                // The nonce map only ever forgets: a forgotten nonce is a miss, never a wrong hit.
                if nonces.len() > 4 * SEGMENT_CACHE_SEGMENTS {
                    nonces.clear();
                }
                cache.insert(key, segment.clone());
                nonces.insert(key, nonce);
                segment
            }
        };
        Ok(segment.page(index).expect("index checked against the page count").to_vec())
    }

    /// Heavy compression of `count` pages of `chunk` from `first` (seed 000 §3.2.3), for archived
    /// data: the pages that exist are read, verified, and compressed together with zstd at a high
    /// level in segments of at most one extent, then each page points into its segment. Pages
    /// written while this runs keep their newer content: each page is locked from its read to
    /// the segment's installation. Refused when the software policy is off.
    pub fn heavy_compress(&self, chunk: ChunkId, first: PageNo, count: u32) -> Result<HeavyReport> {
        if self.software == SoftwareCompression::Off {
            return Err(Error::invalid("software compression is off on this node: no heavy compression"));
        }
        let volume = self
            .store
            .volume(chunk.volume())
            .ok_or_else(|| Error::invalid(format!("no volume {}", chunk.volume().0)))?;
        if volume.mode != crate::volume::VolumeMode::Normal || volume.page_size as usize != self.page_size.bytes() {
            return Err(Error::invalid(format!(
                "volume {:?} cannot be heavily compressed by this page path",
                volume.name
            )));
        }
        let group = (HEAVY_GROUP_BYTES / self.page_size.bytes()) as u32;
        let mut report = HeavyReport::default();
        let end = first.0.checked_add(count).ok_or_else(|| Error::invalid("the page range overflows"))?;
        let mut start = first.0;
        while start < end {
            let stop = end.min(start + group);
            self.heavy_group(chunk, (start..stop).map(PageNo).collect(), &mut report)?;
            start = stop;
        }
        Ok(report)
    }

    /// Compresses one group of pages as a segment, halving the group until it fits an extent.
    fn heavy_group(&self, chunk: ChunkId, pages: Vec<PageNo>, report: &mut HeavyReport) -> Result<()> {
        let mut stripes: Vec<usize> = pages.iter().map(|&p| self.stripe(chunk, p)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        // Stripes in ascending order: writers of single pages take one, so no deadlock.
        let _locks: Vec<_> = stripes.iter().map(|&s| self.page_locks[s].lock()).collect();
        let mut present = Vec::new();
        let mut content = Vec::new();
        let mut before = 0u64;
        for &page in &pages {
            let Some(entry) = self.store.entry(chunk, page) else { continue };
            if entry.encoding == Encoding::Heavy {
                continue;
            }
            let Some(bytes) = self.read_page(chunk, page)? else { continue };
            before += u64::from(entry.run.count) * tundra_device::BLOCK_SIZE_BYTES;
            present.push((page, page_checksum(chunk, page, &bytes), entry.lsn));
            content.extend_from_slice(&bytes);
        }
        if present.is_empty() {
            return Ok(());
        }
        let frame = tundra_codec::heavy::compress_segment(&content, self.page_size, self.heavy).map_err(codec_error)?;
        let limit = crate::ids::EXTENT_BLOCKS as usize * tundra_device::BLOCK_SIZE - HEAVY_HEADER_BYTES;
        if frame.len() > limit {
            if pages.len() == 1 {
                return Ok(());
            }
            drop(_locks);
            let half = pages.len() / 2;
            self.heavy_group(chunk, pages[..half].to_vec(), report)?;
            return self.heavy_group(chunk, pages[half..].to_vec(), report);
        }
        let mut segment = Vec::with_capacity(HEAVY_HEADER_BYTES + frame.len());
        segment.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        segment.extend_from_slice(&(present.len() as u16).to_le_bytes());
        segment.extend_from_slice(&[0, 0]);
        segment.extend_from_slice(&segment_nonce().to_le_bytes());
        segment.extend_from_slice(&frame);
        // Pages absent from the segment are not indexed by it: index them by position.
        self.store.apply_heavy(chunk, &present, &segment)?;
        {
            let mut cache = self.cache.lock();
            for &(page, _, _) in &present {
                cache.invalidate((chunk, page));
            }
        }
        report.pages += present.len() as u64;
        report.segments += 1;
        report.bytes_before += before;
        report.bytes_after +=
            segment.len().div_ceil(tundra_device::BLOCK_SIZE) as u64 * tundra_device::BLOCK_SIZE_BYTES;
        Ok(())
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
        self.store.trim_page(chunk, page)?;
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

/// A number that names one heavy segment for the cache of decompressed segments: the clock and a
/// process-wide counter, so two segments written to the same blocks never share it.
fn segment_nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    clock ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(48)
}

/// Codec errors from stored bytes are corruption; from a caller's input, invalid requests. The
/// message is the codec's own, without its kind: the store's error names the kind once.
fn codec_error(error: tundra_codec::Error) -> Error {
    match error.kind() {
        tundra_codec::ErrorKind::Corrupted => Error::corrupted(error.message()),
        _ => Error::invalid(error.message()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tundra_codec::{DecompressCost, LinearCost, SelectorConfig};
    use tundra_device::BlockDevice;
    use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
    use tundra_device::mem::MemDevice;

    use super::*;
    use crate::journal::{Journal, JournalGeometry};
    use crate::store::tests::test_volume;

    const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 64 };

    /// A page that looks like a heap page of rows: text with varying numbers, some free space.
    fn table_page(seed: u64, size: usize) -> Vec<u8> {
        let mut page = vec![0u8; size];
        let mut at = size / 5;
        let mut row = seed * 1000;
        while at + 80 < size {
            let line =
                format!("{row:010}|2013-01-{:02}|UA|N{:05}|EWR|IAH|{:4}|", 1 + row % 28, row * 37 % 99_991, row % 1440);
            page[at..at + line.len()].copy_from_slice(line.as_bytes());
            at += line.len() + 7;
            row += 1;
        }
        page
    }

    fn pages_on_a_drive(page_size: usize) -> (Arc<MemDevice>, Arc<MemDevice>, Pages) {
        let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
        let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
        let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
        let drive = CsdDevice::format(media.clone(), &options, CsdConfig::default()).unwrap();
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let pages = pages_over(Arc::new(drive), fast.clone(), page_size);
        (media, fast, pages)
    }

    fn pages_over(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>, page_size: usize) -> Pages {
        let store = Arc::new(Store::open(data, fast).unwrap());
        store.create_volume(test_volume(page_size)).unwrap();
        path_of(store, page_size, CpuLoad::Fixed(0.0))
    }

    /// The page path over `store`, with a fixed cost model that keeps Algorithm 1's decisions
    /// independent of this machine's timing.
    fn path_of(store: Arc<Store>, page_size: usize, cpu: CpuLoad) -> Pages {
        let codec = PageCodec::new(1).unwrap();
        let cost = DecompressCost {
            page_size: PageSize::from_bytes(page_size as u64).unwrap(),
            lz4: LinearCost { fixed_us: 0.5, us_per_byte: 0.5 / 1024.0 },
            zstd: LinearCost { fixed_us: 2.0, us_per_byte: 2.0 / 1024.0 },
        };
        let selector = Selector::new(SelectorConfig::default(), codec, cost).unwrap();
        Pages::new(store, PageSize::from_bytes(page_size as u64).unwrap(), selector, codec, cpu).unwrap()
    }

    #[test]
    fn pages_round_trip_through_both_layers() {
        let (_, _, pages) = pages_on_a_drive(16384);
        let chunk = ChunkId(1);
        for p in 0..200u32 {
            pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 16384), Lsn(1), None).unwrap();
        }
        for p in 0..200u32 {
            assert_eq!(pages.read_page(chunk, PageNo(p)).unwrap().unwrap(), table_page(u64::from(p), 16384));
        }
        assert_eq!(pages.read_page(chunk, PageNo(999)).unwrap(), None);
        let counts = pages.counts();
        assert_eq!(counts.written_lz4 + counts.written_zstd + counts.written_raw, 200);
        assert_eq!(counts.written_raw, 0, "table pages compress");
        let stats = pages.store().stats();
        assert!(stats.stored_bytes < 200 * 16384 / 2, "software compression at least halves: {stats:?}");
        assert!(pages.write_page(chunk, PageNo(0), &[0u8; 100], Lsn(2), None).is_err());
    }

    #[test]
    fn a_corrupted_page_is_an_error_never_wrong_data() {
        let (_, _, pages) = pages_on_a_drive(8192);
        let chunk = ChunkId(2);
        pages.write_page(chunk, PageNo(0), &table_page(1, 8192), Lsn(1), None).unwrap();
        pages.write_page(chunk, PageNo(1), &table_page(2, 8192), Lsn(1), None).unwrap();
        let entry0 = pages.store().entry(chunk, PageNo(0)).unwrap();
        let entry1 = pages.store().entry(chunk, PageNo(1)).unwrap();
        // Page 1's bytes written where page 0 lives: valid compressed data, wrong page.
        let other = pages.store().read_blocks(entry1.run.first_lba(), usize::from(entry1.run.count)).unwrap();
        let mut misplaced = other.clone();
        misplaced.resize(usize::from(entry0.run.count) * 4096, 0);
        pages.store().data_device().write(entry0.run.first_lba(), &misplaced).unwrap();
        let error = pages.read_page(chunk, PageNo(0)).unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Corrupted, "{error}");
        pages.store().data_device().write(entry0.run.first_lba(), &vec![0xAB; misplaced.len()]).unwrap();
        assert_eq!(pages.read_page(chunk, PageNo(0)).unwrap_err().kind(), crate::ErrorKind::Corrupted);
        assert_eq!(pages.read_page(chunk, PageNo(1)).unwrap().unwrap(), table_page(2, 8192));
    }

    #[test]
    fn partial_writes_merge_store_raw_then_recompress() {
        let (_, _, pages) = pages_on_a_drive(16384);
        let chunk = ChunkId(5);
        let original = table_page(9, 16384);
        pages.write_page(chunk, PageNo(0), &original, Lsn(1), None).unwrap();
        pages.write_partial(chunk, PageNo(0), 100, b"patched", Lsn(2)).unwrap();
        pages.write_partial(chunk, PageNo(1), 16380, b"tail", Lsn(2)).unwrap();
        let mut expected = original.clone();
        expected[100..107].copy_from_slice(b"patched");
        assert_eq!(pages.read_page(chunk, PageNo(0)).unwrap().unwrap(), expected);
        let mut fresh = vec![0u8; 16384];
        fresh[16380..].copy_from_slice(b"tail");
        assert_eq!(pages.read_page(chunk, PageNo(1)).unwrap().unwrap(), fresh);
        assert_eq!(pages.store().entry(chunk, PageNo(0)).unwrap().encoding, Encoding::Raw);
        assert_eq!(pages.recompress_partial().unwrap(), 2);
        assert_ne!(pages.store().entry(chunk, PageNo(0)).unwrap().encoding, Encoding::Raw);
        assert_eq!(pages.read_page(chunk, PageNo(0)).unwrap().unwrap(), expected);
        assert_eq!(pages.recompress_partial().unwrap(), 0);
        for (offset, len) in [(16384, 1), (16380, 5), (0, 0)] {
            let err = pages.write_partial(chunk, PageNo(0), offset, &vec![1u8; len], Lsn(3)).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Invalid);
        }
    }

    /// Every write path follows the software policy: single pages, batches, pages written with
    /// a named algorithm, and the background pass over partial writes.
    #[test]
    fn the_software_policy_decides_every_whole_page() {
        let expected = [
            (SoftwareCompression::Lz4, Some(Encoding::Lz4)),
            (SoftwareCompression::Zstd, Some(Encoding::Zstd)),
            (SoftwareCompression::Off, Some(Encoding::Raw)),
            (SoftwareCompression::Auto, None),
        ];
        for (policy, encoding) in expected {
            let (_, _, pages) = pages_on_a_drive(16384);
            let pages = pages.with_software_compression(policy);
            assert_eq!(pages.software_compression(), policy);
            let chunk = ChunkId(3);
            let contents: Vec<Vec<u8>> = (0..12u64).map(|p| table_page(p + 40, 16384)).collect();
            for p in 0..4u32 {
                pages.write_page(chunk, PageNo(p), &contents[p as usize], Lsn(1), None).unwrap();
            }
            let items: Vec<_> = (4..8u32).map(|p| (PageNo(p), contents[p as usize].as_slice(), Lsn(1), None)).collect();
            pages.write_pages(chunk, &items).unwrap();
            // A writer that names an algorithm (or raw) gets it only under Auto.
            pages.write_page_with(chunk, PageNo(8), &contents[8], Lsn(1), Some(Algorithm::Zstd)).unwrap();
            pages.write_page_with(chunk, PageNo(9), &contents[9], Lsn(1), Some(Algorithm::Lz4)).unwrap();
            pages.write_page_with(chunk, PageNo(10), &contents[10], Lsn(1), None).unwrap();
            // A partial write is stored raw, then the background pass compresses it again.
            pages.write_partial(chunk, PageNo(11), 0, &contents[11][..100], Lsn(1)).unwrap();
            let recompressed = pages.recompress_partial().unwrap();
            let stored: Vec<Encoding> =
                (0..12u32).map(|p| pages.store().entry(chunk, PageNo(p)).unwrap().encoding).collect();
            match encoding {
                Some(encoding) => {
                    assert!(stored.iter().all(|&e| e == encoding), "{policy:?}: {stored:?}");
                    assert_eq!(recompressed, usize::from(encoding != Encoding::Raw), "{policy:?}");
                }
                None => {
                    assert_eq!(&stored[8..11], &[Encoding::Zstd, Encoding::Lz4, Encoding::Raw]);
                    assert!(stored[..8].iter().chain(&stored[11..]).all(|&e| e != Encoding::Raw), "{stored:?}");
                    assert_eq!(recompressed, 1);
                }
            }
            let heavy = pages.heavy_compress(chunk, PageNo(0), 4);
            assert_eq!(heavy.is_err(), policy == SoftwareCompression::Off, "{policy:?}: {heavy:?}");
            for (p, content) in contents.iter().enumerate().take(11) {
                assert!(pages.read_page(chunk, PageNo(p as u32)).unwrap().unwrap() == *content, "page {p}");
            }
        }
    }

    #[test]
    fn concurrent_partial_writes_to_one_page_lose_nothing() {
        let (_, _, pages) = pages_on_a_drive(8192);
        let chunk = ChunkId(6);
        std::thread::scope(|scope| {
            for t in 0..4usize {
                let pages = &pages;
                scope.spawn(move || {
                    for i in 0..16usize {
                        let offset = (t * 16 + i) * 64;
                        pages.write_partial(chunk, PageNo(0), offset, &[t as u8 + 1; 64], Lsn(1)).unwrap();
                    }
                });
            }
        });
        let page = pages.read_page(chunk, PageNo(0)).unwrap().unwrap();
        for t in 0..4usize {
            assert!(page[t * 1024..(t + 1) * 1024].iter().all(|&b| b == t as u8 + 1), "thread {t}'s bytes were lost");
        }
    }

    /// A data device whose trims take a while, so that a trim racing a writer's allocation
    /// shows up every time rather than once in a while.
    struct SlowTrim(MemDevice);

    impl BlockDevice for SlowTrim {
        fn block_count(&self) -> u64 {
            self.0.block_count()
        }
        fn read(&self, lba: tundra_device::Lba, buf: &mut [u8]) -> tundra_device::Result<()> {
            self.0.read(lba, buf)
        }
        fn write(&self, lba: tundra_device::Lba, data: &[u8]) -> tundra_device::Result<()> {
            self.0.write(lba, data)
        }
        fn trim(&self, lba: tundra_device::Lba, blocks: u64) -> tundra_device::Result<()> {
            std::thread::sleep(std::time::Duration::from_micros(300));
            self.0.trim(lba, blocks)
        }
        fn flush(&self) -> tundra_device::Result<()> {
            self.0.flush()
        }
        fn usage(&self) -> tundra_device::Usage {
            self.0.usage()
        }
    }

    #[test]
    fn freed_blocks_are_trimmed_before_a_writer_can_reuse_them() {
        let journal = JournalGeometry { checkpoint_blocks: 64, log_blocks: 8192 };
        let fast = Arc::new(MemDevice::new(journal.total_blocks()));
        Journal::format(fast.as_ref(), journal).unwrap();
        let pages = pages_over(Arc::new(SlowTrim(MemDevice::new(16384))), fast, 8192);
        let chunk = ChunkId(9);
        let content = |t: u32, p: u32, round: u32| -> Vec<u8> {
            let mut page = table_page(u64::from(t * 1000 + p), 8192);
            page[..4].copy_from_slice(&round.to_le_bytes());
            page
        };
        // Every rewrite frees the page's old run; every 64 frees, the writer that crosses the
        // batch releases them (trims, then makes them allocatable) while the others allocate.
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                let pages = &pages;
                scope.spawn(move || {
                    for round in 0..60u32 {
                        for p in 0..8u32 {
                            let page = PageNo(t * 8 + p);
                            pages.write_page_with(chunk, page, &content(t, p, round), Lsn(1), None).unwrap();
                        }
                    }
                });
            }
        });
        pages.set_cache_pages(0);
        for t in 0..4u32 {
            for p in 0..8u32 {
                let read = pages.read_page(chunk, PageNo(t * 8 + p)).unwrap().unwrap();
                assert!(read == content(t, p, 59), "page {} lost its last write", t * 8 + p);
            }
        }
        let report = pages.check().unwrap();
        assert!(report.damaged.is_empty(), "{:?}", report.damaged);
    }

    #[test]
    fn a_batch_of_pages_is_stored_with_one_commit_or_not_at_all() {
        let (_, _, pages) = pages_on_a_drive(8192);
        let chunk = ChunkId(10);
        pages.write_page(chunk, PageNo(3), &table_page(300, 8192), Lsn(1), None).unwrap();
        let contents: Vec<Vec<u8>> = (0..40u64).map(|p| table_page(p + 1000, 8192)).collect();
        let items: Vec<_> =
            contents.iter().enumerate().map(|(p, c)| (PageNo(p as u32), c.as_slice(), Lsn(2), None)).collect();
        pages.write_pages(chunk, &items).unwrap();
        for (p, content) in contents.iter().enumerate() {
            assert!(pages.read_page(chunk, PageNo(p as u32)).unwrap().unwrap() == *content, "page {p}");
        }
        let counts = pages.counts();
        assert_eq!(counts.written_lz4 + counts.written_zstd + counts.written_raw, 41);
        // A batch with one page outside the volume stores nothing and leaks nothing.
        let before = pages.store().stats();
        let bad = [
            (PageNo(50), contents[0].as_slice(), Lsn(3), None),
            (PageNo(u32::MAX), contents[1].as_slice(), Lsn(3), None),
        ];
        assert!(pages.write_pages(chunk, &bad).is_err());
        assert_eq!(pages.read_page(chunk, PageNo(50)).unwrap(), None);
        assert_eq!(pages.store().stats().stored_bytes, before.stored_bytes);
        let report = pages.check().unwrap();
        assert!(report.damaged.is_empty(), "{:?}", report.damaged);
    }

    #[test]
    fn the_cache_hits_and_never_serves_an_old_version() {
        let (_, _, pages) = pages_on_a_drive(8192);
        let chunk = ChunkId(7);
        pages.write_page(chunk, PageNo(3), &table_page(1, 8192), Lsn(1), None).unwrap();
        for _ in 0..5 {
            assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(1, 8192));
        }
        let stats = pages.cache_stats();
        assert_eq!((stats.hits, stats.misses), (4, 1));
        pages.write_page(chunk, PageNo(3), &table_page(2, 8192), Lsn(2), None).unwrap();
        assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(2, 8192));
        pages.set_cache_pages(0);
        assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(2, 8192));
        assert_eq!(pages.cache_stats().pages, 0);
    }

    #[test]
    fn check_is_clean_then_finds_damage() {
        let (_, _, pages) = pages_on_a_drive(8192);
        let chunk = ChunkId(8);
        for p in 0..20u32 {
            pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 8192), Lsn(1), None).unwrap();
            pages.write_page(chunk, PageNo(p), &table_page(u64::from(p) + 100, 8192), Lsn(2), None).unwrap();
        }
        let clean = pages.check().unwrap();
        assert_eq!(clean.pages, 20);
        assert!(clean.damaged.is_empty(), "{clean:?}");
        assert!(clean.device_mapped_bytes <= clean.referenced_bytes);
        let entry = pages.store().entry(chunk, PageNo(4)).unwrap();
        pages.store().data_device().write(entry.run.first_lba(), &vec![0x5A; 4096]).unwrap();
        let damaged = pages.check().unwrap();
        assert_eq!(damaged.damaged.len(), 1, "{damaged:?}");
        assert!(damaged.damaged[0].contains("page 4"));
    }

    #[test]
    fn heavy_compression_shrinks_archived_pages_and_reads_them_back() {
        let (_, _, pages) = pages_on_a_drive(16384);
        let chunk = ChunkId(9);
        for p in 0..64u32 {
            pages
                .write_page(chunk, PageNo(p), &table_page(u64::from(p), 16384), Lsn(100 + u64::from(p)), None)
                .unwrap();
        }
        pages.trim_page(chunk, PageNo(10)).unwrap();
        let before = pages.store().stats().stored_bytes;
        let report = pages.heavy_compress(chunk, PageNo(0), 64).unwrap();
        // Archiving changes no page: each keeps the LSN of its last change.
        for p in (0..64u32).filter(|&p| p != 10) {
            let entry = pages.store().entry(chunk, PageNo(p)).unwrap();
            assert_eq!((entry.encoding, entry.lsn), (Encoding::Heavy, Lsn(100 + u64::from(p))), "page {p}");
        }
        assert_eq!(report.pages, 63);
        assert!(report.segments >= 2, "512 KiB groups: {report:?}");
        pages.store().release_freed().unwrap();
        let after = pages.store().stats().stored_bytes;
        assert!(after * 2 < before, "heavy segments at least halve the blocks: {before} -> {after}");
        for p in 0..64u32 {
            let got = pages.read_page(chunk, PageNo(p)).unwrap();
            if p == 10 {
                assert_eq!(got, None);
            } else {
                assert_eq!(got.unwrap(), table_page(u64::from(p), 16384), "page {p}");
            }
        }
        // Rewriting one page of a segment moves it out; the segment lives on for the others.
        pages.write_page(chunk, PageNo(3), &table_page(333, 16384), Lsn(2), None).unwrap();
        pages.trim_page(chunk, PageNo(4)).unwrap();
        assert_eq!(pages.read_page(chunk, PageNo(4)).unwrap(), None);
        pages.store().release_freed().unwrap();
        assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(333, 16384));
        assert_eq!(pages.read_page(chunk, PageNo(5)).unwrap().unwrap(), table_page(5, 16384));
        let check = pages.check().unwrap();
        assert!(check.damaged.is_empty(), "{check:?}");
    }

    #[test]
    fn heavy_segments_survive_reopen_and_their_blocks_are_freed_when_empty() {
        let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
        let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
        let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
        let drive: Arc<dyn BlockDevice> = Arc::new(CsdDevice::format(media, &options, CsdConfig::default()).unwrap());
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let chunk = ChunkId(2);
        {
            let pages = pages_over(drive.clone(), fast.clone(), 8192);
            for p in 0..16u32 {
                pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 8192), Lsn(1), None).unwrap();
            }
            pages.heavy_compress(chunk, PageNo(0), 16).unwrap();
        }
        let store = Arc::new(Store::open(drive.clone(), fast.clone()).unwrap());
        let extents = store.stats().extents_in_use;
        assert_eq!(extents, 1, "one segment in one extent");
        let pages = path_of(store.clone(), 8192, CpuLoad::Fixed(0.0));
        for p in 0..16u32 {
            assert_eq!(pages.read_page(chunk, PageNo(p)).unwrap().unwrap(), table_page(u64::from(p), 8192));
        }
        for p in 0..16u32 {
            store.trim_page(chunk, PageNo(p)).unwrap();
        }
        store.release_freed().unwrap();
        assert_eq!(store.stats().extents_in_use, 0, "the segment's blocks are freed with its last page");
    }

    /// Random page operations in every mode against a model: whole-page writes chosen by
    /// Algorithm 1 (idle or busy host) or forced to lz4, zstd or raw (pages the user marks
    /// uncompressed), batched writes, partial writes (the none mode), trims, heavy compression
    /// of a range, re-compression of partially written pages and reopening the store, on a
    /// mode normal volume of two chunks and a mode none volume. After every step the page read
    /// back equals the model; at the end every page does and the store checks clean (what
    /// `tundra fsck` runs: every checksum, no leaked block).
    mod model {
        use std::collections::BTreeMap;

        use proptest::prelude::*;

        use super::*;
        use crate::ids::VolumeId;
        use crate::volume::{Volume, VolumeMode};

        const PAGE: usize = 8192;

        #[derive(Clone, Debug)]
        enum Op {
            /// Algorithm 1 (busy: the CPU rule picks lz4 without comparing).
            Write {
                target: u8,
                page: u8,
                content: u8,
                seed: u16,
                busy: bool,
            },
            /// Forced: 0 lz4, 1 zstd, 2 raw.
            WriteWith {
                target: u8,
                page: u8,
                content: u8,
                seed: u16,
                algorithm: u8,
            },
            Batch {
                target: u8,
                first: u8,
                count: u8,
                content: u8,
                seed: u16,
            },
            Partial {
                target: u8,
                page: u8,
                offset: u16,
                len: u16,
                seed: u16,
            },
            Trim {
                target: u8,
                page: u8,
            },
            Heavy {
                first: u8,
                count: u8,
            },
            Recompress,
            Reopen,
        }

        fn op() -> impl Strategy<Value = Op> {
            let t = 0u8..3;
            let p = 0u8..12;
            prop_oneof![
                4 => (t.clone(), p.clone(), 0u8..4, any::<u16>(), any::<bool>())
                    .prop_map(|(target, page, content, seed, busy)| Op::Write { target, page, content, seed, busy }),
                2 => (t.clone(), p.clone(), 0u8..4, any::<u16>(), 0u8..3).prop_map(
                    |(target, page, content, seed, algorithm)| Op::WriteWith { target, page, content, seed, algorithm }
                ),
                1 => (t.clone(), p.clone(), 1u8..6, 0u8..4, any::<u16>())
                    .prop_map(|(target, first, count, content, seed)| Op::Batch { target, first, count, content, seed }),
                2 => (t.clone(), p.clone(), 0u16..8192, 1u16..600, any::<u16>())
                    .prop_map(|(target, page, offset, len, seed)| Op::Partial { target, page, offset, len, seed }),
                1 => (t, p).prop_map(|(target, page)| Op::Trim { target, page }),
                1 => (0u8..12, 1u8..12).prop_map(|(first, count)| Op::Heavy { first, count }),
                1 => Just(Op::Recompress),
                1 => Just(Op::Reopen),
            ]
        }

        /// Target 0 and 1: chunks 0 and 1 of the mode normal volume 0; 2: the mode none volume 1.
        fn chunk_of(target: u8) -> ChunkId {
            match target {
                0 => ChunkId::new(VolumeId(0), 0),
                1 => ChunkId::new(VolumeId(0), 1),
                _ => ChunkId::new(VolumeId(1), 0),
            }
        }

        /// Table rows, zeros, incompressible bytes, or half rows and half noise.
        fn content(kind: u8, seed: u16) -> Vec<u8> {
            let noise = |n: usize| {
                let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect::<Vec<u8>>()
            };
            match kind {
                0 => table_page(u64::from(seed), PAGE),
                1 => vec![0u8; PAGE],
                2 => noise(PAGE),
                _ => {
                    let mut page = table_page(u64::from(seed), PAGE);
                    page[..PAGE / 2].copy_from_slice(&noise(PAGE / 2));
                    page
                }
            }
        }

        struct Rig {
            media: Arc<MemDevice>,
            fast: Arc<MemDevice>,
        }

        impl Rig {
            fn open(&self, busy: bool) -> Pages {
                let quiet = CsdConfig { background: false, ..CsdConfig::default() };
                let drive: Arc<dyn BlockDevice> = Arc::new(CsdDevice::open(self.media.clone(), quiet).unwrap());
                let store = Arc::new(Store::open(drive, self.fast.clone()).unwrap());
                if store.volume(VolumeId(0)).is_none() {
                    store.create_volume(test_volume(PAGE)).unwrap();
                    let none =
                        Volume { id: VolumeId(1), name: "wal".into(), mode: VolumeMode::None, ..test_volume(PAGE) };
                    store.create_volume(none).unwrap();
                }
                path_of(store, PAGE, CpuLoad::Fixed(if busy { 0.9 } else { 0.0 }))
            }
        }

        fn expect(model: &BTreeMap<(u8, u8), Vec<u8>>, pages: &Pages, target: u8, page: u8, after: &Op) {
            let got = pages.read_page(chunk_of(target), PageNo(u32::from(page))).unwrap();
            assert!(got.as_ref() == model.get(&(target, page)), "target {target} page {page} differs after {after:?}");
        }

        fn encoding_of(pages: &Pages, target: u8, page: u8) -> Encoding {
            pages.store().entry(chunk_of(target), PageNo(u32::from(page))).expect("a written page").encoding
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
            #[test]
            fn pages_match_a_model_in_every_mode(ops in proptest::collection::vec(op(), 1..60)) {
                let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
                let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
                let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
                let quiet = CsdConfig { background: false, ..CsdConfig::default() };
                CsdDevice::format(media.clone(), &options, quiet).unwrap();
                Journal::format(fast.as_ref(), JOURNAL).unwrap();
                let rig = Rig { media, fast };
                let mut busy = false;
                let mut pages = rig.open(busy);
                let mut model: BTreeMap<(u8, u8), Vec<u8>> = BTreeMap::new();
                let mut version = 0u64;
                for op in &ops {
                    version += 1;
                    match *op {
                        Op::Write { target, page, content: kind, seed, busy: now_busy } => {
                            if now_busy != busy {
                                busy = now_busy;
                                drop(pages);
                                pages = rig.open(busy);
                            }
                            let data = content(kind, seed);
                            pages.write_page(chunk_of(target), PageNo(u32::from(page)), &data, Lsn(version), None).unwrap();
                            model.insert((target, page), data);
                            let encoding = encoding_of(&pages, target, page);
                            if target == 2 || kind == 2 {
                                prop_assert_eq!(encoding, Encoding::Raw, "mode none and noise are stored raw");
                            }
                            if busy && target != 2 {
                                prop_assert!(encoding != Encoding::Zstd, "a busy host gets lz4 (or raw), never zstd");
                            }
                            expect(&model, &pages, target, page, op);
                        }
                        Op::WriteWith { target, page, content: kind, seed, algorithm } => {
                            let data = content(kind, seed);
                            let algorithm = [Some(Algorithm::Lz4), Some(Algorithm::Zstd), None][usize::from(algorithm)];
                            pages.write_page_with(chunk_of(target), PageNo(u32::from(page)), &data, Lsn(version), algorithm).unwrap();
                            model.insert((target, page), data);
                            let encoding = encoding_of(&pages, target, page);
                            if target == 2 || algorithm.is_none() {
                                prop_assert_eq!(encoding, Encoding::Raw);
                            } else if encoding != Encoding::Raw {
                                let wanted = if algorithm == Some(Algorithm::Lz4) { Encoding::Lz4 } else { Encoding::Zstd };
                                prop_assert_eq!(encoding, wanted);
                            }
                            expect(&model, &pages, target, page, op);
                        }
                        Op::Batch { target, first, count, content: kind, seed } => {
                            let datas: Vec<Vec<u8>> =
                                (0..count).map(|i| content(kind, seed.wrapping_add(u16::from(i)))).collect();
                            let items: Vec<_> = datas
                                .iter()
                                .enumerate()
                                .map(|(i, d)| (PageNo(u32::from(first) + i as u32), d.as_slice(), Lsn(version), None))
                                .collect();
                            pages.write_pages(chunk_of(target), &items).unwrap();
                            for (i, d) in datas.into_iter().enumerate() {
                                model.insert((target, first + i as u8), d);
                            }
                            for i in 0..count {
                                expect(&model, &pages, target, first + i, op);
                            }
                        }
                        Op::Partial { target, page, offset, len, seed } => {
                            let offset = usize::from(offset);
                            let len = usize::from(len).min(PAGE - offset);
                            let bytes: Vec<u8> = content(2, seed)[..len].to_vec();
                            pages.write_partial(chunk_of(target), PageNo(u32::from(page)), offset, &bytes, Lsn(version)).unwrap();
                            let entry = model.entry((target, page)).or_insert_with(|| vec![0u8; PAGE]);
                            entry[offset..offset + len].copy_from_slice(&bytes);
                            prop_assert_eq!(encoding_of(&pages, target, page), Encoding::Raw, "a partial write stores the page raw");
                            expect(&model, &pages, target, page, op);
                        }
                        Op::Trim { target, page } => {
                            pages.trim_page(chunk_of(target), PageNo(u32::from(page))).unwrap();
                            model.remove(&(target, page));
                            expect(&model, &pages, target, page, op);
                        }
                        Op::Heavy { first, count } => {
                            pages.heavy_compress(chunk_of(0), PageNo(u32::from(first)), u32::from(count)).unwrap();
                            for page in first..first.saturating_add(count).min(12) {
                                expect(&model, &pages, 0, page, op);
                            }
                            // The mode none volume refuses, and changes nothing.
                            prop_assert!(pages.heavy_compress(chunk_of(2), PageNo(0), 4).is_err());
                        }
                        Op::Recompress => {
                            pages.recompress_partial().unwrap();
                        }
                        Op::Reopen => {
                            drop(pages);
                            pages = rig.open(busy);
                        }
                    }
                    // The allocator equals the one derived from the index after every step.
                    if let Err(problem) = pages.store().check_invariants() {
                        prop_assert!(false, "after {:?}: {}", op, problem);
                    }
                }
                pages.set_cache_pages(0);
                for target in 0..3u8 {
                    for page in 0..12u8 {
                        expect(&model, &pages, target, page, &Op::Reopen);
                    }
                }
                let report = pages.check().unwrap();
                prop_assert!(report.damaged.is_empty(), "{:?}", report.damaged);
                drop(pages);
                let pages = rig.open(false);
                for ((target, page), data) in &model {
                    let got = pages.read_page(chunk_of(*target), PageNo(u32::from(*page))).unwrap();
                    prop_assert!(got.as_ref() == Some(data), "target {} page {} lost at reopen", target, page);
                }
                prop_assert!(pages.check().unwrap().damaged.is_empty());
            }
        }
    }

    /// Power fails at a random write of the drive's media or of the journal, in the middle of
    /// page writes, partial writes, trims and heavy compression, on the emulated drive: after
    /// recovery of both layers every page verifies and holds its newest acknowledged content, or
    /// the content the operation cut short by the power failure was writing. An older
    /// acknowledged content is a rollback and fails the check.
    #[test]
    fn crash_points_through_both_layers_lose_no_acknowledged_page() {
        let struck = two_layer_crash_rounds(40);
        assert!(struck > 30, "power should often fail inside an operation: {struck}");
    }

    /// The two-layer crash oracle catches the rollback it guards against: with recovery
    /// dropping the newest journal record, the same rounds fail.
    #[test]
    fn the_two_layer_crash_oracle_fails_when_recovery_drops_the_newest_commit() {
        crate::journal::set_drop_newest_record(true);
        let verdict = std::panic::catch_unwind(|| two_layer_crash_rounds(40));
        crate::journal::set_drop_newest_record(false);
        assert!(verdict.is_err(), "the two-layer crash oracle missed a dropped acknowledged write");
    }

    /// Runs `rounds` rounds of operations through both layers with power failing at random
    /// writes; panics on the first page that breaks the oracle. Returns how many failed.
    fn two_layer_crash_rounds(rounds: u64) -> u64 {
        use std::collections::BTreeMap;

        use tundra_device::conformance::Rng;
        use tundra_device::fault::FaultyDevice;

        let options = FormatOptions { segment_bytes: 64 * 1024, ..FormatOptions::new(16 << 20, 4 << 20) };
        let quiet = CsdConfig { background: false, ..CsdConfig::default() };
        let mut rng = Rng::new(99);
        let mut struck = 0;
        for round in 0..rounds {
            let media =
                Arc::new(FaultyDevice::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096), round));
            let fast = Arc::new(FaultyDevice::new(MemDevice::new(JOURNAL.total_blocks()), round + 500));
            CsdDevice::format(media.clone(), &options, quiet).unwrap();
            Journal::format(fast.as_ref(), JOURNAL).unwrap();
            let chunk = ChunkId(1);
            // Per page: the content a reader may see (None: absent).
            let mut acknowledged: BTreeMap<u32, Option<Vec<u8>>> = BTreeMap::new();
            // What the operation a power failure cut short was writing, per page.
            let mut in_flight: BTreeMap<u32, Vec<Option<Vec<u8>>>> = BTreeMap::new();
            for crash in 0..3u64 {
                let drive: Arc<dyn BlockDevice> = Arc::new(CsdDevice::open(media.clone(), quiet).unwrap());
                let store = Arc::new(Store::open(drive, fast.clone()).unwrap());
                if store.volume(crate::ids::VolumeId(0)).is_none() {
                    store.create_volume(test_volume(8192)).unwrap();
                }
                store.check_invariants().unwrap_or_else(|p| panic!("round {round} crash {crash}: at recovery: {p}"));
                let pages = path_of(store, 8192, CpuLoad::Fixed(0.0));
                // What `tundra fsck` runs: every page verified, no block leaked.
                let report = pages.check().unwrap_or_else(|e| panic!("round {round} crash {crash}: check: {e}"));
                assert!(report.damaged.is_empty(), "round {round} crash {crash}: {:?}", report.damaged);
                for page in 0..8u32 {
                    let got = pages
                        .read_page(chunk, PageNo(page))
                        .unwrap_or_else(|e| panic!("round {round}: page {page}: {e}"));
                    let expected = acknowledged.get(&page).cloned().flatten();
                    let possible = in_flight.get(&page).is_some_and(|v| v.contains(&got));
                    assert!(got == expected || possible, "round {round} crash {crash}: page {page} lost its content");
                    acknowledged.insert(page, got);
                }
                in_flight.clear();
                if rng.chance(50) {
                    media.crash_after(rng.below(40))
                } else {
                    fast.crash_after(rng.below(20))
                }
                for step in 0..25u64 {
                    let page = rng.below(8) as u32;
                    in_flight.clear();
                    let result = match rng.below(10) {
                        0 => {
                            in_flight.entry(page).or_default().push(None);
                            pages.trim_page(chunk, PageNo(page)).map(|()| vec![(page, None)])
                        }
                        1 => {
                            // Heavy compression changes no content: nothing new to allow.
                            pages.heavy_compress(chunk, PageNo(0), 8).map(|_| Vec::new())
                        }
                        2 => {
                            let mut merged =
                                acknowledged.get(&page).cloned().flatten().unwrap_or_else(|| vec![0; 8192]);
                            merged[100..108].copy_from_slice(&(round * 1000 + crash * 100 + step).to_le_bytes());
                            in_flight.entry(page).or_default().push(Some(merged.clone()));
                            let patch = merged[100..108].to_vec();
                            pages
                                .write_partial(chunk, PageNo(page), 100, &patch, Lsn(1))
                                .map(|()| vec![(page, Some(merged))])
                        }
                        _ => {
                            let content = table_page(round * 1000 + crash * 100 + step, 8192);
                            in_flight.entry(page).or_default().push(Some(content.clone()));
                            pages
                                .write_page(chunk, PageNo(page), &content, Lsn(1), None)
                                .map(|_| vec![(page, Some(content))])
                        }
                    };
                    match result {
                        Ok(changes) => {
                            for (page, content) in changes {
                                acknowledged.insert(page, content);
                            }
                            let invariants = pages.store().check_invariants();
                            invariants.unwrap_or_else(|p| panic!("round {round} crash {crash} step {step}: {p}"));
                        }
                        Err(_) => {
                            struck += 1;
                            break;
                        }
                    }
                }
                drop(pages);
                media.crash();
                fast.crash();
                media.recover().unwrap();
                fast.recover().unwrap();
            }
        }
        struck
    }
}
