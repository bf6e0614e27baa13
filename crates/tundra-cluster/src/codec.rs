//! The manager's values as bytes: a [`Command`] (one entry of the manager's Raft log) and a
//! [`ClusterState`] (the manager group's snapshot). Each is a version byte
//! ([`FORMAT_VERSION`]) and then the postcard encoding of the value (docs/format.md, "The
//! cluster manager's log entries and snapshot").
//!
//! A snapshot carries only what the commands set (the configuration, each node's status,
//! capacity and overhead, each chunk's expected and reported sizes, replicas and move); every
//! derived figure (a node's chunks and their space, the moves' incoming and outgoing space,
//! the totals) is recounted on decoding, each relation checked, so bytes that decode always
//! give a state whose invariants hold. Decoding never panics: a short, damaged or unknown
//! encoding is an [`Error`] of kind `Invalid` and nothing is built.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use tundra_store::ids::ChunkId;

use crate::config::ManagerConfig;
use crate::error::{Error, Result};
use crate::plan::Move;
use crate::state::{ChunkState, ClusterState, Command, NodeState, NodeStatus, check_spaces, counted_size};
use crate::usage::{NodeId, Space};

/// The version byte that starts every encoded command and snapshot.
pub const FORMAT_VERSION: u8 = 1;

/// A [`ChunkId`] as its number (the store's id type knows nothing of serde).
pub mod chunk_id {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tundra_store::ids::ChunkId;

    pub fn serialize<S: Serializer>(chunk: &ChunkId, serializer: S) -> Result<S::Ok, S::Error> {
        chunk.0.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ChunkId, D::Error> {
        u64::deserialize(deserializer).map(ChunkId)
    }
}

fn versioned<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = vec![FORMAT_VERSION];
    // Serializing to a vector fails only for a type serde cannot express: a bug here.
    bytes.extend(postcard::to_allocvec(value).expect("every manager type has a postcard encoding"));
    bytes
}

fn unversioned<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T> {
    match bytes.split_first() {
        Some((&FORMAT_VERSION, rest)) => match postcard::take_from_bytes::<T>(rest) {
            Ok((value, [])) => Ok(value),
            Ok((_, trailing)) => Err(Error::invalid(format!("{what} followed by {} stray bytes", trailing.len()))),
            Err(e) => Err(Error::invalid(format!("{what} that does not decode: {e}"))),
        },
        Some((version, _)) => Err(Error::invalid(format!("{what} of unknown version {version}"))),
        None => Err(Error::invalid(format!("an empty {what}"))),
    }
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        versioned(self)
    }

    /// The command in `bytes`; its byte figures are checked as `apply` checks them.
    pub fn decode(bytes: &[u8]) -> Result<Command> {
        let command: Command = unversioned(bytes, "a manager command")?;
        command.check_figures()?;
        Ok(command)
    }
}

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    node: NodeId,
    status: NodeStatus,
    capacity: Space,
    overhead: Space,
}

#[derive(Serialize, Deserialize)]
struct ChunkRecord {
    #[serde(with = "chunk_id")]
    chunk: ChunkId,
    expected: Space,
    reported: Space,
    replicas: Vec<NodeId>,
    moving: Option<Move>,
}

#[derive(Serialize, Deserialize)]
struct StateRecord {
    config: ManagerConfig,
    nodes: Vec<NodeRecord>,
    chunks: Vec<ChunkRecord>,
}

