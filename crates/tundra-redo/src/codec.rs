//! The byte encoding of redo records and batches (docs/format.md, "Redo records"): what a
//! writer sends and what the redo log stores, little-endian, one version byte per batch.
//!
//! Decoding trusts nothing: every count and length is checked against the bytes that remain
//! before anything is allocated from it, and every record against the page size the caller
//! gives (an image is exactly one page; a record of byte ranges has at least one range, each
//! non-empty and inside the page). A batch that decodes is also well formed as a batch: its
//! records' LSNs strictly increase inside `(prev_lsn, end_lsn]`. Every failure is an `Invalid`
//! error, because the bytes are a request; the redo log, which reads the same encoding back
//! from its media behind a checksum, reports such a failure as `Corrupted`.

use tundra_store::ids::{Lsn, VolumeId};

use crate::{Error, Payload, RedoBatch, RedoRecord, Result, WriterEpoch};

/// The batch format this build writes and reads.
pub const BATCH_VERSION: u8 = 1;
/// Bytes before a batch's first record.
pub const BATCH_HEADER_BYTES: usize = 36;
/// Bytes of a record before its image or its ranges: LSN, page, flags and a count or length.
pub const RECORD_HEADER_BYTES: usize = 21;
/// Bytes of a range before its bytes: offset and length.
pub const RANGE_HEADER_BYTES: usize = 8;
/// The fewest bytes a record can take before its checks refuse it: a header and nothing else.
const MIN_RECORD_BYTES: usize = RECORD_HEADER_BYTES;
/// The record's flag bit that says its payload is a whole page (`will_init`).
const FLAG_WILL_INIT: u8 = 1;

/// Checks one record against the page size: an image of exactly one page, or at least one
/// range, each of at least one byte and inside the page.
pub fn check_record(record: &RedoRecord, page_size: u32) -> Result<()> {
    assert!(page_size > 0, "a page size of zero");
    let lsn = record.lsn;
    match &record.payload {
        Payload::Image(image) if image.len() as u64 != u64::from(page_size) => Err(Error::invalid(format!(
            "the record at LSN {lsn} carries an image of {} bytes; a page is {page_size}",
            image.len()
        ))),
        Payload::Image(_) => Ok(()),
        Payload::Ranges(ranges) if ranges.is_empty() => {
            Err(Error::invalid(format!("the record at LSN {lsn} changes no byte range")))
        }
        Payload::Ranges(ranges) => {
            for (offset, bytes) in ranges {
                check_range(lsn, *offset, bytes.len() as u64, page_size)?;
            }
            Ok(())
        }
    }
}

fn check_range(lsn: Lsn, offset: u32, len: u64, page_size: u32) -> Result<()> {
    if len == 0 {
        return Err(Error::invalid(format!("the record at LSN {lsn} has an empty range at offset {offset}")));
    }
    if u64::from(offset) + len > u64::from(page_size) {
        return Err(Error::invalid(format!(
            "the record at LSN {lsn} has a range of {len} bytes at offset {offset}, past the end of a \
             {page_size}-byte page"
        )));
    }
    Ok(())
}

/// Checks a batch: `end_lsn >= prev_lsn`, every record well formed for the page size, and the
/// records' LSNs strictly increasing inside `(prev_lsn, end_lsn]`. The volume is the caller's
/// to check.
pub fn check_batch(batch: &RedoBatch, page_size: u32) -> Result<()> {
    let (prev, end) = (batch.prev_lsn, batch.end_lsn);
    if end < prev {
        return Err(Error::invalid(format!("a batch ending at LSN {end}, before its prev_lsn {prev}")));
    }
    let mut last = prev;
    for record in &batch.records {
        if record.lsn <= last {
            return Err(Error::invalid(format!(
                "the record at LSN {} follows LSN {last}: records must strictly increase after prev_lsn {prev}",
                record.lsn
            )));
        }
        if record.lsn > end {
            return Err(Error::invalid(format!(
                "the record at LSN {} lies past the batch's end_lsn {end}",
                record.lsn
            )));
        }
        check_record(record, page_size)?;
        last = record.lsn;
    }
    Ok(())
}

