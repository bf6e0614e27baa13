//! The two numbered vocabularies of the wire: request opcodes and response status codes. Their
//! numbers are a contract (docs/protocol.md): a number, once given, is never reused. Each one
//! belongs to the protocol version that introduced it, and a connection uses only those of the
//! version its hello chose.

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
    /// Version 2: a cluster operation (drain, move), asked as JSON text, answered as JSON text.
    ClusterAdmin = 33,
    /// Version 2: a batch of redo records from a volume's writer.
    AppendRedo = 48,
    /// Version 2: a volume's redo watermarks.
    RedoStatus = 49,
    /// Version 2: one page as of an LSN.
    GetPageAtLsn = 64,
    /// Version 2: many pages of one volume as of one LSN (prefetch).
    GetPagesAtLsn = 65,
    /// Version 2: a read-only node takes a lease on a volume's history.
    RegisterReader = 80,
    RenewReader = 81,
    ReleaseReader = 82,
}

impl Opcode {
    /// Every opcode this build knows, in number order.
    pub const ALL: [Opcode; 20] = [
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
        Opcode::ClusterAdmin,
        Opcode::AppendRedo,
        Opcode::RedoStatus,
        Opcode::GetPageAtLsn,
        Opcode::GetPagesAtLsn,
        Opcode::RegisterReader,
        Opcode::RenewReader,
        Opcode::ReleaseReader,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    /// The opcode numbered `code`, or `None` for a number no version defines.
    pub fn from_code(code: u16) -> Option<Opcode> {
        Opcode::ALL.into_iter().find(|opcode| opcode.code() == code)
    }

    /// The protocol version that introduced this opcode: a connection whose hello chose an
    /// older version refuses it as unknown.
    pub fn since(self) -> u16 {
        match self {
            Opcode::Ping
            | Opcode::VolumeLookup
            | Opcode::VolumeCreate
            | Opcode::VolumeList
            | Opcode::VolumeResize
            | Opcode::VolumeDelete
            | Opcode::ReadPage
            | Opcode::WritePage
            | Opcode::Trim
            | Opcode::Flush
            | Opcode::HeavyCompress
            | Opcode::Stats => 1,
            Opcode::ClusterAdmin
            | Opcode::AppendRedo
            | Opcode::RedoStatus
            | Opcode::GetPageAtLsn
            | Opcode::GetPagesAtLsn
            | Opcode::RegisterReader
            | Opcode::RenewReader
            | Opcode::ReleaseReader => 2,
        }
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
            Opcode::ClusterAdmin => "CLUSTER_ADMIN",
            Opcode::AppendRedo => "APPEND_REDO",
            Opcode::RedoStatus => "REDO_STATUS",
            Opcode::GetPageAtLsn => "GET_PAGE_AT_LSN",
            Opcode::GetPagesAtLsn => "GET_PAGES_AT_LSN",
            Opcode::RegisterReader => "REGISTER_READER",
            Opcode::RenewReader => "RENEW_READER",
            Opcode::ReleaseReader => "RELEASE_READER",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a request ended: the `code` field of a response frame's header. Every status but `Ok`
/// carries a UTF-8 message as its body, preceded by an LSN for the statuses whose
/// [`Status::carries_lsn`] is true.
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
    /// Version 2: the server speaks the opcode's version but does not implement the operation
    /// (a node without redo streams). Nothing changed.
    NotSupported = 13,
    /// Version 2: the LSN asked for is below the volume's minimum reader LSN, which the body
    /// carries; history that old is gone. The reader resyncs at or above that LSN.
    TooOld = 14,
    /// Version 2: the server's complete LSN is short of the read, even after waiting; the body
    /// carries the complete LSN. The client retries later or elsewhere.
    NotYet = 15,
    /// Version 2: the reader's lease is gone (expired, released, or revoked for lagging too
    /// far); the body carries the minimum reader LSN. The reader registers again and resyncs.
    LeaseLost = 16,
}

impl Status {
    /// Every status this build knows, in number order.
    pub const ALL: [Status; 17] = [
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
        Status::NotSupported,
        Status::TooOld,
        Status::NotYet,
        Status::LeaseLost,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    /// The status numbered `code`, or `None` for a number no version defines.
    pub fn from_code(code: u16) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.code() == code)
    }

    /// The protocol version that introduced this status. A server never sends a newer status
    /// on a connection of an older version, and a client treats one as a broken peer.
    pub fn since(self) -> u16 {
        match self {
            Status::NotSupported | Status::TooOld | Status::NotYet | Status::LeaseLost => 2,
            _ => 1,
        }
    }

    /// True for the statuses whose body starts with a u64 LSN before the message.
    pub fn carries_lsn(self) -> bool {
        matches!(self, Status::TooOld | Status::NotYet | Status::LeaseLost)
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
            Status::NotSupported => "NOT_SUPPORTED",
            Status::TooOld => "TOO_OLD",
            Status::NotYet => "NOT_YET",
            Status::LeaseLost => "LEASE_LOST",
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
        assert_eq!(Status::from_code(17), None);
    }

    #[test]
    fn version_2_adds_the_redo_opcodes_and_statuses() {
        let new: Vec<Opcode> = Opcode::ALL.into_iter().filter(|opcode| opcode.since() == 2).collect();
        assert_eq!(new.len(), 8);
        assert!(new.iter().all(|opcode| opcode.code() >= 48 || *opcode == Opcode::ClusterAdmin));
        assert!(Opcode::ALL.into_iter().all(|opcode| (1..=2).contains(&opcode.since())));
        assert_eq!(Status::ALL.into_iter().filter(|status| status.since() == 2).count(), 4);
        assert!(Status::ALL.into_iter().filter(|status| status.carries_lsn()).all(|status| status.since() == 2));
    }

    #[test]
    fn numbers_are_the_documented_ones() {
        // These numbers are on the wire; changing one breaks every deployed peer.
        assert_eq!(Opcode::ReadPage.code(), 16);
        assert_eq!(Opcode::WritePage.code(), 17);
        assert_eq!(Opcode::Stats.code(), 32);
        assert_eq!(Opcode::ClusterAdmin.code(), 33);
        assert_eq!(Status::NotFound.code(), 2);
        assert_eq!(Status::ShuttingDown.code(), 10);
        assert_eq!(Status::Busy.code(), 12);
        assert_eq!(Opcode::AppendRedo.code(), 48);
        assert_eq!(Opcode::RedoStatus.code(), 49);
        assert_eq!(Opcode::GetPageAtLsn.code(), 64);
        assert_eq!(Opcode::GetPagesAtLsn.code(), 65);
        assert_eq!(Opcode::RegisterReader.code(), 80);
        assert_eq!(Opcode::RenewReader.code(), 81);
        assert_eq!(Opcode::ReleaseReader.code(), 82);
        assert_eq!(Status::NotSupported.code(), 13);
        assert_eq!(Status::TooOld.code(), 14);
        assert_eq!(Status::NotYet.code(), 15);
        assert_eq!(Status::LeaseLost.code(), 16);
    }
}
