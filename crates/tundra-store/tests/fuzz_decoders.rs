//! Fuzzing the store's on-media decoders: the journal's `Record::decode`, and the journal's
//! superblock, checkpoint and log block decoders (private to journal.rs) through `Journal::open`
//! on a device holding mutated journal blocks. Any bytes give a value or a clean error, never a
//! panic; a record that decodes encodes back to the bytes it came from.
//!
//! Every journal block ends with a crc32c of its first 4092 bytes, so mutations are also tried
//! "re-sealed" (the crc computed again after the flip) to reach the field checks behind it.
//! `TUNDRA_FUZZ_CASES` sets the cases per property (default 256).

use std::sync::Arc;

use proptest::prelude::*;
use tundra_device::BLOCK_SIZE;
use tundra_device::mem::MemDevice;
use tundra_store::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, ExtentId, Lsn, PageNo, VolumeId};
use tundra_store::index::{Encoding, PageEntry};
use tundra_store::journal::{Journal, JournalGeometry, Record};
use tundra_store::volume::{DEFAULT_CHUNK_BYTES, Volume, VolumeMode};

const GEOMETRY: JournalGeometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 16 };

/// A media's block count and its written blocks.
type Media = (u64, std::collections::HashMap<u64, Box<[u8]>>);

fn cases() -> u32 {
    let cases = std::env::var("TUNDRA_FUZZ_CASES").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(256);
    eprintln!("fuzz cases per property: {cases}");
    cases
}

fn page_set() -> impl Strategy<Value = Record> {
    (any::<u64>(), any::<u32>(), 0..4usize, any::<u32>(), 0..EXTENT_BLOCKS as u8, any::<(u16, u32, u64)>()).prop_map(
        |(chunk, page, encoding, extent, offset, (stored_len, checksum, version))| {
            let count = 1 + (u32::from(stored_len) % (EXTENT_BLOCKS - u32::from(offset))) as u8;
            let encoding = [Encoding::Raw, Encoding::Lz4, Encoding::Zstd, Encoding::Heavy][encoding];
            let run = BlockRun::new(ExtentId(extent), offset, count);
            let entry = PageEntry { encoding, run, stored_len, checksum, lsn: Lsn(version) };
            Record::PageSet { chunk: ChunkId(chunk), page: PageNo(page), entry }
        },
    )
}

fn volume_set() -> impl Strategy<Value = Record> {
    (any::<u32>(), 1..1000u64, any::<bool>(), "[a-z0-9_]{1,64}", any::<bool>()).prop_map(
        |(id, pages, big, name, none)| {
            let page_size = if big { 16384 } else { 8192 };
            let mode = if none { VolumeMode::None } else { VolumeMode::Normal };
            let size_bytes = pages * u64::from(page_size);
            Record::VolumeSet(Volume {
                id: VolumeId(id),
                name,
                size_bytes,
                page_size,
                chunk_bytes: DEFAULT_CHUNK_BYTES,
                mode,
            })
        },
    )
}

fn record() -> impl Strategy<Value = Record> {
    prop_oneof![
        page_set(),
        (any::<u64>(), any::<u32>()).prop_map(|(c, p)| Record::PageClear { chunk: ChunkId(c), page: PageNo(p) }),
        volume_set(),
        any::<u32>().prop_map(|id| Record::VolumeDelete(VolumeId(id))),
    ]
}

/// Decodes `bytes`; a record that decodes must have come from exactly its encoding.
fn check_decode(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((record, len)) = Record::decode(bytes) {
        prop_assert!(len > 0 && len <= bytes.len(), "length {len} of {}", bytes.len());
        let mut again = Vec::new();
        record.encode(&mut again);
        prop_assert_eq!(&again[..], &bytes[..len]);
    }
    Ok(())
}

