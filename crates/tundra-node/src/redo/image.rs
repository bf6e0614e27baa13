//! A copy of a volume's redo stream that another node can install (seed 000 §3.2.1: a new
//! replica receives the stored, compressed images, never compressed again; §3.3: the records
//! not yet folded into them): what a replicated volume's redo group sends a replica that its
//! log cannot bring up to date (a new replica, or one whose entries were purged).
//!
//! The copy is the volume's page images as this node's store holds them (the records folded
//! so far) and every batch the node-local redo log still holds (from its truncation point to
//! its end), with the stream's writer epoch (fence), truncation LSN and durable LSN. It is a
//! byte stream of checksummed items (docs/format.md, "A redo stream's copy"), written and read
//! in pieces, so neither side holds more than one item and an index of the images.
//!
//! Installing replaces the volume's images in this node's store chunk by chunk
//! (`Store::replace_chunk_images`, each all or nothing), then lays the batches in a new log on
//! a free stream slot and names that slot the volume's in one write of the redo area's
//! directory: a crash before that write leaves the old stream (the new slot is free again at
//! the next open), one after it leaves the new. The whole copy is read and checked before
//! anything changes, so a damaged copy is an error that changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use tundra_redo::{RedoBatch, RedoLog, WriterEpoch, codec};
use tundra_store::command::PagePut;
use tundra_store::ids::{ChunkId, Lsn, PageNo, VolumeId};
use tundra_store::index::Encoding;
use tundra_store::store::{ChunkImage, HeavySlot, PageImage};

use super::redo_error;
use crate::node::{Node, VolumeRef};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"TNDRSIMG";
const FORMAT: u16 = 1;
/// Magic, format, volume, page size, fence, start LSN, durable LSN.
const HEADER_BYTES: usize = 8 + 2 + 4 + 4 + 8 + 8 + 8;
/// Kind, body length, body crc32c.
const ITEM_HEADER_BYTES: usize = 1 + 4 + 4;
const KIND_PAGE: u8 = 0;
const KIND_HEAVY: u8 = 1;
const KIND_BATCH: u8 = 2;
const KIND_END: u8 = 3;
/// The largest item body accepted: a batch can never be larger than a stream's log, and an
/// image is at most a heavy segment; a larger length is damage.
const MAX_ITEM_BYTES: u32 = 64 << 20;

/// Bugs for the tests to catch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyBug {
    #[default]
    None,
    /// The copy leaves out the stream's last batch (and says it ends before it).
    DropLastBatch,
}

/// What a copy says of the stream it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyHead {
    pub volume: VolumeId,
    pub page_size: u32,
    /// The writer epoch the stream fences below.
    pub fence: u64,
    /// Batches through this LSN are in the images only.
    pub start_lsn: u64,
    /// The end of the last batch.
    pub durable_lsn: u64,
}

impl CopyHead {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&self.volume.0.to_le_bytes());
        out.extend_from_slice(&self.page_size.to_le_bytes());
        out.extend_from_slice(&self.fence.to_le_bytes());
        out.extend_from_slice(&self.start_lsn.to_le_bytes());
        out.extend_from_slice(&self.durable_lsn.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<CopyHead> {
        if bytes.len() != HEADER_BYTES || &bytes[..8] != MAGIC {
            return Err(Error::Invalid("not a redo stream's copy".into()));
        }
        let mut r = Fields { bytes: &bytes[8..] };
        let format = r.u16()?;
        if format != FORMAT {
            return Err(Error::Invalid(format!("a redo stream's copy of format {format}; this build reads {FORMAT}")));
        }
        Ok(CopyHead {
            volume: VolumeId(r.u32()?),
            page_size: r.u32()?,
            fence: r.u64()?,
            start_lsn: r.u64()?,
            durable_lsn: r.u64()?,
        })
    }
}

/// Fixed-width little-endian fields, each checked against the bytes left.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(Error::Invalid("a redo stream's copy with an item cut short".into()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().map_err(|_| cut())?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| cut())?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| cut())?))
    }
}

fn cut() -> Error {
    Error::Invalid("a redo stream's copy with an item cut short".into())
}

fn put_item(out: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>, kind: u8, body: &[u8]) -> Result<()> {
    let mut header = Vec::with_capacity(ITEM_HEADER_BYTES);
    header.push(kind);
    header.extend_from_slice(&(body.len() as u32).to_le_bytes());
    header.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out(&header).map_err(Error::Io)?;
    out(body).map_err(Error::Io)
}

