//! What one client, or all of them together, may hold of the server: connections, time and
//! memory. A storage node must keep serving its valid clients whatever the others do, so
//! nothing a client sends sizes an allocation before the bytes have arrived, and a client that
//! stalls or idles is the first to go when room is needed.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::proto::MAX_REQUEST_BYTES;

/// The limits a [`crate::Server`] keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once. When full, a new connection closes the one that has been
    /// negotiating longest, else one idle for at least `evict_idle_after`; with neither, the
    /// new connection is refused (closed at once).
    pub max_connections: usize,
    /// How long a client may take to send each part of its handshake.
    pub handshake_timeout: Duration,
    /// Once a request has begun, how long the server waits for each further piece of it (the
    /// rest of its header, its payload), and for the client to take each piece of a reply.
    /// A client that stalls longer is disconnected. Between requests a client may idle for
    /// as long as it likes.
    pub request_timeout: Duration,
    /// A negotiated connection idle this long may be closed to make room at the cap.
    pub evict_idle_after: Duration,
    /// Payload bytes held for all connections at once (write data as it arrives, read data
    /// before it is sent). A request waits for room, at most `request_timeout`. At least one
    /// request of the largest size.
    pub max_buffered_bytes: u64,
    /// Requests one connection may have in flight at once (received and not yet answered).
    /// Requests beyond it wait in the client's socket until one is answered: the server reads
    /// no further. Each request in flight may run on a thread of its own, so this also bounds
    /// a connection's threads.
    pub max_requests_in_flight: usize,
    /// Payload bytes (write data, read data) of one connection's requests in flight; a single
    /// request larger than the rest of it still runs once it is the only one. At least one
    /// request of the largest size, at most `max_buffered_bytes`, so one connection cannot
    /// take the whole budget from the others.
    pub max_bytes_in_flight: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 512,
            handshake_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            evict_idle_after: Duration::from_secs(60),
            max_buffered_bytes: 256 << 20,
            max_requests_in_flight: 16,
            max_bytes_in_flight: 64 << 20,
        }
    }
}

impl Limits {
    /// Why these limits cannot work, if they cannot.
    pub fn problem(&self) -> Option<String> {
        if self.max_connections == 0 {
            return Some("max_connections must be at least 1".into());
        }
        for (name, value) in [
            ("handshake_timeout", self.handshake_timeout),
            ("request_timeout", self.request_timeout),
            ("evict_idle_after", self.evict_idle_after),
        ] {
            if value.is_zero() {
                return Some(format!("{name} must be longer than zero"));
            }
        }
        if self.max_buffered_bytes < u64::from(MAX_REQUEST_BYTES) {
            return Some(format!(
                "max_buffered_bytes must hold at least one request of the largest size, {MAX_REQUEST_BYTES} bytes"
            ));
        }
        if self.max_requests_in_flight == 0 {
            return Some("max_requests_in_flight must be at least 1".into());
        }
        if self.max_bytes_in_flight < u64::from(MAX_REQUEST_BYTES) {
            return Some(format!(
                "max_bytes_in_flight must hold at least one request of the largest size, {MAX_REQUEST_BYTES} bytes"
            ));
        }
        if self.max_bytes_in_flight > self.max_buffered_bytes {
            return Some("max_bytes_in_flight must not be more than max_buffered_bytes".into());
        }
        None
    }
}

/// Payload bytes the connections may hold together: taken before memory is filled, given back
/// when the request is done.
pub(crate) struct Budget {
    available: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        Budget { available: Mutex::new(bytes), freed: Condvar::new() }
    }

    /// Takes `bytes` more into `held`, waiting until `deadline` for room; false if there was
    /// none by then.
    pub fn take(&self, held: &mut Held<'_>, bytes: u64, deadline: Instant) -> bool {
        let mut available = self.available.lock();
        while *available < bytes {
            if self.freed.wait_until(&mut available, deadline).timed_out() && *available < bytes {
                return false;
            }
        }
        *available -= bytes;
        held.bytes += bytes;
        true
    }

    pub fn available(&self) -> u64 {
        *self.available.lock()
    }

    fn give_back(&self, bytes: u64) {
        if bytes > 0 {
            *self.available.lock() += bytes;
            self.freed.notify_all();
        }
    }
}

/// Bytes of the budget one request holds; given back when dropped.
pub(crate) struct Held<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl<'a> Held<'a> {
    pub fn none(budget: &'a Budget) -> Held<'a> {
        Held { budget, bytes: 0 }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_never_gives_more_than_it_has_and_waits_for_room() {
        let budget = Budget::new(10);
        let soon = Instant::now() + Duration::from_millis(20);
        let mut a = Held::none(&budget);
        assert!(budget.take(&mut a, 6, soon));
        let mut b = Held::none(&budget);
        assert!(!budget.take(&mut b, 5, soon), "only 4 bytes are left");
        assert_eq!(budget.available(), 4);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let mut c = Held::none(&budget);
                budget.take(&mut c, 8, Instant::now() + Duration::from_secs(30))
            });
            drop(a);
            assert!(waiter.join().unwrap(), "room given back wakes the waiter");
        });
        drop(b);
        assert_eq!(budget.available(), 10, "every byte taken is given back");
    }

    #[test]
    fn limits_that_cannot_work_are_named() {
        assert_eq!(Limits::default().problem(), None);
        assert!(Limits { max_connections: 0, ..Limits::default() }.problem().unwrap().contains("max_connections"));
        let small = Limits { max_buffered_bytes: 1 << 20, ..Limits::default() };
        assert!(small.problem().unwrap().contains("largest size"));
        let zero = Limits { request_timeout: Duration::ZERO, ..Limits::default() };
        assert!(zero.problem().unwrap().contains("request_timeout"));
        let serial = Limits { max_requests_in_flight: 0, ..Limits::default() };
        assert!(serial.problem().unwrap().contains("max_requests_in_flight"));
        let narrow = Limits { max_bytes_in_flight: 1 << 20, ..Limits::default() };
        assert!(narrow.problem().unwrap().contains("max_bytes_in_flight"));
        let wide = Limits { max_bytes_in_flight: 512 << 20, ..Limits::default() };
        assert!(wide.problem().unwrap().contains("max_buffered_bytes"));
    }
}
