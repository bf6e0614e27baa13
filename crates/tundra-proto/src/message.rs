//! Bodies: what each opcode's request and reply carry, encoded and decoded. Decoding takes any
//! bytes and returns an error, never panics: the bytes come from the network.
//!
//! Strings are a u16 length and that many UTF-8 bytes; an optional volume is a u8 (0 absent,
//! 1 present) and a u32. A body must be consumed exactly: trailing bytes are an error, so that a
//! field added in a later version can never be silently ignored by an older peer.

use crate::codes::Opcode;
use crate::types::{HeavyResult, VolumeInfo, VolumeMode, VolumeSpec, WriteMode};

/// A body that does not parse. The server answers `INVALID` and keeps the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed {opcode} body: {message}")]
pub struct DecodeError {
    pub opcode: Opcode,
    pub message: String,
}

/// Reads fields off a body, front to back.
struct Cursor<'a> {
    opcode: Opcode,
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(opcode: Opcode, bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { opcode, bytes }
    }

    fn error(&self, message: impl Into<String>) -> DecodeError {
        DecodeError { opcode: self.opcode, message: message.into() }
    }

    fn take<const N: usize>(&mut self, field: &str) -> Result<[u8; N], DecodeError> {
        let Some((head, rest)) = self.bytes.split_first_chunk::<N>() else {
            return Err(self.error(format!("the body ends inside {field}")));
        };
        self.bytes = rest;
        Ok(*head)
    }

    fn u8(&mut self, field: &str) -> Result<u8, DecodeError> {
        Ok(self.take::<1>(field)?[0])
    }

    fn u16(&mut self, field: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(field)?))
    }

    fn u32(&mut self, field: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(field)?))
    }

    fn str(&mut self, field: &str) -> Result<&'a str, DecodeError> {
        let len = usize::from(self.u16(field)?);
        if self.bytes.len() < len {
            return Err(self.error(format!("{field} is {len} bytes but the body has {} left", self.bytes.len())));
        }
        let (text, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        std::str::from_utf8(text).map_err(|_| self.error(format!("{field} is not UTF-8")))
    }

    fn optional_volume(&mut self) -> Result<Option<u32>, DecodeError> {
        let present = self.u8("the volume flag")?;
        let volume = self.u32("the volume id")?;
        match present {
            0 if volume == 0 => Ok(None),
            0 => Err(self.error("an absent volume must be sent as id 0")),
            1 => Ok(Some(volume)),
            other => Err(self.error(format!("volume flag {other} is neither 0 nor 1"))),
        }
    }

    fn volume_mode(&mut self) -> Result<VolumeMode, DecodeError> {
        let code = self.u8("the volume mode")?;
        VolumeMode::from_code(code).ok_or_else(|| self.error(format!("unknown volume mode {code}")))
    }

    fn volume_info(&mut self) -> Result<VolumeInfo, DecodeError> {
        let id = self.u32("the volume id")?;
        let size_bytes = self.u64("the volume size")?;
        let page_size = self.u32("the page size")?;
        let mode = self.volume_mode()?;
        let name = self.str("the volume name")?.to_string();
        Ok(VolumeInfo { id, name, size_bytes, page_size, mode })
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    fn finish(self) -> Result<(), DecodeError> {
        if !self.bytes.is_empty() {
            return Err(self.error(format!("{} unexpected bytes after the last field", self.bytes.len())));
        }
        Ok(())
    }
}

