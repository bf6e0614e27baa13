//! The store's commands: every change a replica applies, as a value (seed 000 §3.2.1,
//! Figure 4). The leader side (`pages`) decides what a change is (it compresses a page with
//! Algorithm 1, merges a partial write, builds a heavy segment) and expresses it as a
//! [`StoreCommand`]; the replica side ([`crate::store::Store::apply`]) allocates blocks,
//! writes the device, journals and installs it, and never compresses. A Raft entry will carry
//! a command's encoding (docs/format.md, "Store commands"), so that every replica stores the
//! bytes the leader compressed once.
//!
//! A command carries no block placement: each replica allocates on its own device, so two
//! replicas applying the same commands in the same order hold the same pages, with the same
//! encodings, bytes, checksums and LSNs, in blocks of their own. What a replica's journal
//! records is the command's effect on that replica (the runs it chose), not the command:
//! journalling the page bytes as well would write every page twice.

use crate::ids::{ChunkId, Lsn, PageNo, VolumeId};
use crate::index::Encoding;
use crate::journal::{Cursor, decode_volume, encode_volume, encoding_bits, encoding_from_bits};
use crate::store::{PageImage, Watermarks};
use crate::volume::Volume;
use crate::{Error, Result};

/// One page of a [`StoreCommand::PutPages`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagePut {
    pub page: PageNo,
    pub image: PageImage,
    /// The LSN of the change the image carries.
    pub lsn: Lsn,
}

/// One page of a heavy segment: its place in the segment is its place in the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeavyPage {
    pub page: PageNo,
    /// The checksum of the page's uncompressed content, bound to its address.
    pub checksum: u32,
    /// The page's own LSN, kept: archiving changes no page.
    pub lsn: Lsn,
}

/// A change to a store, as the leader decided it and every replica applies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreCommand {
    /// Whole pages of one chunk, already encoded; stored with one journal commit.
    PutPages { chunk: ChunkId, pages: Vec<PagePut> },
    /// Pages of one chunk removed: they read as absent.
    TrimPages { chunk: ChunkId, pages: Vec<PageNo> },
    /// A heavy segment (seed 000 §3.2.3) holding `pages`, consecutive pages of `chunk` in order;
    /// `segment` is the header and compressed frame, at most one extent.
    PutHeavy { chunk: ChunkId, pages: Vec<HeavyPage>, segment: Vec<u8> },
    /// A new volume, whose id was never given out before.
    CreateVolume(Volume),
    /// A volume grows.
    ResizeVolume { volume: VolumeId, size_bytes: u64 },
    /// A volume and all its pages are gone.
    DeleteVolume(VolumeId),
    /// A volume's redo watermarks advance: the durable LSN and the lowest LSN a reader may still
    /// ask for. The store keeps the highest it was given.
    SetWatermarks { volume: VolumeId, marks: Watermarks },
}

/// The version of the command encoding; a decoder refuses any other.
pub const COMMAND_FORMAT: u8 = 1;

const TAG_PUT_PAGES: u8 = 1;
const TAG_TRIM_PAGES: u8 = 2;
const TAG_PUT_HEAVY: u8 = 3;
const TAG_CREATE_VOLUME: u8 = 4;
const TAG_RESIZE_VOLUME: u8 = 5;
const TAG_DELETE_VOLUME: u8 = 6;
const TAG_SET_WATERMARKS: u8 = 7;

/// The most pages one command may name: a 16 KiB-page chunk of 1 GiB. A decoder refuses more
/// before it allocates anything.
pub const MAX_COMMAND_PAGES: usize = 65_536;
/// The longest image or segment a command may carry: one extent (a heavy segment's bound; a
/// page image is at most a page).
pub const MAX_COMMAND_BYTES: usize = crate::ids::EXTENT_BLOCKS as usize * tundra_device::BLOCK_SIZE;

impl StoreCommand {
    /// The chunk the command changes, if it changes one chunk's pages.
    pub fn chunk(&self) -> Option<ChunkId> {
        match self {
            StoreCommand::PutPages { chunk, .. }
            | StoreCommand::TrimPages { chunk, .. }
            | StoreCommand::PutHeavy { chunk, .. } => Some(*chunk),
            _ => None,
        }
    }

