//! The server: one acceptor thread and one thread per connection, blocking sockets, no runtime.
//! This file owns the threads and their shutdown; `conn.rs` owns what a connection does.
//!
//! Shutdown is bounded. It stops accepting, shuts the read side of every connection (a thread
//! blocked reading the next request wakes at once, answers `SHUTTING_DOWN` and closes), waits
//! up to the grace period for threads still inside a service call, then shuts the sockets
//! completely and waits one more second. A thread still inside the service after that is left
//! behind, counted in the report: a service call cannot be interrupted from outside.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::conn;
use crate::frame::{VERSION_MAX, VERSION_MIN};
use crate::service::Service;

/// How the server treats its connections. `Default` gives the documented values.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Connections open at once. At the cap a new connection closes the one that has waited
    /// longest for its hello, else one idle past `evict_idle_after`; with neither it is
    /// answered `BUSY` and closed. So silent or idle connections never lock out a client.
    pub max_connections: usize,
    /// How long a new connection may take to send its hello.
    pub hello_timeout: Duration,
    /// Once a request has begun to arrive, how long the server waits for each further piece
    /// of it; a client that stalls longer is disconnected.
    pub request_timeout: Duration,
    /// How long a client may stay connected without sending a request; then it is closed.
    pub idle_timeout: Duration,
    /// A client idle this long may be closed to make room at the cap.
    pub evict_idle_after: Duration,
    /// How long a response write may block on a client that does not read, before the
    /// connection is dropped. `None` waits forever.
    pub write_timeout: Option<Duration>,
    /// How long shutdown waits for connections to finish the request they are executing.
    pub shutdown_grace: Duration,
    /// The protocol versions the server offers in its hello, inside this build's
    /// [`VERSION_MIN`]..=[`VERSION_MAX`]. Raising `min_version` turns away clients too old
    /// to speak a newer version, with `UNSUPPORTED_VERSION` naming both ranges.
    pub min_version: u16,
    pub max_version: u16,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            max_connections: 512,
            hello_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(3600),
            evict_idle_after: Duration::from_secs(60),
            write_timeout: Some(Duration::from_secs(60)),
            shutdown_grace: Duration::from_secs(5),
            min_version: VERSION_MIN,
            max_version: VERSION_MAX,
        }
    }
}

impl ServerConfig {
    /// Why this configuration cannot work, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.max_connections == 0 {
            return Some("max_connections must be at least 1".into());
        }
        let built = VERSION_MIN..=VERSION_MAX;
        if !built.contains(&self.min_version)
            || !built.contains(&self.max_version)
            || self.min_version > self.max_version
        {
            return Some(format!(
                "protocol versions {}..={} are not a range inside this build's {VERSION_MIN}..={VERSION_MAX}",
                self.min_version, self.max_version
            ));
        }
        let durations = [
            ("hello_timeout", self.hello_timeout),
            ("request_timeout", self.request_timeout),
            ("idle_timeout", self.idle_timeout),
            ("evict_idle_after", self.evict_idle_after),
        ];
        durations.iter().find(|(_, d)| d.is_zero()).map(|(name, _)| format!("{name} must be longer than zero"))
    }
}

/// What shutdown found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Connections still open when the server stopped accepting.
    pub connections: usize,
    /// Connections still busy after the grace period, whose sockets were shut completely.
    pub forced: usize,
    /// Connection threads still running when shutdown returned (stuck inside a service call);
    /// they exit when the call returns.
    pub abandoned: usize,
}

/// State shared by the acceptor, the connections and the `Server` handle.
pub(crate) struct Shared {
    pub(crate) service: Arc<dyn Service>,
    pub(crate) config: ServerConfig,
    pub(crate) stopping: AtomicBool,
    connections: Mutex<Connections>,
    /// Signalled whenever a connection ends.
    ended: Condvar,
    /// The clock connections' activity is measured on.
    started: Instant,
    /// Connections closed at the cap to make room for a new one.
    evicted: AtomicU64,
}

#[derive(Default)]
struct Connections {
    next_id: u64,
    live: HashMap<u64, Connection>,
}

struct Connection {
    /// A second handle on the socket, for shutting it from outside the connection's thread.
    stream: TcpStream,
    handle: Option<JoinHandle<()>>,
    activity: Arc<Activity>,
}

/// When a connection opened and last finished a request, in milliseconds after the server
/// started; `last_request_ms` is 0 until its hello is answered.
#[derive(Default)]
pub(crate) struct Activity {
    opened_ms: AtomicU64,
    last_request_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn touch(&self, shared: &Shared) {
        self.last_request_ms.store(millis_since(shared.started).max(1), Ordering::Relaxed);
    }
}

fn millis_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The connection to close for a new one at the cap: the one waiting longest for its hello,
/// else the one idle longest if that is past `evict_idle_after`.
fn victim(live: &HashMap<u64, Connection>, shared: &Shared) -> Option<u64> {
    let in_hello = live
        .iter()
        .filter(|(_, c)| c.activity.last_request_ms.load(Ordering::Relaxed) == 0)
        .min_by_key(|(id, c)| (c.activity.opened_ms.load(Ordering::Relaxed), **id));
    if let Some((&id, _)) = in_hello {
        return Some(id);
    }
    let now = millis_since(shared.started);
    let idle_ms = u64::try_from(shared.config.evict_idle_after.as_millis()).unwrap_or(u64::MAX);
    live.iter()
        .map(|(&id, c)| (c.activity.last_request_ms.load(Ordering::Relaxed), id))
        .filter(|&(last, _)| now.saturating_sub(last) >= idle_ms)
        .min()
        .map(|(_, id)| id)
}

