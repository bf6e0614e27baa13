//! The listening socket, the accept thread and one thread per connection, and shutdown.
//!
//! Connections are capped ([`Limits::max_connections`]): at the cap, a new connection closes
//! the one that has been negotiating longest, else one idle past [`Limits::evict_idle_after`],
//! and is refused when there is neither. So idle or half-open connections can never lock out a
//! valid client, and the threads and descriptors stay bounded whatever clients do.
//!
//! Shutdown sets a flag, shuts down the listening socket (which wakes the blocked `accept`) and
//! the read side of every connection (which wakes a blocked read with end of file). A connection
//! busy with a request finishes it and sends its reply, then sees the flag and closes. After
//! [`SHUTDOWN_GRACE`] the remaining sockets are shut down both ways, which also ends a reply
//! blocked on a client that stopped reading. The threads are then joined; the only wait left
//! unbounded is an export call that never returns.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::connection;
use crate::export::Exports;
use crate::limits::{Budget, Limits};
use crate::stats::{Counters, Stats};

/// How long shutdown waits for in-flight requests before cutting connections.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Pause after a failed `accept` (out of file descriptors, say), so the loop does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// An NBD server: listens on one address, serves each connection on its own thread.
pub struct Server {
    local_addr: SocketAddr,
    listener: Arc<TcpListener>,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

/// What the accept thread, the connection threads and the `Server` share.
pub(crate) struct Shared {
    pub exports: Arc<dyn Exports>,
    pub limits: Limits,
    /// Payload bytes all connections may hold at once.
    pub budget: Budget,
    /// The clock connections' activity is measured on.
    pub started: Instant,
    pub counters: Counters,
    pub stopping: AtomicBool,
    connections: Mutex<Connections>,
    /// Signalled whenever a connection closes.
    closed: Condvar,
    /// Why the last connection closed for a protocol violation, with the client's address.
    pub last_protocol_error: Mutex<Option<String>>,
}

#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, Open>,
    threads: Vec<JoinHandle<()>>,
}

/// What the server knows of an open connection.
struct Open {
    /// A handle on the socket, to shut it down from outside.
    stream: TcpStream,
    /// The export it negotiated; None while it is negotiating.
    export: Option<String>,
    activity: Arc<Activity>,
}

/// When a connection last did something, shared with its thread.
#[derive(Default)]
pub(crate) struct Activity {
    /// Milliseconds after the server started, when the connection opened.
    opened_ms: AtomicU64,
    /// Milliseconds after the server started, when the last request was done; 0 while the
    /// connection is negotiating.
    last_request_ms: AtomicU64,
}

impl Activity {
    /// Marks a request done (or the negotiation finished) now.
    pub fn touch(&self, started: Instant) {
        self.last_request_ms.store(millis_since(started).max(1), Ordering::Relaxed);
    }
}

