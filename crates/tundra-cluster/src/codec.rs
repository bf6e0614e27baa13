//! The manager's values as bytes: a [`Command`] (one entry of the manager's Raft log) and a
//! [`ClusterState`] (the manager group's snapshot). Each is a version byte and then the
//! postcard encoding of the value (docs/format.md, "The cluster manager's log entries and
//! snapshot").
//!
//! Versions (a new field or variant is a new version byte; a member refuses versions it does
//! not know). Commands are version 5 ([`COMMAND_VERSION`]): version 2 added `ChunkSizes` after
//! the version 1 variants, version 3 added `Report`, `PlaceChunkAt`, `Claim`, `Release` and
//! `RecordRound` after those, version 4 `GrowChunk` after those, version 5 the claim owner
//! `MoveOwner::Repair`; entries an older build wrote to the log still decode, as any
//! command their version had. Snapshots are version 4 ([`SNAPSHOT_VERSION`]): version 4 may
//! hold a claim of owner `MoveOwner::Repair`, which version 3's layout could not; version 2's
//! chunk records say whether a chunk's size was ever reported (`Option`), version 3's node
//! records carry the node's last timed report (usage, time, thin provisioning) and the state
//! the claim on moves and the background rebalancer's last round. Version 1 and 2 snapshots
//! still decode: a version 1 reported size of zero on both axes reads as "none reported" (the
//! same count: a chunk with nothing reported counts at its expected size either way), and
//! before version 3 no node has a timed report (each is unknown to the decisions until its
//! next report, within a second), no claim is held and no round is recorded.
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
use crate::mover::{MoveClaim, MoveOwner, RoundRecord};
use crate::plan::Move;
use crate::state::{ChunkState, ClusterState, Command, NodeState, NodeStatus, check_spaces, counted_size};
use crate::usage::{NodeId, Space};

/// The version byte that starts every command this build encodes.
pub const COMMAND_VERSION: u8 = 5;
/// The older command versions that still decode (version 4: every variant, no `Repair`
/// owner; version 3: every variant up to `RecordRound`; version 2: every variant up to
/// `ChunkSizes`; version 1: every variant before it).
pub const COMMAND_VERSION_4: u8 = 4;
pub const COMMAND_VERSION_3: u8 = 3;
pub const COMMAND_VERSION_2: u8 = 2;
pub const COMMAND_VERSION_1: u8 = 1;
/// The version byte that starts every snapshot this build writes.
pub const SNAPSHOT_VERSION: u8 = 4;
/// The older snapshot versions that still decode (version 3: version 4's layout, without a
/// `Repair` claim).
pub const SNAPSHOT_VERSION_3: u8 = 3;
pub const SNAPSHOT_VERSION_2: u8 = 2;
pub const SNAPSHOT_VERSION_1: u8 = 1;

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

fn versioned<T: Serialize>(version: u8, value: &T) -> Vec<u8> {
    let mut bytes = vec![version];
    // Serializing to a vector fails only for a type serde cannot express: a bug here.
    bytes.extend(postcard::to_allocvec(value).expect("every manager type has a postcard encoding"));
    bytes
}

/// The version byte of `bytes`, and the rest.
fn split_version<'a>(bytes: &'a [u8], what: &str) -> Result<(u8, &'a [u8])> {
    bytes.split_first().map(|(&v, rest)| (v, rest)).ok_or_else(|| Error::invalid(format!("an empty {what}")))
}

/// `rest` (what follows the version byte) as a whole `T`.
fn whole<'a, T: Deserialize<'a>>(rest: &'a [u8], what: &str) -> Result<T> {
    match postcard::take_from_bytes::<T>(rest) {
        Ok((value, [])) => Ok(value),
        Ok((_, trailing)) => Err(Error::invalid(format!("{what} followed by {} stray bytes", trailing.len()))),
        Err(e) => Err(Error::invalid(format!("{what} that does not decode: {e}"))),
    }
}

fn unknown_version(what: &str, version: u8) -> Error {
    Error::invalid(format!("{what} of unknown version {version}"))
}

impl Command {
    /// The command version that added this variant: an entry of an older version cannot hold it.
    pub fn version_added(&self) -> u8 {
        match self {
            Command::ChunkSizes { .. } => 2,
            Command::Claim { owner: MoveOwner::Repair { .. }, .. }
            | Command::Release { owner: MoveOwner::Repair { .. } } => 5,
            Command::Report { .. }
            | Command::PlaceChunkAt { .. }
            | Command::Claim { .. }
            | Command::Release { .. }
            | Command::RecordRound(_) => 3,
            Command::GrowChunk { .. } => 4,
            _ => 1,
        }
    }

