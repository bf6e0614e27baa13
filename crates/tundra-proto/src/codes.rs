//! The two numbered vocabularies of the wire: request opcodes and response status codes. Their
//! numbers are a contract (docs/protocol.md): a number, once given, is never reused.

use std::fmt;

/// What a request asks for: the `code` field of a request frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    Ping = 1,
    VolumeLookup = 2,
    VolumeCreate = 3,
    VolumeList = 4,
    VolumeResize = 5,
    VolumeDelete = 6,
    ReadPage = 16,
    WritePage = 17,
    Trim = 18,
    Flush = 19,
    HeavyCompress = 20,
    Stats = 32,
}

impl Opcode {
    /// Every opcode of protocol version 1, in number order.
    pub const ALL: [Opcode; 12] = [
        Opcode::Ping,
        Opcode::VolumeLookup,
        Opcode::VolumeCreate,
        Opcode::VolumeList,
        Opcode::VolumeResize,
        Opcode::VolumeDelete,
        Opcode::ReadPage,
        Opcode::WritePage,
        Opcode::Trim,
        Opcode::Flush,
        Opcode::HeavyCompress,
        Opcode::Stats,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    /// The opcode numbered `code`, or `None` for a number version 1 does not define.
    pub fn from_code(code: u16) -> Option<Opcode> {
        Opcode::ALL.into_iter().find(|opcode| opcode.code() == code)
    }

    /// The name docs/protocol.md uses.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Ping => "PING",
            Opcode::VolumeLookup => "VOLUME_LOOKUP",
            Opcode::VolumeCreate => "VOLUME_CREATE",
            Opcode::VolumeList => "VOLUME_LIST",
            Opcode::VolumeResize => "VOLUME_RESIZE",
            Opcode::VolumeDelete => "VOLUME_DELETE",
            Opcode::ReadPage => "READ_PAGE",
            Opcode::WritePage => "WRITE_PAGE",
            Opcode::Trim => "TRIM",
            Opcode::Flush => "FLUSH",
            Opcode::HeavyCompress => "HEAVY_COMPRESS",
            Opcode::Stats => "STATS",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a request ended: the `code` field of a response frame's header. Every status but `Ok`
/// carries a UTF-8 message as its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    /// A bad argument (page past the end, unsupported page size, malformed body). Nothing changed.
    Invalid = 1,
    /// No volume of that name or id.
    NotFound = 2,
    /// A volume of that name exists already.
    Exists = 3,
    /// No space left for the data. Nothing changed.
    NoSpace = 4,
    /// Stored bytes or a frame's body failed their checksum.
    Corrupted = 5,
    /// A device failed.
    Io = 6,
    /// The hello's version range and the server's do not meet.
    UnsupportedVersion = 7,
    /// The opcode is not one the negotiated version defines.
    UnknownOpcode = 8,
    /// A frame's body is longer than the protocol allows.
    TooLarge = 9,
    /// The server is shutting down; requests not answered before this were not executed.
    ShuttingDown = 10,
    /// A bug or an unexpected state in the server.
    Internal = 11,
    /// The server has as many connections as it accepts; try again later.
    Busy = 12,
}

impl Status {
    /// Every status of protocol version 1, in number order.
    pub const ALL: [Status; 13] = [
        Status::Ok,
        Status::Invalid,
        Status::NotFound,
        Status::Exists,
        Status::NoSpace,
        Status::Corrupted,
        Status::Io,
        Status::UnsupportedVersion,
        Status::UnknownOpcode,
        Status::TooLarge,
        Status::ShuttingDown,
        Status::Internal,
        Status::Busy,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    /// The status numbered `code`, or `None` for a number version 1 does not define.
    pub fn from_code(code: u16) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.code() == code)
    }

    /// The name docs/protocol.md uses.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Invalid => "INVALID",
            Status::NotFound => "NOT_FOUND",
            Status::Exists => "EXISTS",
            Status::NoSpace => "NO_SPACE",
            Status::Corrupted => "CORRUPTED",
            Status::Io => "IO",
            Status::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Status::UnknownOpcode => "UNKNOWN_OPCODE",
            Status::TooLarge => "TOO_LARGE",
            Status::ShuttingDown => "SHUTTING_DOWN",
            Status::Internal => "INTERNAL",
            Status::Busy => "BUSY",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        for opcode in Opcode::ALL {
            assert_eq!(Opcode::from_code(opcode.code()), Some(opcode));
        }
        for status in Status::ALL {
            assert_eq!(Status::from_code(status.code()), Some(status));
        }
        assert_eq!(Opcode::from_code(0), None);
        assert_eq!(Opcode::from_code(0xFFFF), None);
        assert_eq!(Status::from_code(13), None);
    }

    #[test]
    fn numbers_are_the_documented_ones() {
        // These numbers are on the wire; changing one breaks every deployed peer.
        assert_eq!(Opcode::ReadPage.code(), 16);
        assert_eq!(Opcode::WritePage.code(), 17);
        assert_eq!(Opcode::Stats.code(), 32);
        assert_eq!(Status::NotFound.code(), 2);
        assert_eq!(Status::ShuttingDown.code(), 10);
        assert_eq!(Status::Busy.code(), 12);
    }
}
