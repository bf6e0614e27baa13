//! Bodies: what each opcode's request and reply carry, encoded and decoded. Decoding takes any
//! bytes and returns an error, never panics: the bytes come from the network.
//!
//! Strings are a u16 length and that many UTF-8 bytes; an optional value is a u8 (0 absent,
//! 1 present) and the value (`wire.rs`). A body must be consumed exactly: trailing bytes are an
//! error, so that a field added in a later version can never be silently ignored by an older
//! peer. The redo opcodes' values and layouts are in `redo.rs`.

use crate::codes::{Opcode, Status};
use crate::redo::{
    AppendOutcome, LeaseRenewal, PageRead, PagesRead, ReaderLease, RedoAppend, RedoStatus, ServedPage, ServedPages,
};
use crate::types::{HeavyResult, VolumeInfo, VolumeMode, VolumeSpec, WriteMode};
use crate::wire::{Cursor, put_optional_u32, put_str, put_u32, put_u64};

pub use crate::wire::MAX_STRING_BYTES;

/// A body that does not parse. The server answers `INVALID` and keeps the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed {opcode} body: {message}")]
pub struct DecodeError {
    pub opcode: Opcode,
    pub message: String,
}

/// A request, borrowing its strings and page bytes from the frame it was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Echoed back as the reply's body.
    Ping {
        payload: &'a [u8],
    },
    VolumeLookup {
        name: &'a str,
    },
    VolumeCreate {
        name: &'a str,
        size_bytes: u64,
        page_size: u32,
        mode: VolumeMode,
        /// Copies of the volume in a cluster (1: this node only). Sent as an optional last
        /// byte, absent when 1, so a request for one copy is the same bytes as before.
        replicas: u8,
    },
    VolumeList,
    VolumeResize {
        name: &'a str,
        size_bytes: u64,
    },
    VolumeDelete {
        name: &'a str,
    },
    ReadPage {
        volume: u32,
        page: u64,
    },
    WritePage {
        volume: u32,
        page: u64,
        mode: WriteMode,
        data: &'a [u8],
    },
    Trim {
        volume: u32,
        first: u64,
        count: u64,
    },
    /// `None` flushes every volume.
    Flush {
        volume: Option<u32>,
    },
    HeavyCompress {
        volume: u32,
        first: u64,
        count: u64,
    },
    Stats {
        volume: Option<u32>,
    },
    /// Version 2: a cluster operation as JSON text (the node chooses what it understands).
    ClusterAdmin {
        request: &'a str,
    },
    /// Version 2. The records are sent straight from the caller's buffer.
    AppendRedo(RedoAppend<'a>),
    /// Version 2.
    RedoStatus {
        volume: u32,
    },
    /// Version 2.
    GetPageAtLsn(PageRead),
    /// Version 2.
    GetPagesAtLsn(PagesRead<'a>),
    /// Version 2. Registering again with the same `reader_id` replaces that reader's lease (a
    /// restarted reader).
    RegisterReader {
        volume: u32,
        reader_id: u64,
        start_lsn: u64,
    },
    /// Version 2. `apply_lsn` is how far the reader has applied redo; it never goes back.
    RenewReader {
        volume: u32,
        lease_id: u64,
        apply_lsn: u64,
    },
    /// Version 2. Releasing a lease that is gone already is not an error.
    ReleaseReader {
        volume: u32,
        lease_id: u64,
    },
}

impl<'a> Request<'a> {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Ping { .. } => Opcode::Ping,
            Request::VolumeLookup { .. } => Opcode::VolumeLookup,
            Request::VolumeCreate { .. } => Opcode::VolumeCreate,
            Request::VolumeList => Opcode::VolumeList,
            Request::VolumeResize { .. } => Opcode::VolumeResize,
            Request::VolumeDelete { .. } => Opcode::VolumeDelete,
            Request::ReadPage { .. } => Opcode::ReadPage,
            Request::WritePage { .. } => Opcode::WritePage,
            Request::Trim { .. } => Opcode::Trim,
            Request::Flush { .. } => Opcode::Flush,
            Request::HeavyCompress { .. } => Opcode::HeavyCompress,
            Request::Stats { .. } => Opcode::Stats,
            Request::ClusterAdmin { .. } => Opcode::ClusterAdmin,
            Request::AppendRedo(_) => Opcode::AppendRedo,
            Request::RedoStatus { .. } => Opcode::RedoStatus,
            Request::GetPageAtLsn(_) => Opcode::GetPageAtLsn,
            Request::GetPagesAtLsn(_) => Opcode::GetPagesAtLsn,
            Request::RegisterReader { .. } => Opcode::RegisterReader,
            Request::RenewReader { .. } => Opcode::RenewReader,
            Request::ReleaseReader { .. } => Opcode::ReleaseReader,
        }
    }

    /// Why the request breaks the protocol's rules for its arguments, if it does: rules that
    /// need no knowledge of the node's volumes, so every server refuses the same requests
    /// (`INVALID`) before its service sees them.
    pub fn problem(&self) -> Option<String> {
        match self {
            Request::AppendRedo(append) => append.problem(),
            Request::GetPageAtLsn(read) => read.at.problem(),
            Request::GetPagesAtLsn(read) => read.problem(),
            _ => None,
        }
    }

    /// A request for creating `spec`.
    pub fn volume_create(spec: &'a VolumeSpec) -> Request<'a> {
        Request::VolumeCreate {
            name: &spec.name,
            size_bytes: spec.size_bytes,
            page_size: spec.page_size,
            mode: spec.mode,
            replicas: 1,
        }
    }

    /// The longest string field, which must fit the wire's u16 length.
    pub fn longest_string(&self) -> usize {
        match self {
            Request::VolumeLookup { name }
            | Request::VolumeCreate { name, .. }
            | Request::VolumeResize { name, .. }
            | Request::VolumeDelete { name } => name.len(),
            Request::ClusterAdmin { request } => request.len(),
            _ => 0,
        }
    }

    /// Appends the body, except the trailing bytes [`Request::trailing_data`] returns (page data,
    /// redo records and ping payloads), which a writer sends straight from the caller's buffer.
    pub fn encode_head(&self, out: &mut Vec<u8>) {
        assert!(self.longest_string() <= MAX_STRING_BYTES, "a name longer than the wire allows");
        match *self {
            Request::Ping { .. } | Request::VolumeList => {}
            Request::VolumeLookup { name } | Request::VolumeDelete { name } => put_str(out, name),
            Request::ClusterAdmin { request } => put_str(out, request),
            Request::VolumeCreate { name, size_bytes, page_size, mode, replicas } => {
                put_u64(out, size_bytes);
                put_u32(out, page_size);
                out.push(mode.code());
                put_str(out, name);
                if replicas != 1 {
                    out.push(replicas);
                }
            }
            Request::VolumeResize { name, size_bytes } => {
                put_u64(out, size_bytes);
                put_str(out, name);
            }
            Request::ReadPage { volume, page } => {
                put_u32(out, volume);
                put_u64(out, page);
            }
            Request::WritePage { volume, page, mode, .. } => {
                put_u32(out, volume);
                put_u64(out, page);
                out.push(mode.code());
            }
            Request::Trim { volume, first, count } | Request::HeavyCompress { volume, first, count } => {
                put_u32(out, volume);
                put_u64(out, first);
                put_u64(out, count);
            }
            Request::Flush { volume } | Request::Stats { volume } => put_optional_u32(out, volume),
            Request::AppendRedo(append) => append.encode_head(out),
            Request::RedoStatus { volume } => put_u32(out, volume),
            Request::GetPageAtLsn(read) => read.encode(out),
            Request::GetPagesAtLsn(read) => read.encode(out),
            Request::RegisterReader { volume, reader_id, start_lsn } => {
                put_u32(out, volume);
                put_u64(out, reader_id);
                put_u64(out, start_lsn);
            }
            Request::RenewReader { volume, lease_id, apply_lsn } => {
                put_u32(out, volume);
                put_u64(out, lease_id);
                put_u64(out, apply_lsn);
            }
            Request::ReleaseReader { volume, lease_id } => {
                put_u32(out, volume);
                put_u64(out, lease_id);
            }
        }
    }

    /// The bytes that end the body after [`Request::encode_head`]'s.
    pub fn trailing_data(&self) -> &'a [u8] {
        match *self {
            Request::Ping { payload } => payload,
            Request::WritePage { data, .. } => data,
            Request::AppendRedo(append) => append.records,
            _ => &[],
        }
    }

    /// The whole body in one buffer.
    pub fn encode_body(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_head(&mut out);
        out.extend_from_slice(self.trailing_data());
        out
    }

    /// Parses the body of a request with `opcode`.
    pub fn decode(opcode: Opcode, body: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        let mut cursor = Cursor::new(opcode, body);
        let request = match opcode {
            Opcode::Ping => Request::Ping { payload: cursor.rest() },
            Opcode::VolumeLookup => Request::VolumeLookup { name: cursor.str("the volume name")? },
            Opcode::VolumeCreate => {
                let size_bytes = cursor.u64("the volume size")?;
                let page_size = cursor.u32("the page size")?;
                let mode = cursor.volume_mode()?;
                let name = cursor.str("the volume name")?;
                // Present only when more than one copy is asked for, so that no body has two
                // encodings: a count below 2 sent explicitly is malformed.
                let replicas = match cursor.remaining() {
                    0 => 1,
                    _ => match cursor.u8("the replica count")? {
                        n if n >= 2 => n,
                        n => return Err(cursor.error(format!("a replica count of {n} (counts below 2 are not sent)"))),
                    },
                };
                Request::VolumeCreate { name, size_bytes, page_size, mode, replicas }
            }
            Opcode::VolumeList => Request::VolumeList,
            Opcode::VolumeResize => {
                let size_bytes = cursor.u64("the volume size")?;
                Request::VolumeResize { name: cursor.str("the volume name")?, size_bytes }
            }
            Opcode::VolumeDelete => Request::VolumeDelete { name: cursor.str("the volume name")? },
            Opcode::ReadPage => {
                Request::ReadPage { volume: cursor.u32("the volume id")?, page: cursor.u64("the page number")? }
            }
            Opcode::WritePage => {
                let volume = cursor.u32("the volume id")?;
                let page = cursor.u64("the page number")?;
                let code = cursor.u8("the write mode")?;
                let mode =
                    WriteMode::from_code(code).ok_or_else(|| cursor.error(format!("unknown write mode {code}")))?;
                Request::WritePage { volume, page, mode, data: cursor.rest() }
            }
            Opcode::Trim | Opcode::HeavyCompress => {
                let volume = cursor.u32("the volume id")?;
                let first = cursor.u64("the first page")?;
                let count = cursor.u64("the page count")?;
                if opcode == Opcode::Trim {
                    Request::Trim { volume, first, count }
                } else {
                    Request::HeavyCompress { volume, first, count }
                }
            }
            Opcode::Flush => Request::Flush { volume: cursor.optional_u32("the volume")? },
            Opcode::Stats => Request::Stats { volume: cursor.optional_u32("the volume")? },
            Opcode::ClusterAdmin => Request::ClusterAdmin { request: cursor.str("the request")? },
            Opcode::AppendRedo => Request::AppendRedo(RedoAppend::decode(&mut cursor)?),
            Opcode::RedoStatus => Request::RedoStatus { volume: cursor.u32("the volume id")? },
            Opcode::GetPageAtLsn => Request::GetPageAtLsn(PageRead::decode(&mut cursor)?),
            Opcode::GetPagesAtLsn => Request::GetPagesAtLsn(PagesRead::decode(&mut cursor)?),
            Opcode::RegisterReader => Request::RegisterReader {
                volume: cursor.u32("the volume id")?,
                reader_id: cursor.u64("the reader id")?,
                start_lsn: cursor.u64("the start LSN")?,
            },
            Opcode::RenewReader => Request::RenewReader {
                volume: cursor.u32("the volume id")?,
                lease_id: cursor.u64("the lease id")?,
                apply_lsn: cursor.u64("the apply LSN")?,
            },
            Opcode::ReleaseReader => {
                Request::ReleaseReader { volume: cursor.u32("the volume id")?, lease_id: cursor.u64("the lease id")? }
            }
        };
        cursor.finish()?;
        Ok(request)
    }
}

