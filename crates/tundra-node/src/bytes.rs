//! Byte I/O, for block-device clients (NBD) that address a volume in bytes: reads, writes and
//! zeroing of any range. Each walks its range page by page (spans.rs): a whole page is read or
//! written as it is, a piece is copied out of its page or merged into it. Writes go to the
//! write-back cache (writeback.rs), durable at the next flush; with the cache off, whole pages
//! go through Algorithm 1 at once and pieces are merged into their stored page and stored raw
//! (the none mode of seed 000 §3.2.3).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::node::{Node, VolumeRef, WriteMode};
use crate::spans::{ByteRange, PageSpan};
use crate::writeback::Content;
use crate::{Error, Result};
use tundra_store::ids::{ChunkId, PageNo};

impl Node {
    /// Reads `buf.len()` bytes at byte `offset` of a volume. A page in the write-back cache is
    /// read from there; the others are read from the store together, a chunk at a time, so
    /// that pages whose images follow one another on the device take one device read
    /// (`Pages::read_pages_shared`).
    pub fn read_bytes(&self, volume: &VolumeRef, offset: u64, buf: &mut [u8]) -> Result<()> {
        volume.check_live()?;
        check_bytes(volume, offset, buf.len() as u64)?;
        let mut spans = ByteRange::new(offset, buf.len() as u64, volume.page_size()).pages().peekable();
        let Some(first) = spans.next() else { return Ok(()) };
        if spans.peek().is_none() {
            return self.read_within(volume, first.index, first.within, &mut buf[first.buffer()]);
        }
        let started = self.clock.now();
        // The pages of one chunk still to read from the store, with their spans.
        let mut batch: Vec<(PageSpan, PageNo)> = Vec::new();
        let mut batch_chunk: Option<ChunkId> = None;
        let mut pages = 0u32;
        for span in std::iter::once(first).chain(spans) {
            pages += 1;
            let (chunk, page) = volume.volume.locate(span.index)?;
            let range = span.within..span.within + span.len;
            match self.writeback.get((volume.volume.id, span.index)) {
                Some(Content::Page(content)) => buf[span.buffer()].copy_from_slice(&content[range]),
                Some(Content::Trimmed) => buf[span.buffer()].fill(0),
                None => {
                    if let Some(other) = batch_chunk.filter(|&c| c != chunk) {
                        read_batch(volume, other, &mut batch, buf)?;
                    }
                    batch_chunk = Some(chunk);
                    batch.push((span, page));
                }
            }
        }
        if let Some(chunk) = batch_chunk {
            read_batch(volume, chunk, &mut batch, buf)?;
        }
        let elapsed = self.clock.now().saturating_sub(started);
        for _ in 0..pages {
            volume.latency.page_read.observe(elapsed / pages);
        }
        Ok(())
    }

    /// Writes `data` at byte `offset` (a block-device client): into the write-back cache, whole
    /// pages as they are and pieces merged into their page; durable at the next flush. With
    /// the cache off, whole aligned pages go through Algorithm 1 at once and pieces are merged
    /// into their stored page and stored raw (the none mode).
    pub fn write_bytes(&self, volume: &VolumeRef, offset: u64, data: &[u8]) -> Result<()> {
        volume.check_live()?;
        self.check_not_redo(volume)?;
        check_bytes(volume, offset, data.len() as u64)?;
        for span in ByteRange::new(offset, data.len() as u64, volume.page_size()).pages() {
            let piece = &data[span.buffer()];
            let started = self.clock.now();
            if self.writeback_enabled {
                self.cache_piece(volume, &span, piece)?;
            } else if span.is_whole() {
                let _no_flush = self.writeback.direct(volume.volume.id);
                self.store_page(volume, span.index, self.block_write_mode(volume, span.index), piece)?;
            } else {
                let (chunk, page) = volume.volume.locate(span.index)?;
                volume.pages.write_partial(chunk, page, span.within, piece, self.next_lsn())?;
            }
            volume.latency.page_write.observe(self.clock.now().saturating_sub(started));
        }
        if self.writeback.over_limit() {
            self.flush_dirty()?;
        }
        Ok(())
    }

