//! The bytes on a connection between two nodes (docs/format.md, "Peer protocol"): a handshake
//! in which each side names itself and, with a cluster key, proves it holds the key; then
//! frames, each a 16-byte header (body length, kind, version, request id), the body and a tag.
//!
//! With a key, the handshake is a challenge and response: each side sends a fresh 32-byte nonce
//! and answers with HMAC-SHA256(key, role, both nonces, both ids), so neither a replay nor a
//! node without the key gets in; every frame then carries HMAC-SHA256 under a key derived from
//! the handshake for its direction, over a per-direction counter, the header and the body, so
//! a frame cannot be changed, dropped, replayed or moved without the connection failing.
//! Without a key (loopback only) the tag is a CRC-32C of the header and body, against damage.
//! Secrecy is not offered: the traffic is pages the nodes store as they are.
//!
//! Nothing read from a peer is trusted before it is checked: lengths are bounded before any
//! buffer is sized, unknown kinds and versions are refused, and a frame whose tag fails ends
//! the connection.

use std::io::Read;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type HmacSha256 = Hmac<Sha256>;

/// The peer protocol's version: both sides must speak it.
pub const PEER_VERSION: u8 = 1;
const HELLO_MAGIC: &[u8; 8] = b"TUNDRAPR";
const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const HEADER_BYTES: usize = 16;
/// The largest frame body: a whole chunk's snapshot travels in one.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Request = 1,
    Response = 2,
}

/// The cluster's shared secret.
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

/// The shortest key accepted.
pub const MIN_KEY_BYTES: usize = 32;

impl ClusterKey {
    pub fn new(bytes: Vec<u8>) -> Result<ClusterKey, String> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(format!("a cluster key of {} bytes; at least {MIN_KEY_BYTES} are needed", bytes.len()));
        }
        Ok(ClusterKey(bytes))
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        parts.iter().for_each(|part| mac.update(part));
        mac.finalize().into_bytes().into()
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey({} bytes)", self.0.len())
    }
}

fn nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    let mut nonce = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(nonce)
}

fn hello(node: u64, nonce: &[u8; NONCE_BYTES]) -> Vec<u8> {
    let mut out = HELLO_MAGIC.to_vec();
    out.push(PEER_VERSION);
    out.extend_from_slice(&node.to_le_bytes());
    out.extend_from_slice(nonce);
    out
}

const HELLO_BYTES: usize = 8 + 1 + 8 + NONCE_BYTES;

fn parse_hello(bytes: &[u8; HELLO_BYTES]) -> Result<(u64, [u8; NONCE_BYTES]), String> {
    if &bytes[..8] != HELLO_MAGIC {
        return Err("the peer does not speak Tundra's peer protocol".into());
    }
    if bytes[8] != PEER_VERSION {
        return Err(format!("the peer speaks peer protocol version {}, this node {PEER_VERSION}", bytes[8]));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[9..17]);
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&bytes[17..]);
    Ok((u64::from_le_bytes(id), nonce))
}

/// Both sides' names and nonces, in the dialer-first order every proof and key is over.
struct Transcript {
    dialer: u64,
    listener: u64,
    dialer_nonce: [u8; NONCE_BYTES],
    listener_nonce: [u8; NONCE_BYTES],
}

impl Transcript {
    fn proof(&self, key: &ClusterKey, role: &[u8]) -> [u8; PROOF_BYTES] {
        key.mac(&[
            b"tundra peer proof",
            role,
            &self.dialer.to_le_bytes(),
            &self.listener.to_le_bytes(),
            &self.dialer_nonce,
            &self.listener_nonce,
        ])
    }

    fn sealer(&self, key: Option<&ClusterKey>, direction: &[u8]) -> Sealer {
        let derived = key.map(|key| {
            key.mac(&[b"tundra peer session", direction, &self.dialer_nonce, &self.listener_nonce]).to_vec()
        });
        Sealer { key: derived, counter: 0 }
    }
}

/// Tags (or checks) one direction's frames.
pub struct Sealer {
    key: Option<Vec<u8>>,
    counter: u64,
}

impl Sealer {
    fn tag_len(&self) -> usize {
        if self.key.is_some() { 32 } else { 4 }
    }

    fn tag(&mut self, header: &[u8], body: &[u8]) -> Vec<u8> {
        let counter = self.counter;
        self.counter += 1;
        match &self.key {
            Some(key) => {
                let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
                mac.update(&counter.to_le_bytes());
                mac.update(header);
                mac.update(body);
                mac.finalize().into_bytes().to_vec()
            }
            None => crc32c::crc32c_append(crc32c::crc32c(header), body).to_le_bytes().to_vec(),
        }
    }