/// A successful reply, owned: what a client gets back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// PING: the request's payload.
    Pong(Vec<u8>),
    /// VOLUME_LOOKUP, VOLUME_CREATE, VOLUME_RESIZE.
    Volume(VolumeInfo),
    /// VOLUME_LIST: a u32 count, then the volumes.
    Volumes(Vec<VolumeInfo>),
    /// READ_PAGE: the page, exactly the volume's page size.
    Page(Vec<u8>),
    /// VOLUME_DELETE, WRITE_PAGE, TRIM, FLUSH, RELEASE_READER: an empty body.
    Done,
    /// HEAVY_COMPRESS: pages, segments, bytes before, bytes after, each u64.
    Heavy(HeavyResult),
    /// STATS: UTF-8 text (JSON by convention; the node chooses its content).
    Stats(String),
    /// CLUSTER_ADMIN: UTF-8 text, JSON by convention.
    Admin(String),
    /// APPEND_REDO: the outcome, u8, and its LSN or epoch, u64.
    Appended(AppendOutcome),
    /// REDO_STATUS: writer epoch, durable, complete and minimum reader LSNs, each u64.
    RedoStatus(RedoStatus),
    /// GET_PAGE_AT_LSN: served LSN u64, page LSN u64, the page.
    PageAtLsn(ServedPage),
    /// GET_PAGES_AT_LSN: served LSN u64, page size u32, count u32, the page LSNs, the pages.
    PagesAtLsn(ServedPages),
    /// REGISTER_READER: lease id, granted LSN, duration in milliseconds, each u64.
    Lease(ReaderLease),
    /// RENEW_READER: duration in milliseconds, minimum reader LSN, each u64.
    Renewed(LeaseRenewal),
}

