//! Fuzzing the emulated drive's on-media decoders: any bytes give a value or a clean error,
//! never a panic.
//!
//! Arbitrary bytes mostly stop at a magic number or a checksum, so each decoder is also fed
//! mutations of valid encodings whose checksum is computed again after the mutation ("re-sealed"):
//! those reach the field checks behind the checksum, which a crc32c collision or a bug that
//! writes a bad field with a good checksum would reach too. The drive as a whole is fuzzed by
//! opening mutated (and re-sealed) media of a small drive and reading every block. The map's
//! entry decoder is private; it is reached through the checkpoint's map bytes.
//!
//! `TUNDRA_FUZZ_CASES` sets the cases per property (default 256).

use std::sync::Arc;

use proptest::prelude::*;
use tundra_device::csd::layout::{CheckpointHeader, RecordHeader, RecordKind, SegmentHeader, Superblock};
use tundra_device::csd::{CompressionMode, CsdConfig, CsdDevice, FormatOptions};
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_env::Rng;

/// A media's block count and its written blocks.
type Media = (u64, std::collections::HashMap<u64, Box<[u8]>>);

fn cases() -> u32 {
    let cases = std::env::var("TUNDRA_FUZZ_CASES").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(256);
    eprintln!("fuzz cases per property: {cases}");
    cases
}

/// Flips `bit` of the byte at `at` (taken modulo the length) of `bytes`.
fn flip(bytes: &mut [u8], at: usize, bit: u8) {
    let at = at % bytes.len();
    bytes[at] ^= 1 << (bit % 8);
}