    fn check(&mut self, header: &[u8], body: &[u8], tag: &[u8]) -> bool {
        let counter = self.counter;
        self.counter += 1;
        match &self.key {
            Some(key) => {
                let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
                mac.update(&counter.to_le_bytes());
                mac.update(header);
                mac.update(body);
                mac.verify_slice(tag).is_ok()
            }
            None => crc32c::crc32c_append(crc32c::crc32c(header), body).to_le_bytes()[..] == *tag,
        }
    }
}

/// An established connection's two directions.
pub struct Session {
    pub peer: u64,
    pub send: Sealer,
    pub receive: Sealer,
}

/// The dialer's side of the handshake with the node expected to be `expected`.
pub async fn dial_handshake<S>(
    stream: &mut S,
    me: u64,
    expected: u64,
    key: Option<&ClusterKey>,
) -> Result<Session, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let my_nonce = nonce().map_err(|e| format!("reading a nonce: {e}"))?;
    stream.write_all(&hello(me, &my_nonce)).await.map_err(io)?;
    let mut reply = [0u8; HELLO_BYTES];
    stream.read_exact(&mut reply).await.map_err(io)?;
    let (peer, peer_nonce) = parse_hello(&reply)?;
    if peer != expected {
        return Err(format!("the node at this address is node {peer}, not node {expected}"));
    }
    let transcript = Transcript { dialer: me, listener: peer, dialer_nonce: my_nonce, listener_nonce: peer_nonce };
    if let Some(key) = key {
        let mut proof = [0u8; PROOF_BYTES];
        stream.read_exact(&mut proof).await.map_err(io)?;
        if !constant_time_eq(&proof, &transcript.proof(key, b"listener")) {
            return Err(format!("node {peer} did not prove it holds the cluster key"));
        }
        stream.write_all(&transcript.proof(key, b"dialer")).await.map_err(io)?;
    }
    Ok(Session { peer, send: transcript.sealer(key, b"dialer"), receive: transcript.sealer(key, b"listener") })
}

/// The listener's side: the dialer names itself, and `admit` says whether that node may
/// connect.
pub async fn accept_handshake<S>(
    stream: &mut S,
    me: u64,
    key: Option<&ClusterKey>,
    admit: impl Fn(u64) -> bool,
) -> Result<Session, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut first = [0u8; HELLO_BYTES];
    stream.read_exact(&mut first).await.map_err(io)?;
    let (peer, peer_nonce) = parse_hello(&first)?;
    if !admit(peer) {
        return Err(format!("node {peer} is not a peer this node accepts connections from"));
    }
    let my_nonce = nonce().map_err(|e| format!("reading a nonce: {e}"))?;
    stream.write_all(&hello(me, &my_nonce)).await.map_err(io)?;
    let transcript = Transcript { dialer: peer, listener: me, dialer_nonce: peer_nonce, listener_nonce: my_nonce };
    if let Some(key) = key {
        stream.write_all(&transcript.proof(key, b"listener")).await.map_err(io)?;
        let mut proof = [0u8; PROOF_BYTES];
        stream.read_exact(&mut proof).await.map_err(io)?;
        if !constant_time_eq(&proof, &transcript.proof(key, b"dialer")) {
            return Err(format!("node {peer} did not prove it holds the cluster key"));
        }
    }
    Ok(Session { peer, send: transcript.sealer(key, b"listener"), receive: transcript.sealer(key, b"dialer") })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// One frame, as read.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub id: u64,
    pub body: Vec<u8>,
}

/// A frame's bytes with its tag.
pub fn seal(sealer: &mut Sealer, kind: Kind, id: u64, body: &[u8]) -> Vec<u8> {
    assert!(body.len() <= MAX_FRAME_BYTES, "a frame body over the limit");
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len() + 32);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.push(kind as u8);
    out.push(PEER_VERSION);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    let tag = sealer.tag(&out, body);
    out.extend_from_slice(body);
    out.extend_from_slice(&tag);
    out
}

