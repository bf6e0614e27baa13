//! The journal's records: one change to the store's state each, with their byte layout
//! (docs/format.md, "Journal records"). Decoding checks every field against what contains it
//! before using it; a record that does not decode is damage, never a panic.

use crate::ids::{BlockRun, ChunkId, ExtentId, Lsn, PageNo, VolumeId};
use crate::index::{Encoding, PageEntry};
use crate::store::Watermarks;
use crate::volume::{MAX_NAME_BYTES, Volume, VolumeMode};
use crate::{Error, Result};

/// One change to a chunk's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The page is now stored in `entry`'s blocks, which were durable before this record.
    PageSet { chunk: ChunkId, page: PageNo, entry: PageEntry },
    /// The page no longer exists (trimmed); it reads as zeros.
    PageClear { chunk: ChunkId, page: PageNo },
    /// A volume was created or changed.
    VolumeSet(Volume),
    /// A volume and all its pages are gone.
    VolumeDelete(VolumeId),
    /// Every volume id below this one has been given out: ids are never given twice, so a
    /// client holding the id of a deleted volume can never reach a newer one. Every checkpoint
    /// carries it, since the volume that held the highest id may be gone.
    VolumeIdFloor(VolumeId),
    /// A volume's redo watermarks advanced (see [`Watermarks`]); every checkpoint carries the
    /// latest of each volume.
    Watermarks { volume: VolumeId, marks: Watermarks },
    /// The replication layer's position in a chunk's replicated log (at most
    /// [`MAX_CHUNK_MARK_BYTES`], opaque to the store), journalled in the same commit as the
    /// effect of the command it follows, so that after a crash a replica knows exactly which
    /// commands its pages reflect. Every checkpoint carries the latest of each chunk.
    ChunkMark { chunk: ChunkId, mark: Vec<u8> },
    /// The next `records` records, all of one commit, take effect together or not at all: a
    /// commit larger than one log block may tear at a block boundary, and replay drops a unit
    /// the log ends inside of (a snapshot's install, seed 000 §3.2.1: the chunk as it was or as
    /// sent). Never in a checkpoint.
    Unit { records: u32 },
    /// A piece of the stored image of the page the next [`Record::PageSet`] of the same chunk
    /// and page installs: `bytes` from byte `offset` of the image. A small commit carries its
    /// pages' images in the log this way instead of flushing the data device before the log
    /// (one flush per commit instead of two); replay writes the image again to the entry's
    /// blocks if that entry is still the page's at the end of the log, since the data device
    /// may have lost it. Never in a checkpoint: a checkpoint flushes the data device first.
    PageData { chunk: ChunkId, page: PageNo, offset: u16, bytes: Vec<u8> },
}

const TAG_PAGE_SET: u8 = 1;
const TAG_PAGE_CLEAR: u8 = 2;
const TAG_VOLUME_SET: u8 = 3;
const TAG_VOLUME_DELETE: u8 = 4;
const TAG_VOLUME_ID_FLOOR: u8 = 5;
const TAG_WATERMARKS: u8 = 6;
const TAG_CHUNK_MARK: u8 = 7;
const TAG_UNIT: u8 = 8;
const TAG_PAGE_DATA: u8 = 9;
/// The bytes of a [`Record::PageData`] before its data.
const PAGE_DATA_HEADER_BYTES: usize = 1 + 8 + 4 + 2 + 2;
/// The most image bytes one [`Record::PageData`] carries: it fills one log block's payload.
pub const PAGE_DATA_MAX_BYTES: usize = super::frame::LOG_PAYLOAD_BYTES - PAGE_DATA_HEADER_BYTES;
/// The longest chunk mark the journal keeps.
pub const MAX_CHUNK_MARK_BYTES: usize = 80;
/// The largest encoded record: a volume with the longest name.
pub const MAX_RECORD_BYTES: usize = 1 + 4 + 8 + 4 + 8 + 1 + 1 + MAX_NAME_BYTES;
/// The bytes of a page record, the most common kind.
pub const PAGE_RECORD_BYTES: usize = 34;
const _: () = assert!(1 + 8 + 1 + MAX_CHUNK_MARK_BYTES <= MAX_RECORD_BYTES);

