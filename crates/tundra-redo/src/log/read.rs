//! Reading batches back from the log: the applier catching up, and the baseline without
//! per-page log slots, which reads a page's records back from the stream.
//!
//! A reader finds each batch through the in-memory index of retained batches, reads the blocks
//! its frame spans and checks everything again (each block's header and body checksums, its
//! position and volume, the frame's checksum, the batch's encoding), so bytes damaged since they
//! were written, or a block reused because the batch was truncated meanwhile, are an error and
//! never a wrong record.

use tundra_device::BLOCK_SIZE;
use tundra_store::ids::Lsn;

use super::frame::{BlockRead, FRAME_HEADER_BYTES, PAYLOAD_BYTES, StreamOffset, frame_header, read_block};
use super::{BatchEntry, RedoLog};
use crate::{Error, RedoBatch, Result, codec};

/// The durable batches after an LSN, in order; see [`RedoLog::read_after`].
pub struct BatchReader<'a> {
    log: &'a RedoLog,
    /// Records at or before this LSN are left out.
    after: Lsn,
    /// The end of the last batch read: the next one ends after it.
    read_through: Lsn,
    done: bool,
}

impl<'a> BatchReader<'a> {
    pub(super) fn new(log: &'a RedoLog, after: Lsn) -> Result<BatchReader<'a>> {
        let start_lsn = log.committer.lock().start_lsn;
        if after < start_lsn {
            return Err(truncated(after, start_lsn));
        }
        Ok(BatchReader { log, after, read_through: after, done: false })
    }

    fn next_entry(&self) -> Result<Option<BatchEntry>> {
        let c = self.log.committer.lock();
        if self.read_through < c.start_lsn {
            return Err(truncated(self.read_through, c.start_lsn));
        }
        let index = c.entries.partition_point(|e| e.end_lsn <= self.read_through);
        Ok(c.entries.get(index).copied())
    }
}

impl Iterator for BatchReader<'_> {
    type Item = Result<RedoBatch>;

    fn next(&mut self) -> Option<Result<RedoBatch>> {
        if self.done {
            return None;
        }
        let read = self.next_entry().and_then(|entry| entry.map(|e| self.log.read_batch(&e)).transpose());
        match read {
            Ok(Some(mut batch)) => {
                self.read_through = batch.end_lsn;
                batch.records.retain(|record| record.lsn > self.after);
                Some(Ok(batch))
            }
            Ok(None) => None,
            Err(error) => {
                self.done = true;
                Some(Err(error))
            }
        }
    }
}

fn truncated(after: Lsn, start_lsn: Lsn) -> Error {
    Error::invalid(format!(
        "the redo log's batches through LSN {start_lsn} were truncated; records after LSN {after} cannot all be read"
    ))
}

impl RedoLog {
    /// Reads and verifies the batch of `entry`. If the batch was truncated meanwhile (its blocks
    /// may be reused), the error is `Invalid`; otherwise a failed check is `Corrupted`.
    fn read_batch(&self, entry: &BatchEntry) -> Result<RedoBatch> {
        self.read_frame(entry).map_err(|error| {
            let start_lsn = self.committer.lock().start_lsn;
            if entry.end_lsn <= start_lsn { truncated(entry.end_lsn, start_lsn) } else { error }
        })
    }

    fn read_frame(&self, entry: &BatchEntry) -> Result<RedoBatch> {
        let first = entry.start.position();
        let end = entry.start.plus(entry.frame_bytes);
        let count = StreamOffset(end.0 - 1).position().0 - first.0 + 1;
        let mut blocks = vec![0u8; count as usize * BLOCK_SIZE];
        {
            let _reading = self.io_gate.read();
            let mut done = 0u64;
            while done < count {
                let position = first.after(done);
                let room = self.geometry.log_blocks - position.0 % self.geometry.log_blocks;
                let run = room.min(count - done);
                let bytes = &mut blocks[(done as usize) * BLOCK_SIZE..((done + run) as usize) * BLOCK_SIZE];
                self.device.read(self.geometry.lba(position), bytes)?;
                done += run;
            }
        }
        let mut frame = Vec::with_capacity(entry.frame_bytes as usize);
        for (i, block) in blocks.chunks_exact(BLOCK_SIZE).enumerate() {
            let position = first.after(i as u64);
            let damaged = |what: &str| {
                Error::corrupted(format!(
                    "reading back the batch ending at LSN {}: the redo log block at position {position} ({}) {what}",
                    entry.end_lsn,
                    self.geometry.lba(position)
                ))
            };
            let payload = match read_block(block) {
                BlockRead::Verified { header, payload, body_ok: true }
                    if header.position == position && header.volume == self.geometry.volume =>
                {
                    payload
                }
                BlockRead::Verified { body_ok: true, .. } => return Err(damaged("is another block")),
                _ => return Err(damaged("fails its checks")),
            };
            // The frame fills every block it spans from `from` to the block's end, or to its own.
            let from = if i == 0 { entry.start.in_block() } else { 0 };
            let want = (entry.frame_bytes as usize - frame.len()).min(PAYLOAD_BYTES - from);
            if payload.len() < from + want {
                return Err(damaged("holds fewer bytes than the batch's frame"));
            }
            frame.extend_from_slice(&payload[from..from + want]);
        }
        if frame.len() as u64 != entry.frame_bytes {
            return Err(Error::corrupted(format!(
                "reading back the batch ending at LSN {}: its blocks hold {} of its {} bytes",
                entry.end_lsn,
                frame.len(),
                entry.frame_bytes
            )));
        }
        let (len, crc) = frame_header(&frame);
        let bytes = &frame[FRAME_HEADER_BYTES..];
        if len != bytes.len() || crc32c::crc32c(bytes) != crc {
            return Err(Error::corrupted(format!(
                "reading back the batch ending at LSN {}: its frame fails its checks",
                entry.end_lsn
            )));
        }
        let batch = codec::decode_batch(bytes, self.geometry.page_size).map_err(|e| {
            Error::corrupted(format!("reading back the batch ending at LSN {}: {}", entry.end_lsn, e.message()))
        })?;
        if batch.end_lsn != entry.end_lsn || batch.volume != self.geometry.volume {
            return Err(Error::corrupted(format!(
                "reading back the batch ending at LSN {}: the log holds another batch there",
                entry.end_lsn
            )));
        }
        Ok(batch)
    }
}