fn put_u16(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Longest string a body can carry: its length is a u16.
pub const MAX_STRING_BYTES: usize = u16::MAX as usize;

/// Writes a length-prefixed string. Longer strings are the caller's bug: names are checked
/// before they are sent (the client refuses them as invalid).
fn put_str(out: &mut Vec<u8>, text: &str) {
    let len = u16::try_from(text.len()).expect("strings on the wire are at most 65535 bytes");
    put_u16(out, len);
    out.extend_from_slice(text.as_bytes());
}

fn put_optional_volume(out: &mut Vec<u8>, volume: Option<u32>) {
    out.push(u8::from(volume.is_some()));
    put_u32(out, volume.unwrap_or(0));
}

/// Writes a volume as replies carry it: id u32, size u64, page size u32, mode u8, name.
pub fn put_volume_info(out: &mut Vec<u8>, info: &VolumeInfo) {
    put_u32(out, info.id);
    put_u64(out, info.size_bytes);
    put_u32(out, info.page_size);
    out.push(info.mode.code());
    put_str(out, &info.name);
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
        }
    }

    /// A request for creating `spec`.
    pub fn volume_create(spec: &'a VolumeSpec) -> Request<'a> {
        Request::VolumeCreate {
            name: &spec.name,
            size_bytes: spec.size_bytes,
            page_size: spec.page_size,
            mode: spec.mode,
        }
    }

    /// The longest string field, which must fit the wire's u16 length.
    pub fn longest_string(&self) -> usize {
        match self {
            Request::VolumeLookup { name }
            | Request::VolumeCreate { name, .. }
            | Request::VolumeResize { name, .. }
            | Request::VolumeDelete { name } => name.len(),
            _ => 0,
        }
    }

    /// Appends the body, except the trailing bytes [`Request::trailing_data`] returns (page data
    /// and ping payloads), which a writer sends straight from the caller's buffer.
    pub fn encode_head(&self, out: &mut Vec<u8>) {
        assert!(self.longest_string() <= MAX_STRING_BYTES, "a name longer than the wire allows");
        match *self {
            Request::Ping { .. } | Request::VolumeList => {}
            Request::VolumeLookup { name } | Request::VolumeDelete { name } => put_str(out, name),
            Request::VolumeCreate { name, size_bytes, page_size, mode } => {
                put_u64(out, size_bytes);
                put_u32(out, page_size);
                out.push(mode.code());
                put_str(out, name);
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
            Request::Flush { volume } | Request::Stats { volume } => put_optional_volume(out, volume),
        }
    }

    /// The bytes that end the body after [`Request::encode_head`]'s.
    pub fn trailing_data(&self) -> &'a [u8] {
        match *self {
            Request::Ping { payload } => payload,
            Request::WritePage { data, .. } => data,
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
                Request::VolumeCreate { name, size_bytes, page_size, mode }
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
            Opcode::Flush => Request::Flush { volume: cursor.optional_volume()? },
            Opcode::Stats => Request::Stats { volume: cursor.optional_volume()? },
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
    /// VOLUME_DELETE, WRITE_PAGE, TRIM, FLUSH: an empty body.
    Done,
    /// HEAVY_COMPRESS: pages, segments, bytes before, bytes after, each u64.
    Heavy(HeavyResult),
    /// STATS: UTF-8 text (JSON by convention; the node chooses its content).
    Stats(String),
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
            Reply::Stats(text) => out.extend_from_slice(text.as_bytes()),
        }
    }

    /// Parses the body of a successful reply to a request with `opcode`. Takes the body by
    /// value so that a page moves into the reply without a copy.
    pub fn decode(opcode: Opcode, body: Vec<u8>) -> Result<Reply, DecodeError> {
        match opcode {
            Opcode::Ping => return Ok(Reply::Pong(body)),
            Opcode::ReadPage => return Ok(Reply::Page(body)),
            Opcode::Stats => {
                return String::from_utf8(body)
                    .map(Reply::Stats)
                    .map_err(|_| DecodeError { opcode, message: "the statistics are not UTF-8".into() });
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
            Opcode::VolumeDelete | Opcode::WritePage | Opcode::Trim | Opcode::Flush => Reply::Done,
            Opcode::HeavyCompress => Reply::Heavy(HeavyResult {
                pages: cursor.u64("the page count")?,
                segments: cursor.u64("the segment count")?,
                bytes_before: cursor.u64("the bytes before")?,
                bytes_after: cursor.u64("the bytes after")?,
            }),
            Opcode::Ping | Opcode::ReadPage | Opcode::Stats => unreachable!("handled above"),
        };
        cursor.finish()?;
        Ok(reply)
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

    fn volume(id: u32, name: &str) -> VolumeInfo {
        VolumeInfo { id, name: name.into(), size_bytes: 1 << 30, page_size: 16384, mode: VolumeMode::Normal }
    }

    fn sample_requests(page: &[u8]) -> Vec<Request<'_>> {
        vec![
            Request::Ping { payload: b"" },
            Request::Ping { payload: b"echo" },
            Request::VolumeLookup { name: "db" },
            Request::VolumeCreate { name: "wal", size_bytes: 1 << 34, page_size: 8192, mode: VolumeMode::None },
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
        ]
    }

    #[test]
    fn every_request_round_trips() {
        let page: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
        for request in sample_requests(&page) {
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
    }
}
