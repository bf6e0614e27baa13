//! The redo side of the protocol, version 2: what a volume's writer sends (APPEND_REDO), how a
//! reader asks for pages as of an LSN (GET_PAGE_AT_LSN, GET_PAGES_AT_LSN), the leases that keep
//! a reader's history from being folded away (REGISTER_READER, RENEW_READER, RELEASE_READER)
//! and a volume's watermarks (REDO_STATUS). Each value here has its own byte layout
//! (docs/protocol.md, "Version 2: redo, reads at an LSN, leases").
//!
//! LSNs are plain u64s: this crate defines its own wire types and depends on neither the store
//! nor the redo crate. Redo records travel as opaque bytes with a record count; their encoding
//! is docs/format.md's "Redo records", which the node decodes and this crate never does.

use crate::codes::Opcode;
use crate::message::DecodeError;
use crate::wire::{Cursor, put_optional_u64, put_u32, put_u64};

/// Pages a vectored read may name at most. Checked before anything is allocated for them; at
/// 16 KiB pages the reply stays near 2 MiB, so a pipelined client's replies cannot swamp the
/// socket buffers (docs/protocol.md, "Deadlock and queue depth").
pub const MAX_PAGES_PER_READ: usize = 128;

/// The `request_lsn` that asks for the newest version the server can serve: the writer's own
/// reads, which never lag (Neon's "latest").
pub const LATEST_LSN: u64 = u64::MAX;

const _: () = assert!(MAX_PAGES_PER_READ * 8 < u16::MAX as usize);

/// APPEND_REDO: a batch from a volume's one writer, claiming every record in
/// `(prev_lsn, end_lsn]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedoAppend<'a> {
    pub volume: u32,
    /// A new or restarted writer takes a higher epoch; storage refuses lower ones (fencing).
    pub writer_epoch: u64,
    /// Must equal the end of the last batch the stream accepted.
    pub prev_lsn: u64,
    pub end_lsn: u64,
    pub record_count: u32,
    /// `record_count` records in docs/format.md's "Redo records" encoding, back to back.
    pub records: &'a [u8],
}

impl<'a> RedoAppend<'a> {
    /// The head of the body: every field, the records' byte length last. The records follow.
    pub(crate) fn encode_head(&self, out: &mut Vec<u8>) {
        put_u32(out, self.volume);
        put_u64(out, self.writer_epoch);
        put_u64(out, self.prev_lsn);
        put_u64(out, self.end_lsn);
        put_u32(out, self.record_count);
        put_u32(out, u32::try_from(self.records.len()).expect("record bytes fit a frame"));
    }

    pub(crate) fn decode(cursor: &mut Cursor<'a>) -> Result<RedoAppend<'a>, DecodeError> {
        let volume = cursor.u32("the volume id")?;
        let writer_epoch = cursor.u64("the writer epoch")?;
        let prev_lsn = cursor.u64("the previous LSN")?;
        let end_lsn = cursor.u64("the end LSN")?;
        let record_count = cursor.u32("the record count")?;
        let record_bytes = cursor.u32("the records' length")?;
        let records = cursor.bytes(record_bytes as usize, "the records")?;
        Ok(RedoAppend { volume, writer_epoch, prev_lsn, end_lsn, record_count, records })
    }

    /// Why the batch breaks the protocol's rules, if it does. These need no record decoded:
    /// LSNs strictly increase inside `(prev_lsn, end_lsn]`, so that range holds at least
    /// `record_count` LSNs, and every record takes at least one byte.
    pub fn problem(&self) -> Option<String> {
        if self.end_lsn < self.prev_lsn {
            return Some(format!("the batch ends at LSN {} before it starts at {}", self.end_lsn, self.prev_lsn));
        }
        if u64::from(self.record_count) > self.end_lsn - self.prev_lsn {
            return Some(format!(
                "{} records cannot have increasing LSNs in ({}, {}]",
                self.record_count, self.prev_lsn, self.end_lsn
            ));
        }
        if (self.record_count == 0) != self.records.is_empty() {
            return Some(format!("{} records in {} bytes", self.record_count, self.records.len()));
        }
        if self.record_count as usize > self.records.len() {
            return Some(format!("{} records cannot fit in {} bytes", self.record_count, self.records.len()));
        }
        None
    }
}

/// What an append answers when it is not refused outright. Gap and Fenced are answers, not
/// errors: the writer acts on them (resends, or stops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// The batch is durable; so is every record up to `durable_lsn`.
    Ok { durable_lsn: u64 },
    /// `prev_lsn` is not the end of the stream: the writer resends from `expected_prev_lsn`.
    Gap { expected_prev_lsn: u64 },
    /// A writer of a higher epoch, `epoch`, owns the stream: this writer must stop.
    Fenced { epoch: u64 },
}

