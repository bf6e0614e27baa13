//! The connections between nodes: one TCP connection per pair of nodes, dialed by the node of
//! the lower id and redialed whenever it drops, carrying every group's Raft messages and the
//! forwarded page I/O in both directions, each request tagged with an id its response names.
//! A forwarded request on a pair with no connection fails at once (the forwarding node waits
//! and asks again). A Raft message on such a pair first waits one [`REDIAL`] for the link to
//! come back, then fails: openraft's replication task sends a failed append again at once,
//! and failing at once made each leader spin on its dead peer (some 50,000 failed appends a
//! second per node, which cut the live groups' writes twelvefold while a node was down). So
//! a dead node costs its peers a redial every [`REDIAL`] and a few failed messages per group
//! per [`REDIAL`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tundra_raft::network::{Call, Envelope, Transport};

use crate::messages::{PeerRequest, PeerResponse};
use crate::wire::{self, ClusterKey, Kind, Session};

/// How long a node waits before dialing a peer again.
pub const REDIAL: Duration = Duration::from_millis(100);
/// How long a Raft RPC may take before it counts as lost.
const RAFT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may carry nothing from its peer before the peer counts as out of
/// reach ([`PeerTransport::is_connected`]): five times the longest heartbeat interval of a
/// group (tundra-raft's `heartbeat_config`), so a peer that shares a group with this node is
/// heard from well within it while it answers.
pub const SILENCE: Duration = Duration::from_secs(5);

/// What a node does with a peer's request.
pub type Handler =
    Arc<dyn Fn(u64, PeerRequest) -> std::pin::Pin<Box<dyn Future<Output = PeerResponse> + Send>> + Send + Sync>;

/// One established connection.
struct Conn {
    out: mpsc::UnboundedSender<(Kind, u64, Vec<u8>)>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>,
    next_id: AtomicU64,
    /// When a frame last came from the peer (or the connection was made), in milliseconds
    /// since the transport's `epoch`.
    heard: AtomicU64,
}

struct Link {
    addr: String,
    conn: Mutex<Option<Arc<Conn>>>,
}

/// Bytes this node sent, by what they carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TrafficStats {
    /// Frame bytes of Raft messages (appends, votes, snapshots) sent to peers.
    pub raft_bytes_sent: u64,
    /// Frame bytes of everything else sent (forwarded I/O, answers).
    pub other_bytes_sent: u64,
    /// Bytes of the largest Raft message sent: an append carries at most about a mebibyte of
    /// entries (tundra-raft's `APPEND_BYTES`), a snapshot's piece a mebibyte.
    pub largest_raft_message_sent: u64,
}

struct Inner {
    me: u64,
    key: Option<ClusterKey>,
    /// Every peer's link; a node added while running (join.rs) gets one then.
    links: parking_lot::RwLock<BTreeMap<u64, Arc<Link>>>,
    handler: OnceLock<Handler>,
    raft_bytes: AtomicU64,
    other_bytes: AtomicU64,
    largest_raft: AtomicU64,
    /// The budget of moves' catch-up traffic (pace.rs).
    pace: Arc<crate::pace::CatchUpPace>,
    /// The origin of the connections' `heard` times.
    epoch: std::time::Instant,
}

impl Inner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A node's connections to its peers.
#[derive(Clone)]
pub struct PeerTransport {
    inner: Arc<Inner>,
}

impl PeerTransport {
    /// The transport of node `me` to `peers` (id and peer address, `me` excluded).
    pub fn new(me: u64, peers: &[(u64, String)], key: Option<ClusterKey>) -> PeerTransport {
        let links = peers
            .iter()
            .filter(|(id, _)| *id != me)
            .map(|(id, addr)| (*id, Arc::new(Link { addr: addr.clone(), conn: Mutex::new(None) })))
            .collect();
        let inner = Inner {
            me,
            key,
            links: parking_lot::RwLock::new(links),
            handler: OnceLock::new(),
            raft_bytes: AtomicU64::new(0),
            largest_raft: AtomicU64::new(0),
            other_bytes: AtomicU64::new(0),
            pace: Arc::new(crate::pace::CatchUpPace::default()),
            epoch: std::time::Instant::now(),
        };
        PeerTransport { inner: Arc::new(inner) }
    }

    /// Starts accepting peers on `listener` and dialing the peers of higher ids; requests
    /// go to `handler`. Called once, on the node's runtime.
    pub fn start(&self, listener: TcpListener, handler: Handler) {
        assert!(self.inner.handler.set(handler).is_ok(), "a transport is started once");
        tokio::spawn(accept_loop(self.inner.clone(), listener));
        let links: Vec<(u64, Arc<Link>)> = self.inner.links.read().iter().map(|(&p, l)| (p, l.clone())).collect();
        for (peer, link) in links {
            if peer > self.inner.me {
                tokio::spawn(dial_loop(self.inner.clone(), peer, link));
            }
        }
    }

