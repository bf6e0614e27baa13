//! The redo that `tundra-bench redo` commits: batches of byte-range records shaped like a row
//! store's, each encoded by tundra-redo's codec to exactly the size asked for.
//!
//! A record changes one page the way a heap update does: the page's LSN (8 bytes at offset 0),
//! one line pointer (4 bytes) and one tuple (a 23-byte binary header and a text row of an
//! order: numbers, a customer name, a status, a price, a date and a comment of English words).
//! The text is what makes the compressed alternative honest: random bytes would not compress
//! and text of one repeated word would compress far too well. Everything comes from one seed,
//! so every method and every run commits the same bytes.

use tundra_env::Rng;
use tundra_redo::codec::{BATCH_HEADER_BYTES, RANGE_HEADER_BYTES, RECORD_HEADER_BYTES, encoded_batch_len};
use tundra_redo::{Payload, RedoBatch, RedoRecord, WriterEpoch};
use tundra_store::ids::{Lsn, VolumeId};

/// The volume every benchmark stream belongs to.
pub const VOLUME: VolumeId = VolumeId(1);
/// The writer epoch of every batch.
pub const EPOCH: WriterEpoch = WriterEpoch(1);
/// The longest text row a full record carries.
const MAX_ROW_BYTES: usize = 200;
/// The 23-byte tuple header before a row.
const TUPLE_HEADER_BYTES: usize = 23;
/// The most a full record takes once encoded: three range headers, the page LSN, the line
/// pointer, the tuple header and the longest row.
const MAX_RECORD_BYTES: usize =
    RECORD_HEADER_BYTES + 3 * RANGE_HEADER_BYTES + 8 + 4 + TUPLE_HEADER_BYTES + MAX_ROW_BYTES;
/// The least a record of one one-byte range takes.
const MIN_RECORD_BYTES: usize = RECORD_HEADER_BYTES + RANGE_HEADER_BYTES + 1;
/// The smallest batch [`Workload::batch`] builds: a header and one record.
pub const MIN_BATCH_BYTES: usize = BATCH_HEADER_BYTES + MIN_RECORD_BYTES;
/// Pages below this offset hold the page header and line pointers; tuples go above it.
const TUPLES_FROM: u64 = 1024;

const WORDS: &[&str] = &[
    "the",
    "regular",
    "deposits",
    "packages",
    "accounts",
    "requests",
    "carefully",
    "quickly",
    "final",
    "ironic",
    "express",
    "pending",
    "special",
    "furiously",
    "blithely",
    "slyly",
    "boldly",
    "above",
    "across",
    "along",
    "among",
    "around",
    "instructions",
    "theodolites",
    "foxes",
    "pinto",
    "beans",
    "ideas",
    "platelets",
    "sleep",
    "wake",
    "haggle",
    "nag",
    "cajole",
    "detect",
    "integrate",
    "maintain",
    "use",
    "after",
    "before",
    "even",
    "unusual",
    "silent",
    "bold",
    "careful",
    "dependencies",
    "excuses",
    "dolphins",
    "warhorses",
    "asymptotes",
];
const STATUSES: &[&str] = &["open", "shipped", "delivered", "returned", "pending"];

/// Builds the batches of one stream, each continuing the LSNs of the one before.
pub struct Workload {
    rng: Rng,
    page_size: u32,
    pages: u64,
    end_lsn: Lsn,
    /// The transaction id the tuple headers carry; it grows with every record.
    xid: u32,
}

impl Workload {
    /// A stream over `pages` pages of `page_size` bytes (at least 4 KiB) whose first batch
    /// follows `start`.
    pub fn new(seed: u64, page_size: u32, pages: u64, start: Lsn) -> Workload {
        assert!(page_size >= 4096, "pages of at least 4 KiB");
        assert!(pages > 0, "a volume of at least one page");
        Workload { rng: Rng::new(seed), page_size, pages, end_lsn: start, xid: 1000 }
    }

    /// The next batch, whose encoding is exactly `batch_bytes` long (at least
    /// [`MIN_BATCH_BYTES`]): full records while more than two fit, then one record whose one
    /// range takes what is left.
    pub fn batch(&mut self, batch_bytes: usize) -> RedoBatch {
        assert!(batch_bytes >= MIN_BATCH_BYTES, "a batch of {batch_bytes} bytes cannot hold a record");
        let prev_lsn = self.end_lsn;
        let mut records = Vec::new();
        let mut left = batch_bytes - BATCH_HEADER_BYTES;
        // Stopping while `MAX + MIN` bytes remain leaves room for the closing record, and the
        // closing record is shorter than a full one, so its range fits any page.
        while left >= MAX_RECORD_BYTES + MIN_RECORD_BYTES {
            let record = self.row_update();
            left -= tundra_redo::codec::encoded_record_len(&record);
            records.push(record);
        }
        records.push(self.closing_record(left - RECORD_HEADER_BYTES - RANGE_HEADER_BYTES));
        let batch = RedoBatch { volume: VOLUME, epoch: EPOCH, prev_lsn, end_lsn: self.end_lsn, records };
        assert_eq!(encoded_batch_len(&batch), batch_bytes, "the batch is cut to the size asked for");
        batch
    }