impl Record {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Record::PageSet { chunk, page, entry } => {
                out.push(TAG_PAGE_SET);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&page.0.to_le_bytes());
                out.push(encoding_bits(entry.encoding));
                out.extend_from_slice(&entry.run.extent.0.to_le_bytes());
                out.push(entry.run.offset);
                out.push(entry.run.count);
                out.extend_from_slice(&entry.stored_len.to_le_bytes());
                out.extend_from_slice(&entry.checksum.to_le_bytes());
                out.extend_from_slice(&entry.lsn.0.to_le_bytes());
            }
            Record::PageClear { chunk, page } => {
                out.push(TAG_PAGE_CLEAR);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&page.0.to_le_bytes());
            }
            Record::VolumeSet(ref volume) => {
                out.push(TAG_VOLUME_SET);
                encode_volume(volume, out);
            }
            Record::VolumeDelete(id) => {
                out.push(TAG_VOLUME_DELETE);
                out.extend_from_slice(&id.0.to_le_bytes());
            }
            Record::VolumeIdFloor(id) => {
                out.push(TAG_VOLUME_ID_FLOOR);
                out.extend_from_slice(&id.0.to_le_bytes());
            }
            Record::Watermarks { volume, marks } => {
                out.push(TAG_WATERMARKS);
                out.extend_from_slice(&volume.0.to_le_bytes());
                out.extend_from_slice(&marks.durable_lsn.0.to_le_bytes());
                out.extend_from_slice(&marks.min_reader_lsn.0.to_le_bytes());
            }
            Record::ChunkMark { chunk, ref mark } => {
                assert!(mark.len() <= MAX_CHUNK_MARK_BYTES);
                out.push(TAG_CHUNK_MARK);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.push(mark.len() as u8);
                out.extend_from_slice(mark);
            }
            Record::Unit { records } => {
                out.push(TAG_UNIT);
                out.extend_from_slice(&records.to_le_bytes());
            }
            Record::PageData { chunk, page, offset, ref bytes } => {
                assert!(bytes.len() <= PAGE_DATA_MAX_BYTES);
                out.push(TAG_PAGE_DATA);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&page.0.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
    }

    /// Decodes one record from the front of `bytes`, returning it and its length.
    pub fn decode(bytes: &[u8]) -> Result<(Record, usize)> {
        let mut r = Cursor { bytes, at: 0 };
        let tag = r.u8()?;
        match tag {
            TAG_VOLUME_SET => return Ok((Record::VolumeSet(decode_volume(&mut r)?), r.at)),
            TAG_VOLUME_DELETE => return Ok((Record::VolumeDelete(VolumeId(r.u32()?)), r.at)),
            TAG_VOLUME_ID_FLOOR => return Ok((Record::VolumeIdFloor(VolumeId(r.u32()?)), r.at)),
            TAG_UNIT => return Ok((Record::Unit { records: r.u32()? }, r.at)),
            TAG_WATERMARKS => {
                let volume = VolumeId(r.u32()?);
                let marks = Watermarks { durable_lsn: Lsn(r.u64()?), min_reader_lsn: Lsn(r.u64()?) };
                return Ok((Record::Watermarks { volume, marks }, r.at));
            }
            TAG_CHUNK_MARK => {
                let chunk = ChunkId(r.u64()?);
                let len = usize::from(r.u8()?);
                if len > MAX_CHUNK_MARK_BYTES {
                    return Err(Error::corrupted(format!("journal chunk mark of {len} bytes")));
                }
                let mark = (0..len).map(|_| r.u8()).collect::<Result<Vec<u8>>>()?;
                return Ok((Record::ChunkMark { chunk, mark }, r.at));
            }
            _ => {}
        }
        let chunk = ChunkId(r.u64()?);
        let page = PageNo(r.u32()?);
        let record = match tag {
            TAG_PAGE_SET => {
                let encoding = encoding_from_bits(r.u8()?)?;
                let extent = ExtentId(r.u32()?);
                let (offset, count) = (r.u8()?, r.u8()?);
                if count == 0 || u32::from(offset) + u32::from(count) > crate::ids::EXTENT_BLOCKS {
                    return Err(Error::corrupted(format!("journal record with a bad block run {offset}+{count}")));
                }
                let entry = PageEntry {
                    encoding,
                    run: BlockRun::new(extent, offset, count),
                    stored_len: r.u16()?,
                    checksum: r.u32()?,
                    lsn: Lsn(r.u64()?),
                };
                Record::PageSet { chunk, page, entry }
            }
            TAG_PAGE_CLEAR => Record::PageClear { chunk, page },
            TAG_PAGE_DATA => {
                let offset = r.u16()?;
                let len = usize::from(r.u16()?);
                if len == 0 || len > PAGE_DATA_MAX_BYTES || usize::from(offset) + len > usize::from(u16::MAX) {
                    return Err(Error::corrupted(format!("journal page data of {len} bytes at offset {offset}")));
                }
                let bytes =
                    r.bytes.get(r.at..r.at + len).ok_or_else(|| Error::corrupted("journal record cut short"))?.to_vec();
                r.at += len;
                Record::PageData { chunk, page, offset, bytes }
            }
            other => return Err(Error::corrupted(format!("journal record with unknown tag {other}"))),
        };
        Ok((record, r.at))
    }
}