impl Shared {
    /// Called by a connection's thread as its last act.
    pub(crate) fn connection_ended(&self, id: u64) {
        let mut connections = self.connections.lock();
        // Dropping our own handle detaches a thread that is about to return anyway.
        connections.live.remove(&id);
        self.ended.notify_all();
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

/// A running server. Dropping it shuts it down.
pub struct Server {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` (port 0 picks a free port) with the default configuration.
    pub fn start(addr: impl ToSocketAddrs, service: Arc<dyn Service>) -> io::Result<Server> {
        Server::start_with(addr, service, ServerConfig::default())
    }

    pub fn start_with(addr: impl ToSocketAddrs, service: Arc<dyn Service>, config: ServerConfig) -> io::Result<Server> {
        if let Some(problem) = config.problem() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("native protocol limits: {problem}")));
        }
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            service,
            config,
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Connections::default()),
            ended: Condvar::new(),
            started: Instant::now(),
            evicted: AtomicU64::new(0),
        });
        let acceptor_shared = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name(format!("tundra-accept-{}", local_addr.port()))
            .spawn(move || accept_loop(&listener, &acceptor_shared))?;
        Ok(Server { local_addr, shared, acceptor: Some(acceptor) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections open now, including ones still in their hello.
    pub fn connection_count(&self) -> usize {
        self.shared.connections.lock().live.len()
    }

    /// Connections closed at the cap to make room for a new one.
    pub fn evicted_count(&self) -> u64 {
        self.shared.evicted.load(Ordering::Relaxed)
    }

    /// Stops accepting, tells every client `SHUTTING_DOWN`, closes the connections and waits
    /// for their threads, for at most the grace period plus a second.
    pub fn shutdown(mut self) -> ShutdownReport {
        self.stop()
    }

    fn stop(&mut self) -> ShutdownReport {
        let Some(acceptor) = self.acceptor.take() else {
            return ShutdownReport::default();
        };
        self.shared.stopping.store(true, Ordering::Release);
        wake_acceptor(self.local_addr);
        // The acceptor checks the flag after every accept, so our own connection ends it.
        let _ = acceptor.join();

        let mut report = ShutdownReport::default();
        {
            let connections = self.shared.connections.lock();
            report.connections = connections.live.len();
            for connection in connections.live.values() {
                // Wakes a thread blocked reading the next request: its read returns end of file.
                let _ = connection.stream.shutdown(Shutdown::Read);
            }
        }
        report.forced = self.wait_for_connections(self.shared.config.shutdown_grace);
        if report.forced > 0 {
            for connection in self.shared.connections.lock().live.values() {
                // A thread blocked writing to a client that does not read fails at once.
                let _ = connection.stream.shutdown(Shutdown::Both);
            }
            report.abandoned = self.wait_for_connections(Duration::from_secs(1));
        }
        report
    }

    /// Waits until no connection is left or `limit` has passed; returns how many are left.
    fn wait_for_connections(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut connections = self.shared.connections.lock();
        while !connections.live.is_empty() {
            if self.shared.ended.wait_until(&mut connections, deadline).timed_out() {
                break;
            }
        }
        let finished: Vec<JoinHandle<()>> =
            connections.live.values_mut().filter_map(|c| c.handle.take_if(|h| h.is_finished())).collect();
        let left = connections.live.len();
        drop(connections);
        for handle in finished {
            let _ = handle.join();
        }
        left
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Opens and drops a connection to the listener so that a blocked `accept` returns.
fn wake_acceptor(addr: SocketAddr) {
    let target = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    };
    let _ = TcpStream::connect_timeout(&target, Duration::from_secs(1));
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.is_stopping() {
            return;
        }
        match accepted {
            Ok((stream, _peer)) => spawn_connection(shared, stream),
            // Out of descriptors or a connection reset before we took it: keep serving the
            // others, without spinning.
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn spawn_connection(shared: &Arc<Shared>, stream: TcpStream) {
    let Ok(outside) = stream.try_clone() else {
        return;
    };
    let activity = Arc::new(Activity::default());
    activity.opened_ms.store(millis_since(shared.started), Ordering::Relaxed);
    let (id, busy) = {
        let mut connections = shared.connections.lock();
        let id = connections.next_id;
        connections.next_id += 1;
        let mut busy = connections.live.len() >= shared.config.max_connections;
        if busy && let Some(evict) = victim(&connections.live, shared) {
            // Its thread sees the socket close and ends; the slot is taken now.
            if let Some(evicted) = connections.live.remove(&evict) {
                let _ = evicted.stream.shutdown(Shutdown::Both);
            }
            shared.evicted.fetch_add(1, Ordering::Relaxed);
            busy = false;
        }
        let connection = Connection { stream: outside, handle: None, activity: Arc::clone(&activity) };
        connections.live.insert(id, connection);
        (id, busy)
    };
    let thread_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name(format!("tundra-conn-{id}"))
        .spawn(move || conn::serve(&thread_shared, id, stream, busy, &activity));
    let mut connections = shared.connections.lock();
    match spawned {
        Ok(handle) => {
            // The thread may have ended already and removed its entry; then the handle is dropped.
            if let Some(connection) = connections.live.get_mut(&id) {
                connection.handle = Some(handle);
            }
        }
        Err(_) => {
            connections.live.remove(&id);
        }
    }
}