fn encode_image(chunk: ChunkId, image: &ChunkImage) -> (u8, Vec<u8>) {
    let mut body = Vec::new();
    body.extend_from_slice(&chunk.0.to_le_bytes());
    match image {
        ChunkImage::Page(put) => {
            body.extend_from_slice(&put.page.0.to_le_bytes());
            body.push(put.image.encoding.to_bits());
            body.extend_from_slice(&put.image.checksum.to_le_bytes());
            body.extend_from_slice(&put.lsn.0.to_le_bytes());
            body.extend_from_slice(&put.image.bytes);
            (KIND_PAGE, body)
        }
        ChunkImage::Heavy { segment, pages } => {
            body.extend_from_slice(&(pages.len() as u32).to_le_bytes());
            for slot in pages {
                body.extend_from_slice(&slot.page.0.to_le_bytes());
                body.extend_from_slice(&slot.position.to_le_bytes());
                body.extend_from_slice(&slot.checksum.to_le_bytes());
                body.extend_from_slice(&slot.lsn.0.to_le_bytes());
            }
            body.extend_from_slice(segment);
            (KIND_HEAVY, body)
        }
    }
}

fn decode_image(kind: u8, body: &[u8]) -> Result<(ChunkId, ChunkImage)> {
    let mut r = Fields { bytes: body };
    let chunk = ChunkId(r.u64()?);
    if kind == KIND_PAGE {
        let page = PageNo(r.u32()?);
        let bits = r.u8()?;
        let encoding = Encoding::from_bits(bits)
            .filter(|&e| e != Encoding::Heavy)
            .ok_or_else(|| Error::Invalid(format!("a redo stream's copy with a page of encoding {bits}")))?;
        let checksum = r.u32()?;
        let lsn = Lsn(r.u64()?);
        let image = PageImage { encoding, bytes: r.bytes.to_vec(), checksum };
        return Ok((chunk, ChunkImage::Page(PagePut { page, image, lsn })));
    }
    let count = r.u32()?;
    if u64::from(count) > r.bytes.len() as u64 / 18 {
        return Err(Error::Invalid(format!("a redo stream's copy with a heavy segment of {count} pages")));
    }
    let mut pages = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let page = PageNo(r.u32()?);
        let position = r.u16()?;
        pages.push(HeavySlot { page, position, checksum: r.u32()?, lsn: Lsn(r.u64()?) });
    }
    Ok((chunk, ChunkImage::Heavy { segment: r.bytes.to_vec(), pages }))
}

/// Reads a copy's items in order from a source of its bytes (`read(offset, len)`).
struct Items<'a> {
    read: &'a dyn Fn(u64, usize) -> std::result::Result<Vec<u8>, String>,
    len: u64,
    at: u64,
}

impl Items<'_> {
    fn exact(&self, offset: u64, n: usize) -> Result<Vec<u8>> {
        let bytes = (self.read)(offset, n).map_err(Error::Io)?;
        if bytes.len() != n {
            return Err(Error::Invalid(format!(
                "a redo stream's copy of {} bytes read short at byte {offset}",
                self.len
            )));
        }
        Ok(bytes)
    }

    fn head(&mut self) -> Result<CopyHead> {
        if self.len < HEADER_BYTES as u64 {
            return Err(Error::Invalid(format!("a redo stream's copy of {} bytes", self.len)));
        }
        let head = CopyHead::decode(&self.exact(0, HEADER_BYTES)?)?;
        self.at = HEADER_BYTES as u64;
        Ok(head)
    }

    /// The next item: its offset, kind and checked body; `None` at the end of the bytes.
    fn next_item(&mut self) -> Result<Option<(u64, u8, Vec<u8>)>> {
        if self.at == self.len {
            return Ok(None);
        }
        let offset = self.at;
        if self.len - offset < ITEM_HEADER_BYTES as u64 {
            return Err(Error::Invalid(format!("a redo stream's copy whose last item at byte {offset} is cut short")));
        }
        let header = self.exact(offset, ITEM_HEADER_BYTES)?;
        let mut r = Fields { bytes: &header };
        let (kind, body_len, crc) = (r.u8()?, r.u32()?, r.u32()?);
        if body_len > MAX_ITEM_BYTES || u64::from(body_len) > self.len - offset - ITEM_HEADER_BYTES as u64 {
            return Err(Error::Invalid(format!(
                "a redo stream's copy with an item of {body_len} bytes at byte {offset}"
            )));
        }
        let body = self.exact(offset + ITEM_HEADER_BYTES as u64, body_len as usize)?;
        if crc32c::crc32c(&body) != crc {
            return Err(Error::Corrupted(format!(
                "a redo stream's copy whose item at byte {offset} fails its checksum"
            )));
        }
        self.at = offset + ITEM_HEADER_BYTES as u64 + u64::from(body_len);
        Ok(Some((offset, kind, body)))
    }
}

