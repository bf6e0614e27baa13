//! Heavy compression (seed 000 §3.2.3): a range of archived pages compressed together into
//! segments of at most one extent.

use super::*;

impl Pages {
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
            present.push(HeavyPage { page, checksum: page_checksum(chunk, page, &bytes), lsn: entry.lsn });
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
        segment.extend_from_slice(&self.next_segment_nonce().to_le_bytes());
        segment.extend_from_slice(&frame);
        // Pages absent from the segment are not indexed by it: index them by position.
        let segment_bytes = segment.len();
        let archived: Vec<PageNo> = present.iter().map(|p| p.page).collect();
        self.store.apply(&StoreCommand::PutHeavy { chunk, pages: present, segment })?;
        {
            let mut cache = self.cache.lock();
            for &page in &archived {
                cache.invalidate((chunk, page));
            }
        }
        report.pages += archived.len() as u64;
        report.segments += 1;
        report.bytes_before += before;
        report.bytes_after +=
            segment_bytes.div_ceil(tundra_device::BLOCK_SIZE) as u64 * tundra_device::BLOCK_SIZE_BYTES;
        Ok(())
    }
}
