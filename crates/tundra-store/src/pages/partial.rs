//! Writes to part of a page (the none mode of seed 000 §3.2.3): read, merge, store raw, and
//! later compress again once no partial write is pending.

use super::*;

impl Pages {
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
            let first = Wanted::Select(PageHistory::FirstWrite);
            let (encoded, revisit) = self.encode_noting(chunk, &content, first, &mut None)?;
            if encoded.encoding != tundra_codec::Encoding::Raw {
                self.store_encoded(chunk, page, &content, encoded, entry.lsn)?;
                done += 1;
            }
            // Compressed with lz4 on a busy host, or left raw by it: the idle pass compares.
            self.rechoose.lock().note(chunk, page, revisit);
        }
        Ok(done)
    }
}