impl Reply {
    /// Appends the body of this reply.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Pong(bytes) | Reply::Page(bytes) => out.extend_from_slice(bytes),
            Reply::Volume(info) => put_volume_info(out, info),
            Reply::Volumes(infos) => put_volume_list(out, infos),
            Reply::Done => {}
            Reply::Heavy(result) => put_heavy_result(out, result),
            Reply::Stats(text) | Reply::Admin(text) => out.extend_from_slice(text.as_bytes()),
            Reply::Appended(outcome) => outcome.encode(out),
            Reply::RedoStatus(status) => status.encode(out),
            Reply::PageAtLsn(page) => {
                ServedPage::encode_head(out, page.lsns());
                out.extend_from_slice(&page.data);
            }
            Reply::PagesAtLsn(pages) => {
                ServedPages::encode_head(out, pages.served_lsn, pages.page_size, &pages.page_lsns);
                out.extend_from_slice(&pages.data);
            }
            Reply::Lease(lease) => lease.encode(out),
            Reply::Renewed(renewal) => renewal.encode(out),
        }
    }

    /// Parses the body of a successful reply to a request with `opcode`. Takes the body by
    /// value so that a page moves into the reply without a copy.
    pub fn decode(opcode: Opcode, body: Vec<u8>) -> Result<Reply, DecodeError> {
        match opcode {
            Opcode::Ping => return Ok(Reply::Pong(body)),
            Opcode::ReadPage => return Ok(Reply::Page(body)),
            Opcode::GetPageAtLsn => return ServedPage::decode(opcode, body).map(Reply::PageAtLsn),
            Opcode::GetPagesAtLsn => return ServedPages::decode(opcode, body).map(Reply::PagesAtLsn),
            Opcode::Stats => {
                return String::from_utf8(body)
                    .map(Reply::Stats)
                    .map_err(|_| DecodeError { opcode, message: "the statistics are not UTF-8".into() });
            }
            Opcode::ClusterAdmin => {
                return String::from_utf8(body)
                    .map(Reply::Admin)
                    .map_err(|_| DecodeError { opcode, message: "the answer is not UTF-8".into() });
            }
            _ => {}
        }
        let mut cursor = Cursor::new(opcode, &body);
        let reply = match opcode {
            Opcode::VolumeLookup | Opcode::VolumeCreate | Opcode::VolumeResize => Reply::Volume(cursor.volume_info()?),
            Opcode::VolumeList => {
                let count = cursor.u32("the volume count")?;
                // Each volume takes at least 19 bytes, so a lying count cannot allocate much.
                let mut infos = Vec::with_capacity((count as usize).min(body.len() / 19));
                for _ in 0..count {
                    infos.push(cursor.volume_info()?);
                }
                Reply::Volumes(infos)
            }
            Opcode::VolumeDelete | Opcode::WritePage | Opcode::Trim | Opcode::Flush | Opcode::ReleaseReader => {
                Reply::Done
            }
            Opcode::HeavyCompress => Reply::Heavy(HeavyResult {
                pages: cursor.u64("the page count")?,
                segments: cursor.u64("the segment count")?,
                bytes_before: cursor.u64("the bytes before")?,
                bytes_after: cursor.u64("the bytes after")?,
            }),
            Opcode::AppendRedo => Reply::Appended(AppendOutcome::decode(&mut cursor)?),
            Opcode::RedoStatus => Reply::RedoStatus(RedoStatus::decode(&mut cursor)?),
            Opcode::RegisterReader => Reply::Lease(ReaderLease::decode(&mut cursor)?),
            Opcode::RenewReader => Reply::Renewed(LeaseRenewal::decode(&mut cursor)?),
            Opcode::Ping
            | Opcode::ReadPage
            | Opcode::Stats
            | Opcode::ClusterAdmin
            | Opcode::GetPageAtLsn
            | Opcode::GetPagesAtLsn => {
                unreachable!("handled above")
            }
        };
        cursor.finish()?;
        Ok(reply)
    }
}

