//! The wire constants of the NBD protocol (NetworkBlockDevice/nbd doc/proto.md) that this server
//! speaks, and the little helpers that put them in big-endian bytes. No I/O.
//!
//! Only this module and its two users, `handshake.rs` and `transmission.rs`, know a byte of the
//! wire format.

// Magic numbers.
/// `NBDMAGIC`, the first eight bytes the server sends.
pub(crate) const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, sent by the server after `NBDMAGIC` and by the client before every option.
pub(crate) const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic that starts every option reply.
pub(crate) const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The magic that starts every transmission request.
pub(crate) const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The magic that starts every simple reply.
pub(crate) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

// Handshake flags (server, 16 bits) and client flags (32 bits).
pub(crate) const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub(crate) const FLAG_NO_ZEROES: u16 = 1 << 1;
pub(crate) const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub(crate) const FLAG_C_NO_ZEROES: u32 = 1 << 1;
pub(crate) const CLIENT_FLAGS_KNOWN: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

// Options.
pub(crate) const OPT_EXPORT_NAME: u32 = 1;
pub(crate) const OPT_ABORT: u32 = 2;
pub(crate) const OPT_LIST: u32 = 3;
pub(crate) const OPT_INFO: u32 = 6;
pub(crate) const OPT_GO: u32 = 7;

// Option reply types.
pub(crate) const REP_ACK: u32 = 1;
pub(crate) const REP_SERVER: u32 = 2;
pub(crate) const REP_INFO: u32 = 3;
const REP_ERR: u32 = 1 << 31;
pub(crate) const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub(crate) const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub(crate) const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub(crate) const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub(crate) const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

// Information types of NBD_REP_INFO.
pub(crate) const INFO_EXPORT: u16 = 0;
pub(crate) const INFO_NAME: u16 = 1;
pub(crate) const INFO_DESCRIPTION: u16 = 2;
pub(crate) const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags (16 bits).
pub(crate) const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub(crate) const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub(crate) const FLAG_SEND_FUA: u16 = 1 << 3;
pub(crate) const FLAG_SEND_TRIM: u16 = 1 << 5;
pub(crate) const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub(crate) const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub(crate) const FLAG_SEND_CACHE: u16 = 1 << 10;

/// The transmission flags of every export: everything this server implements. Not
/// `NBD_FLAG_SEND_FAST_ZERO` (an export cannot tell whether zeroing is faster than writing),
/// not `NBD_FLAG_SEND_DF` (no structured replies), not `NBD_FLAG_READ_ONLY`.
pub(crate) const TRANSMISSION_FLAGS: u16 = FLAG_HAS_FLAGS
    | FLAG_SEND_FLUSH
    | FLAG_SEND_FUA
    | FLAG_SEND_TRIM
    | FLAG_SEND_WRITE_ZEROES
    | FLAG_CAN_MULTI_CONN
    | FLAG_SEND_CACHE;

// Commands.
pub(crate) const CMD_READ: u16 = 0;
pub(crate) const CMD_WRITE: u16 = 1;
pub(crate) const CMD_DISC: u16 = 2;
pub(crate) const CMD_FLUSH: u16 = 3;
pub(crate) const CMD_TRIM: u16 = 4;
pub(crate) const CMD_CACHE: u16 = 5;
pub(crate) const CMD_WRITE_ZEROES: u16 = 6;

// Command flags.
pub(crate) const CMD_FLAG_FUA: u16 = 1 << 0;
pub(crate) const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

// Error values of replies.
pub(crate) const EPERM: u32 = 1;
pub(crate) const EIO: u32 = 5;
pub(crate) const EINVAL: u32 = 22;
pub(crate) const ENOSPC: u32 = 28;
pub(crate) const EOVERFLOW: u32 = 75;
pub(crate) const ENOTSUP: u32 = 95;
pub(crate) const ESHUTDOWN: u32 = 108;

// Sizes.
/// Bytes of a request header: magic, flags, type, cookie, offset, length.
pub(crate) const REQUEST_HEADER_LEN: usize = 28;
/// The largest option payload read into memory; longer ones are drained and refused.
pub(crate) const MAX_OPTION_LEN: u32 = 64 * 1024;
/// The longest string (export name, description) the protocol allows.
pub(crate) const MAX_STRING_LEN: usize = 4096;
/// Zero bytes that end an `NBD_OPT_EXPORT_NAME` reply unless the client negotiated
/// `NBD_FLAG_C_NO_ZEROES`.
pub(crate) const EXPORT_NAME_PADDING_LEN: usize = 124;