/// What the check of a whole copy found: its head, where each chunk's images are, where its
/// batches are.
struct Checked {
    head: CopyHead,
    images: BTreeMap<ChunkId, Vec<u64>>,
    batches: Vec<u64>,
}

impl Node {
    /// Writes a copy of volume `id`'s redo stream through `out`, in pieces: the stream's head,
    /// every page image of the volume in this node's store, every batch its log holds. Folding
    /// and spilling wait meanwhile (the stream's `upkeep` lock; the log is truncated only under
    /// it), and the caller holds appends off (a redo group copies between two applies), so the
    /// copy is of one moment. A volume without a stream yet copies as an empty one.
    pub fn redo_copy(
        &self,
        id: VolumeId,
        out: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>,
        bug: CopyBug,
    ) -> Result<CopyHead> {
        let volume = self.volume(id)?;
        let stream = self.redo.stream(id);
        let _upkeep = stream.as_ref().map(|s| s.upkeep.lock());
        let mut head =
            CopyHead { volume: id, page_size: volume.volume.page_size, fence: 0, start_lsn: 0, durable_lsn: 0 };
        // How many of the log's batches the copy carries.
        let mut count = 0usize;
        if let Some(stream) = &stream {
            // A replicated stream's deferred appends are made durable first: the copy is of
            // the log as it stands on disk, and reads back only what is durable.
            stream.log.sync().map_err(redo_error)?;
            head.fence = stream.log.fence().0;
            head.start_lsn = stream.log.start_lsn().0;
            head.durable_lsn = stream.log.durable_lsn().0;
            // Every batch is read and checked before anything is written, so a log that fails
            // its checks writes nothing; none is kept: they are read again below and streamed
            // one at a time (the stream's upkeep is held, and a copy is taken between two
            // applies, so the log is the same both times).
            let mut last_prev = None;
            for batch in stream.log.read_after(Lsn(head.start_lsn)).map_err(redo_error)? {
                last_prev = Some(batch.map_err(redo_error)?.prev_lsn.0);
                count += 1;
            }
            if bug == CopyBug::DropLastBatch
                && let Some(prev) = last_prev
            {
                count -= 1;
                head.durable_lsn = prev;
            }
        }
        out(&head.encode()).map_err(Error::Io)?;
        let store = volume.pages.store();
        // Only a stream that took redo has folded pages; a volume written through its chunk
        // groups keeps its pages out of its redo group's copies.
        let chunks = volume_chunks(&volume).filter(|_| head.durable_lsn > 0);
        for chunk in chunks {
            for (page, entry, slots) in store.snapshot_plan(chunk) {
                let Some(image) = store.snapshot_image(chunk, page, &entry, slots).map_err(Error::from)? else {
                    continue;
                };
                let (kind, body) = encode_image(chunk, &image);
                put_item(out, kind, &body)?;
            }
        }
        let mut sent = 0usize;
        if let Some(stream) = stream.as_ref().filter(|_| count > 0) {
            let mut body = Vec::new();
            for batch in stream.log.read_after(Lsn(head.start_lsn)).map_err(redo_error)?.take(count) {
                body.clear();
                codec::encode_batch(&batch.map_err(redo_error)?, &mut body);
                put_item(out, KIND_BATCH, &body)?;
                sent += 1;
            }
        }
        if sent != count {
            return Err(Error::Io(format!("the redo log held {count} batches, then {sent} while it was copied")));
        }
        put_item(out, KIND_END, &(count as u64).to_le_bytes())?;
        Ok(head)
    }

    /// Drops volume `id`'s redo stream on this node (its replica moved away) and frees its
    /// slot; the volume's images stay for the caller to free.
    pub fn drop_redo_stream(&self, id: VolumeId) -> Result<()> {
        self.redo.forget(id)
    }

