//! The codec's tests: round trips, the documented bytes, every refusal the format names, every
//! truncation refused, and arbitrary or bit-flipped bytes that never panic the decoder.
//! `TUNDRA_FUZZ_CASES` sets the fuzz cases (default 4000); `TUNDRA_SEED` replays a seed.

use tundra_env::Rng;
use tundra_store::ids::{Lsn, VolumeId};

use super::*;
use crate::ErrorKind;

const PAGE: u32 = 8192;

/// A random record at `lsn`: a whole page, or one to four ranges inside the page.
pub(crate) fn random_record(rng: &mut Rng, lsn: Lsn, page_size: u32) -> RedoRecord {
    let page = rng.below(1 << 20);
    let payload = if rng.chance(0.2) {
        Payload::Image(rng.bytes(page_size as usize))
    } else {
        let ranges = (0..1 + rng.below(4))
            .map(|_| {
                let longest = if rng.chance(0.1) { u64::from(page_size) } else { 64 };
                let len = 1 + rng.below(longest);
                let offset = rng.below(u64::from(page_size) - len + 1) as u32;
                (offset, rng.bytes(len as usize))
            })
            .collect();
        Payload::Ranges(ranges)
    };
    RedoRecord { lsn, page, payload }
}

/// A random batch after `prev_lsn`: up to `max_records` records with gaps between their LSNs
/// (a record's LSN is where it ends in the writer's log), sometimes none (a heartbeat, which
/// still moves the stream's end by at least one).
pub(crate) fn random_batch(
    rng: &mut Rng,
    volume: VolumeId,
    epoch: WriterEpoch,
    prev_lsn: Lsn,
    max_records: u64,
    page_size: u32,
) -> RedoBatch {
    let mut lsn = prev_lsn.0;
    let records: Vec<RedoRecord> = (0..rng.below(max_records + 1))
        .map(|_| {
            lsn += 1 + rng.below(300);
            random_record(rng, Lsn(lsn), page_size)
        })
        .collect();
    let end_lsn = Lsn(lsn + rng.below(3) + u64::from(records.is_empty()));
    RedoBatch { volume, epoch, prev_lsn, end_lsn, records }
}

fn encoded(batch: &RedoBatch) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_batch(batch, &mut bytes);
    bytes
}

fn fuzz_cases() -> u64 {
    let cases = std::env::var("TUNDRA_FUZZ_CASES").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(4000);
    eprintln!("fuzz cases: {cases}");
    cases
}

#[test]
fn batches_round_trip() {
    let mut rng = Rng::new(tundra_env::seed_from_env(1));
    let mut prev = Lsn(0);
    for round in 0..300 {
        let page_size = if round % 2 == 0 { PAGE } else { 512 };
        let batch = random_batch(&mut rng, VolumeId(7), WriterEpoch(round), prev, 6, page_size);
        let bytes = encoded(&batch);
        assert_eq!(bytes.len(), encoded_batch_len(&batch));
        check_batch(&batch, page_size).unwrap();
        assert_eq!(decode_batch(&bytes, page_size).unwrap(), batch, "round {round}");
        prev = batch.end_lsn;
    }
}

/// The bytes docs/format.md "Redo records" gives, field by field.
#[test]
fn the_encoding_keeps_its_documented_bytes() {
    let batch = RedoBatch {
        volume: VolumeId(0x0102_0304),
        epoch: WriterEpoch(5),
        prev_lsn: Lsn(100),
        end_lsn: Lsn(300),
        records: vec![
            RedoRecord {
                lsn: Lsn(150),
                page: 9,
                payload: Payload::Ranges(vec![(16, vec![0xaa, 0xbb]), (4000, vec![1])]),
            },
            RedoRecord { lsn: Lsn(300), page: 2, payload: Payload::Image(vec![0x5a; 512]) },
        ],
    };
    let b = encoded(&batch);
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!((b[0], &b[1..4]), (1, &[0u8; 3][..]), "version, reserved");
    assert_eq!((u32_at(4), u64_at(8), u64_at(16), u64_at(24), u32_at(32)), (0x0102_0304, 5, 100, 300, 2));
    // The first record: LSN, page, flags 0, two ranges.
    let r = 36;
    assert_eq!((u64_at(r), u64_at(r + 8), b[r + 16], u32_at(r + 17)), (150, 9, 0, 2));
    assert_eq!((u32_at(r + 21), u32_at(r + 25), &b[r + 29..r + 31]), (16, 2, &[0xaa, 0xbb][..]));
    assert_eq!((u32_at(r + 31), u32_at(r + 35), b[r + 39]), (4000, 1, 1));
    // The second: flags 1 (will_init), the image's length, the image.
    let r = r + 40;
    assert_eq!((u64_at(r), u64_at(r + 8), b[r + 16], u32_at(r + 17)), (300, 2, 1, 512));
    assert!(b[r + 21..].iter().all(|&x| x == 0x5a) && b.len() == r + 21 + 512);
    assert!(batch.records[1].will_init() && !batch.records[0].will_init());
}

