//! The read path: the cache of decompressed pages, the store's image, decompression (heavy
//! segments through their own cache) and the address-bound checksum.

use super::*;

impl Pages {
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
        Ok(self.read_pages_shared(chunk, &[page])?.pop().flatten())
    }

    /// [`Pages::read_page_shared`] for several pages of one chunk: the pages not in the cache
    /// are read from the store together ([`crate::store::Store::read_images`]: one device
    /// read for images whose runs follow one another), each verified as a page read alone is.
    pub fn read_pages_shared(&self, chunk: ChunkId, pages: &[PageNo]) -> Result<Vec<Option<Arc<[u8]>>>> {
        let mut out: Vec<Option<Arc<[u8]>>> = Vec::with_capacity(pages.len());
        let mut missing: Vec<usize> = Vec::new();
        {
            let mut cache = self.cache.lock();
            for (i, &page) in pages.iter().enumerate() {
                let cached = cache.get((chunk, page));
                if cached.is_some() {
                    self.reads.fetch_add(1, Ordering::Relaxed);
                } else {
                    missing.push(i);
                }
                out.push(cached);
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let wanted: Vec<PageNo> = missing.iter().map(|&i| pages[i]).collect();
        let images = self.store.read_images(chunk, &wanted)?;
        for (&i, image) in missing.iter().zip(images) {
            let Some((entry, stored)) = image else { continue };
            let content: Arc<[u8]> = Arc::from(self.expand(chunk, pages[i], &entry, stored)?);
            self.remember(chunk, pages[i], entry, || content.clone());
            out[i] = Some(content);
        }
        Ok(out)
    }

    /// Reads a page's stored image from the device, past the cache, and verifies it: the
    /// page's entry when it is sound, `None` when the page does not exist, a corruption error
    /// when its bytes fail. What a scrub asks of every page.
    pub fn verify_stored(&self, chunk: ChunkId, page: PageNo) -> Result<Option<crate::index::PageEntry>> {
        Ok(self.load(chunk, page)?.map(|(entry, _)| entry))
    }

    /// The page's stored image as one [`PagePut`] (the bytes as stored, never compressed
    /// again, with their LSN), verified first: a copy for a replica whose own image is bad.
    /// `None` when the page does not exist; a corruption error when this copy is bad too.
    pub fn good_image(&self, chunk: ChunkId, page: PageNo) -> Result<Option<crate::command::PagePut>> {
        let Some((entry, bytes)) = self.store.read_image(chunk, page)? else { return Ok(None) };
        if entry.encoding == Encoding::Heavy {
            return Err(Error::invalid("a copy of a page of a heavy segment is not built yet"));
        }
        let image = crate::store::PageImage { encoding: entry.encoding, bytes, checksum: entry.checksum };
        let put = crate::command::PagePut { page, image, lsn: entry.lsn };
        self.verify_image(chunk, &put)?;
        Ok(Some(put))
    }

    /// Checks that an image (from a peer, or read here) decompresses to content that matches
    /// its checksum; a corruption error otherwise.
    pub fn verify_image(&self, chunk: ChunkId, put: &crate::command::PagePut) -> Result<()> {
        let encoding = match put.image.encoding {
            Encoding::Heavy => return Err(Error::invalid("a heavy segment is not a page image")),
            Encoding::Raw => tundra_codec::Encoding::Raw,
            Encoding::Lz4 => tundra_codec::Encoding::Compressed(Algorithm::Lz4),
            Encoding::Zstd => tundra_codec::Encoding::Compressed(Algorithm::Zstd),
        };
        let content = match encoding {
            tundra_codec::Encoding::Raw if put.image.bytes.len() == self.page_size.bytes() => put.image.bytes.clone(),
            tundra_codec::Encoding::Raw => return Err(Error::corrupted("a raw image that is not one page long")),
            encoding => self.codec.decode(encoding, &put.image.bytes, self.page_size).map_err(codec_error)?,
        };
        if page_checksum(chunk, put.page, &content) != put.image.checksum {
            return Err(Error::corrupted(format!("page {} of chunk {} fails its checksum", put.page.0, chunk.0)));
        }
        Ok(())
    }

    /// Reads a page from the store, decompresses and verifies it.
    fn load(&self, chunk: ChunkId, page: PageNo) -> Result<Option<(crate::index::PageEntry, Vec<u8>)>> {
        let Some((entry, stored)) = self.store.read_image(chunk, page)? else { return Ok(None) };
        let content = self.expand(chunk, page, &entry, stored)?;
        Ok(Some((entry, content)))
    }

    /// A page's content from its stored image: decompressed and verified against its checksum.
    fn expand(
        &self,
        chunk: ChunkId,
        page: PageNo,
        entry: &crate::index::PageEntry,
        stored: Vec<u8>,
    ) -> Result<Vec<u8>> {
        let encoding = match entry.encoding {
            Encoding::Heavy => None,
            Encoding::Raw => Some(tundra_codec::Encoding::Raw),
            Encoding::Lz4 => Some(tundra_codec::Encoding::Compressed(Algorithm::Lz4)),
            Encoding::Zstd => Some(tundra_codec::Encoding::Compressed(Algorithm::Zstd)),
        };
        let content = match encoding {
            None => self.heavy_page(entry, &stored)?,
            // A raw page is its stored bytes: no copy.
            Some(tundra_codec::Encoding::Raw) if stored.len() == self.page_size.bytes() => stored,
            Some(encoding) => self.codec.decode(encoding, &stored, self.page_size).map_err(codec_error)?,
        };
        if page_checksum(chunk, page, &content) != entry.checksum {
            return Err(Error::corrupted(format!("page {} of chunk {} fails its checksum", page.0, chunk.0)));
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(content)
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

    /// One page of a heavy segment, from the cache of decompressed segments when this segment
    /// (same first block and nonce) was decompressed before.
    fn heavy_page(&self, entry: &crate::index::PageEntry, stored: &[u8]) -> Result<Vec<u8>> {
        let (page_count, len) = Self::segment_extent(stored)?;
        let nonce = u64::from_le_bytes(stored[8..HEAVY_HEADER_BYTES].try_into().expect("8 bytes"));
        let index = usize::from(entry.stored_len);
        if index >= page_count {
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
                let frame = &stored[HEAVY_HEADER_BYTES..len];
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

    /// A heavy segment's bytes as stored (`stored` may run on to the end of its blocks):
    /// its header's page count and the segment's own length, checked against `stored`.
    fn segment_extent(stored: &[u8]) -> Result<(usize, usize)> {
        let header = stored.get(..HEAVY_HEADER_BYTES).ok_or_else(|| Error::corrupted("a heavy segment cut short"))?;
        let frame_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let page_count = usize::from(u16::from_le_bytes(header[4..6].try_into().expect("2 bytes")));
        if HEAVY_HEADER_BYTES + frame_len > stored.len() {
            return Err(Error::corrupted("a heavy segment header that does not fit its blocks"));
        }
        Ok((page_count, HEAVY_HEADER_BYTES + frame_len))
    }

    /// Decompresses a heavy segment (never from the cache) and says, for each (page, position,
    /// checksum), whether the content at that position matches.
    fn verify_places(&self, chunk: ChunkId, stored: &[u8], places: &[(PageNo, u16, u32)]) -> Result<Vec<bool>> {
        let (page_count, len) = Self::segment_extent(stored)?;
        let frame = &stored[HEAVY_HEADER_BYTES..len];
        let segment =
            tundra_codec::heavy::decompress_segment(frame, self.page_size, page_count).map_err(codec_error)?;
        Ok(places
            .iter()
            .map(|&(page, position, checksum)| {
                segment
                    .page(usize::from(position))
                    .is_some_and(|content| page_checksum(chunk, page, content) == checksum)
            })
            .collect())
    }

    /// [`Pages::verify_places`], as an error naming the first page that fails.
    fn verify_all(&self, chunk: ChunkId, stored: &[u8], places: &[(PageNo, u16, u32)]) -> Result<()> {
        let good = self.verify_places(chunk, stored, places)?;
        match places.iter().zip(good).find(|(_, good)| !*good) {
            Some(((page, _, _), _)) => Err(Error::corrupted(format!(
                "page {} of chunk {} fails its checksum in its heavy segment",
                page.0, chunk.0
            ))),
            None => Ok(()),
        }
    }

    /// Checks a heavy segment as a snapshot captures it (its bytes as stored, and the chunk's
    /// pages that point into it): a corruption error naming the first page that fails.
    pub fn verify_segment_image(
        &self,
        chunk: ChunkId,
        segment: &[u8],
        slots: &[crate::store::HeavySlot],
    ) -> Result<()> {
        let places: Vec<(PageNo, u16, u32)> = slots.iter().map(|s| (s.page, s.position, s.checksum)).collect();
        self.verify_all(chunk, segment, &places)
    }

    /// The pages of `chunk` whose entries point into the same heavy segment as `entry`.
    pub fn segment_pages(
        &self,
        chunk: ChunkId,
        entry: &crate::index::PageEntry,
    ) -> Vec<(PageNo, crate::index::PageEntry)> {
        self.store
            .chunk_entries(chunk)
            .into_iter()
            .filter(|(_, e)| e.encoding == Encoding::Heavy && e.run == entry.run)
            .collect()
    }

    /// Reads the heavy segment `pages` point into from the device, past every cache, and
    /// verifies every one of them in it: a corruption error naming the first that fails (or
    /// the segment, when it does not decompress). What a scrub asks of a segment.
    pub fn verify_segment(&self, chunk: ChunkId, pages: &[(PageNo, crate::index::PageEntry)]) -> Result<()> {
        let Some(&(first, _)) = pages.first() else { return Ok(()) };
        let Some((_, stored)) = self.store.read_image(chunk, first)? else { return Ok(()) };
        self.verify_all(chunk, &stored, &places_of(pages))
    }

    /// Of `pages` (entries of this replica pointing into one heavy segment), those whose
    /// content verifies in `segment`, a peer's copy of that segment.
    pub fn check_segment_copy(
        &self,
        chunk: ChunkId,
        segment: &[u8],
        pages: &[(PageNo, crate::index::PageEntry)],
    ) -> Result<Vec<(PageNo, crate::index::PageEntry)>> {
        let (_, len) = Self::segment_extent(segment)?;
        if len != segment.len() {
            return Err(Error::corrupted("a heavy segment copy longer than its header says"));
        }
        let good = self.verify_places(chunk, segment, &places_of(pages))?;
        Ok(pages.iter().zip(good).filter(|(_, good)| *good).map(|(page, _)| *page).collect())
    }

    /// The heavy segment page `page` points into, verified for that page first: a copy for a
    /// replica whose own segment is bad, as the page's place in a `PutHeavy` and the segment's
    /// bytes. `None` when the page does not exist or is not in a heavy segment.
    pub fn good_segment(&self, chunk: ChunkId, page: PageNo) -> Result<Option<(crate::command::HeavyPage, Vec<u8>)>> {
        let Some((entry, stored)) = self.store.read_image(chunk, page)? else { return Ok(None) };
        if entry.encoding != Encoding::Heavy {
            return Ok(None);
        }
        self.verify_all(chunk, &stored, &places_of(&[(page, entry)]))?;
        let (_, len) = Self::segment_extent(&stored)?;
        let heavy = crate::command::HeavyPage { page, checksum: entry.checksum, lsn: entry.lsn };
        Ok(Some((heavy, stored[..len].to_vec())))
    }
}

/// Each page's place in its heavy segment and checksum, from its entry.
fn places_of(pages: &[(PageNo, crate::index::PageEntry)]) -> Vec<(PageNo, u16, u32)> {
    pages.iter().map(|(page, entry)| (*page, entry.stored_len, entry.checksum)).collect()
}