/// Writes a volume as replies carry it: id u32, size u64, page size u32, mode u8, name.
pub fn put_volume_info(out: &mut Vec<u8>, info: &VolumeInfo) {
    put_u32(out, info.id);
    put_u64(out, info.size_bytes);
    put_u32(out, info.page_size);
    out.push(info.mode.code());
    put_str(out, &info.name);
}

/// Parses the body of a refusal with `status` of a request with `opcode`: the LSN first for a
/// status that [carries one](Status::carries_lsn), then a message for a person. A message that
/// is not UTF-8 is still shown, with replacement characters: it is only read by people.
pub fn decode_refusal(opcode: Opcode, status: Status, body: &[u8]) -> Result<(Option<u64>, String), DecodeError> {
    let mut cursor = Cursor::new(opcode, body);
    let lsn = if status.carries_lsn() { Some(cursor.u64(&format!("the LSN of {status}"))?) } else { None };
    Ok((lsn, String::from_utf8_lossy(cursor.rest()).into_owned()))
}

/// Appends the head of a refusal's body: the LSN, for a status that carries one.
pub fn put_refusal_head(out: &mut Vec<u8>, status: Status, lsn: Option<u64>) {
    if status.carries_lsn() {
        put_u64(out, lsn.unwrap_or(0));
    }
}