fn invalid(result: Result<impl std::fmt::Debug>, needle: &str) {
    match result {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
            assert!(e.message().contains(needle), "{e} does not say {needle:?}");
        }
        Ok(value) => panic!("accepted: {value:?}"),
    }
}

#[test]
fn malformed_records_and_batches_are_refused() {
    let ranges = |ranges: Vec<(u32, Vec<u8>)>| RedoRecord { lsn: Lsn(5), page: 1, payload: Payload::Ranges(ranges) };
    let batch = |records: Vec<RedoRecord>, end: u64| RedoBatch {
        volume: VolumeId(1),
        epoch: WriterEpoch(1),
        prev_lsn: Lsn(4),
        end_lsn: Lsn(end),
        records,
    };
    let cases: Vec<(RedoBatch, &str)> = vec![
        (batch(vec![ranges(vec![(8190, vec![1, 2, 3])])], 5), "past the end of a 8192-byte page"),
        (batch(vec![ranges(vec![(u32::MAX, vec![1])])], 5), "past the end"),
        (batch(vec![ranges(vec![(0, vec![])])], 5), "an empty range"),
        (batch(vec![ranges(vec![])], 5), "changes no byte range"),
        (
            batch(vec![RedoRecord { lsn: Lsn(5), page: 1, payload: Payload::Image(vec![0; 4096]) }], 5),
            "an image of 4096",
        ),
        (batch(vec![ranges(vec![(0, vec![1])])], 3), "before its prev_lsn"),
        (batch(vec![ranges(vec![(0, vec![1])])], 4), "past the batch's end_lsn"),
        (batch(vec![RedoRecord { lsn: Lsn(4), ..ranges(vec![(0, vec![1])]) }], 9), "must strictly increase"),
        (
            batch(vec![ranges(vec![(0, vec![1])]), RedoRecord { lsn: Lsn(5), ..ranges(vec![(0, vec![1])]) }], 9),
            "must strictly increase",
        ),
    ];
    for (bad, needle) in cases {
        invalid(check_batch(&bad, PAGE), needle);
        // The same batch as bytes is refused by the decoder for the same reason.
        invalid(decode_batch(&encoded(&bad), PAGE), needle);
    }
}

#[test]
fn malformed_bytes_are_refused() {
    let mut rng = Rng::new(3);
    let batch = random_batch(&mut rng, VolumeId(2), WriterEpoch(1), Lsn(0), 1, PAGE);
    let good = encoded(&RedoBatch {
        records: vec![RedoRecord { lsn: Lsn(1), page: 3, payload: Payload::Ranges(vec![(0, vec![7])]) }],
        end_lsn: Lsn(1),
        ..batch
    });
    let patched = |at: usize, value: &[u8]| {
        let mut bytes = good.clone();
        bytes[at..at + value.len()].copy_from_slice(value);
        bytes
    };
    invalid(decode_batch(&patched(0, &[2]), PAGE), "a redo batch of format 2; this build reads format 1");
    invalid(decode_batch(&patched(2, &[1]), PAGE), "reserved bytes");
    invalid(decode_batch(&patched(32, &u32::MAX.to_le_bytes()), PAGE), "cut short");
    invalid(decode_batch(&patched(36 + 16, &[2]), PAGE), "unknown flags");
    invalid(decode_batch(&patched(36 + 16, &[1]), PAGE), "an image of 1 bytes");
    invalid(decode_batch(&patched(36 + 17, &0u32.to_le_bytes()), PAGE), "changes no byte range");
    invalid(decode_batch(&patched(36 + 17, &u32::MAX.to_le_bytes()), PAGE), "cut short");
    invalid(decode_batch(&patched(36 + 25, &0u32.to_le_bytes()), PAGE), "an empty range");
    invalid(decode_batch(&patched(36 + 25, &2u32.to_le_bytes()), PAGE), "cut short");
    invalid(decode_batch(&patched(36 + 21, &8192u32.to_le_bytes()), PAGE), "past the end");
    let mut longer = good.clone();
    longer.push(0);
    invalid(decode_batch(&longer, PAGE), "1 bytes follow the last");
    assert!(decode_batch(&good, PAGE).is_ok());
}