impl AppendOutcome {
    /// The reply body: a u8 (0 ok, 1 gap, 2 fenced) and a u64.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let (code, value) = match *self {
            AppendOutcome::Ok { durable_lsn } => (0, durable_lsn),
            AppendOutcome::Gap { expected_prev_lsn } => (1, expected_prev_lsn),
            AppendOutcome::Fenced { epoch } => (2, epoch),
        };
        out.push(code);
        put_u64(out, value);
    }

    pub(crate) fn decode(cursor: &mut Cursor<'_>) -> Result<AppendOutcome, DecodeError> {
        let code = cursor.u8("the append outcome")?;
        let value = cursor.u64("the outcome's value")?;
        match code {
            0 => Ok(AppendOutcome::Ok { durable_lsn: value }),
            1 => Ok(AppendOutcome::Gap { expected_prev_lsn: value }),
            2 => Ok(AppendOutcome::Fenced { epoch: value }),
            other => Err(cursor.error(format!("unknown append outcome {other}"))),
        }
    }
}

/// The LSN a read is for, as Neon's page service protocol v3 has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAt {
    /// The LSN the reader wants the page as of; [`LATEST_LSN`] for the newest.
    pub request_lsn: u64,
    /// The reader promises the page did not change in `(not_modified_since, request_lsn]`, so
    /// the server may answer as soon as its complete LSN reaches `not_modified_since`.
    pub not_modified_since: u64,
    /// The reader's lease, if it holds one: a read under a lease that is gone fails with
    /// `LEASE_LOST` instead of reading history that may be folded away meanwhile.
    pub lease: Option<u64>,
}

impl ReadAt {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.request_lsn);
        put_u64(out, self.not_modified_since);
        put_optional_u64(out, self.lease);
    }

    fn decode(cursor: &mut Cursor<'_>) -> Result<ReadAt, DecodeError> {
        Ok(ReadAt {
            request_lsn: cursor.u64("the request LSN")?,
            not_modified_since: cursor.u64("the not-modified-since LSN")?,
            lease: cursor.optional_u64("the lease")?,
        })
    }

    /// Why the read breaks the protocol's rules, if it does: LSN 0 comes before every record,
    /// and a page cannot be unmodified since an LSN after the one asked for.
    pub fn problem(&self) -> Option<String> {
        if self.request_lsn == 0 {
            return Some("request LSN 0 is before every record".into());
        }
        if self.not_modified_since > self.request_lsn {
            return Some(format!(
                "not modified since LSN {} is after the request LSN {}",
                self.not_modified_since, self.request_lsn
            ));
        }
        None
    }

    /// True when a reply served at `served_lsn` answers this read: at or above the LSN the
    /// reader promised no change since, and not above the one it asked for.
    pub fn admits(&self, served_lsn: u64) -> bool {
        self.not_modified_since <= served_lsn && served_lsn <= self.request_lsn
    }
}

/// GET_PAGE_AT_LSN: one page as of an LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRead {
    pub volume: u32,
    pub page: u64,
    pub at: ReadAt,
}

impl PageRead {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.volume);
        put_u64(out, self.page);
        self.at.encode(out);
    }

    pub(crate) fn decode(cursor: &mut Cursor<'_>) -> Result<PageRead, DecodeError> {
        let volume = cursor.u32("the volume id")?;
        let page = cursor.u64("the page number")?;
        Ok(PageRead { volume, page, at: ReadAt::decode(cursor)? })
    }
}

