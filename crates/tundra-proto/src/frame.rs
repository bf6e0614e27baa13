//! Framing: the hello that opens a connection and the fixed 20-byte header in front of every
//! request and response body. Nothing here knows what a body means (that is `message.rs`).
//!
//! The parsers take byte slices, never a socket, so that the fuzz tests reach the exact code the
//! server and the client run.

use std::io::{self, Write};

use crate::codes::Status;

/// The first eight bytes each side sends. The last byte is the magic's own revision, not the
/// protocol version; a peer that sees another magic is not speaking this protocol.
pub const MAGIC: [u8; 8] = *b"TUNDRA\0\x01";

/// The protocol versions this build speaks: 1, pages and volumes; 2, which adds redo streams,
/// reads at an LSN and reader leases (docs/protocol.md, "Versioning").
pub const VERSION_MIN: u16 = 1;
pub const VERSION_MAX: u16 = 2;

/// Bytes of a frame header: body length u32, code u16, flags u16, request id u64, crc u32.
pub const HEADER_BYTES: usize = 20;

/// The longest body either side accepts. 64 MiB is far above any page (8 or 16 KiB) and any
/// volume list, and small enough that a lying length cannot make a peer allocate much.
pub const MAX_BODY_BYTES: u32 = 64 << 20;

/// Response flag: the server closes the connection after this frame. Requests carry no flags
/// in versions 1 and 2.
pub const FLAG_CLOSE: u16 = 1;
/// The flag bits versions 1 and 2 define, for responses. Requests must carry 0.
pub const RESPONSE_FLAGS: u16 = FLAG_CLOSE;

/// The request id of the server's connection notices (a refused hello, shutting down, a frame
/// whose id could not be read). Clients number their requests from 1.
pub const NOTICE_ID: u64 = 0;

pub const CLIENT_HELLO_BYTES: usize = 12;
pub const SERVER_HELLO_BYTES: usize = 16;

const _: () = assert!(MAX_BODY_BYTES as u64 <= u32::MAX as u64);
const _: () = assert!(VERSION_MIN >= 1 && VERSION_MIN <= VERSION_MAX);
const _: () = assert!(RESPONSE_FLAGS & FLAG_CLOSE == FLAG_CLOSE);

/// The header in front of every frame's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u32,
    /// The opcode of a request, the status of a response.
    pub code: u16,
    pub flags: u16,
    pub request_id: u64,
    /// CRC32C of the header's first 16 bytes followed by the body.
    pub crc: u32,
}

impl FrameHeader {
    /// The header of a frame whose body is the concatenation of `parts`, checksum included.
    pub fn new(code: u16, flags: u16, request_id: u64, parts: &[&[u8]]) -> FrameHeader {
        let body_len: usize = parts.iter().map(|part| part.len()).sum();
        let body_len = u32::try_from(body_len).expect("frame bodies are shorter than 4 GiB");
        let mut header = FrameHeader { body_len, code, flags, request_id, crc: 0 };
        let mut crc = crc32c::crc32c(&header.encode()[..16]);
        for part in parts {
            crc = crc32c::crc32c_append(crc, part);
        }
        header.crc = crc;
        header
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[0..4].copy_from_slice(&self.body_len.to_le_bytes());
        bytes[4..6].copy_from_slice(&self.code.to_le_bytes());
        bytes[6..8].copy_from_slice(&self.flags.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.crc.to_le_bytes());
        bytes
    }

    /// Every 20 bytes decode to some header; `check` and `verify` say whether to trust it.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> FrameHeader {
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[8..16]);
        FrameHeader {
            body_len: u32_at(0),
            code: u16_at(4),
            flags: u16_at(6),
            request_id: u64::from_le_bytes(id),
            crc: u32_at(16),
        }
    }

    pub fn body_len(&self) -> usize {
        self.body_len as usize
    }

    /// Refuses a body longer than `max_body` before anything is allocated for it.
    pub fn check(&self, max_body: u32) -> Result<(), FrameError> {
        if self.body_len > max_body {
            return Err(FrameError::TooLarge { request_id: self.request_id, body_len: self.body_len, max: max_body });
        }
        Ok(())
    }

    /// Checks the checksum against the header and `body`.
    pub fn verify(&self, body: &[u8]) -> Result<(), FrameError> {
        debug_assert_eq!(body.len(), self.body_len());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&self.encode()[..16]), body);
        if crc != self.crc {
            return Err(FrameError::BadChecksum { request_id: self.request_id, stored: self.crc, computed: crc });
        }
        Ok(())
    }
}

