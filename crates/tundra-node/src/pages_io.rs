//! Page I/O, for engines that address a volume in pages (the native protocol): read a page,
//! write one with the compression the engine chose (durable when it returns), trim a range,
//! compress a range heavily. Byte I/O (bytes.rs) reads through the same path and stores whole
//! pages through [`Node::store_page`].

use tundra_codec::Algorithm;
use tundra_store::pages::HeavyReport;
use tundra_store::volume::VolumeMode;

use crate::node::{Node, VolumeRef, WriteMode};
use crate::writeback::Content;
use crate::{Error, Result};

impl Node {
    /// Reads page `index` of a volume into `out` (exactly one page; zeros if never written).
    /// A page written by a block-device client and not yet flushed is read from the write-back
    /// cache.
    pub fn read_page(&self, volume: &VolumeRef, index: u64, out: &mut [u8]) -> Result<()> {
        volume.check_live()?;
        check_len(volume, out.len())?;
        self.read_within(volume, index, 0, out)
    }

    /// Reads `out.len()` bytes from byte `within` of page `index`: only those bytes are copied,
    /// from the write-back cache or from the page cache's copy.
    pub(crate) fn read_within(&self, volume: &VolumeRef, index: u64, within: usize, out: &mut [u8]) -> Result<()> {
        let started = self.clock.now();
        let (chunk, page) = volume.volume.locate(index)?;
        let range = within..within + out.len();
        match self.writeback.get((volume.volume.id, index)) {
            Some(Content::Page(content)) => out.copy_from_slice(&content[range]),
            Some(Content::Trimmed) => out.fill(0),
            None => match volume.pages.read_page_shared(chunk, page)? {
                Some(content) => out.copy_from_slice(&content[range]),
                None => out.fill(0),
            },
        }
        volume.latency.page_read.observe(self.clock.now().saturating_sub(started));
        Ok(())
    }

    /// Writes page `index` of a volume, durably (the page protocol: the engine chose the mode).
    pub fn write_page(&self, volume: &VolumeRef, index: u64, mode: WriteMode, content: &[u8]) -> Result<()> {
        let started = self.clock.now();
        check_len(volume, content.len())?;
        volume.volume.locate(index)?;
        self.check_not_redo(volume)?;
        let _no_flush = self.writeback.direct(volume.volume.id);
        // An older cached version must never overwrite this one later.
        let mut shard = self.writeback.lock((volume.volume.id, index));
        volume.check_live()?;
        shard.remove();
        self.store_page(volume, index, mode, content)?;
        drop(shard);
        volume.latency.page_write.observe(self.clock.now().saturating_sub(started));
        Ok(())
    }

    /// Compresses and stores one page: durable when it returns.
    pub(crate) fn store_page(&self, volume: &VolumeRef, index: u64, mode: WriteMode, content: &[u8]) -> Result<()> {
        let (chunk, page) = volume.volume.locate(index)?;
        let lsn = self.next_lsn();
        let mode = if volume.volume.mode == VolumeMode::None { WriteMode::None } else { mode };
        match mode {
            WriteMode::Auto { update_fraction } => {
                volume.pages.write_page(chunk, page, content, lsn, update_fraction)?;
            }
            WriteMode::Lz4 => volume.pages.write_page_with(chunk, page, content, lsn, Some(Algorithm::Lz4))?,
            WriteMode::Zstd => volume.pages.write_page_with(chunk, page, content, lsn, Some(Algorithm::Zstd))?,
            WriteMode::None => volume.pages.write_page_with(chunk, page, content, lsn, None)?,
        }
        Ok(())
    }

    /// Removes `count` pages from `first`: they read as zeros and their blocks are freed.
    pub fn trim_pages(&self, volume: &VolumeRef, first: u64, count: u64) -> Result<()> {
        volume.check_live()?;
        self.check_not_redo(volume)?;
        check_range(volume, first, count)?;
        let _no_flush = self.writeback.direct(volume.volume.id);
        for index in first..first + count {
            let (chunk, page) = volume.volume.locate(index)?;
            let mut shard = self.writeback.lock((volume.volume.id, index));
            shard.remove();
            volume.pages.trim_page(chunk, page)?;
        }
        Ok(())
    }

    /// Heavy compression of `count` pages from `first` (seed 000 §3.2.3), chunk by chunk.
    pub fn heavy_compress(&self, volume: &VolumeRef, first: u64, count: u64) -> Result<HeavyReport> {
        volume.check_live()?;
        check_range(volume, first, count)?;
        if volume.volume.mode == VolumeMode::None {
            return Err(Error::Invalid(format!("volume {:?} is never compressed", volume.volume.name)));
        }
        // The range is archived as the store holds it: cached writes go there first. Writes
        // that arrive later stay cached and replace the archived pages when flushed.
        self.flush_dirty()?;
        let _no_flush = self.writeback.direct(volume.volume.id);
        let mut total = HeavyReport::default();
        let per_chunk = volume.volume.pages_per_chunk();
        let mut index = first;
        while index < first + count {
            let (chunk, page) = volume.volume.locate(index)?;
            let n = (per_chunk - u64::from(page.0)).min(first + count - index);
            let report = volume.pages.heavy_compress(chunk, page, n as u32)?;
            total.pages += report.pages;
            total.segments += report.segments;
            total.bytes_before += report.bytes_before;
            total.bytes_after += report.bytes_after;
            index += n;
        }
        Ok(total)
    }
}

fn check_len(volume: &VolumeRef, len: usize) -> Result<()> {
    if len != volume.page_size() {
        return Err(Error::Invalid(format!(
            "a page of {len} bytes for volume {:?} of {}-byte pages",
            volume.volume.name, volume.volume.page_size
        )));
    }
    Ok(())
}

fn check_range(volume: &VolumeRef, first: u64, count: u64) -> Result<()> {
    match first.checked_add(count) {
        Some(end) if end <= volume.volume.page_count() => Ok(()),
        _ => Err(Error::Invalid(format!(
            "pages {first}..+{count} are outside volume {:?} ({} pages)",
            volume.volume.name,
            volume.volume.page_count()
        ))),
    }
}