    /// The command's bytes (docs/format.md, "Store commands").
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![COMMAND_FORMAT];
        match self {
            StoreCommand::PutPages { chunk, pages } => {
                out.push(TAG_PUT_PAGES);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
                for put in pages {
                    out.extend_from_slice(&put.page.0.to_le_bytes());
                    out.extend_from_slice(&put.lsn.0.to_le_bytes());
                    out.push(encoding_bits(put.image.encoding));
                    out.extend_from_slice(&put.image.checksum.to_le_bytes());
                    out.extend_from_slice(&(put.image.bytes.len() as u32).to_le_bytes());
                    out.extend_from_slice(&put.image.bytes);
                }
            }
            StoreCommand::TrimPages { chunk, pages } => {
                out.push(TAG_TRIM_PAGES);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
                for page in pages {
                    out.extend_from_slice(&page.0.to_le_bytes());
                }
            }
            StoreCommand::PutHeavy { chunk, pages, segment } => {
                out.push(TAG_PUT_HEAVY);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
                for heavy in pages {
                    out.extend_from_slice(&heavy.page.0.to_le_bytes());
                    out.extend_from_slice(&heavy.checksum.to_le_bytes());
                    out.extend_from_slice(&heavy.lsn.0.to_le_bytes());
                }
                out.extend_from_slice(&(segment.len() as u32).to_le_bytes());
                out.extend_from_slice(segment);
            }
            StoreCommand::CreateVolume(volume) => {
                out.push(TAG_CREATE_VOLUME);
                encode_volume(volume, &mut out);
            }
            StoreCommand::ResizeVolume { volume, size_bytes } => {
                out.push(TAG_RESIZE_VOLUME);
                out.extend_from_slice(&volume.0.to_le_bytes());
                out.extend_from_slice(&size_bytes.to_le_bytes());
            }
            StoreCommand::DeleteVolume(volume) => {
                out.push(TAG_DELETE_VOLUME);
                out.extend_from_slice(&volume.0.to_le_bytes());
            }
            StoreCommand::SetWatermarks { volume, marks } => {
                out.push(TAG_SET_WATERMARKS);
                out.extend_from_slice(&volume.0.to_le_bytes());
                out.extend_from_slice(&marks.durable_lsn.0.to_le_bytes());
                out.extend_from_slice(&marks.min_reader_lsn.0.to_le_bytes());
            }
        }
        out
    }

    /// Decodes a command's bytes. Every count and length is checked against the bytes that
    /// remain (and the bounds above) before anything is allocated; bytes left over are an
    /// error. The image's fit to its volume is checked when the command is applied.
    pub fn decode(bytes: &[u8]) -> Result<StoreCommand> {
        let mut r = Cursor { bytes, at: 0 };
        let version = r.u8().map_err(cut)?;
        if version != COMMAND_FORMAT {
            return Err(Error::corrupted(format!(
                "a store command of format {version}; this build reads format {COMMAND_FORMAT}"
            )));
        }
        let command = match r.u8().map_err(cut)? {
            TAG_PUT_PAGES => decode_put_pages(&mut r)?,
            TAG_TRIM_PAGES => {
                let chunk = ChunkId(r.u64().map_err(cut)?);
                let count = count(&mut r, 4)?;
                let pages = (0..count).map(|_| r.u32().map(PageNo)).collect::<Result<Vec<_>>>().map_err(cut)?;
                StoreCommand::TrimPages { chunk, pages }
            }
            TAG_PUT_HEAVY => decode_put_heavy(&mut r)?,
            TAG_CREATE_VOLUME => StoreCommand::CreateVolume(decode_volume(&mut r)?),
            TAG_RESIZE_VOLUME => StoreCommand::ResizeVolume {
                volume: VolumeId(r.u32().map_err(cut)?),
                size_bytes: r.u64().map_err(cut)?,
            },
            TAG_DELETE_VOLUME => StoreCommand::DeleteVolume(VolumeId(r.u32().map_err(cut)?)),
            TAG_SET_WATERMARKS => StoreCommand::SetWatermarks {
                volume: VolumeId(r.u32().map_err(cut)?),
                marks: Watermarks {
                    durable_lsn: Lsn(r.u64().map_err(cut)?),
                    min_reader_lsn: Lsn(r.u64().map_err(cut)?),
                },
            },
            other => return Err(Error::corrupted(format!("a store command with unknown tag {other}"))),
        };
        if r.at != bytes.len() {
            return Err(Error::corrupted(format!("a store command followed by {} stray bytes", bytes.len() - r.at)));
        }
        Ok(command)
    }
}

fn decode_put_pages(r: &mut Cursor<'_>) -> Result<StoreCommand> {
    let chunk = ChunkId(r.u64().map_err(cut)?);
    // Each page takes at least its 21 fixed bytes.
    let count = count(r, 21)?;
    let mut pages = Vec::with_capacity(count);
    for _ in 0..count {
        let page = PageNo(r.u32().map_err(cut)?);
        let lsn = Lsn(r.u64().map_err(cut)?);
        let encoding = encoding_from_bits(r.u8().map_err(cut)?)?;
        if encoding == Encoding::Heavy {
            return Err(Error::corrupted("a page image encoded heavy outside a heavy segment"));
        }
        let checksum = r.u32().map_err(cut)?;
        let bytes = payload(r)?;
        pages.push(PagePut { page, image: PageImage { encoding, bytes, checksum }, lsn });
    }
    Ok(StoreCommand::PutPages { chunk, pages })
}

fn decode_put_heavy(r: &mut Cursor<'_>) -> Result<StoreCommand> {
    let chunk = ChunkId(r.u64().map_err(cut)?);
    let count = count(r, 16)?;
    let mut pages = Vec::with_capacity(count);
    for _ in 0..count {
        pages.push(HeavyPage {
            page: PageNo(r.u32().map_err(cut)?),
            checksum: r.u32().map_err(cut)?,
            lsn: Lsn(r.u64().map_err(cut)?),
        });
    }
    let segment = payload(r)?;
    Ok(StoreCommand::PutHeavy { chunk, pages, segment })
}