/// Appends `record`'s encoding to `out`. The record must pass [`check_record`]; lengths that do
/// not fit their fields are a programmer error.
pub fn encode_record(record: &RedoRecord, out: &mut Vec<u8>) {
    out.extend_from_slice(&record.lsn.0.to_le_bytes());
    out.extend_from_slice(&record.page.to_le_bytes());
    match &record.payload {
        Payload::Image(image) => {
            out.push(FLAG_WILL_INIT);
            out.extend_from_slice(&u32_len(image.len()).to_le_bytes());
            out.extend_from_slice(image);
        }
        Payload::Ranges(ranges) => {
            out.push(0);
            out.extend_from_slice(&u32_len(ranges.len()).to_le_bytes());
            for (offset, bytes) in ranges {
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&u32_len(bytes.len()).to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
    }
}

/// The bytes [`encode_record`] writes for `record`.
pub fn encoded_record_len(record: &RedoRecord) -> usize {
    RECORD_HEADER_BYTES
        + match &record.payload {
            Payload::Image(image) => image.len(),
            Payload::Ranges(ranges) => ranges.iter().map(|(_, bytes)| RANGE_HEADER_BYTES + bytes.len()).sum(),
        }
}

/// The bytes [`encode_batch`] writes for `batch`.
pub fn encoded_batch_len(batch: &RedoBatch) -> usize {
    BATCH_HEADER_BYTES + batch.records.iter().map(encoded_record_len).sum::<usize>()
}

/// Appends `batch`'s encoding to `out`.
pub fn encode_batch(batch: &RedoBatch, out: &mut Vec<u8>) {
    out.reserve(encoded_batch_len(batch));
    out.push(BATCH_VERSION);
    out.extend_from_slice(&[0u8; 3]);
    out.extend_from_slice(&batch.volume.0.to_le_bytes());
    out.extend_from_slice(&batch.epoch.0.to_le_bytes());
    out.extend_from_slice(&batch.prev_lsn.0.to_le_bytes());
    out.extend_from_slice(&batch.end_lsn.0.to_le_bytes());
    out.extend_from_slice(&u32_len(batch.records.len()).to_le_bytes());
    for record in &batch.records {
        encode_record(record, out);
    }
}

fn u32_len(len: usize) -> u32 {
    u32::try_from(len).expect("a length the batch's checks bound fits in 32 bits")
}

/// Decodes a batch that fills `bytes` exactly, for pages of `page_size` bytes.
pub fn decode_batch(bytes: &[u8], page_size: u32) -> Result<RedoBatch> {
    assert!(page_size > 0, "a page size of zero");
    let mut cursor = Cursor { bytes, at: 0 };
    let version = cursor.u8("the format version")?;
    if version != BATCH_VERSION {
        return Err(Error::invalid(format!(
            "a redo batch of format {version}; this build reads format {BATCH_VERSION}"
        )));
    }
    if cursor.take(3, "the reserved bytes")? != [0u8; 3] {
        return Err(Error::invalid("a redo batch whose reserved bytes 1..4 are not zero"));
    }
    let volume = VolumeId(cursor.u32("the volume")?);
    let epoch = WriterEpoch(cursor.u64("the epoch")?);
    let prev_lsn = Lsn(cursor.u64("prev_lsn")?);
    let end_lsn = Lsn(cursor.u64("end_lsn")?);
    let count = cursor.u32("the record count")? as usize;
    // Each record takes at least MIN_RECORD_BYTES (each range at least RANGE_HEADER_BYTES), so a
    // count the bytes cannot hold is refused before anything is allocated for it.
    if count > cursor.remaining() / MIN_RECORD_BYTES {
        return Err(Error::invalid(format!(
            "a redo batch of {count} records in {} bytes: it is cut short",
            cursor.remaining()
        )));
    }
    let mut records = Vec::with_capacity(count);
    for index in 0..count {
        let start = cursor.at;
        let record = decode_record(&mut cursor, page_size)
            .map_err(|e| Error::invalid(format!("record {index} at byte {start}: {}", e.message())))?;
        records.push(record);
    }
    if cursor.remaining() > 0 {
        return Err(Error::invalid(format!(
            "{} bytes follow the last of the batch's {count} records",
            cursor.remaining()
        )));
    }
    let batch = RedoBatch { volume, epoch, prev_lsn, end_lsn, records };
    check_batch(&batch, page_size)?;
    Ok(batch)
}

/// Decodes `count` records that fill `bytes` exactly (a batch's records without its header, as
/// the native protocol's AppendRedo carries them), for pages of `page_size` bytes. The records'
/// order against a batch's LSN range is checked by the batch, not here.
pub fn decode_records(bytes: &[u8], count: u32, page_size: u32) -> Result<Vec<RedoRecord>> {
    assert!(page_size > 0, "a page size of zero");
    let mut cursor = Cursor { bytes, at: 0 };
    let count = count as usize;
    if count > cursor.remaining() / MIN_RECORD_BYTES {
        return Err(Error::invalid(format!("{count} redo records in {} bytes: they are cut short", bytes.len())));
    }
    let mut records = Vec::with_capacity(count);
    for index in 0..count {
        let start = cursor.at;
        let record = decode_record(&mut cursor, page_size)
            .map_err(|e| Error::invalid(format!("record {index} at byte {start}: {}", e.message())))?;
        records.push(record);
    }
    if cursor.remaining() > 0 {
        return Err(Error::invalid(format!("{} bytes follow the last of {count} redo records", cursor.remaining())));
    }
    Ok(records)
}

/// Decodes one record at the cursor and checks it against the page size.
fn decode_record(cursor: &mut Cursor<'_>, page_size: u32) -> Result<RedoRecord> {
    let lsn = Lsn(cursor.u64("the LSN")?);
    let page = cursor.u64("the page")?;
    let flags = cursor.u8("the flags")?;
    if flags & !FLAG_WILL_INIT != 0 {
        return Err(Error::invalid(format!("the record at LSN {lsn} has unknown flags {flags:#04x}")));
    }
    let count_or_len = cursor.u32("the image length or range count")?;
    let payload = if flags & FLAG_WILL_INIT != 0 {
        if count_or_len != page_size {
            return Err(Error::invalid(format!(
                "the record at LSN {lsn} carries an image of {count_or_len} bytes; a page is {page_size}"
            )));
        }
        Payload::Image(cursor.take(count_or_len as usize, "the image")?.to_vec())
    } else {
        Payload::Ranges(decode_ranges(cursor, lsn, count_or_len as usize, page_size)?)
    };
    Ok(RedoRecord { lsn, page, payload })
}

fn decode_ranges(cursor: &mut Cursor<'_>, lsn: Lsn, count: usize, page_size: u32) -> Result<Vec<(u32, Vec<u8>)>> {
    if count == 0 {
        return Err(Error::invalid(format!("the record at LSN {lsn} changes no byte range")));
    }
    if count > cursor.remaining() / RANGE_HEADER_BYTES {
        return Err(Error::invalid(format!(
            "the record at LSN {lsn} claims {count} ranges in {} bytes: it is cut short",
            cursor.remaining()
        )));
    }
    let mut ranges = Vec::with_capacity(count);
    for _ in 0..count {
        let offset = cursor.u32("a range's offset")?;
        let len = cursor.u32("a range's length")?;
        check_range(lsn, offset, u64::from(len), page_size)?;
        ranges.push((offset, cursor.take(len as usize, "a range's bytes")?.to_vec()));
    }
    Ok(ranges)
}

/// Reads little-endian fields from a byte slice, refusing any read past its end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        if len > self.remaining() {
            return Err(Error::invalid(format!(
                "{what} needs {len} bytes at byte {} but only {} remain: the batch is cut short",
                self.at,
                self.remaining()
            )));
        }
        let bytes = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(bytes)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let bytes = self.take(8, what)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(array))
    }
}

#[cfg(test)]
pub(crate) mod tests;