    fn next_lsn(&mut self) -> Lsn {
        self.end_lsn = Lsn(self.end_lsn.0 + 1);
        self.xid = self.xid.wrapping_add(1);
        self.end_lsn
    }

    /// A heap update: the page LSN, a line pointer and a tuple.
    fn row_update(&mut self) -> RedoRecord {
        let lsn = self.next_lsn();
        let page = self.rng.below(self.pages);
        let row_bytes = self.rng.range(60..MAX_ROW_BYTES as u64 + 1) as usize;
        let mut row = self.row_text(row_bytes);
        row.truncate(MAX_ROW_BYTES);
        let mut tuple = self.tuple_header(page);
        tuple.extend_from_slice(&row);
        let tuple_offset = self.tuple_offset(tuple.len());
        let slot = self.rng.below(200) as u32;
        let line_pointer = (tuple_offset & 0x7fff) | (1 << 15) | ((tuple.len() as u32 & 0x7fff) << 17);
        let ranges = vec![
            (0, lsn.0.to_le_bytes().to_vec()),
            (24 + 4 * slot, line_pointer.to_le_bytes().to_vec()),
            (tuple_offset, tuple),
        ];
        RedoRecord { lsn, page, payload: Payload::Ranges(ranges) }
    }

    /// A record of one range of `len` bytes of a tuple, to fill a batch to its size.
    fn closing_record(&mut self, len: usize) -> RedoRecord {
        let lsn = self.next_lsn();
        let page = self.rng.below(self.pages);
        let mut tuple = self.tuple_header(page);
        tuple.extend_from_slice(&self.row_text(len));
        tuple.truncate(len);
        let offset = self.tuple_offset(len);
        RedoRecord { lsn, page, payload: Payload::Ranges(vec![(offset, tuple)]) }
    }

    /// Where a tuple of `len` bytes goes: above the line pointers, inside the page.
    fn tuple_offset(&mut self, len: usize) -> u32 {
        let end = u64::from(self.page_size) - len as u64;
        assert!(end > TUPLES_FROM, "a tuple of {len} bytes fits above the line pointers");
        self.rng.range(TUPLES_FROM..end) as u32
    }

    /// A tuple header: the inserting and deleting transactions, a command id, the tuple's own
    /// page and slot, flag bits and the header's length.
    fn tuple_header(&mut self, page: u64) -> Vec<u8> {
        let mut header = Vec::with_capacity(TUPLE_HEADER_BYTES + MAX_ROW_BYTES);
        header.extend_from_slice(&self.xid.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&(self.rng.below(4) as u32).to_le_bytes());
        header.extend_from_slice(&(page as u32).to_le_bytes());
        header.extend_from_slice(&(self.rng.below(200) as u16).to_le_bytes());
        header.extend_from_slice(&6u16.to_le_bytes());
        header.extend_from_slice(&0x0902u16.to_le_bytes());
        header.push(TUPLE_HEADER_BYTES as u8 + 1);
        assert_eq!(header.len(), TUPLE_HEADER_BYTES);
        header
    }

    /// An order row of at least `min_len` bytes: the comment grows until it is long enough.
    fn row_text(&mut self, min_len: usize) -> Vec<u8> {
        let rng = &mut self.rng;
        let mut row = format!(
            "{:010}|Customer#{:09}|{}|{}.{:02}|{}-{:02}-{:02}|",
            rng.below(6_000_000),
            rng.below(150_000),
            rng.pick(STATUSES),
            rng.range(900..105_000),
            rng.below(100),
            rng.range(1992..1999),
            rng.range(1..13),
            rng.range(1..29),
        );
        while row.len() < min_len {
            row.push_str(rng.pick::<&str>(WORDS));
            row.push(' ');
        }
        row.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use tundra_codec::{Algorithm, PageCodec};
    use tundra_redo::codec::{check_batch, decode_batch, encode_batch};

    use super::*;

    #[test]
    fn batches_have_the_size_asked_for_and_decode_back() {
        let mut workload = Workload::new(7, 16384, 4096, Lsn(100));
        let mut prev = Lsn(100);
        for size in (MIN_BATCH_BYTES..2000).step_by(7).chain([4096, 16384, 65536, 1 << 20]) {
            let batch = workload.batch(size);
            assert_eq!(batch.prev_lsn, prev);
            check_batch(&batch, 16384).unwrap();
            let mut bytes = Vec::new();
            encode_batch(&batch, &mut bytes);
            assert_eq!(bytes.len(), size);
            assert_eq!(decode_batch(&bytes, 16384).unwrap(), batch);
            prev = batch.end_lsn;
        }
    }

    #[test]
    fn batches_compress_like_text_not_like_noise_or_zeros() {
        let mut workload = Workload::new(7, 16384, 4096, Lsn(0));
        let mut bytes = Vec::new();
        encode_batch(&workload.batch(16384), &mut bytes);
        let compressed = PageCodec::new(1).unwrap().compress_bytes(Algorithm::Zstd, &bytes).unwrap();
        let ratio = bytes.len() as f64 / compressed.len() as f64;
        assert!((1.5..6.0).contains(&ratio), "a 16 KiB batch compresses {ratio:.2} times");
    }
}