    /// Replaces volume `id`'s redo stream here with the copy of `len` bytes that `read` gives
    /// (`read(offset, len)`), checked whole first: a copy that fails a check is an error and
    /// changes nothing. `empty_mark` is the chunk mark given to a chunk whose images the copy
    /// replaces and that has none here (the node runs no group of it).
    pub fn redo_install(
        &self,
        id: VolumeId,
        len: u64,
        read: &dyn Fn(u64, usize) -> std::result::Result<Vec<u8>, String>,
        empty_mark: &[u8],
    ) -> Result<CopyHead> {
        let volume = self.volume(id)?;
        let checked = check_copy(&volume, len, read)?;
        if checked.head.durable_lsn == 0 && checked.head.fence == 0 {
            // A stream that never took redo: nothing to install.
            return Ok(checked.head);
        }
        let old = self.redo.stream(id);
        // No fold, spill or read of the old stream while its images and log are replaced.
        let _upkeep = old.as_ref().map(|s| s.upkeep.lock());
        let _readers = old.as_ref().map(|s| s.fold_gate.write());
        // The old stream's deferred appends (io.rs) are written to its own slot now, so no
        // later sync writes them into the slot once it is freed (an error leaves the old log
        // stopped, which writes nothing more either).
        if let Some(old) = &old {
            let _ = old.log.sync();
        }
        let items = Items { read, len, at: 0 };
        let store = volume.pages.store();
        for chunk in volume_chunks(&volume) {
            let offsets = checked.images.get(&chunk).map_or(&[][..], Vec::as_slice);
            let mut images = offsets.iter().map(|&offset| {
                let mut at = Items { at: offset, ..items };
                let (_, kind, body) = at
                    .next_item()
                    .and_then(|item| item.ok_or_else(|| Error::Invalid("an image past the copy's end".into())))
                    .map_err(store_error)?;
                decode_image(kind, &body).map(|(_, image)| image).map_err(store_error)
            });
            let mark = store.chunk_mark(chunk).unwrap_or_else(|| empty_mark.to_vec());
            store.replace_chunk_images(chunk, &mut images, &mark).map_err(Error::from)?;
        }
        let batches = checked.batches.iter().map(|&offset| {
            let mut at = Items { at: offset, ..items };
            let (_, _, body) = at.next_item()?.ok_or_else(|| Error::Invalid("a batch past the copy's end".into()))?;
            codec::decode_batch(&body, volume.volume.page_size).map_err(redo_error)
        });
        self.redo.install_stream(&volume, &checked.head, batches)?;
        Ok(checked.head)
    }
}

fn store_error(error: Error) -> tundra_store::Error {
    tundra_store::Error::invalid(error.to_string())
}

/// The chunks of a volume, in order.
fn volume_chunks(volume: &VolumeRef) -> impl Iterator<Item = ChunkId> + use<> {
    let count = volume.volume.page_count().div_ceil(volume.volume.pages_per_chunk()).max(1);
    let id = volume.volume.id;
    (0..count as u32).map(move |index| ChunkId::new(id, index))
}

/// Reads the whole copy and checks every item: the head names this volume and its page size,
/// every image is of one of its chunks, in chunk order, and decodes, the batches decode and
/// follow each other from the start LSN to the durable LSN with epochs never above the fence,
/// and the end item counts them last.
fn check_copy(
    volume: &VolumeRef,
    len: u64,
    read: &dyn Fn(u64, usize) -> std::result::Result<Vec<u8>, String>,
) -> Result<Checked> {
    let mut items = Items { read, len, at: 0 };
    let head = items.head()?;
    if head.volume != volume.volume.id || head.page_size != volume.volume.page_size {
        return Err(Error::Invalid(format!(
            "a copy of volume id {}'s redo stream (pages of {} bytes) sent to volume id {} (pages of {} bytes)",
            head.volume.0, head.page_size, volume.volume.id.0, volume.volume.page_size
        )));
    }
    if head.start_lsn > head.durable_lsn {
        return Err(Error::Invalid(format!(
            "a redo stream's copy starting at LSN {} past its durable LSN {}",
            head.start_lsn, head.durable_lsn
        )));
    }
    let chunks: Vec<ChunkId> = volume_chunks(volume).collect();
    let mut checked = Checked { head, images: BTreeMap::new(), batches: Vec::new() };
    let mut end_lsn = head.start_lsn;
    let mut epoch = 0;
    let mut ended = false;
    while let Some((offset, kind, body)) = items.next_item()? {
        if ended {
            return Err(Error::Invalid(format!("a redo stream's copy with an item after its end, at byte {offset}")));
        }
        match kind {
            KIND_PAGE | KIND_HEAVY => {
                let (chunk, _) = decode_image(kind, &body)?;
                if !chunks.contains(&chunk) {
                    return Err(Error::Invalid(format!("a redo stream's copy with an image of chunk {:#x}", chunk.0)));
                }
                if checked.batches.is_empty() && checked.images.keys().next_back().is_none_or(|&last| last <= chunk) {
                    checked.images.entry(chunk).or_default().push(offset);
                } else {
                    return Err(Error::Invalid(format!(
                        "a redo stream's copy with an image out of order at byte {offset}"
                    )));
                }
            }
            KIND_BATCH => {
                let batch = codec::decode_batch(&body, volume.volume.page_size).map_err(redo_error)?;
                if batch.volume != volume.volume.id || batch.prev_lsn.0 != end_lsn || batch.epoch.0 < epoch {
                    return Err(Error::Invalid(format!(
                        "a redo stream's copy whose batch ({}, {}] of epoch {} does not follow LSN {end_lsn}, epoch {epoch}",
                        batch.prev_lsn.0, batch.end_lsn.0, batch.epoch.0
                    )));
                }
                end_lsn = batch.end_lsn.0;
                epoch = batch.epoch.0;
                checked.batches.push(offset);
            }
            KIND_END => {
                let count: [u8; 8] = body.as_slice().try_into().map_err(|_| cut())?;
                if u64::from_le_bytes(count) != checked.batches.len() as u64 {
                    return Err(Error::Invalid("a redo stream's copy whose end counts other batches".into()));
                }
                ended = true;
            }
            other => return Err(Error::Invalid(format!("a redo stream's copy with an item of kind {other}"))),
        }
    }
    if !ended {
        return Err(Error::Invalid("a redo stream's copy without its end".into()));
    }
    if end_lsn != head.durable_lsn || epoch > head.fence {
        return Err(Error::Invalid(format!(
            "a redo stream's copy whose batches end at LSN {end_lsn} (epoch {epoch}), but whose head says LSN {} \
             (fence {})",
            head.durable_lsn, head.fence
        )));
    }
    Ok(checked)
}