/// A volume's fields: id, size, page size, chunk size, mode, name length and name.
pub(crate) fn encode_volume(volume: &Volume, out: &mut Vec<u8>) {
    assert!(volume.name.len() <= MAX_NAME_BYTES);
    out.extend_from_slice(&volume.id.0.to_le_bytes());
    out.extend_from_slice(&volume.size_bytes.to_le_bytes());
    out.extend_from_slice(&volume.page_size.to_le_bytes());
    out.extend_from_slice(&volume.chunk_bytes.to_le_bytes());
    out.push(match volume.mode {
        VolumeMode::Normal => 0,
        VolumeMode::None => 1,
    });
    out.push(volume.name.len() as u8);
    out.extend_from_slice(volume.name.as_bytes());
}

pub(crate) fn decode_volume(r: &mut Cursor<'_>) -> Result<Volume> {
    let id = VolumeId(r.u32()?);
    let size_bytes = r.u64()?;
    let page_size = r.u32()?;
    let chunk_bytes = r.u64()?;
    let mode = match r.u8()? {
        0 => VolumeMode::Normal,
        1 => VolumeMode::None,
        other => return Err(Error::corrupted(format!("journal record with unknown volume mode {other}"))),
    };
    let name_len = usize::from(r.u8()?);
    let mut name = Vec::with_capacity(name_len);
    for _ in 0..name_len {
        name.push(r.u8()?);
    }
    let name = String::from_utf8(name).map_err(|_| Error::corrupted("a volume name that is not UTF-8"))?;
    let volume = Volume { id, name, size_bytes, page_size, chunk_bytes, mode };
    volume.validate().map_err(|e| Error::corrupted(format!("journal volume record: {}", e.message())))?;
    Ok(volume)
}

pub(crate) fn encoding_bits(encoding: Encoding) -> u8 {
    match encoding {
        Encoding::Raw => 1,
        Encoding::Lz4 => 2,
        Encoding::Zstd => 3,
        Encoding::Heavy => 4,
    }
}

pub(crate) fn encoding_from_bits(bits: u8) -> Result<Encoding> {
    match bits {
        1 => Ok(Encoding::Raw),
        2 => Ok(Encoding::Lz4),
        3 => Ok(Encoding::Zstd),
        4 => Ok(Encoding::Heavy),
        other => Err(Error::corrupted(format!("journal record with unknown encoding {other}"))),
    }
}

/// Reads little-endian fields, failing cleanly at the end of the bytes.
pub(crate) struct Cursor<'a> {
    pub bytes: &'a [u8],
    pub at: usize,
}

impl Cursor<'_> {
    pub fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let slice = self.bytes.get(self.at..self.at + N).ok_or_else(|| Error::corrupted("journal record cut short"))?;
        self.at += N;
        Ok(slice.try_into().expect("slice of N bytes"))
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}