fn millis_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Server {
    /// Binds `addr` (for example "127.0.0.1:10809", or port 0 for any free port) and returns at
    /// once; connections are accepted and served on background threads.
    pub fn start(addr: &str, exports: Arc<dyn Exports>) -> io::Result<Server> {
        Server::start_with(addr, exports, Limits::default())
    }

    /// [`Server::start`] with other limits; limits that cannot work are `InvalidInput`.
    pub fn start_with(addr: &str, exports: Arc<dyn Exports>, limits: Limits) -> io::Result<Server> {
        if let Some(problem) = limits.problem() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("NBD limits: {problem}")));
        }
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let listener = Arc::new(TcpListener::bind(addrs.as_slice())?);
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            exports,
            budget: Budget::new(limits.max_buffered_bytes),
            limits,
            started: Instant::now(),
            counters: Counters::default(),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Connections::default()),
            closed: Condvar::new(),
            last_protocol_error: Mutex::new(None),
        });
        let accept_thread = {
            let (listener, shared) = (Arc::clone(&listener), Arc::clone(&shared));
            std::thread::Builder::new().name(format!("nbd-accept-{}", local_addr.port())).spawn(move || {
                accept_loop(&listener, &shared);
            })?
        };
        Ok(Server { local_addr, listener, shared, accept_thread: Some(accept_thread) })
    }

    /// The address the server listens on, with the port the system chose for port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The counters, as they are now.
    pub fn stats(&self) -> Stats {
        let held = self.shared.limits.max_buffered_bytes - self.shared.budget.available();
        Stats { payload_bytes_held: held, ..self.shared.counters.snapshot() }
    }

    /// Why the most recent connection closed for a protocol violation (counted in
    /// [`Stats::protocol_errors`]), prefixed with the client's address; for logs.
    pub fn last_protocol_error(&self) -> Option<String> {
        self.shared.last_protocol_error.lock().clone()
    }

    /// Closes every connection that negotiated `export` (a volume that was deleted, say): a
    /// request in progress finishes, and the client sees the connection close. Returns how
    /// many were closed.
    pub fn close_export(&self, export: &str) -> usize {
        self.shared.close_export(export)
    }

    /// [`Server::close_export`] as a function, for whoever learns that an export is gone (the
    /// node, when a volume is deleted). It keeps no server alive: once the server is gone it
    /// closes nothing (the exports often hold whoever holds this, and a cycle would leak both).
    pub fn export_closer(&self) -> impl Fn(&str) -> usize + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        move |export| shared.upgrade().map_or(0, |shared| shared.close_export(export))
    }

    /// The limits this server keeps.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Stops accepting, closes every connection after its in-flight request, joins the threads.
    /// Takes at most [`SHUTDOWN_GRACE`] plus the time of export calls already running. Dropping
    /// the server does the same.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept_thread) = self.accept_thread.take() else {
            return;
        };
        {
            // Under the lock, so that the accept thread either registers a connection before
            // this (and it is shut down here) or sees the flag and drops it.
            let connections = self.shared.connections.lock();
            self.shared.stopping.store(true, Ordering::SeqCst);
            for open in connections.open.values() {
                let _ = open.stream.shutdown(Shutdown::Read);
            }
        }
        wake_accept(&self.listener, self.local_addr);
        let _ = accept_thread.join();

        let deadline = Instant::now() + SHUTDOWN_GRACE;
        let mut connections = self.shared.connections.lock();
        while !connections.open.is_empty() {
            if self.shared.closed.wait_until(&mut connections, deadline).timed_out() {
                break;
            }
        }
        for open in connections.open.values() {
            let _ = open.stream.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut connections.threads);
        drop(connections);
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes the accept thread's blocked `accept` return. On Linux shutting down a listening
/// socket does it; connecting to it does it everywhere else.
fn wake_accept(listener: &TcpListener, local_addr: SocketAddr) {
    // SAFETY: the descriptor belongs to `listener`, which is alive for the whole call.
    unsafe {
        libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR);
    }
    if cfg!(not(target_os = "linux")) {
        let mut target = local_addr;
        if target.ip().is_unspecified() {
            target.set_ip(if target.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = TcpStream::connect_timeout(&target, Duration::from_secs(1));
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => {
                Counters::add(&shared.counters.connections_accepted, 1);
                spawn_connection(stream, peer, shared);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => std::thread::sleep(ACCEPT_RETRY_DELAY),
        }
    }
}

fn spawn_connection(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    let Ok(handle) = stream.try_clone() else {
        return;
    };
    let mut connections = shared.connections.lock();
    if shared.stopping.load(Ordering::SeqCst) {
        return;
    }
    // Join the threads of connections that have closed, so the list stays short.
    let (finished, running): (Vec<_>, Vec<_>) = connections.threads.drain(..).partition(|thread| thread.is_finished());
    connections.threads = running;
    for thread in finished {
        let _ = thread.join();
    }
    if connections.open.len() >= shared.limits.max_connections {
        match victim(&connections.open, shared) {
            Some(id) => {
                // Its thread sees the socket close and deregisters; the slot is taken now.
                let evicted = connections.open.remove(&id).expect("chosen among the open");
                let _ = evicted.stream.shutdown(Shutdown::Both);
                Counters::add(&shared.counters.connections_evicted, 1);
            }
            None => {
                Counters::add(&shared.counters.connections_refused, 1);
                return;
            }
        }
    }
    let id = connections.next_id;
    connections.next_id += 1;
    let activity = Arc::new(Activity::default());
    activity.opened_ms.store(millis_since(shared.started), Ordering::Relaxed);
    connections.open.insert(id, Open { stream: handle, export: None, activity: Arc::clone(&activity) });
    shared.counters.connections_open.fetch_add(1, Ordering::Relaxed);
    let thread_shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
        let _registration = Registration { shared: &thread_shared, id };
        connection::run(stream, peer, &thread_shared, id, &activity);
    });
    match spawned {
        Ok(thread) => connections.threads.push(thread),
        Err(_) => {
            // The closure and its stream were dropped, which closed the connection.
            connections.open.remove(&id);
            shared.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The connection to close for a new one at the cap: the one negotiating longest, else the one
/// idle longest if that is past `evict_idle_after`.
fn victim(open: &HashMap<u64, Open>, shared: &Shared) -> Option<u64> {
    let negotiating = open
        .iter()
        .filter(|(_, o)| o.activity.last_request_ms.load(Ordering::Relaxed) == 0)
        .min_by_key(|(id, o)| (o.activity.opened_ms.load(Ordering::Relaxed), **id));
    if let Some((&id, _)) = negotiating {
        return Some(id);
    }
    let now = millis_since(shared.started);
    let idle_ms = u64::try_from(shared.limits.evict_idle_after.as_millis()).unwrap_or(u64::MAX);
    open.iter()
        .map(|(&id, o)| (o.activity.last_request_ms.load(Ordering::Relaxed), id))
        .filter(|&(last, _)| now.saturating_sub(last) >= idle_ms)
        .min()
        .map(|(_, id)| id)
}

impl Shared {
    fn close_export(&self, export: &str) -> usize {
        let connections = self.connections.lock();
        let mut closed = 0;
        for open in connections.open.values().filter(|o| o.export.as_deref() == Some(export)) {
            let _ = open.stream.shutdown(Shutdown::Both);
            closed += 1;
        }
        closed
    }

    /// Records the export a connection negotiated, for [`Server::close_export`].
    pub(crate) fn negotiated(&self, id: u64, export: &str) {
        if let Some(open) = self.connections.lock().open.get_mut(&id) {
            open.export = Some(export.to_string());
        }
    }
}

/// Removes a connection from the open set when its thread ends, even by a panic in an export.
struct Registration<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut connections = self.shared.connections.lock();
        connections.open.remove(&self.id);
        self.shared.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
        self.shared.closed.notify_all();
    }
}
