//! How the replication layer's values become bytes: the serde encoding (postcard) of the shared
//! log's records and of the messages between nodes, and the helpers that let a chunk's id take
//! part in it. The frames around these bytes (lengths, sequence numbers, checksums, the
//! cluster key's tags) belong to whoever stores or sends them: `log/file.rs` for the durable
//! log, the cluster crate for the network.
//!
//! postcard's decoder reads only the bytes it is given and answers an error for anything
//! malformed; a length it reads is never trusted for an allocation beyond the input, so bytes
//! from a disk or a peer can be handed to it as they are.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A value's bytes.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing to a vector fails only for a type serde cannot express, which would be a bug
    // here, never an input's fault.
    postcard::to_allocvec(value).expect("every replication type has a postcard encoding")
}

/// A value from its bytes, which must be exactly one value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (value, rest) = postcard::take_from_bytes::<T>(bytes).map_err(|e| format!("undecodable: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the value", rest.len()));
    }
    Ok(value)
}

/// A byte vector as one length and its bytes, copied whole (serde's default is one element
/// at a time, which costs more than compressing the page did).
pub mod bytes {
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
            Ok(bytes.to_vec())
        }

        fn visit_byte_buf<E: Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(bytes)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(byte) = seq.next_element()? {
                out.push(byte);
            }
            Ok(out)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(BytesVisitor)
    }
}

/// A [`tundra_store::ids::ChunkId`] as its number.
pub mod chunk {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tundra_store::ids::ChunkId;

    pub fn serialize<S: Serializer>(chunk: &ChunkId, serializer: S) -> Result<S::Ok, S::Error> {
        chunk.0.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ChunkId, D::Error> {
        u64::deserialize(deserializer).map(ChunkId)
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
    use tundra_store::ids::ChunkId;

    use super::*;
    use crate::log::LogRecord;
    use crate::types::Proposal;

    fn records() -> Vec<LogRecord> {
        let log_id = LogId::new(CommittedLeaderId::new(3, 2), 17);
        let entry =
            Entry { log_id, payload: EntryPayload::Normal(Proposal { command: vec![1, 2, 3, 250], request: 7 }) };
        vec![
            LogRecord::Entries { group: ChunkId(1 << 32), entries: vec![entry] },
            LogRecord::Vote { group: ChunkId(7), vote: Vote::new(4, 1) },
            LogRecord::Truncate { group: ChunkId(7), since: 9 },
            LogRecord::Purge { group: ChunkId(7), upto: log_id },
            LogRecord::Committed { group: ChunkId(7), committed: Some(log_id) },
            LogRecord::Reset { group: ChunkId(7) },
        ]
    }

    #[test]
    fn records_round_trip() {
        let records = records();
        let bytes = encode(&records);
        assert_eq!(decode::<Vec<LogRecord>>(&bytes).unwrap(), records);
    }

    /// Every prefix and every single-byte change of a valid encoding decodes to an error or to
    /// some value, never a panic; trailing bytes are refused.
    #[test]
    fn damaged_bytes_never_panic() {
        let bytes = encode(&records());
        for len in 0..bytes.len() {
            assert!(decode::<Vec<LogRecord>>(&bytes[..len]).is_err());
        }
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0xff;
            let _ = decode::<Vec<LogRecord>>(&damaged);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<Vec<LogRecord>>(&longer).is_err());
    }
}