impl ClusterState {
    /// The state as a snapshot's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let nodes = self
            .nodes
            .iter()
            .map(|(&node, n)| NodeRecord { node, status: n.status, capacity: n.capacity, overhead: n.overhead })
            .collect();
        let chunks = self
            .chunks
            .iter()
            .map(|(&chunk, c)| ChunkRecord {
                chunk,
                expected: c.expected,
                reported: c.reported,
                replicas: c.replicas.iter().copied().collect(),
                moving: c.moving,
            })
            .collect();
        versioned(&StateRecord { config: self.config, nodes, chunks })
    }

    /// The state a snapshot's bytes stand for, every derived figure recounted and checked.
    pub fn decode(bytes: &[u8]) -> Result<ClusterState> {
        let record: StateRecord = unversioned(bytes, "a manager snapshot")?;
        let mut state = ClusterState::new(record.config)?;
        for n in record.nodes {
            check_spaces(&[n.capacity, n.overhead])?;
            let node = NodeState {
                status: n.status,
                capacity: n.capacity,
                chunks: BTreeSet::new(),
                chunk_space: Space::ZERO,
                overhead: n.overhead,
                incoming: Space::ZERO,
                outgoing: Space::ZERO,
            };
            if state.nodes.insert(n.node, node).is_some() {
                return Err(Error::invalid(format!("a snapshot names {} twice", n.node)));
            }
        }
        for c in record.chunks {
            state.rebuild_chunk(c)?;
        }
        Ok(state)
    }

    fn rebuild_chunk(&mut self, c: ChunkRecord) -> Result<()> {
        let id = c.chunk.0;
        check_spaces(&[c.expected, c.reported])?;
        let replicas: BTreeSet<NodeId> = c.replicas.iter().copied().collect();
        if replicas.is_empty() || replicas.len() != c.replicas.len() {
            return Err(Error::invalid(format!("chunk {id}: replicas {:?} empty or repeated", c.replicas)));
        }
        if let Some(unknown) = replicas.iter().find(|n| !self.nodes.contains_key(n)) {
            return Err(Error::invalid(format!("chunk {id} is on {unknown}, which the snapshot does not name")));
        }
        if self.chunks.contains_key(&c.chunk) {
            return Err(Error::invalid(format!("a snapshot names chunk {id} twice")));
        }
        let size = counted_size(c.expected, c.reported);
        let overflow = || Error::invalid(format!("chunk {id}: the space counted passes 2^64 bytes"));
        self.chunk_total = checked_plus(self.chunk_total, size).ok_or_else(overflow)?;
        for node in &replicas {
            let n = self.nodes.get_mut(node).expect("checked above");
            n.chunks.insert(c.chunk);
            n.chunk_space = checked_plus(n.chunk_space, size).ok_or_else(overflow)?;
        }
        if let Some(m) = c.moving {
            let valid = m.chunk == c.chunk
                && replicas.contains(&m.to)
                && !replicas.contains(&m.from)
                && self.nodes.contains_key(&m.from);
            if !valid {
                return Err(Error::invalid(format!("chunk {id}: a move {m:?} its replicas {replicas:?} contradict")));
            }
            let to = self.nodes.get_mut(&m.to).expect("a replica's node");
            to.incoming = checked_plus(to.incoming, size).ok_or_else(overflow)?;
            let from = self.nodes.get_mut(&m.from).expect("checked above");
            from.outgoing = checked_plus(from.outgoing, size).ok_or_else(overflow)?;
            self.moving.insert(c.chunk);
        }
        let chunk = ChunkState { size, expected: c.expected, reported: c.reported, replicas, moving: c.moving };
        self.chunks.insert(c.chunk, chunk);
        Ok(())
    }
}