/// A frame that cannot be trusted. Both end the connection: after either, the reader no longer
/// knows where the next frame starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a frame body of {body_len} bytes is longer than the {max} bytes allowed")]
    TooLarge { request_id: u64, body_len: u32, max: u32 },
    #[error("frame checksum mismatch: the frame says {stored:#010x}, its bytes give {computed:#010x}")]
    BadChecksum { request_id: u64, stored: u32, computed: u32 },
}

impl FrameError {
    /// The id the damaged frame's header names (possibly damaged itself).
    pub fn request_id(&self) -> u64 {
        match self {
            FrameError::TooLarge { request_id, .. } | FrameError::BadChecksum { request_id, .. } => *request_id,
        }
    }

    /// The status the server answers it with.
    pub fn status(&self) -> Status {
        match self {
            FrameError::TooLarge { .. } => Status::TooLarge,
            FrameError::BadChecksum { .. } => Status::Corrupted,
        }
    }
}

/// A frame parsed in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub header: FrameHeader,
    pub body: &'a [u8],
}

/// Parses the frame that starts `bytes`: `Ok(None)` when more bytes are needed, otherwise the
/// frame and its total length (header and body). The checksum is verified.
pub fn decode_frame(bytes: &[u8], max_body: u32) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(header_bytes) = bytes.first_chunk::<HEADER_BYTES>() else {
        return Ok(None);
    };
    let header = FrameHeader::decode(header_bytes);
    header.check(max_body)?;
    let total = HEADER_BYTES + header.body_len();
    let Some(body) = bytes.get(HEADER_BYTES..total) else {
        return Ok(None);
    };
    header.verify(body)?;
    Ok(Some((Frame { header, body }, total)))
}

/// Writes one frame whose body is the concatenation of `parts`.
pub fn write_frame(out: &mut impl Write, code: u16, flags: u16, request_id: u64, parts: &[&[u8]]) -> io::Result<()> {
    let header = FrameHeader::new(code, flags, request_id, parts);
    out.write_all(&header.encode())?;
    for part in parts {
        out.write_all(part)?;
    }
    Ok(())
}

/// What a client sends first: the versions it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHello {
    pub min_version: u16,
    pub max_version: u16,
}

impl ClientHello {
    /// The hello of this build.
    pub const CURRENT: ClientHello = ClientHello { min_version: VERSION_MIN, max_version: VERSION_MAX };

    pub fn encode(&self) -> [u8; CLIENT_HELLO_BYTES] {
        let mut bytes = [0u8; CLIENT_HELLO_BYTES];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..10].copy_from_slice(&self.min_version.to_le_bytes());
        bytes[10..12].copy_from_slice(&self.max_version.to_le_bytes());
        bytes
    }

    /// `None` when the magic is wrong: the peer speaks another protocol.
    pub fn decode(bytes: &[u8; CLIENT_HELLO_BYTES]) -> Option<ClientHello> {
        if bytes[0..8] != MAGIC {
            return None;
        }
        Some(ClientHello {
            min_version: u16::from_le_bytes([bytes[8], bytes[9]]),
            max_version: u16::from_le_bytes([bytes[10], bytes[11]]),
        })
    }

    /// The highest version both sides speak, if any.
    pub fn negotiate(&self, server_min: u16, server_max: u16) -> Option<u16> {
        let low = self.min_version.max(server_min).max(1);
        let high = self.max_version.min(server_max);
        (low <= high).then_some(high)
    }
}

/// The server's answer to a hello. A `version` of 0 means refused: an error frame (request id
/// [`NOTICE_ID`], flag [`FLAG_CLOSE`]) follows and the server closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerHello {
    pub version: u16,
    pub server_min: u16,
    pub server_max: u16,
}

