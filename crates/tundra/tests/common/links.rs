//! Fault-injecting TCP proxies for the links between cluster nodes in the end-to-end tests.
//!
//! A node dials each peer at the address its own config's `peers` list gives, and listens on
//! its own entry's address. So a test can give node A the address of a proxy for peer B: the
//! proxy accepts A's connection, dials B's real address, and copies bytes both ways. One proxy
//! per ordered pair of nodes carries every connection A opens to B, so a test can hold the
//! bytes of one direction of a link, or both, and let them go again.
//!
//! A cut holds bytes rather than dropping them or closing connections: that is what a network
//! partition does to TCP (segments retransmitted until the path heals), so a connection stays
//! up through a cut and delivers everything late, after the heal, in order. Peers see their
//! requests time out while the cut lasts and stale messages arrive once it heals. A
//! connection opened during a cut is accepted but carries nothing until the heal.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often a held copy looks whether its direction healed.
const HOLD_POLL: Duration = Duration::from_millis(2);

/// What one proxy shares with its copying threads.
#[derive(Default)]
struct State {
    /// Bytes from the dialing node to the node dialed are held.
    forward_held: AtomicBool,
    /// Bytes from the node dialed back to the dialing node are held.
    backward_held: AtomicBool,
    stopped: AtomicBool,
    /// Reads whose bytes had to wait for a heal: evidence that a cut met live traffic.
    held_reads: AtomicU64,
}

impl State {
    fn held(&self, forward: bool) -> bool {
        if forward { self.forward_held.load(Ordering::Relaxed) } else { self.backward_held.load(Ordering::Relaxed) }
    }
}

/// A proxy on 127.0.0.1 in front of `upstream`.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(State::default());
        let shared = state.clone();
        std::thread::spawn(move || accept_loop(listener, upstream, shared));
        Proxy { addr, state }
    }

    /// Holds (true) or passes (false) the bytes the dialing node sends.
    pub fn hold_forward(&self, held: bool) {
        self.state.forward_held.store(held, Ordering::Relaxed);
    }

    /// Holds (true) or passes (false) the bytes the dialed node sends back.
    pub fn hold_backward(&self, held: bool) {
        self.state.backward_held.store(held, Ordering::Relaxed);
    }

    pub fn held_reads(&self) -> u64 {
        self.state.held_reads.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Relaxed);
        self.hold_forward(false);
        self.hold_backward(false);
        // Wakes the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<State>) {
    for incoming in listener.incoming() {
        if state.stopped.load(Ordering::Relaxed) {
            return;
        }
        let Ok(dialer) = incoming else { continue };
        // A node that is down refuses: the dialing node sees its connection closed at once.
        let Ok(dialed) = TcpStream::connect(upstream) else { continue };
        let _ = dialer.set_nodelay(true);
        let _ = dialed.set_nodelay(true);
        let (Ok(dialer_read), Ok(dialed_read)) = (dialer.try_clone(), dialed.try_clone()) else { continue };
        let forward = state.clone();
        std::thread::spawn(move || copy(dialer_read, dialed, &forward, true));
        let backward = state.clone();
        std::thread::spawn(move || copy(dialed_read, dialer, &backward, false));
    }
}

/// Copies `from` to `to` until either ends, holding bytes while the direction is cut.
fn copy(mut from: TcpStream, mut to: TcpStream, state: &State, forward: bool) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let count = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(count) => count,
        };
        if state.held(forward) {
            state.held_reads.fetch_add(1, Ordering::Relaxed);
            while state.held(forward) && !state.stopped.load(Ordering::Relaxed) {
                std::thread::sleep(HOLD_POLL);
            }
        }
        if to.write_all(&buffer[..count]).is_err() {
            break;
        }
    }
    // The end of one direction is passed on; the other direction ends when its side closes.
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

/// Which way a cut holds bytes between two nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Nothing passes between the two nodes.
    Both,
    /// Only what the first node sends is held; the second's bytes reach it.
    OneWay,
}

/// The proxies of a cluster of `count` nodes: one for every ordered pair (a, b), the address
/// node a's config gives for node b.
pub struct Links {
    count: u64,
    proxies: Vec<Proxy>,
}

impl Links {
    /// Proxies in front of the nodes' real peer addresses (`peer_addrs[id - 1]`).
    pub fn start(peer_addrs: &[SocketAddr]) -> Links {
        let count = peer_addrs.len() as u64;
        // Proxy (from, to) at index (from - 1) * count + (to - 1); the diagonal is never
        // dialed, and a proxy there keeps the indexing plain.
        let proxies = (0..count * count).map(|i| Proxy::start(peer_addrs[(i % count) as usize])).collect();
        Links { count, proxies }
    }

    fn proxy(&self, from: u64, to: u64) -> &Proxy {
        assert!((1..=self.count).contains(&from) && (1..=self.count).contains(&to) && from != to, "{from}->{to}");
        &self.proxies[((from - 1) * self.count + (to - 1)) as usize]
    }

    /// The address node `from` dials to reach node `to`.
    pub fn addr(&self, from: u64, to: u64) -> SocketAddr {
        self.proxy(from, to).addr
    }

    /// Holds what `a` sends to `b` (whichever of them dialed), and with [`Cut::Both`] what `b`
    /// sends to `a` too.
    pub fn cut(&self, a: u64, b: u64, cut: Cut) {
        self.proxy(a, b).hold_forward(true);
        self.proxy(b, a).hold_backward(true);
        if cut == Cut::Both {
            self.proxy(b, a).hold_forward(true);
            self.proxy(a, b).hold_backward(true);
        }
    }

    /// Cuts node `node` off from every other node, both ways.
    pub fn isolate(&self, node: u64) {
        for other in (1..=self.count).filter(|&o| o != node) {
            self.cut(node, other, Cut::Both);
        }
    }

    /// Every link passes everything again.
    pub fn heal(&self) {
        for proxy in &self.proxies {
            proxy.hold_forward(false);
            proxy.hold_backward(false);
        }
    }

    /// Reads held by cuts, over every proxy.
    pub fn held_reads(&self) -> u64 {
        self.proxies.iter().map(Proxy::held_reads).sum()
    }
}