/// Reads one frame and checks it; any failure means the connection must end.
pub async fn read_frame<R>(reader: &mut R, sealer: &mut Sealer) -> Result<Frame, String>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut header = [0u8; HEADER_BYTES];
    reader.read_exact(&mut header).await.map_err(io)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let kind = match header[4] {
        1 => Kind::Request,
        2 => Kind::Response,
        other => return Err(format!("a frame of unknown kind {other}")),
    };
    if header[5] != PEER_VERSION || header[6..8] != [0, 0] {
        return Err(format!("a frame of version {} or with reserved bits set", header[5]));
    }
    if len > MAX_FRAME_BYTES {
        return Err(format!("a frame of {len} bytes, over the limit"));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&header[8..]);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await.map_err(io)?;
    let mut tag = vec![0u8; sealer.tag_len()];
    reader.read_exact(&mut tag).await.map_err(io)?;
    if !sealer.check(&header, &body, &tag) {
        return Err("a frame whose tag does not verify (damaged, forged or out of order)".into());
    }
    Ok(Frame { kind, id: u64::from_le_bytes(id), body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> ClusterKey {
        ClusterKey::new(vec![byte; 32]).unwrap()
    }

    async fn pair(
        dialer_key: Option<ClusterKey>,
        listener_key: Option<ClusterKey>,
    ) -> (Result<Session, String>, Result<Session, String>) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let dial = async move { dial_handshake(&mut a, 1, 2, dialer_key.as_ref()).await };
        let accept = async move { accept_handshake(&mut b, 2, listener_key.as_ref(), |id| id == 1).await };
        tokio::join!(dial, accept)
    }

    #[tokio::test]
    async fn the_same_key_connects_and_frames_verify() {
        let (dialer, listener) = pair(Some(key(7)), Some(key(7))).await;
        let (mut dialer, mut listener) = (dialer.unwrap(), listener.unwrap());
        assert_eq!(dialer.peer, 2);
        assert_eq!(listener.peer, 1);
        for id in 0..3 {
            let bytes = seal(&mut dialer.send, Kind::Request, id, b"pages");
            let frame = read_frame(&mut bytes.as_slice(), &mut listener.receive).await.unwrap();
            assert_eq!(frame, Frame { kind: Kind::Request, id, body: b"pages".to_vec() });
        }
    }

    #[tokio::test]
    async fn another_key_is_refused() {
        let (dialer, listener) = pair(Some(key(7)), Some(key(8))).await;
        assert!(dialer.is_err() || listener.is_err());
    }

    #[tokio::test]
    async fn a_node_without_the_key_is_refused() {
        // The listener holds the key; the dialer has none, so it sends no proof.
        let (a, b) = tokio::io::duplex(4096);
        let (mut a, mut b) = (a, b);
        let dial = async move {
            let result = dial_handshake(&mut a, 1, 2, None).await;
            drop(a);
            result
        };
        let accept = async move { accept_handshake(&mut b, 2, Some(&key(7)), |id| id == 1).await };
        let (_, listener) = tokio::join!(dial, accept);
        assert!(listener.is_err());
    }

    #[tokio::test]
    async fn a_changed_replayed_or_reordered_frame_is_refused() {
        let (dialer, listener) = pair(Some(key(7)), Some(key(7))).await;
        let (mut dialer, mut listener) = (dialer.unwrap(), listener.unwrap());
        let first = seal(&mut dialer.send, Kind::Request, 1, b"first");
        let second = seal(&mut dialer.send, Kind::Request, 2, b"second");
        // Every bit of a frame matters.
        for bit in 0..first.len() * 8 {
            let mut changed = first.clone();
            changed[bit / 8] ^= 1 << (bit % 8);
            let mut probe = Sealer { key: listener.receive.key.clone(), counter: 0 };
            assert!(read_frame(&mut changed.as_slice(), &mut probe).await.is_err(), "bit {bit}");
        }
        // The second frame first: out of order.
        let mut probe = Sealer { key: listener.receive.key.clone(), counter: 0 };
        assert!(read_frame(&mut second.as_slice(), &mut probe).await.is_err());
        read_frame(&mut first.as_slice(), &mut listener.receive).await.unwrap();
        // The first again: a replay.
        assert!(read_frame(&mut first.clone().as_slice(), &mut listener.receive).await.is_err());
    }

    #[tokio::test]
    async fn an_oversized_or_unknown_frame_is_refused_before_any_allocation() {
        let mut sealer = Sealer { key: None, counter: 0 };
        let mut header = vec![0xff, 0xff, 0xff, 0x7f, 1, PEER_VERSION, 0, 0];
        header.extend_from_slice(&[0; 8]);
        assert!(read_frame(&mut header.as_slice(), &mut sealer).await.is_err());
        let mut unknown = vec![0, 0, 0, 0, 9, PEER_VERSION, 0, 0];
        unknown.extend_from_slice(&[0; 8]);
        assert!(read_frame(&mut unknown.as_slice(), &mut sealer).await.is_err());
    }
}