/// Appends the body of a HEAVY_COMPRESS reply.
pub fn put_heavy_result(out: &mut Vec<u8>, result: &HeavyResult) {
    put_u64(out, result.pages);
    put_u64(out, result.segments);
    put_u64(out, result.bytes_before);
    put_u64(out, result.bytes_after);
}

/// Appends the body of a VOLUME_LIST reply.
pub fn put_volume_list(out: &mut Vec<u8>, infos: &[VolumeInfo]) {
    put_u32(out, u32::try_from(infos.len()).expect("fewer than 2^32 volumes"));
    for info in infos {
        put_volume_info(out, info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redo::{MAX_PAGES_PER_READ, PageList, ReadAt};

    fn volume(id: u32, name: &str) -> VolumeInfo {
        VolumeInfo { id, name: name.into(), size_bytes: 1 << 30, page_size: 16384, mode: VolumeMode::Normal }
    }

    const AT: ReadAt = ReadAt { request_lsn: 90, not_modified_since: 80, lease: Some(3) };

    fn sample_requests<'a>(page: &'a [u8], pages: &'a [u64]) -> Vec<Request<'a>> {
        vec![
            Request::Ping { payload: b"" },
            Request::Ping { payload: b"echo" },
            Request::VolumeLookup { name: "db" },
            Request::VolumeCreate {
                name: "wal",
                size_bytes: 1 << 34,
                page_size: 8192,
                mode: VolumeMode::None,
                replicas: 1,
            },
            Request::VolumeCreate {
                name: "db",
                size_bytes: 1 << 30,
                page_size: 8192,
                mode: VolumeMode::Normal,
                replicas: 3,
            },
            Request::VolumeList,
            Request::VolumeResize { name: "db", size_bytes: 1 << 35 },
            Request::VolumeDelete { name: "é" },
            Request::ReadPage { volume: 7, page: u64::MAX },
            Request::WritePage { volume: 7, page: 3, mode: WriteMode::Zstd, data: page },
            Request::WritePage { volume: 7, page: 3, mode: WriteMode::Auto, data: b"" },
            Request::Trim { volume: 1, first: 2, count: 3 },
            Request::Flush { volume: None },
            Request::Flush { volume: Some(0) },
            Request::HeavyCompress { volume: 1, first: 0, count: 1 << 20 },
            Request::Stats { volume: Some(u32::MAX) },
            Request::Stats { volume: None },
            Request::ClusterAdmin { request: "{\"drain_step\":{\"node\":1}}" },
            Request::AppendRedo(RedoAppend {
                volume: 7,
                writer_epoch: 2,
                prev_lsn: 100,
                end_lsn: 200,
                record_count: 3,
                records: page,
            }),
            Request::AppendRedo(RedoAppend {
                volume: 7,
                writer_epoch: 2,
                prev_lsn: 200,
                end_lsn: 210,
                record_count: 0,
                records: b"",
            }),
            Request::RedoStatus { volume: 7 },
            Request::GetPageAtLsn(PageRead { volume: 7, page: 5, at: AT }),
            Request::GetPageAtLsn(PageRead { volume: 7, page: 5, at: ReadAt { lease: None, ..AT } }),
            Request::GetPagesAtLsn(PagesRead { volume: 7, pages: PageList::Numbers(pages), at: AT }),
            Request::RegisterReader { volume: 7, reader_id: 11, start_lsn: 90 },
            Request::RenewReader { volume: 7, lease_id: 3, apply_lsn: 95 },
            Request::ReleaseReader { volume: 7, lease_id: 3 },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        let page: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
        let pages: Vec<u64> = (0..MAX_PAGES_PER_READ as u64).map(|n| n * 3).collect();
        for request in sample_requests(&page, &pages) {
            let body = request.encode_body();
            assert_eq!(Request::decode(request.opcode(), &body), Ok(request));
        }
    }

    #[test]
    fn request_layouts_are_the_documented_ones() {
        let read = Request::ReadPage { volume: 2, page: 5 }.encode_body();
        assert_eq!(read, [2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        let write = Request::WritePage { volume: 2, page: 5, mode: WriteMode::None, data: b"xy" }.encode_body();
        assert_eq!(write, [2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 3, b'x', b'y']);
        let lookup = Request::VolumeLookup { name: "ab" }.encode_body();
        assert_eq!(lookup, [2, 0, b'a', b'b']);
        assert_eq!(Request::Flush { volume: None }.encode_body(), [0, 0, 0, 0, 0]);
        assert_eq!(Request::Flush { volume: Some(1) }.encode_body(), [1, 1, 0, 0, 0]);
    }

    #[test]
    fn every_reply_round_trips() {
        let replies = [
            (Opcode::Ping, Reply::Pong(b"echo".to_vec())),
            (Opcode::VolumeLookup, Reply::Volume(volume(1, "db"))),
            (Opcode::VolumeCreate, Reply::Volume(volume(2, ""))),
            (Opcode::VolumeResize, Reply::Volume(volume(u32::MAX, "x"))),
            (Opcode::VolumeList, Reply::Volumes(vec![])),
            (Opcode::VolumeList, Reply::Volumes(vec![volume(1, "a"), volume(2, "bb")])),
            (Opcode::ReadPage, Reply::Page(vec![9; 8192])),
            (Opcode::WritePage, Reply::Done),
            (Opcode::VolumeDelete, Reply::Done),
            (Opcode::Trim, Reply::Done),
            (Opcode::Flush, Reply::Done),
            (
                Opcode::HeavyCompress,
                Reply::Heavy(HeavyResult { pages: 1, segments: 2, bytes_before: 3, bytes_after: 4 }),
            ),
            (Opcode::Stats, Reply::Stats("{\"pages\":1}".into())),
            (Opcode::ClusterAdmin, Reply::Admin("{\"chunks_left\":0}".into())),
        ];
        for (opcode, reply) in replies {
            let mut body = Vec::new();
            reply.encode_body(&mut body);
            assert_eq!(Reply::decode(opcode, body), Ok(reply), "{opcode}");
        }
        let mut list = Vec::new();
        put_volume_list(&mut list, &[volume(1, "a")]);
        assert_eq!(Reply::decode(Opcode::VolumeList, list), Ok(Reply::Volumes(vec![volume(1, "a")])));
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let cases: [(Opcode, &[u8]); 9] = [
            (Opcode::VolumeLookup, &[]),
            (Opcode::VolumeLookup, &[5, 0, b'a']),
            (Opcode::VolumeLookup, &[1, 0, 0xFF]),
            (Opcode::VolumeLookup, &[1, 0, b'a', 0]),
            (Opcode::VolumeCreate, &[0; 12]),
            (Opcode::ReadPage, &[0; 11]),
            (Opcode::WritePage, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]),
            (Opcode::Flush, &[2, 0, 0, 0, 0]),
            (Opcode::Flush, &[0, 1, 0, 0, 0]),
        ];
        for (opcode, body) in cases {
            let error = Request::decode(opcode, body).unwrap_err();
            assert_eq!(error.opcode, opcode);
        }
        assert!(Reply::decode(Opcode::VolumeList, vec![0xFF, 0xFF, 0xFF, 0xFF]).is_err());
        assert!(Reply::decode(Opcode::Stats, vec![0xC0]).is_err());
        assert!(Reply::decode(Opcode::WritePage, vec![0]).is_err());
        assert!(Reply::decode(Opcode::AppendRedo, vec![3, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(), "an unknown outcome");
        assert!(Reply::decode(Opcode::GetPageAtLsn, vec![0; 15]).is_err());
        assert!(Reply::decode(Opcode::ReleaseReader, vec![0]).is_err());
    }
}