/// Page numbers as a caller holds them or as they arrived on the wire (u64s, little-endian,
/// not aligned), so that decoding a request borrows its frame instead of copying.
#[derive(Clone, Copy)]
pub enum PageList<'a> {
    Numbers(&'a [u64]),
    Wire(&'a [u8]),
}

impl<'a> PageList<'a> {
    pub fn len(&self) -> usize {
        match self {
            PageList::Numbers(numbers) => numbers.len(),
            PageList::Wire(bytes) => bytes.len() / 8,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        let (numbers, bytes): (&'a [u64], &'a [u8]) = match *self {
            PageList::Numbers(numbers) => (numbers, &[]),
            PageList::Wire(bytes) => (&[], bytes),
        };
        let wire = bytes.chunks_exact(8).map(|chunk| {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            u64::from_le_bytes(word)
        });
        numbers.iter().copied().chain(wire)
    }

    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

impl PartialEq for PageList<'_> {
    fn eq(&self, other: &PageList<'_>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for PageList<'_> {}

impl std::fmt::Debug for PageList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// GET_PAGES_AT_LSN: pages of one volume as of one LSN, for prefetch. All or nothing: one
/// refusal answers for every page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagesRead<'a> {
    pub volume: u32,
    pub pages: PageList<'a>,
    pub at: ReadAt,
}

impl<'a> PagesRead<'a> {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.volume);
        self.at.encode(out);
        put_u32(out, u32::try_from(self.pages.len()).expect("page lists are checked before encoding"));
        for page in self.pages.iter() {
            put_u64(out, page);
        }
    }

    pub(crate) fn decode(cursor: &mut Cursor<'a>) -> Result<PagesRead<'a>, DecodeError> {
        let volume = cursor.u32("the volume id")?;
        let at = ReadAt::decode(cursor)?;
        let count = cursor.u32("the page count")? as usize;
        // Refused from the count alone, before the list is looked at.
        if count > MAX_PAGES_PER_READ {
            return Err(cursor.error(format!("{count} pages; a vectored read names at most {MAX_PAGES_PER_READ}")));
        }
        let pages = PageList::Wire(cursor.bytes(count * 8, "the page numbers")?);
        Ok(PagesRead { volume, pages, at })
    }

    /// Why the read breaks the protocol's rules, if it does.
    pub fn problem(&self) -> Option<String> {
        if self.pages.is_empty() {
            return Some("a vectored read names no page".into());
        }
        if self.pages.len() > MAX_PAGES_PER_READ {
            return Some(format!("{} pages; a vectored read names at most {MAX_PAGES_PER_READ}", self.pages.len()));
        }
        self.at.problem()
    }
}

/// What a service answers for one page besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLsns {
    /// The LSN the page was served as of: `not_modified_since <= served_lsn <= request_lsn`.
    pub served_lsn: u64,
    /// The LSN of the last record that changed the page, at most `served_lsn`; 0 for a page
    /// no record has touched.
    pub page_lsn: u64,
}

/// GET_PAGE_AT_LSN's reply, as a client receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedPage {
    pub served_lsn: u64,
    pub page_lsn: u64,
    /// Exactly the volume's page size.
    pub data: Vec<u8>,
}

impl ServedPage {
    /// Writes the reply's head: served LSN, page LSN. The page follows.
    pub(crate) fn encode_head(out: &mut Vec<u8>, lsns: PageLsns) {
        put_u64(out, lsns.served_lsn);
        put_u64(out, lsns.page_lsn);
    }

    /// Parses the reply. The page stays in `body`'s allocation: only the head is cut off.
    pub(crate) fn decode(opcode: Opcode, mut body: Vec<u8>) -> Result<ServedPage, DecodeError> {
        let mut cursor = Cursor::new(opcode, &body);
        let served_lsn = cursor.u64("the served LSN")?;
        let page_lsn = cursor.u64("the page LSN")?;
        let head = body.len() - cursor.remaining();
        body.drain(..head);
        Ok(ServedPage { served_lsn, page_lsn, data: body })
    }

    pub fn lsns(&self) -> PageLsns {
        PageLsns { served_lsn: self.served_lsn, page_lsn: self.page_lsn }
    }
}

/// What a service answers for a vectored read besides the pages' bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchLsns {
    /// One LSN for every page.
    pub served_lsn: u64,
    /// Each page's own LSN, in the order the request named the pages.
    pub page_lsns: Vec<u64>,
}

/// GET_PAGES_AT_LSN's reply, as a client receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedPages {
    pub served_lsn: u64,
    pub page_size: u32,
    pub page_lsns: Vec<u64>,
    /// The pages back to back, in the order the request named them.
    pub data: Vec<u8>,
}

impl ServedPages {
    pub fn len(&self) -> usize {
        self.page_lsns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.page_lsns.is_empty()
    }

    /// The `index`th page named by the request: its LSN and its bytes.
    pub fn page(&self, index: usize) -> Option<(u64, &[u8])> {
        let lsn = *self.page_lsns.get(index)?;
        let size = self.page_size as usize;
        Some((lsn, self.data.get(index * size..(index + 1) * size)?))
    }