    /// Links node `peer` at `addr`, a node added while this one runs (join.rs): dialed from
    /// now on if its id is higher, admitted when it dials otherwise. A peer linked already is
    /// left as it is. Called on the node's runtime, after [`PeerTransport::start`].
    pub fn add_peer(&self, peer: u64, addr: &str) {
        if peer == self.inner.me {
            return;
        }
        let link = {
            let mut links = self.inner.links.write();
            if links.contains_key(&peer) {
                return;
            }
            let link = Arc::new(Link { addr: addr.to_string(), conn: Mutex::new(None) });
            links.insert(peer, link.clone());
            link
        };
        if peer > self.inner.me {
            tokio::spawn(dial_loop(self.inner.clone(), peer, link));
        }
    }

    /// Whether `peer` is in reach: a connection to it is established and something came from it
    /// within [`SILENCE`]. A partition holds a connection's bytes without closing it, so a peer
    /// cut off this way stays connected; counted in reach, it had a leader capture a chunk for
    /// it, applies waiting, for a send that could only fail.
    pub fn is_connected(&self, peer: u64) -> bool {
        let Some(link) = self.inner.links.read().get(&peer).cloned() else { return false };
        let conn = link.conn.lock().clone();
        conn.is_some_and(|conn| {
            let silent = self.inner.now_ms().saturating_sub(conn.heard.load(Ordering::Relaxed));
            linked_by_connection() || Duration::from_millis(silent) <= SILENCE
        })
    }

    /// The budget of moves' catch-up traffic.
    pub fn pace(&self) -> &Arc<crate::pace::CatchUpPace> {
        &self.inner.pace
    }

    pub fn traffic(&self) -> TrafficStats {
        TrafficStats {
            raft_bytes_sent: self.inner.raft_bytes.load(Ordering::Relaxed),
            other_bytes_sent: self.inner.other_bytes.load(Ordering::Relaxed),
            largest_raft_message_sent: self.inner.largest_raft.load(Ordering::Relaxed),
        }
    }

    /// Sends a request to `peer` and waits at most `timeout` for its answer.
    pub async fn call(&self, peer: u64, request: &PeerRequest, timeout: Duration) -> Result<PeerResponse, String> {
        call(&self.inner, peer, request, timeout).await
    }
}

async fn call(inner: &Inner, peer: u64, request: &PeerRequest, timeout: Duration) -> Result<PeerResponse, String> {
    let link =
        inner.links.read().get(&peer).cloned().ok_or_else(|| format!("node {peer} is not a peer of this node"))?;
    let conn = link.conn.lock().clone().ok_or_else(|| format!("no connection to node {peer} ({})", link.addr))?;
    let body = tundra_raft::codec::encode(request);
    if matches!(request, PeerRequest::Raft(_)) {
        inner.raft_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        inner.largest_raft.fetch_max(body.len() as u64, Ordering::Relaxed);
    } else {
        inner.other_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    }
    let id = conn.next_id.fetch_add(1, Ordering::Relaxed);
    let (sender, receiver) = oneshot::channel();
    conn.pending.lock().insert(id, sender);
    if conn.out.send((Kind::Request, id, body)).is_err() {
        conn.pending.lock().remove(&id);
        return Err(format!("the connection to node {peer} closed"));
    }
    match tokio::time::timeout(timeout, receiver).await {
        Ok(Ok(bytes)) => tundra_raft::codec::decode(&bytes).map_err(|e| format!("node {peer} answered bytes {e}")),
        Ok(Err(_)) => Err(format!("the connection to node {peer} closed before it answered")),
        Err(_) => {
            conn.pending.lock().remove(&id);
            Err(format!("node {peer} did not answer within {timeout:?}"))
        }
    }
}

impl Transport for PeerTransport {
    fn call(&self, envelope: Envelope) -> Call {
        let inner = self.inner.clone();
        Box::pin(async move {
            let to = envelope.to;
            // A move's snapshot to its learner waits for its budget (pace.rs).
            if matches!(envelope.rpc, tundra_raft::network::Rpc::Snapshot { .. })
                && inner.pace.paces(envelope.group.0, to)
            {
                let bytes = tundra_raft::codec::encode(&envelope).len() as u64;
                tokio::time::sleep(inner.pace.reserve(bytes)).await;
            }
            let unlinked = |inner: &Inner| inner.links.read().get(&to).is_some_and(|link| link.conn.lock().is_none());
            if unlinked(&inner) && !fails_at_once() {
                tokio::time::sleep(REDIAL).await;
            }
            match call(&inner, to, &PeerRequest::Raft(envelope), RAFT_TIMEOUT).await? {
                PeerResponse::Raft(reply) => reply,
                PeerResponse::Forward(_) => Err(format!("node {to} answered a Raft message with another kind")),
            }
        })
    }

    fn is_connected(&self, peer: u64) -> bool {
        PeerTransport::is_connected(self, peer)
    }
}

/// A twin's hook: `TUNDRA_TEST_LINKED_BY_CONNECTION=1` counts a peer in reach while its
/// connection is up, heard from or not (as before [`SILENCE`]); the bug `cluster_silent_link`
/// must catch. Unset in production.
fn linked_by_connection() -> bool {
    static BY_CONNECTION: OnceLock<bool> = OnceLock::new();
    *BY_CONNECTION.get_or_init(|| std::env::var("TUNDRA_TEST_LINKED_BY_CONNECTION").is_ok_and(|v| v == "1"))
}