    /// The variant's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Configure(_) => "Configure",
            Command::AddNode { .. } => "AddNode",
            Command::Heartbeat { .. } => "Heartbeat",
            Command::ChunkStats { .. } => "ChunkStats",
            Command::PlaceChunk { .. } => "PlaceChunk",
            Command::DeleteChunk { .. } => "DeleteChunk",
            Command::AdoptChunk { .. } => "AdoptChunk",
            Command::DrainNode { .. } => "DrainNode",
            Command::NodeDead { .. } => "NodeDead",
            Command::RemoveNode { .. } => "RemoveNode",
            Command::BeginMove(_) => "BeginMove",
            Command::FinishMove { .. } => "FinishMove",
            Command::AbortMove { .. } => "AbortMove",
            Command::ChunkSizes { .. } => "ChunkSizes",
            Command::Report { .. } => "Report",
            Command::PlaceChunkAt { .. } => "PlaceChunkAt",
            Command::Claim { .. } => "Claim",
            Command::Release { .. } => "Release",
            Command::RecordRound(_) => "RecordRound",
            Command::GrowChunk { .. } => "GrowChunk",
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        versioned(COMMAND_VERSION, self)
    }

    /// The command in `bytes`; its byte figures are checked as `apply` checks them.
    pub fn decode(bytes: &[u8]) -> Result<Command> {
        let what = "a manager command";
        let (version, rest) = split_version(bytes, what)?;
        if !(COMMAND_VERSION_1..=COMMAND_VERSION).contains(&version) {
            return Err(unknown_version(what, version));
        }
        let command: Command = whole(rest, what)?;
        let added = command.version_added();
        if added > version {
            return Err(Error::invalid(format!(
                "a version {version} manager command that is a {} (added in version {added})",
                command.name()
            )));
        }
        command.check_figures()?;
        Ok(command)
    }
}

/// A node as version 1 and 2 snapshots record it.
#[derive(Serialize, Deserialize)]
struct NodeRecordV2 {
    node: NodeId,
    status: NodeStatus,
    capacity: Space,
    overhead: Space,
}

/// A node's last timed report (version 3).
#[derive(Serialize, Deserialize)]
struct NodeReport {
    used: Space,
    at_unix_ms: u64,
    overcommit: bool,
}

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    node: NodeId,
    status: NodeStatus,
    capacity: Space,
    overhead: Space,
    report: Option<NodeReport>,
}

impl From<NodeRecordV2> for NodeRecord {
    fn from(n: NodeRecordV2) -> NodeRecord {
        NodeRecord { node: n.node, status: n.status, capacity: n.capacity, overhead: n.overhead, report: None }
    }
}

#[derive(Serialize, Deserialize)]
struct ChunkRecord {
    #[serde(with = "chunk_id")]
    chunk: ChunkId,
    expected: Space,
    reported: Option<Space>,
    replicas: Vec<NodeId>,
    moving: Option<Move>,
}

#[derive(Serialize, Deserialize)]
struct StateRecord {
    config: ManagerConfig,
    nodes: Vec<NodeRecord>,
    chunks: Vec<ChunkRecord>,
    claim: Option<MoveClaim>,
    last_round: Option<RoundRecord>,
}

/// A version 2 snapshot.
#[derive(Serialize, Deserialize)]
struct StateRecordV2 {
    config: ManagerConfig,
    nodes: Vec<NodeRecordV2>,
    chunks: Vec<ChunkRecord>,
}

impl From<StateRecordV2> for StateRecord {
    fn from(v2: StateRecordV2) -> StateRecord {
        let nodes = v2.nodes.into_iter().map(NodeRecord::from).collect();
        StateRecord { config: v2.config, nodes, chunks: v2.chunks, claim: None, last_round: None }
    }
}

/// A version 1 snapshot's chunk record: the reported size a plain `Space`, zero when none was.
#[derive(Serialize, Deserialize)]
struct ChunkRecordV1 {
    #[serde(with = "chunk_id")]
    chunk: ChunkId,
    expected: Space,
    reported: Space,
    replicas: Vec<NodeId>,
    moving: Option<Move>,
}