    /// Writes the reply's head: served LSN, page size, count, the page LSNs. The pages follow.
    pub(crate) fn encode_head(out: &mut Vec<u8>, served_lsn: u64, page_size: u32, page_lsns: &[u64]) {
        put_u64(out, served_lsn);
        put_u32(out, page_size);
        put_u32(out, u32::try_from(page_lsns.len()).expect("vectored reads are bounded"));
        for &lsn in page_lsns {
            put_u64(out, lsn);
        }
    }

    /// Parses the reply. The pages stay in `body`'s allocation: only the head is cut off.
    pub(crate) fn decode(opcode: Opcode, mut body: Vec<u8>) -> Result<ServedPages, DecodeError> {
        let mut cursor = Cursor::new(opcode, &body);
        let served_lsn = cursor.u64("the served LSN")?;
        let page_size = cursor.u32("the page size")?;
        let count = cursor.u32("the page count")? as usize;
        if count > MAX_PAGES_PER_READ {
            return Err(cursor.error(format!("{count} pages; a vectored read names at most {MAX_PAGES_PER_READ}")));
        }
        let mut page_lsns = Vec::with_capacity(count);
        for _ in 0..count {
            page_lsns.push(cursor.u64("a page LSN")?);
        }
        if (page_size as usize).checked_mul(count) != Some(cursor.remaining()) {
            return Err(
                cursor.error(format!("{count} pages of {page_size} bytes, but {} bytes follow", cursor.remaining()))
            );
        }
        let head = body.len() - cursor.remaining();
        body.drain(..head);
        Ok(ServedPages { served_lsn, page_size, page_lsns, data: body })
    }
}

/// REGISTER_READER's reply: a lease on a volume's history from `granted_lsn` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaderLease {
    /// Names the lease in renewals, releases and reads, with its volume; chosen by the server.
    pub lease_id: u64,
    /// The LSN the reader may read at from now on: at least the `start_lsn` it asked for.
    pub granted_lsn: u64,
    /// How long the lease lasts without a renewal, counted from when the server answered. A
    /// duration, not a time of day: the reader's clock is not the server's, and a reader that
    /// counts from when it sent the request renews early, never late.
    pub valid_for_ms: u64,
}

impl ReaderLease {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.lease_id);
        put_u64(out, self.granted_lsn);
        put_u64(out, self.valid_for_ms);
    }

    pub(crate) fn decode(cursor: &mut Cursor<'_>) -> Result<ReaderLease, DecodeError> {
        Ok(ReaderLease {
            lease_id: cursor.u64("the lease id")?,
            granted_lsn: cursor.u64("the granted LSN")?,
            valid_for_ms: cursor.u64("the lease's duration")?,
        })
    }
}

/// RENEW_READER's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// As in [`ReaderLease`], from this answer.
    pub valid_for_ms: u64,
    /// The volume's minimum reader LSN now.
    pub lsn_min: u64,
}

impl LeaseRenewal {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.valid_for_ms);
        put_u64(out, self.lsn_min);
    }

    pub(crate) fn decode(cursor: &mut Cursor<'_>) -> Result<LeaseRenewal, DecodeError> {
        Ok(LeaseRenewal {
            valid_for_ms: cursor.u64("the lease's duration")?,
            lsn_min: cursor.u64("the minimum reader LSN")?,
        })
    }
}

/// REDO_STATUS's reply: a volume's redo watermarks. Each only advances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedoStatus {
    /// The highest writer epoch the stream has seen; a new writer takes a higher one.
    pub writer_epoch: u64,
    /// The end of the last batch accepted: every record up to it is durable. A writer resumes
    /// with this as its `prev_lsn`.
    pub durable_lsn: u64,
    /// The highest LSN pages can be served as of now, at most `durable_lsn`.
    pub complete_lsn: u64,
    /// The lowest LSN a reader may still ask for (LSN_min).
    pub lsn_min: u64,
}

impl RedoStatus {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.writer_epoch);
        put_u64(out, self.durable_lsn);
        put_u64(out, self.complete_lsn);
        put_u64(out, self.lsn_min);
    }

    pub(crate) fn decode(cursor: &mut Cursor<'_>) -> Result<RedoStatus, DecodeError> {
        Ok(RedoStatus {
            writer_epoch: cursor.u64("the writer epoch")?,
            durable_lsn: cursor.u64("the durable LSN")?,
            complete_lsn: cursor.u64("the complete LSN")?,
            lsn_min: cursor.u64("the minimum reader LSN")?,
        })
    }
}