/// A test-only hook: `TUNDRA_TEST_RAFT_FAILS_AT_ONCE=1` takes the wait out of a Raft message
/// on a pair with no connection, so that the test of a dead peer's cost can show it spin.
fn fails_at_once() -> bool {
    static AT_ONCE: OnceLock<bool> = OnceLock::new();
    *AT_ONCE.get_or_init(|| std::env::var("TUNDRA_TEST_RAFT_FAILS_AT_ONCE").is_ok_and(|v| v == "1"))
}

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(REDIAL).await;
            continue;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let me = inner.me;
            let admit = |peer: u64| peer < me && inner.links.read().contains_key(&peer);
            let handshake = wire::accept_handshake(&mut stream, me, inner.key.as_ref(), admit);
            match tokio::time::timeout(Duration::from_secs(5), handshake).await {
                Ok(Ok(session)) => serve(inner, stream, session).await,
                Ok(Err(why)) => eprintln!("tundra: refused a peer connection: {why}"),
                Err(_) => eprintln!("tundra: refused a peer connection: no handshake within 5 s"),
            }
        });
    }
}

async fn dial_loop(inner: Arc<Inner>, peer: u64, link: Arc<Link>) {
    let mut said = false;
    loop {
        let dialed = async {
            let mut stream = TcpStream::connect(&link.addr).await.map_err(|e| e.to_string())?;
            let _ = stream.set_nodelay(true);
            let session = wire::dial_handshake(&mut stream, inner.me, peer, inner.key.as_ref()).await?;
            Ok::<_, String>((stream, session))
        };
        match tokio::time::timeout(Duration::from_secs(5), dialed).await {
            Ok(Ok((stream, session))) => {
                said = false;
                serve(inner.clone(), stream, session).await;
            }
            Ok(Err(why))
                if !said && (why.contains("cluster key") || why.contains("not node") || why.contains("version")) =>
            {
                eprintln!("tundra: node {peer} at {} refused: {why}", link.addr);
                said = true;
            }
            _ => {}
        }
        tokio::time::sleep(REDIAL).await;
    }
}

/// Runs one connection until it fails: a writer task seals what is queued, this task reads.
async fn serve(inner: Arc<Inner>, stream: TcpStream, session: Session) {
    let Session { peer, mut send, mut receive } = session;
    let Some(link) = inner.links.read().get(&peer).cloned() else { return };
    let (mut reader, writer) = stream.into_split();
    let (out, mut queue) = mpsc::unbounded_channel::<(Kind, u64, Vec<u8>)>();
    let heard = AtomicU64::new(inner.now_ms());
    let conn = Arc::new(Conn { out, pending: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1), heard });
    *link.conn.lock() = Some(conn.clone());
    let writing = tokio::spawn(async move {
        let mut writer = tokio::io::BufWriter::new(writer);
        while let Some((kind, id, body)) = queue.recv().await {
            if writer.write_all(&wire::seal(&mut send, kind, id, &body)).await.is_err() {
                return;
            }
            if queue.is_empty() && writer.flush().await.is_err() {
                return;
            }
            tundra_raft::lat::mark(if kind == Kind::Request { "tx.request" } else { "tx.response" });
        }
    });
    loop {
        let frame = match wire::read_frame(&mut reader, &mut receive).await {
            Ok(frame) => frame,
            Err(why) => {
                if !why.contains("eof") && !why.contains("reset") {
                    eprintln!("tundra: the connection to node {peer} ended: {why}");
                }
                break;
            }
        };
        conn.heard.store(inner.now_ms(), Ordering::Relaxed);
        tundra_raft::lat::mark(if frame.kind == Kind::Request { "rx.request" } else { "rx.response" });
        match frame.kind {
            Kind::Response => {
                if let Some(sender) = conn.pending.lock().remove(&frame.id) {
                    let _ = sender.send(frame.body);
                }
            }
            Kind::Request => {
                // Decoded on the request's own task, so a large message never holds up the
                // reading of the next.
                let handler = inner.handler.get().cloned();
                let conn = conn.clone();
                let inner = inner.clone();
                tokio::spawn(async move {
                    tundra_raft::lat::mark("handler");
                    let Some(handler) = handler else { return };
                    let request: PeerRequest = match tundra_raft::codec::decode(&frame.body) {
                        Ok(request) => request,
                        Err(why) => {
                            // An authenticated peer sent bytes this build cannot read: it gets
                            // no answer, and its call times out.
                            eprintln!("tundra: node {peer} sent a request that is {why}");
                            return;
                        }
                    };
                    let response = tundra_raft::codec::encode(&handler(peer, request).await);
                    inner.other_bytes.fetch_add(response.len() as u64, Ordering::Relaxed);
                    let _ = conn.out.send((Kind::Response, frame.id, response));
                });
            }
        }
    }
    writing.abort();
    let mut current = link.conn.lock();
    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
        *current = None;
    }
    drop(current);
    // Every caller still waiting hears that the connection closed.
    conn.pending.lock().clear();
}
