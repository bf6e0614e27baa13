//! The simulated network: every message between two nodes is delayed by a random time, and
//! may be lost, duplicated (a second copy delivered later) or, through the random delays,
//! reordered; links can be cut in both directions (partitions), and a crashed node neither
//! sends nor receives. Every decision is drawn from the simulation's one seeded generator at
//! the moment a message is sent, so the order of sends fixes everything.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tundra_env::Rng;

use crate::host::Host;
use crate::network::{Call, Envelope, Transport};
use crate::types::NodeId;

/// How long a sender waits before it learns a message got no answer.
const LOST_AFTER: Duration = Duration::from_millis(100);

/// The network's fault probabilities for one run (chosen per seed).
#[derive(Clone, Copy, Debug)]
pub struct NetFaults {
    pub loss: f64,
    pub duplicate: f64,
    pub delay_max_ms: u64,
}

/// Counts of what the network did.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetCounts {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Messages not delivered because a link was cut or a node was down.
    pub blocked: u64,
    /// Snapshots delivered (a replica brought back with its chunk sent whole).
    pub snapshots: u64,
    /// Pieces of snapshot extents delivered (non-empty ones).
    pub snapshot_pieces: u64,
}

struct State {
    rng: Rng,
    faults: NetFaults,
    /// Each node's current incarnation and, while it is up, its host.
    nodes: BTreeMap<NodeId, (u64, Option<Arc<Host>>)>,
    /// Cut links, each in both directions.
    cut: BTreeSet<(NodeId, NodeId)>,
    counts: NetCounts,
    trace: Option<Vec<String>>,
    start: Instant,
}

/// The network all nodes of a simulated cluster share.
#[derive(Clone)]
pub struct SimNet(Arc<Mutex<State>>);

impl SimNet {
    pub fn new(rng: Rng, faults: NetFaults, trace: bool) -> SimNet {
        SimNet(Arc::new(Mutex::new(State {
            rng,
            faults,
            nodes: BTreeMap::new(),
            cut: BTreeSet::new(),
            counts: NetCounts::default(),
            trace: trace.then(Vec::new),
            start: Instant::now(),
        })))
    }

    /// A new incarnation of `node` that is not up yet: its transport, for its host.
    pub fn incarnate(&self, node: NodeId) -> NodeTransport {
        let mut state = self.0.lock();
        let entry = state.nodes.entry(node).or_insert((0, None));
        entry.0 += 1;
        entry.1 = None;
        NodeTransport { net: self.clone(), from: node, incarnation: entry.0 }
    }

    pub fn up(&self, node: NodeId, host: Arc<Host>) {
        self.0.lock().nodes.entry(node).or_insert((0, None)).1 = Some(host);
    }

    /// The node crashed: messages to it, and from its old incarnation, go nowhere.
    pub fn down(&self, node: NodeId) {
        let mut state = self.0.lock();
        let entry = state.nodes.entry(node).or_insert((0, None));
        entry.0 += 1;
        entry.1 = None;
    }

    pub fn cut(&self, a: NodeId, b: NodeId) {
        let mut state = self.0.lock();
        state.cut.insert((a, b));
        state.cut.insert((b, a));
    }

    pub fn heal(&self) {
        self.0.lock().cut.clear();
    }

    pub fn is_cut(&self) -> bool {
        !self.0.lock().cut.is_empty()
    }

    pub fn set_faults(&self, faults: NetFaults) {
        self.0.lock().faults = faults;
    }

    pub fn counts(&self) -> NetCounts {
        self.0.lock().counts
    }

    /// A line in the trace, stamped with the simulated time, if the run keeps a trace.
    pub fn note(&self, line: impl FnOnce() -> String) {
        let mut state = self.0.lock();
        let at = state.start.elapsed().as_millis();
        if let Some(trace) = state.trace.as_mut() {
            trace.push(format!("{at} {}", line()));
        }
    }

    pub fn take_trace(&self) -> Vec<String> {
        self.0.lock().trace.take().unwrap_or_default()
    }