/// Writes a block's crc32c of its first 4092 bytes into its last 4, as every sealed drive
/// block (superblock, checkpoint header) carries.
fn reseal_block(block: &mut [u8]) {
    let crc = crc32c::crc32c(&block[..BLOCK_SIZE - 4]);
    block[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
}

fn reseal_segment_header(bytes: &mut [u8]) {
    let crc = crc32c::crc32c(&bytes[..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// A record's crc: the segment's incarnation, header bytes 4..16, the payload (docs/format.md).
fn reseal_record(open_seq: u64, record: &mut [u8], payload_len: usize) {
    let crc = crc32c::crc32c(&open_seq.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &record[4..16]);
    let end = (16 + payload_len).min(record.len());
    let crc = crc32c::crc32c_append(crc, &record[16..end]);
    record[..4].copy_from_slice(&crc.to_le_bytes());
}

/// A small drive's media after some writes, a checkpoint, more writes and trims, and no close:
/// every structure the format has, with records on both sides of the checkpoint.
fn small_media() -> Media {
    let options = FormatOptions { segment_bytes: 64 * 1024, ..FormatOptions::new(256 * 1024, 256 * 1024) };
    let blocks = options.geometry().expect("geometry").total_bytes() / BLOCK_SIZE as u64;
    let media = Arc::new(MemDevice::new(blocks));
    let config = CsdConfig { background: false, compression: CompressionMode::Inline, ..CsdConfig::default() };
    let drive = CsdDevice::format(media.clone(), &options, config).expect("format");
    let mut rng = Rng::new(7);
    let mut block = vec![0u8; BLOCK_SIZE];
    for round in 0..2 {
        for lba in 0..drive.block_count() {
            let text = format!("block {lba} round {round} {} ", rng.below(1000));
            block.iter_mut().zip(text.bytes().cycle()).for_each(|(b, t)| *b = t);
            if lba % 5 == 0 {
                rng.fill(&mut block);
            }
            drive.write(Lba(lba), &block).expect("write");
        }
        drive.trim(Lba(3), 2).expect("trim");
        drive.flush().expect("flush");
        if round == 0 {
            drive.checkpoint().expect("checkpoint");
        }
    }
    drop(drive);
    (blocks, media.snapshot())
}

/// Opens a drive on `media` and reads every block: any error is fine, a panic is not. Returns
/// how many blocks read without error (None: the open was refused).
fn open_and_read(blocks: u64, media: std::collections::HashMap<u64, Box<[u8]>>) -> Option<u64> {
    let device = Arc::new(MemDevice::from_snapshot(blocks, media));
    let config = CsdConfig { background: false, ..CsdConfig::default() };
    let drive = CsdDevice::open(device, config).ok()?;
    let mut block = vec![0u8; BLOCK_SIZE];
    Some((0..drive.block_count()).filter(|&lba| drive.read(Lba(lba), &mut block).is_ok()).count() as u64)
}

/// The harness itself: the unmutated media opens and every block reads, so the fuzzed opens
/// below start from a drive that works.
#[test]
fn the_pristine_media_opens_and_reads() {
    let (blocks, media) = media();
    assert_eq!(open_and_read(blocks, media), Some(64));
}

/// Applies a flip (and optionally a re-seal of the structure it lands in) to the media.
fn mutate_media(media: &mut std::collections::HashMap<u64, Box<[u8]>>, blocks: u64, at: u64, bit: u8, reseal: bool) {
    let options = FormatOptions { segment_bytes: 64 * 1024, ..FormatOptions::new(256 * 1024, 256 * 1024) };
    let g = options.geometry().expect("geometry");
    // Flips land in written blocks, where the structures are.
    let mut written: Vec<u64> = media.keys().copied().filter(|&b| b < blocks).collect();
    written.sort_unstable();
    let block_index = written[(at / BLOCK_SIZE as u64) as usize % written.len()];
    let within = (at % BLOCK_SIZE as u64) as usize;
    let block = media.get_mut(&block_index).expect("written block");
    block[within] ^= 1 << (bit % 8);
    if !reseal {
        return;
    }
    let byte = block_index * BLOCK_SIZE as u64;
    let checkpoint_blocks = g.checkpoint_blocks();
    if block_index < 2 || byte == g.checkpoint_offset(0) || byte == g.checkpoint_offset(1) {
        reseal_block(block);
    } else if byte >= g.segment_area_offset() && (byte - g.segment_area_offset()).is_multiple_of(g.segment_bytes) {
        reseal_segment_header(&mut block[..64]);
    } else if block_index < 2 + 2 * checkpoint_blocks {
        // Map bytes: the header's map_crc must match again, then the header's own crc.
        let slot = (block_index - 2) / checkpoint_blocks;
        let header_index = 2 + slot * checkpoint_blocks;
        let mut map = Vec::new();
        for b in header_index + 1..header_index + checkpoint_blocks {
            map.extend_from_slice(media.get(&b).map_or(&[0u8; BLOCK_SIZE][..], |b| &b[..]));
        }
        map.truncate((g.logical_blocks * 7) as usize);
        let crc = crc32c::crc32c(&map);
        if let Some(header) = media.get_mut(&header_index) {
            header[32..36].copy_from_slice(&crc.to_le_bytes());
            reseal_block(header);
        }
    }
}

/// Numbers near the limits a decoder must check, as well as any number.
fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        Just(0),
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) << 32 | 0xffff_fff0),
        Just(1 << 40),
        0..64u64,
        (16u64..1 << 40).prop_map(|x| x * 4096),
    ]
}

fn valid_superblock() -> Vec<u8> {
    let options = FormatOptions::new(1 << 20, 1 << 20);
    let superblock = Superblock {
        geometry: options.geometry().expect("geometry"),
        generation: 3,
        checkpoint_slot: 1,
        checkpoint_seq: 40,
        next_seq: 41,
        open_segments: vec![(0, 2), (3, 30)],
        counters: Default::default(),
    };
    superblock.encode()
}