fn reseal(block: &mut [u8]) {
    let crc = crc32c::crc32c(&block[..BLOCK_SIZE - 4]);
    block[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// A journal after commits, a checkpoint and more commits, left without a clean stop.
fn journal_media() -> Media {
    let blocks = GEOMETRY.total_blocks();
    let device = Arc::new(MemDevice::new(blocks));
    Journal::format(device.as_ref(), GEOMETRY).expect("format");
    let (journal, _) = Journal::open(device.clone()).expect("open");
    let volume = Volume {
        id: VolumeId(1),
        name: "v".into(),
        size_bytes: 1 << 20,
        page_size: 8192,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        mode: VolumeMode::Normal,
    };
    let chunk = ChunkId::new(VolumeId(1), 0);
    let page = |i: u32| {
        let run = BlockRun::new(ExtentId(i / 16), (i % 16) as u8 * 2, 2);
        let entry = PageEntry { encoding: Encoding::Lz4, run, stored_len: 5000, checksum: i, lsn: Lsn(u64::from(i)) };
        Record::PageSet { chunk, page: PageNo(i % 128), entry }
    };
    journal.commit(&[Record::VolumeSet(volume.clone())]).expect("commit");
    for i in 0..300 {
        journal.commit(&[page(i)]).expect("commit");
    }
    let position = journal.position();
    journal.checkpoint(&[Record::VolumeSet(volume)], position).expect("checkpoint");
    for i in 300..700 {
        journal.commit(&[page(i), Record::PageClear { chunk, page: PageNo(i % 7) }]).expect("commit");
    }
    drop(journal);
    (blocks, device.snapshot())
}

fn media() -> Media {
    static MEDIA: std::sync::OnceLock<Media> = std::sync::OnceLock::new();
    MEDIA.get_or_init(journal_media).clone()
}

/// Opens the journal on `media`; a clean error or a replay, never a panic. An opened journal
/// takes one more commit.
fn open(blocks: u64, media: std::collections::HashMap<u64, Box<[u8]>>) -> Option<usize> {
    let device = Arc::new(MemDevice::from_snapshot(blocks, media));
    let (journal, replay) = Journal::open(device).ok()?;
    let _ = journal.commit(&[Record::VolumeDelete(VolumeId(9))]);
    Some(replay.checkpoint.len() + replay.log.len())
}

/// The harness: the unmutated journal replays its checkpoint and the commits after it.
#[test]
fn the_pristine_journal_replays() {
    let (blocks, media) = media();
    assert_eq!(open(blocks, media), Some(1 + 400 * 2));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn record_decode_of_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        check_decode(&bytes)?;
    }

    #[test]
    fn record_decode_of_mutated_records_never_panics(
        records in prop::collection::vec(record(), 1..4),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<usize>(),
    ) {
        let mut bytes = Vec::new();
        for r in &records {
            r.encode(&mut bytes);
        }
        // Unmutated, the first record decodes to itself.
        let (first, _) = Record::decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&first, &records[0]);
        for &(at, bit) in &flips {
            let at = at % bytes.len();
            bytes[at] ^= 1 << (bit % 8);
        }
        bytes.truncate(cut % (bytes.len() + 1));
        check_decode(&bytes)?;
    }

    #[test]
    fn a_journal_on_mutated_blocks_opens_or_refuses_cleanly(
        flips in prop::collection::vec((any::<u64>(), any::<usize>(), any::<u8>(), any::<bool>()), 1..4),
    ) {
        let (blocks, mut media) = media();
        let mut written: Vec<u64> = media.keys().copied().collect();
        written.sort_unstable();
        for &(which, at, bit, sealed) in &flips {
            let block = media.get_mut(&written[(which % written.len() as u64) as usize]).expect("block");
            block[at % BLOCK_SIZE] ^= 1 << (bit % 8);
            if sealed {
                reseal(block);
            }
        }
        let _ = open(blocks, media);
    }

    /// Fails on the code of this commit: see `a_superblock_with_a_huge_geometry_is_refused`.
    #[test]
    fn journal_superblock_fields_past_the_checksum_never_panic(fields in prop::collection::vec(edge_u64(), 6), slot in 0..2u64) {
        let (blocks, mut media) = media();
        let block = media.get_mut(&slot).expect("superblock");
        for (i, value) in fields.iter().enumerate() {
            block[8 + 8 * i..16 + 8 * i].copy_from_slice(&value.to_le_bytes());
        }
        reseal(block);
        let _ = open(blocks, media);
    }
}

/// Numbers near the limits a decoder must check, as well as any number.
fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![any::<u64>(), Just(0), Just(1), Just(u64::MAX), Just(u64::MAX / 2), Just(u64::MAX - 1), 0..64u64]
}

/// Found by `journal_superblock_fields_past_the_checksum_never_panic`: a journal superblock with
/// a good checksum and `checkpoint_blocks` of 2^63 makes `JournalGeometry::total_blocks`
/// (`2 + 2 * checkpoint_blocks + log_blocks`) overflow, a panic in `Journal::open` before the
/// geometry is checked against the device. A checksum collision or a bug writing a bad
/// superblock would reach it.
#[test]
fn a_superblock_with_a_huge_geometry_is_refused_or_recovered_around() {
    let (blocks, mut media) = media();
    for (slot, checkpoint_blocks, log_blocks) in [(0u64, 1u64 << 63, 16u64), (1, 4, u64::MAX - 1)] {
        let block = media.get_mut(&slot).expect("superblock");
        // docs/format.md, "Superblock": checkpoint_blocks at 16, log_blocks at 24, generation at 32.
        block[16..24].copy_from_slice(&checkpoint_blocks.to_le_bytes());
        block[24..32].copy_from_slice(&log_blocks.to_le_bytes());
        block[32..40].copy_from_slice(&(1u64 << 40).to_le_bytes()); // the newest generation
        reseal(block);
        // The impossible superblock is damage: the open refuses, or recovers from the other
        // copy (an older checkpoint, so at least as many records replayed); it never panics.
        let opened = open(blocks, media.clone());
        let intact = open(blocks, journal_media().1).expect("the intact journal opens");
        assert!(opened.is_none_or(|n| n >= intact), "slot {slot}: {opened:?} against {intact}");
        media = journal_media().1;
    }
}
