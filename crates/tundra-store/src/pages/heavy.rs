//! Heavy compression (seed 000 §3.2.3): a range of archived pages compressed together into
//! segments of at most one extent.
//!
//! Planning (reading the pages and compressing them into segments) is apart from applying the
//! [`StoreCommand::PutHeavy`] of each segment: a node alone applies each plan under the pages'
//! locks, and a chunk's Raft leader proposes it, so that every replica stores the same segment
//! bytes and compresses nothing itself. A segment applied after one of its pages changed
//! leaves that page as it is (`Store`'s `put_heavy`), so the leader needs no lock.

use super::*;

/// One heavy segment to store: its command, and what its pages took before and take after.
#[derive(Debug)]
pub struct HeavyPlan {
    pub command: StoreCommand,
    pub report: HeavyReport,
}

impl Pages {
    /// Heavy compression of `count` pages of `chunk` from `first` (seed 000 §3.2.3), for archived
    /// data: the pages that exist are read, verified, and compressed together with zstd at a high
    /// level in segments of at most one extent, then each page points into its segment. Pages
    /// written while this runs keep their newer content: each page is locked from its read to
    /// the segment's installation. Refused when the software policy is off.
    pub fn heavy_compress(&self, chunk: ChunkId, first: PageNo, count: u32) -> Result<HeavyReport> {
        let mut report = HeavyReport::default();
        for pages in self.heavy_groups(chunk, first, count)? {
            let mut stripes: Vec<usize> = pages.iter().map(|&p| self.stripe(chunk, p)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            // Stripes in ascending order: writers of single pages take one, so no deadlock.
            let _locks: Vec<_> = stripes.iter().map(|&s| self.page_locks[s].lock()).collect();
            let mut plans = Vec::new();
            self.plan_group(chunk, pages, &mut plans)?;
            for plan in plans {
                self.apply_heavy(&plan.command)?;
                report.add(&plan.report);
            }
        }
        Ok(report)
    }

    /// The segments heavy compression of `count` pages of `chunk` from `first` would store, read
    /// and compressed now and stored by no one: what a chunk's leader proposes. The same checks
    /// and grouping as [`Pages::heavy_compress`]; no page is locked.
    pub fn plan_heavy(&self, chunk: ChunkId, first: PageNo, count: u32) -> Result<Vec<HeavyPlan>> {
        let mut plans = Vec::new();
        for pages in self.heavy_groups(chunk, first, count)? {
            self.plan_group(chunk, pages, &mut plans)?;
        }
        Ok(plans)
    }

    /// Applies a planned segment here and forgets the cached copies of its pages.
    fn apply_heavy(&self, command: &StoreCommand) -> Result<()> {
        self.store.apply(command)?;
        if let StoreCommand::PutHeavy { chunk, pages, .. } = command {
            let mut cache = self.cache.lock();
            for heavy in pages {
                cache.invalidate((*chunk, heavy.page));
            }
        }
        Ok(())
    }

    /// The range cut into the groups of pages one segment may hold at most, after the checks.
    fn heavy_groups(&self, chunk: ChunkId, first: PageNo, count: u32) -> Result<Vec<Vec<PageNo>>> {
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
        let end = first.0.checked_add(count).ok_or_else(|| Error::invalid("the page range overflows"))?;
        Ok((first.0..end)
            .step_by(group as usize)
            .map(|start| (start..end.min(start + group)).map(PageNo).collect())
            .collect())
    }

    /// Plans one group of pages as a segment, halving the group until it fits an extent; a
    /// single page that does not fit is left as it is.
    fn plan_group(&self, chunk: ChunkId, pages: Vec<PageNo>, plans: &mut Vec<HeavyPlan>) -> Result<()> {
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
            let half = pages.len() / 2;
            self.plan_group(chunk, pages[..half].to_vec(), plans)?;
            return self.plan_group(chunk, pages[half..].to_vec(), plans);
        }
        let mut segment = Vec::with_capacity(HEAVY_HEADER_BYTES + frame.len());
        segment.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        segment.extend_from_slice(&(present.len() as u16).to_le_bytes());
        segment.extend_from_slice(&[0, 0]);
        segment.extend_from_slice(&self.next_segment_nonce().to_le_bytes());
        segment.extend_from_slice(&frame);
        let report = HeavyReport {
            pages: present.len() as u64,
            segments: 1,
            bytes_before: before,
            bytes_after: segment.len().div_ceil(tundra_device::BLOCK_SIZE) as u64 * tundra_device::BLOCK_SIZE_BYTES,
        };
        plans.push(HeavyPlan { command: StoreCommand::PutHeavy { chunk, pages: present, segment }, report });
        Ok(())
    }
}

impl HeavyReport {
    /// Adds another report's figures to these.
    pub fn add(&mut self, other: &HeavyReport) {
        self.pages += other.pages;
        self.segments += other.segments;
        self.bytes_before += other.bytes_before;
        self.bytes_after += other.bytes_after;
    }
}