    /// Puts one page's piece of a byte write in the write-back cache: a whole page as it is, a
    /// piece merged into the cached page or, when none is cached, into the stored one.
    fn cache_piece(&self, volume: &VolumeRef, span: &PageSpan, piece: &[u8]) -> Result<()> {
        let (chunk, page) = volume.volume.locate(span.index)?;
        let mut shard = self.writeback.lock((volume.volume.id, span.index));
        // Checked again under the page's lock: a deleted volume's cached writes are dropped
        // under the same locks, so none is cached after the drop.
        volume.check_live()?;
        let within = span.within..span.within + span.len;
        if span.is_whole() {
            shard.put(Content::Page(Arc::new(piece.to_vec())));
        } else if let Some(cached) = shard.page_mut() {
            cached[within].copy_from_slice(piece);
            self.writeback.count_piece(false);
        } else {
            // The page's current content, under the shard's lock so that no other writer of
            // this page slips in between the read and the merge.
            let mut content = match shard.get() {
                Some(Content::Trimmed) => None,
                _ => volume.pages.read_page(chunk, page)?,
            }
            .unwrap_or_else(|| vec![0u8; volume.page_size()]);
            content[within].copy_from_slice(piece);
            shard.put(Content::Page(Arc::new(content)));
            self.writeback.count_piece(true);
        }
        Ok(())
    }

    /// Algorithm 1 for a block-device write, which carries no redo volume to estimate how much
    /// of the page changed: the comparison is made again on one rewrite in four (chosen by a
    /// hash of page and version, so pages do not move in step), and otherwise the page keeps
    /// its algorithm, so most rewrites compress once.
    pub(crate) fn block_write_mode(&self, volume: &VolumeRef, index: u64) -> WriteMode {
        let version = self.version.load(Ordering::Relaxed);
        let mix =
            (index ^ (u64::from(volume.volume.id.0) << 40)).wrapping_add(version).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        WriteMode::Auto { update_fraction: if mix >> 62 == 0 { None } else { Some(0.0) } }
    }

    /// Zeroes `len` bytes at `offset`: whole pages are trimmed (they read as zeros and free
    /// their blocks), pieces of pages written as zeros.
    pub fn zero_bytes(&self, volume: &VolumeRef, offset: u64, len: u64) -> Result<()> {
        volume.check_live()?;
        self.check_not_redo(volume)?;
        check_bytes(volume, offset, len)?;
        let split = ByteRange::new(offset, len, volume.page_size()).split();
        if let Some(head) = split.head {
            self.write_bytes(volume, offset + head.at, &vec![0u8; head.len])?;
        }
        if !split.whole.is_empty() {
            if self.writeback_enabled {
                for index in split.whole {
                    let mut shard = self.writeback.lock((volume.volume.id, index));
                    volume.check_live()?;
                    shard.put(Content::Trimmed);
                }
            } else {
                self.trim_pages(volume, split.whole.start, split.whole.end - split.whole.start)?;
            }
        }
        if let Some(tail) = split.tail {
            self.write_bytes(volume, offset + tail.at, &vec![0u8; tail.len])?;
        }
        if self.writeback.over_limit() {
            self.flush_dirty()?;
        }
        Ok(())
    }
}

/// Reads the pages of `batch` (all of `chunk`) from the store together into their spans of
/// `buf`, and empties it.
fn read_batch(volume: &VolumeRef, chunk: ChunkId, batch: &mut Vec<(PageSpan, PageNo)>, buf: &mut [u8]) -> Result<()> {
    let pages: Vec<PageNo> = batch.iter().map(|&(_, page)| page).collect();
    let contents = volume.pages.read_pages_shared(chunk, &pages)?;
    for ((span, _), content) in batch.drain(..).zip(contents) {
        match content {
            Some(content) => buf[span.buffer()].copy_from_slice(&content[span.within..span.within + span.len]),
            None => buf[span.buffer()].fill(0),
        }
    }
    Ok(())
}

fn check_bytes(volume: &VolumeRef, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= volume.volume.size_bytes => Ok(()),
        _ => Err(Error::Invalid(format!(
            "bytes {offset}..+{len} are outside volume {:?} ({} bytes)",
            volume.volume.name, volume.volume.size_bytes
        ))),
    }
}