/// A u32 count of items of at least `item_bytes` bytes each, checked against the bound and
/// against the bytes that remain.
fn count(r: &mut Cursor<'_>, item_bytes: usize) -> Result<usize> {
    let count = r.u32().map_err(cut)? as usize;
    let remaining = r.bytes.len() - r.at;
    if count > MAX_COMMAND_PAGES || count.saturating_mul(item_bytes) > remaining {
        return Err(Error::corrupted(format!(
            "a store command naming {count} pages in {remaining} remaining bytes (at most {MAX_COMMAND_PAGES})"
        )));
    }
    Ok(count)
}

/// A u32 length and that many bytes, checked against the bound and the bytes that remain.
fn payload(r: &mut Cursor<'_>) -> Result<Vec<u8>> {
    let len = r.u32().map_err(cut)? as usize;
    let remaining = r.bytes.len() - r.at;
    if len > MAX_COMMAND_BYTES || len > remaining {
        return Err(Error::corrupted(format!(
            "a store command carrying {len} bytes with {remaining} remaining (at most {MAX_COMMAND_BYTES})"
        )));
    }
    let bytes = r.bytes[r.at..r.at + len].to_vec();
    r.at += len;
    Ok(bytes)
}

/// The journal's cursor names its own kind of record; a command cut short says so.
fn cut(_: Error) -> Error {
    Error::corrupted("a store command cut short")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::VolumeMode;

    fn samples() -> Vec<StoreCommand> {
        let chunk = ChunkId::new(VolumeId(3), 2);
        vec![
            StoreCommand::PutPages {
                chunk,
                pages: vec![
                    PagePut {
                        page: PageNo(1),
                        image: PageImage { encoding: Encoding::Lz4, bytes: vec![1, 2, 3], checksum: 9 },
                        lsn: Lsn(5),
                    },
                    PagePut {
                        page: PageNo(7),
                        image: PageImage { encoding: Encoding::Raw, bytes: vec![0; 8192], checksum: 1 },
                        lsn: Lsn(6),
                    },
                ],
            },
            StoreCommand::PutPages { chunk, pages: vec![] },
            StoreCommand::TrimPages { chunk, pages: vec![PageNo(0), PageNo(9)] },
            StoreCommand::PutHeavy {
                chunk,
                pages: vec![HeavyPage { page: PageNo(4), checksum: 7, lsn: Lsn(2) }],
                segment: vec![5; 100],
            },
            StoreCommand::CreateVolume(Volume {
                id: VolumeId(3),
                name: "orders".into(),
                size_bytes: 1 << 30,
                page_size: 8192,
                chunk_bytes: 64 << 20,
                mode: VolumeMode::Normal,
            }),
            StoreCommand::ResizeVolume { volume: VolumeId(3), size_bytes: 2 << 30 },
            StoreCommand::DeleteVolume(VolumeId(3)),
            StoreCommand::SetWatermarks {
                volume: VolumeId(3),
                marks: Watermarks { durable_lsn: Lsn(100), min_reader_lsn: Lsn(90) },
            },
        ]
    }

    #[test]
    fn every_command_round_trips() {
        for command in samples() {
            let bytes = command.encode();
            assert_eq!(StoreCommand::decode(&bytes).unwrap(), command);
        }
    }

    #[test]
    fn cut_extended_and_foreign_bytes_are_refused() {
        for command in samples() {
            let bytes = command.encode();
            for len in 0..bytes.len() {
                assert!(StoreCommand::decode(&bytes[..len]).is_err(), "{command:?} cut to {len} bytes");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(StoreCommand::decode(&longer).is_err());
            let mut other_version = bytes.clone();
            other_version[0] = COMMAND_FORMAT + 1;
            assert!(StoreCommand::decode(&other_version).unwrap_err().message().contains("format"));
        }
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut bytes = vec![COMMAND_FORMAT, TAG_TRIM_PAGES];
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(StoreCommand::decode(&bytes).is_err());
        let mut bytes = vec![COMMAND_FORMAT, TAG_PUT_HEAVY];
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(StoreCommand::decode(&bytes).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut rng = tundra_env::Rng::new(tundra_env::seed_from_env(12));
        for _ in 0..20_000 {
            let len = rng.below(64) as usize;
            let mut bytes = rng.bytes(len);
            if !bytes.is_empty() {
                bytes[0] = COMMAND_FORMAT;
            }
            let _ = StoreCommand::decode(&bytes);
        }
        // Mutations of valid encodings reach deeper.
        for command in samples() {
            let bytes = command.encode();
            for _ in 0..2_000 {
                let mut mutated = bytes.clone();
                let at = rng.below(mutated.len() as u64) as usize;
                mutated[at] ^= 1 << rng.below(8);
                if let Ok(decoded) = StoreCommand::decode(&mutated) {
                    assert_eq!(decoded.encode(), mutated, "a decoded command encodes back to its bytes");
                }
            }
        }
    }
}