    /// The host `to` if a message from this incarnation of `from` can reach it now.
    fn reach(&self, from: NodeId, incarnation: u64, to: NodeId) -> Option<Arc<Host>> {
        let mut state = self.0.lock();
        let sender_alive = state.nodes.get(&from).is_some_and(|(i, host)| *i == incarnation && host.is_some());
        let target = state.nodes.get(&to).and_then(|(_, host)| host.clone());
        let reached = target.filter(|_| sender_alive && !state.cut.contains(&(from, to)));
        if reached.is_none() {
            state.counts.blocked += 1;
        }
        reached
    }
}

/// One incarnation of a node's side of the network.
pub struct NodeTransport {
    net: SimNet,
    from: NodeId,
    incarnation: u64,
}

/// What the network decided for one message when it was sent.
struct Fate {
    delay: Duration,
    back: Duration,
    lose_request: bool,
    lose_reply: bool,
    duplicate_after: Option<Duration>,
}

impl NodeTransport {
    fn fate(&self) -> Fate {
        let mut state = self.net.0.lock();
        let faults = state.faults;
        let rng = &mut state.rng;
        let delay = Duration::from_millis(rng.range(0..faults.delay_max_ms + 1));
        let back = Duration::from_millis(rng.range(0..faults.delay_max_ms + 1));
        let lose_request = rng.chance(faults.loss);
        let lose_reply = rng.chance(faults.loss);
        let duplicate_after =
            rng.chance(faults.duplicate).then(|| Duration::from_millis(rng.range(1..faults.delay_max_ms + 30)));
        state.counts.sent += 1;
        state.counts.lost += u64::from(lose_request) + u64::from(lose_reply);
        state.counts.duplicated += u64::from(duplicate_after.is_some());
        Fate { delay, back, lose_request, lose_reply, duplicate_after }
    }
}

impl Transport for NodeTransport {
    /// Up while the peer runs and no cut stands between the two, as a real node's connection
    /// is (a lossy link still counts as up).
    fn is_connected(&self, peer: NodeId) -> bool {
        let state = self.net.0.lock();
        state.nodes.get(&peer).is_some_and(|(_, host)| host.is_some()) && !state.cut.contains(&(self.from, peer))
    }

    fn call(&self, envelope: Envelope) -> Call {
        let fate = self.fate();
        let (net, from, incarnation) = (self.net.clone(), self.from, self.incarnation);
        Box::pin(async move {
            tokio::time::sleep(fate.delay).await;
            let to = envelope.to;
            let target = match net.reach(from, incarnation, to) {
                Some(target) if !fate.lose_request => target,
                _ => {
                    tokio::time::sleep(LOST_AFTER).await;
                    return Err(format!("no answer from node {to}"));
                }
            };
            net.note(|| format!("{from}->{to} g{} {}", envelope.group.0, envelope.rpc.summary()));
            {
                let mut state = net.0.lock();
                state.counts.delivered += 1;
                state.counts.snapshots += u64::from(matches!(envelope.rpc, crate::network::Rpc::Snapshot { .. }));
                state.counts.snapshot_pieces += u64::from(
                    matches!(&envelope.rpc, crate::network::Rpc::SnapshotPiece { data, .. } if !data.is_empty()),
                );
            }
            if let Some(after) = fate.duplicate_after {
                let (copy, host, net) = (envelope.clone(), target.clone(), net.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    net.note(|| format!("{from}->{to} g{} again {}", copy.group.0, copy.rpc.summary()));
                    let _ = host.handle(copy).await;
                });
            }
            let reply = target.handle(envelope).await?;
            tokio::time::sleep(fate.back).await;
            if fate.lose_reply || net.reach(to, net_incarnation(&net, to), from).is_none() {
                tokio::time::sleep(LOST_AFTER).await;
                return Err(format!("the answer from node {to} was lost"));
            }
            Ok(reply)
        })
    }
}

fn net_incarnation(net: &SimNet, node: NodeId) -> u64 {
    net.0.lock().nodes.get(&node).map_or(0, |(i, _)| *i)
}