/// The largest read, write, write-zeroes or cache request served, advertised as the maximum
/// block size. 32 MiB is the size the protocol says clients may always use.
pub const MAX_REQUEST_BYTES: u32 = 32 * 1024 * 1024;
/// The minimum block size advertised: any byte offset and length is served.
pub const MIN_BLOCK_BYTES: u32 = 1;

const _: () = assert!(MAX_REQUEST_BYTES.is_power_of_two());
const _: () = assert!(MAX_OPTION_LEN as usize >= 4 + MAX_STRING_LEN + 2 + 2 * 16);

/// The preferred block size advertised for an export that asks for `preferred_bytes`: the
/// protocol wants a power of two between 512 and the maximum block size.
pub(crate) fn advertised_preferred_block_size(preferred_bytes: u32) -> u32 {
    preferred_bytes.clamp(512, MAX_REQUEST_BYTES).next_power_of_two()
}

/// A transmission request header, as the client sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Parses a request header; `None` if the magic is wrong (the stream cannot be trusted).
    pub fn parse(bytes: &[u8; REQUEST_HEADER_LEN]) -> Option<Request> {
        let mut cursor = Cursor(bytes.as_slice());
        let magic = cursor.u32()?;
        if magic != REQUEST_MAGIC {
            return None;
        }
        Some(Request {
            flags: cursor.u16()?,
            command: cursor.u16()?,
            cookie: cursor.u64()?,
            offset: cursor.u64()?,
            length: cursor.u32()?,
        })
    }
}

/// The 16-byte simple reply header.
pub(crate) fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    bytes[4..8].copy_from_slice(&error.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes
}

/// The 20-byte option reply header for a reply of `len` bytes.
pub(crate) fn option_reply_header(option: u32, reply_type: u32, len: u32) -> [u8; 20] {
    let mut bytes = [0u8; 20];
    bytes[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    bytes[8..12].copy_from_slice(&option.to_be_bytes());
    bytes[12..16].copy_from_slice(&reply_type.to_be_bytes());
    bytes[16..20].copy_from_slice(&len.to_be_bytes());
    bytes
}

/// A big-endian reader over bytes from the network: every read is checked, none panics.
pub(crate) struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.0.len() < len {
            return None;
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        Some(head)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.bytes(2)?.try_into().ok().map(u16::from_be_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.bytes(4)?.try_into().ok().map(u32::from_be_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.bytes(8)?.try_into().ok().map(u64::from_be_bytes)
    }

    pub fn remaining(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_parses_big_endian_fields() {
        let mut bytes = [0u8; REQUEST_HEADER_LEN];
        bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        bytes[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        bytes[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        bytes[16..24].copy_from_slice(&4096u64.to_be_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_be_bytes());
        let request = Request::parse(&bytes).expect("valid magic");
        assert_eq!(
            request,
            Request {
                flags: CMD_FLAG_FUA,
                command: CMD_WRITE,
                cookie: 0x0102_0304_0506_0708,
                offset: 4096,
                length: 512
            }
        );
    }

    #[test]
    fn request_with_bad_magic_is_refused() {
        let bytes = [0xffu8; REQUEST_HEADER_LEN];
        assert_eq!(Request::parse(&bytes), None);
    }

    #[test]
    fn cursor_never_reads_past_the_end() {
        let mut cursor = Cursor(&[1, 2, 3]);
        assert_eq!(cursor.u16(), Some(0x0102));
        assert_eq!(cursor.u16(), None);
        assert_eq!(cursor.remaining(), 1);
        assert_eq!(cursor.bytes(2), None);
    }

    #[test]
    fn preferred_block_size_is_a_power_of_two_in_range() {
        assert_eq!(advertised_preferred_block_size(8192), 8192);
        assert_eq!(advertised_preferred_block_size(16384), 16384);
        assert_eq!(advertised_preferred_block_size(0), 512);
        assert_eq!(advertised_preferred_block_size(3000), 4096);
        assert_eq!(advertised_preferred_block_size(u32::MAX), MAX_REQUEST_BYTES);
    }

    #[test]
    fn replies_are_big_endian() {
        let reply = simple_reply(EINVAL, 7);
        assert_eq!(reply[0..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(reply[4..8], 22u32.to_be_bytes());
        assert_eq!(reply[8..16], 7u64.to_be_bytes());
        let header = option_reply_header(OPT_GO, REP_ERR_UNKNOWN, 5);
        assert_eq!(header[0..8], OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(header[12..16], 0x8000_0006u32.to_be_bytes());
    }
}