fn valid_record(open_seq: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
    let kind = [RecordKind::Deflate, RecordKind::Raw, RecordKind::Trim][kind as usize % 3];
    let header = RecordHeader { lba: 17, seq: open_seq + 3, kind, payload_len: payload.len() };
    let mut out = vec![0u8; header.record_bytes()];
    header.encode_into(open_seq, payload, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn superblock_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), BLOCK_SIZE), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6)) {
        let _ = Superblock::decode(&bytes);
        let mut block = valid_superblock();
        for &(at, bit) in &flips {
            flip(&mut block, at, bit);
        }
        let _ = Superblock::decode(&block);
        reseal_block(&mut block);
        let _ = Superblock::decode(&block);
    }

    #[test]
    fn superblock_fields_past_the_checksum_never_panic(fields in prop::collection::vec(edge_u64(), 17)) {
        // Every field of the superblock chosen at random, with a good checksum.
        let mut block = valid_superblock();
        for (i, value) in fields.iter().enumerate() {
            let at = 12 + 8 * i;
            block[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        block[128..132].copy_from_slice(&((fields[0] % 10) as u32).to_le_bytes());
        reseal_block(&mut block);
        let _ = Superblock::decode(&block);
    }

    #[test]
    fn checkpoint_header_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), BLOCK_SIZE), at in any::<usize>(), bit in any::<u8>()) {
        let _ = CheckpointHeader::decode(&bytes);
        let header = CheckpointHeader { generation: 2, checkpoint_seq: 9, logical_blocks: 64, map_crc: 5 };
        let mut block = header.encode();
        flip(&mut block, at, bit);
        reseal_block(&mut block);
        let _ = CheckpointHeader::decode(&block);
    }

    #[test]
    fn segment_header_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 64), at in any::<usize>(), bit in any::<u8>()) {
        let _ = SegmentHeader::decode(&bytes);
        let mut header = SegmentHeader { segment: 3, open_seq: 77 }.encode().to_vec();
        flip(&mut header, at, bit);
        reseal_segment_header(&mut header);
        let _ = SegmentHeader::decode(&header);
    }

    #[test]
    fn record_header_decode_never_panics(
        open_seq in any::<u64>(),
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        kind in any::<u8>(),
        payload in prop::collection::vec(any::<u8>(), 1..200),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let _ = RecordHeader::decode(open_seq, &bytes);
        let mut record = valid_record(open_seq, kind, &payload);
        for &(at, bit) in &flips {
            flip(&mut record, at, bit);
        }
        let claimed = usize::from(u16::from_le_bytes([record[14], record[15]]) & 0x1fff);
        reseal_record(open_seq, &mut record, claimed);
        let cut = cut % (record.len() + 1);
        if let Some((header, payload)) = RecordHeader::decode(open_seq, &record[..cut]) {
            prop_assert!(payload.len() == header.payload_len && 16 + payload.len() <= cut);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases().div_ceil(4), ..ProptestConfig::default() })]

    /// The whole drive: open mutated media (with and without re-sealing) and read every block.
    #[test]
    fn a_drive_on_mutated_media_opens_or_refuses_cleanly(
        flips in prop::collection::vec((any::<u64>(), any::<u8>(), any::<bool>()), 1..4),
    ) {
        let (blocks, pristine) = media();
        let mut media = pristine.clone();
        for &(at, bit, reseal) in &flips {
            mutate_media(&mut media, blocks, at, bit, reseal);
        }
        let _ = open_and_read(blocks, media);
    }
}

/// The small drive's media, built once.
fn media() -> Media {
    static MEDIA: std::sync::OnceLock<Media> = std::sync::OnceLock::new();
    MEDIA.get_or_init(small_media).clone()
}

/// Found by `superblock_decode_never_panics`: a superblock with a good checksum and a segment
/// size near 2^64 overflowed the media size computation in `Geometry::validate`.
#[test]
fn a_superblock_with_a_huge_segment_size_is_refused() {
    for (segment_bytes, counts) in [(1u64 << 63, None), (1 << 16, Some((u32::MAX, u32::MAX - 1)))] {
        let mut block = valid_superblock();
        block[28..36].copy_from_slice(&segment_bytes.to_le_bytes());
        if let Some((count, usable)) = counts {
            block[36..40].copy_from_slice(&count.to_le_bytes());
            block[40..44].copy_from_slice(&usable.to_le_bytes());
        }
        reseal_block(&mut block);
        let error = Superblock::decode(&block).expect_err("an impossible geometry");
        assert!(error.to_string().contains("superblock geometry"), "{error}");
    }
}