impl ServerHello {
    pub fn encode(&self) -> [u8; SERVER_HELLO_BYTES] {
        let mut bytes = [0u8; SERVER_HELLO_BYTES];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..10].copy_from_slice(&self.version.to_le_bytes());
        bytes[10..12].copy_from_slice(&self.server_min.to_le_bytes());
        bytes[12..14].copy_from_slice(&self.server_max.to_le_bytes());
        // Bytes 14..16 are reserved: sent as zero, ignored.
        bytes
    }

    /// `None` when the magic is wrong.
    pub fn decode(bytes: &[u8; SERVER_HELLO_BYTES]) -> Option<ServerHello> {
        if bytes[0..8] != MAGIC {
            return None;
        }
        Some(ServerHello {
            version: u16::from_le_bytes([bytes[8], bytes[9]]),
            server_min: u16::from_le_bytes([bytes[10], bytes[11]]),
            server_max: u16::from_le_bytes([bytes[12], bytes[13]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(code: u16, flags: u16, id: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, code, flags, id, &[body]).unwrap();
        out
    }

    #[test]
    fn header_layout_is_little_endian_and_fixed() {
        let header =
            FrameHeader { body_len: 0x0403_0201, code: 0x0605, flags: 0x0807, request_id: 0x100f, crc: 0xAABB };
        let bytes = header.encode();
        assert_eq!(&bytes[0..4], &[1, 2, 3, 4]);
        assert_eq!(&bytes[4..6], &[5, 6]);
        assert_eq!(&bytes[6..8], &[7, 8]);
        assert_eq!(&bytes[8..16], &[0x0f, 0x10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&bytes[16..20], &[0xBB, 0xAA, 0, 0]);
        assert_eq!(FrameHeader::decode(&bytes), header);
    }

    #[test]
    fn frames_round_trip_in_parts_or_whole() {
        let bytes = frame_bytes(17, 0, 42, b"hello page");
        let mut split = Vec::new();
        write_frame(&mut split, 17, 0, 42, &[b"hello", b" page"]).unwrap();
        assert_eq!(bytes, split);
        let (frame, used) = decode_frame(&bytes, MAX_BODY_BYTES).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(frame.header.code, 17);
        assert_eq!(frame.header.request_id, 42);
        assert_eq!(frame.body, b"hello page");
    }

    #[test]
    fn short_input_asks_for_more() {
        let bytes = frame_bytes(1, 0, 7, b"abc");
        for len in 0..bytes.len() {
            assert_eq!(decode_frame(&bytes[..len], MAX_BODY_BYTES), Ok(None), "prefix of {len} bytes");
        }
    }

    #[test]
    fn any_flipped_bit_fails_the_checksum() {
        let bytes = frame_bytes(17, 0, 42, b"page bytes");
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            // A flip in the length field changes where the body ends; every other flip must be
            // caught by the checksum.
            match decode_frame(&damaged, MAX_BODY_BYTES) {
                Ok(None) => assert!(bit < 32, "bit {bit}"),
                Ok(Some(_)) => panic!("bit {bit} flipped undetected"),
                Err(FrameError::BadChecksum { .. }) => {}
                Err(FrameError::TooLarge { .. }) => assert!(bit < 32, "bit {bit}"),
            }
        }
    }

    #[test]
    fn a_long_body_is_refused_from_the_header_alone() {
        let header = FrameHeader { body_len: MAX_BODY_BYTES + 1, code: 17, flags: 0, request_id: 9, crc: 0 };
        let error = decode_frame(&header.encode(), MAX_BODY_BYTES).unwrap_err();
        assert_eq!(error.status(), Status::TooLarge);
        assert_eq!(error.request_id(), 9);
    }

    #[test]
    fn hellos_round_trip_and_check_the_magic() {
        let hello = ClientHello { min_version: 1, max_version: 3 };
        assert_eq!(ClientHello::decode(&hello.encode()), Some(hello));
        let mut wrong = hello.encode();
        wrong[0] = b'X';
        assert_eq!(ClientHello::decode(&wrong), None);
        let reply = ServerHello { version: 1, server_min: 1, server_max: 1 };
        assert_eq!(ServerHello::decode(&reply.encode()), Some(reply));
    }

    #[test]
    fn negotiation_picks_the_highest_common_version() {
        let hello = |min, max| ClientHello { min_version: min, max_version: max };
        assert_eq!(hello(1, 1).negotiate(1, 1), Some(1));
        assert_eq!(hello(1, 5).negotiate(1, 3), Some(3));
        assert_eq!(hello(2, 5).negotiate(1, 3), Some(3));
        assert_eq!(hello(4, 5).negotiate(1, 3), None);
        assert_eq!(hello(3, 1).negotiate(1, 3), None);
        assert_eq!(hello(0, 0).negotiate(0, 3), None);
    }
}