#[derive(Serialize, Deserialize)]
struct StateRecordV1 {
    config: ManagerConfig,
    nodes: Vec<NodeRecordV2>,
    chunks: Vec<ChunkRecordV1>,
}

impl From<StateRecordV1> for StateRecordV2 {
    fn from(v1: StateRecordV1) -> StateRecordV2 {
        let chunks = v1
            .chunks
            .into_iter()
            .map(|c| ChunkRecord {
                chunk: c.chunk,
                expected: c.expected,
                reported: (c.reported != Space::ZERO).then_some(c.reported),
                replicas: c.replicas,
                moving: c.moving,
            })
            .collect();
        StateRecordV2 { config: v1.config, nodes: v1.nodes, chunks }
    }
}

impl ClusterState {
    /// The state as a snapshot's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let nodes = self
            .nodes
            .iter()
            .map(|(&node, n)| NodeRecord {
                node,
                status: n.status,
                capacity: n.capacity,
                overhead: n.overhead,
                report: match (n.reported_used, n.reported_unix_ms) {
                    (Some(used), Some(at_unix_ms)) => Some(NodeReport { used, at_unix_ms, overcommit: n.overcommit }),
                    _ => None,
                },
            })
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
        let record =
            StateRecord { config: self.config, nodes, chunks, claim: self.claim, last_round: self.last_round.clone() };
        versioned(SNAPSHOT_VERSION, &record)
    }

    /// The state a snapshot's bytes (this version's or version 1's) stand for, every derived
    /// figure recounted and checked.
    pub fn decode(bytes: &[u8]) -> Result<ClusterState> {
        let what = "a manager snapshot";
        let record: StateRecord = match split_version(bytes, what)? {
            (SNAPSHOT_VERSION, rest) => whole(rest, what)?,
            (SNAPSHOT_VERSION_3, rest) => {
                let record: StateRecord = whole(rest, what)?;
                if let Some(MoveClaim { owner: MoveOwner::Repair { .. }, .. }) = record.claim {
                    return Err(Error::invalid(format!(
                        "{what} of version 3 whose claim on moves is a repair's (added in version 4)"
                    )));
                }
                record
            }
            (SNAPSHOT_VERSION_2, rest) => whole::<StateRecordV2>(rest, what)?.into(),
            (SNAPSHOT_VERSION_1, rest) => StateRecordV2::from(whole::<StateRecordV1>(rest, what)?).into(),
            (version, _) => return Err(unknown_version(what, version)),
        };
        let mut state = ClusterState::new(record.config)?;
        if let Some(round) = &record.last_round {
            round.check()?;
        }
        state.claim = record.claim;
        state.last_round = record.last_round;
        for n in record.nodes {
            check_spaces(&[n.capacity, n.overhead])?;
            let mut node = NodeState::empty(n.status, n.capacity);
            node.overhead = n.overhead;
            if let Some(report) = n.report {
                check_spaces(&[report.used])?;
                node.reported_used = Some(report.used);
                node.reported_unix_ms = Some(report.at_unix_ms);
                node.overcommit = report.overcommit;
            }
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
        check_spaces(&[c.expected, c.reported.unwrap_or(Space::ZERO)])?;
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
        let size = counted_size(c.expected, c.reported.unwrap_or(Space::ZERO));
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
    use crate::mover::MoveOwner;
    use crate::plan::MoveReason;
    use crate::state::{MAX_FIGURE_BYTES, MAX_SIZES_PER_COMMAND, ReportedSize};

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
        let sizes = vec![
            ReportedSize { chunk: ChunkId(7 << 32 | 1), size: Space::new(GIB, GIB / 3) },
            ReportedSize { chunk: ChunkId(8 << 32), size: Space::new(GIB / 4, GIB / 4) },
        ];
        commands.push(Command::ChunkSizes { node: NodeId(1), sizes });
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
            other_version[0] = 9;
            let error = ClusterState::decode(&other_version).unwrap_err();
            assert!(error.message().contains("unknown version 9"), "{error}");
            let error = Command::decode(&other_version).unwrap_err();
            assert!(error.message().contains("unknown version 9"), "{error}");
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

    /// A version 1 snapshot, as the build before chunk sizes were optional wrote it (three
    /// nodes, two chunks, one of them reported at 1 MiB logical / 256 KiB physical).
    const SNAPSHOT_V1_HEX: &str = "0103000000000000e83f9a9999999999b93f01009a9999999999b93f9a9999999999b93f400210030100808080800480808080020000020080808080048080808002000003008080808004808080800200000280808080708080408080408080408080100301020300818080807080804080804000000301020300";

    fn v1_bytes() -> Vec<u8> {
        (0..SNAPSHOT_V1_HEX.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&SNAPSHOT_V1_HEX[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The state the version 1 snapshot holds, built by commands.
    fn v1_state() -> ClusterState {
        let mut state = ClusterState::new(ManagerConfig::paper(Policy::CompressionAware)).unwrap();
        for node in 1..=3 {
            state.apply(&Command::AddNode { node: NodeId(node), capacity: Space::new(1 << 30, 1 << 29) }).unwrap();
        }
        state.apply(&Command::PlaceChunk { chunk: ChunkId(7 << 32), expected_logical_bytes: 1 << 20 }).unwrap();
        state.apply(&Command::PlaceChunk { chunk: ChunkId(7 << 32 | 1), expected_logical_bytes: 1 << 20 }).unwrap();
        state.apply(&Command::ChunkStats { chunk: ChunkId(7 << 32), size: Space::new(1 << 20, 1 << 18) }).unwrap();
        state
    }

    #[test]
    fn a_version_1_snapshot_still_decodes() {
        let decoded = ClusterState::decode(&v1_bytes()).unwrap();
        decoded.check_invariants();
        assert_eq!(decoded, v1_state());
        assert_eq!(decoded.chunk(ChunkId(7 << 32)).unwrap().reported, Some(Space::new(1 << 20, 1 << 18)));
        assert_eq!(decoded.chunk(ChunkId(7 << 32 | 1)).unwrap().reported, None);
        // Written again, it is version 2, and decodes to the same state.
        let again = decoded.encode();
        assert_eq!(again[0], SNAPSHOT_VERSION);
        assert_eq!(ClusterState::decode(&again).unwrap(), decoded);
    }

    /// Twin of the test above: the same bytes read as the current version are refused (the
    /// version byte is what tells the two layouts apart).
    #[test]
    fn version_1_bytes_read_as_version_2_are_refused() {
        let mut bytes = v1_bytes();
        bytes[0] = SNAPSHOT_VERSION;
        assert!(ClusterState::decode(&bytes).is_err());
    }

    /// Log entries an older build wrote (version 1) decode as they did; a version 1 entry
    /// cannot be a command added in version 2.
    #[test]
    fn version_1_commands_still_decode() {
        let (_, commands) = state();
        for command in &commands {
            let mut old = command.encode();
            assert_eq!(old[0], COMMAND_VERSION);
            old[0] = COMMAND_VERSION_1;
            match command {
                Command::ChunkSizes { .. } => assert!(Command::decode(&old).is_err(), "{command:?}"),
                _ => assert_eq!(&Command::decode(&old).unwrap(), command),
            }
        }
        // A heartbeat as version 1 wrote it: the bytes fixed here, not re-encoded.
        let heartbeat =
            Command::Heartbeat { node: NodeId(2), capacity: Space::new(1 << 20, 1 << 19), used: Space::new(5, 3) };
        let v1 = [1u8, 2, 2, 0x80, 0x80, 0x40, 0x80, 0x80, 0x20, 5, 3];
        assert_eq!(Command::decode(&v1).unwrap(), heartbeat);
    }

    #[test]
    fn chunk_sizes_round_trip_and_count() {
        let (mut state, _) = state();
        let chunk = ChunkId(7 << 32 | 2);
        let holder = *state.chunk(chunk).unwrap().replicas.iter().next().unwrap();
        let size = Space::new(GIB, GIB / 5);
        let command = Command::ChunkSizes { node: holder, sizes: vec![ReportedSize { chunk, size }] };
        assert_eq!(Command::decode(&command.encode()).unwrap(), command);
        state.apply(&command).unwrap();
        state.check_invariants();
        assert_eq!(state.chunk(chunk).unwrap().reported, Some(size));
        assert_eq!(state.chunk(chunk).unwrap().size, size);
        let decoded = ClusterState::decode(&state.encode()).unwrap();
        assert_eq!(decoded, state);
        assert_eq!(decoded.chunk(chunk).unwrap().reported, Some(size));
    }

    /// A report refused in part changes nothing: a chunk the node holds no replica of, a chunk
    /// twice, a move's target still catching up, too many sizes.
    #[test]
    fn a_bad_chunk_sizes_command_changes_nothing() {
        let (state, _) = state();
        let chunk = ChunkId(7 << 32 | 3);
        let replicas = state.chunk(chunk).unwrap().replicas.clone();
        let holder = *replicas.iter().next().unwrap();
        let stranger = (1..=5).map(NodeId).find(|n| !replicas.contains(n)).unwrap();
        let good = ReportedSize { chunk, size: Space::new(GIB, GIB / 2) };
        let other = ReportedSize { chunk: ChunkId(7 << 32 | 4), size: Space::new(GIB, GIB / 2) };
        let moving = ReportedSize { chunk: ChunkId(8 << 32), size: Space::new(GIB, GIB / 2) };
        let unknown = ReportedSize { chunk: ChunkId(99 << 32), size: Space::new(GIB, GIB / 2) };
        let bad = [
            Command::ChunkSizes { node: stranger, sizes: vec![good] },
            Command::ChunkSizes { node: holder, sizes: vec![good, good] },
            Command::ChunkSizes { node: holder, sizes: vec![good, unknown] },
            Command::ChunkSizes { node: NodeId(4), sizes: vec![moving] },
            Command::ChunkSizes { node: holder, sizes: vec![good; MAX_SIZES_PER_COMMAND + 1] },
        ];
        for command in &bad {
            let mut copy = state.clone();
            assert!(copy.apply(command).is_err(), "{command:?} was applied");
            assert_eq!(copy, state, "{command:?} changed the state");
        }
        // Twin: the same entries, well formed, are applied.
        let mut copy = state.clone();
        let holds_other = copy.chunk(other.chunk).unwrap().replicas.contains(&holder);
        let sizes = if holds_other { vec![good, other] } else { vec![good] };
        copy.apply(&Command::ChunkSizes { node: holder, sizes }).unwrap();
        assert_ne!(copy, state);
    }

    /// A version 2 snapshot, as the build before timed reports and the claim wrote it (four
    /// nodes, node 2 heartbeat at 3 MiB / 1 MiB, node 4 draining, one chunk reported at 1 MiB
    /// logical / 256 KiB physical), and a version 2 `ChunkSizes` entry: the bytes fixed here.
    const SNAPSHOT_V2_HEX: &str = "0203000000000000e83f9a9999999999b93f01009a9999999999b93f9a9999999999b93f4002100401008080808004808080800200000200808080800480808080028080800180803003008080808004808080800200000401808080800480808080020000018080808070808040808040018080408080100301020300";
    const CHUNK_SIZES_V2_HEX: &str = "020d01018080808070808040808010";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
    }

    fn v2_state() -> ClusterState {
        let mut state = ClusterState::new(ManagerConfig::paper(Policy::CompressionAware)).unwrap();
        for node in 1..=4 {
            state.apply(&Command::AddNode { node: NodeId(node), capacity: Space::new(1 << 30, 1 << 29) }).unwrap();
        }
        state.apply(&Command::PlaceChunk { chunk: ChunkId(7 << 32), expected_logical_bytes: 1 << 20 }).unwrap();
        state.apply(&Command::ChunkStats { chunk: ChunkId(7 << 32), size: Space::new(1 << 20, 1 << 18) }).unwrap();
        let used = Space::new(3 << 20, 1 << 20);
        state.apply(&Command::Heartbeat { node: NodeId(2), capacity: Space::new(1 << 30, 1 << 29), used }).unwrap();
        state.apply(&Command::DrainNode { node: NodeId(4) }).unwrap();
        state
    }

    #[test]
    fn version_2_snapshots_and_entries_still_decode() {
        let decoded = ClusterState::decode(&hex(SNAPSHOT_V2_HEX)).unwrap();
        decoded.check_invariants();
        assert_eq!(decoded, v2_state());
        assert!(decoded.claim().is_none() && decoded.last_round().is_none());
        assert!(decoded.nodes().values().all(|n| n.reported_unix_ms.is_none()));
        let again = decoded.encode();
        assert_eq!(again[0], SNAPSHOT_VERSION);
        assert_eq!(ClusterState::decode(&again).unwrap(), decoded);
        let sizes = Command::decode(&hex(CHUNK_SIZES_V2_HEX)).unwrap();
        let size = Space::new(1 << 20, 1 << 18);
        let expected =
            Command::ChunkSizes { node: NodeId(1), sizes: vec![ReportedSize { chunk: ChunkId(7 << 32), size }] };
        assert_eq!(sizes, expected);
        // Twin: the version 2 snapshot's bytes read as version 3 are refused.
        let mut as_v3 = hex(SNAPSHOT_V2_HEX);
        as_v3[0] = SNAPSHOT_VERSION;
        assert!(ClusterState::decode(&as_v3).is_err());
    }

    fn version_3_commands() -> Vec<Command> {
        let owner = MoveOwner::Drain { node: 4 };
        let record = RoundRecord {
            node: 1,
            started_unix_ms: 1_700_000_000_000,
            seconds: 2.5,
            planned: 3,
            moves: 1,
            failures: 1,
            failed: vec!["chunk 2 of a from node 1 to node 4: stalled".into()],
            skipped: None,
            error: None,
        };
        vec![
            Command::Report {
                node: NodeId(1),
                capacity: Space::new(100 * GIB, 40 * GIB),
                used: Space::new(GIB, GIB / 2),
                overcommit: true,
                at_unix_ms: 1_700_000_000_000,
            },
            Command::PlaceChunkAt { chunk: ChunkId(9 << 32), expected_logical_bytes: GIB, at_unix_ms: 5 },
            Command::Claim { owner, at_unix_ms: 1_000, lease_ms: 60_000 },
            Command::Release { owner },
            Command::RecordRound(record),
        ]
    }

    /// The commands version 3 added round-trip; the same bytes marked version 2 or 1 are
    /// refused (an older build could not have written them).
    #[test]
    fn version_3_commands_round_trip_and_are_refused_as_older() {
        for command in version_3_commands() {
            let bytes = command.encode();
            assert_eq!(Command::decode(&bytes).unwrap(), command);
            for old in [COMMAND_VERSION_2, COMMAND_VERSION_1] {
                let mut older = bytes.clone();
                older[0] = old;
                let error = Command::decode(&older).unwrap_err();
                assert!(error.message().contains("added in version 3"), "{error}");
            }
            // A version 3 entry (an older build's) still decodes.
            let mut v3 = bytes.clone();
            v3[0] = COMMAND_VERSION_3;
            assert_eq!(Command::decode(&v3).unwrap(), command);
        }
    }

    /// `GrowChunk` (version 4) round-trips and is refused as any older version; applied, the
    /// chunk's expectation and its nodes' space grow, and a smaller figure changes nothing.
    #[test]
    fn grow_chunk_is_version_4_and_grows_the_expectation() {
        let chunk = ChunkId(7 << 32 | 2);
        let command = Command::GrowChunk { chunk, expected_logical_bytes: 3 * GIB };
        let bytes = command.encode();
        assert_eq!(bytes[0], COMMAND_VERSION);
        assert_eq!(Command::decode(&bytes).unwrap(), command);
        for old in [COMMAND_VERSION_3, COMMAND_VERSION_2, COMMAND_VERSION_1] {
            let mut older = bytes.clone();
            older[0] = old;
            let error = Command::decode(&older).unwrap_err();
            assert!(error.message().contains("added in version 4"), "{error}");
        }
        let (mut state, _) = state();
        let before = state.chunk(chunk).unwrap().clone();
        let node = *before.replicas.iter().next().unwrap();
        let space_before = state.node(node).unwrap().chunk_space;
        state.apply(&command).unwrap();
        state.check_invariants();
        let after = state.chunk(chunk).unwrap().clone();
        assert_eq!(after.expected.logical_bytes, 3 * GIB);
        assert_eq!(after.size.logical_bytes, 3 * GIB);
        assert_eq!(state.node(node).unwrap().chunk_space.logical_bytes, space_before.logical_bytes + 2 * GIB);
        let smaller = Command::GrowChunk { chunk, expected_logical_bytes: GIB };
        let grown = state.clone();
        state.apply(&smaller).unwrap();
        assert_eq!(state, grown, "a smaller expectation changes nothing");
        let decoded = ClusterState::decode(&state.encode()).unwrap();
        decoded.check_invariants();
        assert_eq!(decoded, state);
        assert!(state.apply(&Command::GrowChunk { chunk: ChunkId(99 << 32), expected_logical_bytes: GIB }).is_err());
    }

    /// A repair's claim (version 5 commands, a version 4 snapshot) round-trips; its commands
    /// are refused as version 4, and a snapshot holding it as version 3, while a version 3
    /// snapshot with another owner's claim still decodes.
    #[test]
    fn a_repair_claim_is_version_5_and_snapshot_version_4() {
        let owner = MoveOwner::Repair { node: 3 };
        for command in [Command::Claim { owner, at_unix_ms: 1_000, lease_ms: 60_000 }, Command::Release { owner }] {
            let bytes = command.encode();
            assert_eq!(bytes[0], COMMAND_VERSION);
            assert_eq!(Command::decode(&bytes).unwrap(), command);
            let mut older = bytes.clone();
            older[0] = COMMAND_VERSION_4;
            let error = Command::decode(&older).unwrap_err();
            assert!(error.message().contains("added in version 5"), "{error}");
        }
        // Other owners' claims are still version 3 commands.
        assert_eq!(
            Command::Claim { owner: MoveOwner::Drain { node: 3 }, at_unix_ms: 1, lease_ms: 1 }.version_added(),
            3
        );
        let (mut repairing, _) = state();
        repairing.apply(&Command::Claim { owner, at_unix_ms: 1_000, lease_ms: 60_000 }).unwrap();
        let bytes = repairing.encode();
        assert_eq!(bytes[0], SNAPSHOT_VERSION);
        assert_eq!(ClusterState::decode(&bytes).unwrap(), repairing);
        let mut as_v3 = bytes.clone();
        as_v3[0] = SNAPSHOT_VERSION_3;
        let error = ClusterState::decode(&as_v3).unwrap_err();
        assert!(error.message().contains("repair"), "{error}");
        let (mut other, _) = state();
        let drain = MoveOwner::Drain { node: 2 };
        other.apply(&Command::Claim { owner: drain, at_unix_ms: 1_000, lease_ms: 60_000 }).unwrap();
        let mut v3 = other.encode();
        v3[0] = SNAPSHOT_VERSION_3;
        assert_eq!(ClusterState::decode(&v3).unwrap(), other);
    }

    /// A state with a timed report, a claim and a round record round-trips through a snapshot.
    #[test]
    fn reports_claims_and_rounds_round_trip_in_snapshots() {
        let (mut state, _) = state();
        for command in version_3_commands() {
            if !matches!(command, Command::Release { .. } | Command::PlaceChunkAt { .. }) {
                state.apply(&command).unwrap();
            }
        }
        assert!(state.claim().is_some() && state.last_round().is_some());
        let decoded = ClusterState::decode(&state.encode()).unwrap();
        decoded.check_invariants();
        assert_eq!(decoded, state);
        assert_eq!(decoded.node(NodeId(1)).unwrap().reported_unix_ms, Some(1_700_000_000_000));
        assert!(decoded.node(NodeId(1)).unwrap().overcommit);
    }

    /// Bad figures in the new commands are refused: a zero or endless lease, a round record
    /// past its bounds or with a nonsense duration.
    #[test]
    fn bad_claims_and_round_records_are_refused() {
        let owner = MoveOwner::Move { node: 2 };
        let (state, _) = state();
        let long = "x".repeat(crate::mover::ROUND_TEXT_MAX_BYTES + 1);
        let bad = [
            Command::Claim { owner, at_unix_ms: 1, lease_ms: 0 },
            Command::Claim { owner, at_unix_ms: 1, lease_ms: crate::mover::CLAIM_LEASE_MAX_MS + 1 },
            Command::RecordRound(RoundRecord { seconds: f64::NAN, ..Default::default() }),
            Command::RecordRound(RoundRecord { error: Some(long.clone()), ..Default::default() }),
            Command::RecordRound(RoundRecord {
                failed: vec![String::new(); crate::mover::ROUND_FAILURES_MAX + 1],
                ..Default::default()
            }),
        ];
        for command in &bad {
            assert!(Command::decode(&command.encode()).is_err(), "{command:?} decoded");
            let mut copy = state.clone();
            assert!(copy.apply(command).is_err());
            assert_eq!(copy, state);
        }
        // Twin: the bounded record is accepted.
        let cut = RoundRecord { error: Some(long), ..Default::default() }.bounded();
        let mut copy = state.clone();
        copy.apply(&Command::RecordRound(cut)).unwrap();
    }
}