fn checked_plus(a: Space, b: Space) -> Option<Space> {
    Some(Space::new(a.logical_bytes.checked_add(b.logical_bytes)?, a.physical_bytes.checked_add(b.physical_bytes)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::plan::MoveReason;
    use crate::state::MAX_FIGURE_BYTES;

    const GIB: u64 = 1 << 30;

    /// A state with every kind of figure: nodes of each status, placed and adopted chunks with
    /// stats, and a move in flight.
    fn state() -> (ClusterState, Vec<Command>) {
        let mut commands = Vec::new();
        for node in 1..=5 {
            commands.push(Command::AddNode { node: NodeId(node), capacity: Space::new(100 * GIB, 40 * GIB) });
        }
        for index in 0..6 {
            commands.push(Command::PlaceChunk { chunk: ChunkId(7 << 32 | index), expected_logical_bytes: GIB });
        }
        let replicas = [NodeId(1), NodeId(2), NodeId(3)].into();
        commands.push(Command::AdoptChunk { chunk: ChunkId(8 << 32), replicas, expected_logical_bytes: GIB });
        commands.push(Command::ChunkStats { chunk: ChunkId(7 << 32), size: Space::new(GIB / 2, GIB / 8) });
        commands.push(Command::Heartbeat {
            node: NodeId(1),
            capacity: Space::new(100 * GIB, 40 * GIB),
            used: Space::new(9 * GIB, 3 * GIB),
        });
        commands.push(Command::DrainNode { node: NodeId(5) });
        let mut state = ClusterState::new(ManagerConfig::paper(Policy::CompressionAware)).unwrap();
        for command in &commands {
            state.apply(command).unwrap();
        }
        let chunk = ChunkId(8 << 32);
        let moving = Move { chunk, from: NodeId(1), to: NodeId(4), reason: MoveReason::Drain };
        commands.push(Command::BeginMove(moving));
        state.apply(commands.last().unwrap()).unwrap();
        commands.push(Command::NodeDead { node: NodeId(5) });
        state.apply(commands.last().unwrap()).unwrap();
        (state, commands)
    }

    #[test]
    fn commands_and_states_round_trip() {
        let (state, commands) = state();
        for command in &commands {
            assert_eq!(&Command::decode(&command.encode()).unwrap(), command);
        }
        let decoded = ClusterState::decode(&state.encode()).unwrap();
        decoded.check_invariants();
        assert_eq!(decoded, state);
        assert_eq!(decoded.moves_in_flight().count(), 1);
    }

    /// Every prefix and every single-byte change of a valid encoding decodes to an error or to
    /// a value (a state whose invariants hold), never a panic; trailing bytes and unknown
    /// versions are refused.
    #[test]
    fn damaged_bytes_are_errors_never_panics() {
        let (state, commands) = state();
        let mut encodings: Vec<(Vec<u8>, bool)> = commands.iter().map(|c| (c.encode(), false)).collect();
        encodings.push((state.encode(), true));
        for (bytes, is_state) in &encodings {
            for len in 0..bytes.len() {
                let prefix = &bytes[..len];
                let refused =
                    if *is_state { ClusterState::decode(prefix).is_err() } else { Command::decode(prefix).is_err() };
                assert!(refused, "a prefix of {len} bytes decoded");
            }
            for at in 0..bytes.len() {
                for flip in [0x01, 0x80, 0xff] {
                    let mut damaged = bytes.clone();
                    damaged[at] ^= flip;
                    if let Ok(decoded) = ClusterState::decode(&damaged) {
                        decoded.check_invariants();
                    }
                    if let Ok(command) = Command::decode(&damaged) {
                        // Applied to a copy, a decoded command is refused or applied; never a panic.
                        let mut copy = state.clone();
                        if copy.apply(&command).is_ok() {
                            copy.check_invariants();
                        }
                    }
                }
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(ClusterState::decode(&longer).is_err());
            let mut other_version = bytes.clone();
            other_version[0] = 2;
            let error = ClusterState::decode(&other_version).unwrap_err();
            assert!(error.message().contains("unknown version 2"), "{error}");
        }
    }

    #[test]
    fn figures_past_the_bound_are_refused() {
        let command = Command::AddNode { node: NodeId(9), capacity: Space::new(MAX_FIGURE_BYTES + 1, 1) };
        assert!(Command::decode(&command.encode()).is_err());
        let (mut state, _) = state();
        assert!(state.apply(&command).is_err());
        let stats = Command::ChunkStats { chunk: ChunkId(7 << 32 | 1), size: Space::new(1, MAX_FIGURE_BYTES) };
        state.apply(&stats).unwrap();
        state.check_invariants();
    }
}
