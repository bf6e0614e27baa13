//! The offline check `tundra fsck` runs on a page path.

use super::*;

impl Pages {
    /// Checks the whole store offline (what `tundra fsck` reports): every page is read from the
    /// device, decompressed and verified against its checksum, bypassing the cache; the allocator
    /// was already rebuilt from the index when the store opened, which proves no block is used
    /// twice; and the data device must hold no more mapped blocks than the pages reference (more
    /// would be leaked physical space). Pages of volumes of another page size are counted in
    /// the referenced bytes but read by their own path's check.
    pub fn check(&self) -> Result<CheckReport> {
        self.store.release_freed()?;
        // Every page is read from the device, including those whose images wait in memory.
        self.store.write_unwritten()?;
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
}