impl super::Redo {
    /// Lays `head`'s stream in a new log on a free slot, appends `batches` (then an empty batch
    /// of the head's epoch if no batch carries it), and makes it the volume's stream in one
    /// write of the directory; the old stream's slot is freed after. A crash before the
    /// directory write leaves the old stream.
    fn install_stream(
        &self,
        volume: &VolumeRef,
        head: &CopyHead,
        batches: impl Iterator<Item = Result<RedoBatch>>,
    ) -> Result<()> {
        let Some(area) = &self.area else {
            return Err(Error::Invalid(format!(
                "volume {:?} cannot take redo: this data directory was set up before redo streams existed",
                volume.volume.name
            )));
        };
        let old = self.stream(volume.volume.id);
        let slot = {
            let directory = area.directory.lock();
            let Some(slot) = directory.free_slot() else {
                return Err(Error::NoSpace(format!(
                    "every one of the node's {} redo streams is taken: none is free to receive volume {:?}'s copy",
                    directory.slots(),
                    volume.volume.name
                )));
            };
            slot
        };
        let device = self.stream_device(area, slot)?;
        let geometry = tundra_redo::LogGeometry {
            volume: volume.volume.id,
            page_size: volume.volume.page_size,
            log_blocks: area.stream_blocks - 2,
        };
        RedoLog::format_at(device.as_ref(), geometry, Lsn(head.start_lsn)).map_err(redo_error)?;
        let (log, _) = RedoLog::open(device.clone()).map_err(redo_error)?;
        let mut last = (Lsn(head.start_lsn), 0);
        for batch in batches {
            let batch = batch?;
            last = (batch.end_lsn, batch.epoch.0);
            append_all(&log, &batch)?;
        }
        if head.fence > last.1 {
            let epoch_only = RedoBatch {
                volume: volume.volume.id,
                epoch: WriterEpoch(head.fence),
                prev_lsn: last.0,
                end_lsn: last.0,
                records: vec![],
            };
            append_all(&log, &epoch_only)?;
        }
        drop(log);
        let mut streams = self.streams.write();
        {
            let mut directory = area.directory.lock();
            let old_slot = old.as_ref().map(|s| s.slot);
            directory.set_pair(area.device.as_ref(), slot, Some(volume.volume.id), old_slot)?;
        }
        let stream = Arc::new(self.recover_stream(area, slot, volume)?);
        streams.insert(volume.volume.id, stream);
        drop(streams);
        if let Some(old) = old {
            let old_device = self.stream_device(area, old.slot)?;
            old_device.trim(tundra_device::Lba(0), old_device.block_count())?;
            if let Some(slots) = &old.slots {
                slots.clear_all().map_err(redo_error)?;
            }
        }
        Ok(())
    }
}

fn append_all(log: &RedoLog, batch: &RedoBatch) -> Result<()> {
    match log.append(batch).map_err(redo_error)? {
        tundra_redo::AppendOutcome::Ok { .. } => Ok(()),
        refused => Err(Error::Invalid(format!(
            "the new stream refused the copy's batch ({}, {}]: {refused:?}",
            batch.prev_lsn.0, batch.end_lsn.0
        ))),
    }
}