/// Every prefix of a valid encoding is refused: nothing is read past the end, and a batch is
/// never taken for a shorter one.
#[test]
fn every_truncation_is_refused() {
    let mut rng = Rng::new(tundra_env::seed_from_env(4));
    for _ in 0..20 {
        let batch = random_batch(&mut rng, VolumeId(1), WriterEpoch(2), Lsn(10), 4, 512);
        let bytes = encoded(&batch);
        for len in 0..bytes.len() {
            let error = decode_batch(&bytes[..len], 512).expect_err("a prefix decoded");
            assert_eq!(error.kind(), ErrorKind::Invalid);
        }
    }
}

/// Arbitrary bytes, and valid encodings with bits flipped, bytes cut or bytes appended, give a
/// value or an error, never a panic; a batch that decodes is well formed and encodes back to
/// the bytes it came from.
#[test]
fn arbitrary_and_mutated_bytes_never_panic() {
    let mut rng = Rng::new(tundra_env::seed_from_env(5));
    let valid: Vec<Vec<u8>> =
        (0..32).map(|i| encoded(&random_batch(&mut rng, VolumeId(i), WriterEpoch(1), Lsn(i.into()), 3, 512))).collect();
    let mut decoded = 0;
    for case in 0..fuzz_cases() {
        let bytes = match case % 3 {
            0 => {
                let len = rng.below(200) as usize;
                rng.bytes(len)
            }
            1 => {
                let mut bytes = rng.pick(&valid).clone();
                for _ in 0..1 + rng.below(3) {
                    let bit = rng.below(bytes.len() as u64 * 8);
                    bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
                }
                bytes
            }
            _ => {
                // A valid header with a random tail: reaches the record decoder more often.
                let mut bytes = rng.pick(&valid)[..BATCH_HEADER_BYTES].to_vec();
                let len = rng.below(120) as usize;
                let tail = rng.bytes(len);
                bytes.extend_from_slice(&tail);
                bytes
            }
        };
        if let Ok(batch) = decode_batch(&bytes, 512) {
            decoded += 1;
            check_batch(&batch, 512).unwrap();
            assert_eq!(encoded(&batch), bytes, "case {case}: a decoded batch encodes to other bytes");
        }
    }
    eprintln!("{decoded} mutated inputs decoded");
}

/// A batch's records without its header, as the native protocol carries them, decode to the
/// batch's records; a wrong count, a cut or a stray byte is refused.
#[test]
fn records_without_their_batch_header_decode_alike() {
    let mut rng = Rng::new(tundra_env::seed_from_env(9));
    let mut prev = Lsn(0);
    for round in 0..100 {
        let batch = random_batch(&mut rng, VolumeId(1), WriterEpoch(1), prev, 5, PAGE);
        let bytes = encoded(&batch);
        let records = &bytes[BATCH_HEADER_BYTES..];
        let count = batch.records.len() as u32;
        assert_eq!(decode_records(records, count, PAGE).unwrap(), batch.records, "round {round}");
        if count > 0 {
            assert!(decode_records(records, count + 1, PAGE).is_err());
            assert!(decode_records(records, count - 1, PAGE).is_err());
            assert!(decode_records(&records[..records.len() - 1], count, PAGE).is_err());
        }
        let mut longer = records.to_vec();
        longer.push(0);
        assert!(decode_records(&longer, count, PAGE).is_err());
        assert!(decode_records(records, u32::MAX, PAGE).is_err());
        prev = batch.end_lsn;
    }
}
