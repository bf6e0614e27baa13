//! The requests in flight on one connection: the gate that bounds them, the workers that run
//! them, and the one writer their replies share.
//!
//! The connection's thread reads requests (transmission.rs) and hands each checked one to a
//! worker, so a slow request (a read that misses every cache, a flush waiting for the drive)
//! does not hold up the quick ones behind it: replies go out as requests finish, in any order,
//! as the protocol allows for simple replies. A client matches them by cookie. Workers are
//! threads of the connection's scope, started as they are needed and never more than
//! [`Limits::max_requests_in_flight`](crate::Limits::max_requests_in_flight); they end with
//! the connection.
//!
//! Bounds: a request enters only when fewer than `max_requests_in_flight` are in flight and its
//! payload fits in `max_bytes_in_flight` beside theirs (a request larger than that still enters
//! alone). Until it enters the connection's thread reads nothing more, so a client that sends
//! faster than the export answers waits in its own socket buffer. Payload memory is also taken
//! from the server's shared budget, as before any request ran in parallel.
//!
//! Order where it matters: the protocol lets a server run any requests in any order, but some
//! clients (fio's `trimwrite`, say) send a trim and a write of one block back to back and
//! expect the write to win. So a request that overlaps one in flight, where either changes the
//! data, waits for it: requests on disjoint ranges, and reads of one range, overtake each other;
//! conflicting ones run in the order they came. A flush waits for the writes received before
//! it, and the export's flush covers every write completed before it is called, so every write
//! received before `NBD_CMD_FLUSH` (a fortiori every write a client saw answered) is durable
//! when the flush is answered.
//!
//! Replies: a worker writes its reply under the writer's lock and flushes the socket only if no
//! other reply is waiting for the lock, so replies finishing together leave in one system call
//! and a lone reply leaves at once. A reply that cannot be written (the client stopped reading
//! past the request timeout, or went away) ends the connection: the worker records why and shuts
//! the socket down, which wakes the connection's thread.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufWriter, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::Scope;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::connection::Close;
use crate::error::{ExportError, ExportErrorKind};
use crate::export::Export;
use crate::limits::Held;
use crate::proto;
use crate::server::{Activity, Shared};
use crate::stats::Counters;
use crate::transmission::Op;

/// Buffers up to this size are kept for the next request; larger ones are let go after theirs.
pub(crate) const KEPT_BUFFER_BYTES: usize = 256 << 10;

/// One checked request, ready for a worker.
pub(crate) struct Job<'s> {
    /// The order the connection received it in, for counting out-of-order replies.
    seq: u64,
    pub cookie: u64,
    pub op: Op,
    /// Bytes it counts against `max_bytes_in_flight`.
    bytes: u64,
    /// A write's data, with the budget it holds.
    pub payload: Vec<u8>,
    pub held: Held<'s>,
}

/// The bytes a request touches, and whether it changes them; what ordering is decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    offset: u64,
    len: u64,
    changes: bool,
    /// A flush: it conflicts with every change.
    barrier: bool,
}

impl Extent {
    pub fn of(op: Op) -> Extent {
        let (offset, len, changes, barrier) = match op {
            Op::Read { offset, len } => (offset, len as u64, false, false),
            Op::Write { offset, len, .. } => (offset, len as u64, true, false),
            Op::Trim { offset, len, .. } | Op::WriteZeroes { offset, len, .. } => (offset, len, true, false),
            Op::Flush => (0, 0, false, true),
            Op::Cache => (0, 0, false, false),
        };
        Extent { offset, len, changes, barrier }
    }

    /// Whether running `self` before or beside `earlier` could change either's result.
    fn must_follow(&self, earlier: &Extent) -> bool {
        if self.barrier {
            return earlier.changes;
        }
        let overlap = self.offset < earlier.offset.saturating_add(earlier.len)
            && earlier.offset < self.offset.saturating_add(self.len);
        overlap && (self.changes || earlier.changes)
    }
}

/// What the workers and the connection's thread share.
pub(crate) struct Pipeline<'s> {
    shared: &'s Shared,
    export: &'s dyn Export,
    stream: &'s TcpStream,
    activity: &'s Activity,
    replies: Mutex<BufWriter<&'s TcpStream>>,
    /// Replies written or waiting for the writer's lock; the last one flushes.
    replies_waiting: AtomicUsize,
    state: Mutex<State<'s>>,
    changed: Condvar,
}

#[derive(Default)]
struct State<'s> {
    queue: VecDeque<Job<'s>>,
    /// The requests admitted and not yet answered, by sequence number.
    in_flight: BTreeMap<u64, Extent>,
    bytes_in_flight: u64,
    next_seq: u64,
    workers: usize,
    idle_workers: usize,
    /// No more requests will come: idle workers end.
    closing: bool,
    /// Why the connection must end, found by a worker (or by a failed reply).
    ended: Option<Close>,
    /// Small payload buffers given back by workers, for the next writes.
    spare_buffers: Vec<Vec<u8>>,
}

impl<'s> Pipeline<'s> {
    pub fn new(
        shared: &'s Shared,
        export: &'s dyn Export,
        stream: &'s TcpStream,
        activity: &'s Activity,
        replies: BufWriter<&'s TcpStream>,
    ) -> Pipeline<'s> {
        Pipeline {
            shared,
            export,
            stream,
            activity,
            replies: Mutex::new(replies),
            replies_waiting: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// Why a worker ended the connection, if one did.
    pub fn ended(&self) -> Option<Close> {
        self.state.lock().ended.clone()
    }

    /// Waits until a request touching `extent` and carrying `bytes` of payload may enter (room,
    /// and no conflicting request in flight), and numbers it; the reason the connection ends
    /// instead, if a worker ended it meanwhile.
    pub fn admit(&self, extent: Extent, bytes: u64) -> Result<u64, Close> {
        let limits = &self.shared.limits;
        let mut state = self.state.lock();
        loop {
            if let Some(close) = &state.ended {
                return Err(close.clone());
            }
            let room = state.in_flight.len() < limits.max_requests_in_flight
                && (state.in_flight.is_empty() || state.bytes_in_flight + bytes <= limits.max_bytes_in_flight);
            let conflict = || state.in_flight.values().any(|earlier| extent.must_follow(earlier));
            if room && !conflict() {
                let seq = state.next_seq;
                state.next_seq += 1;
                state.in_flight.insert(seq, extent);
                state.bytes_in_flight += bytes;
                self.shared.counters.requests_in_flight.fetch_add(1, Ordering::Relaxed);
                return Ok(seq);
            }
            self.changed.wait(&mut state);
        }
    }

    /// A buffer for a write's payload: a spare one if there is one.
    pub fn buffer(&self) -> Vec<u8> {
        self.state.lock().spare_buffers.pop().unwrap_or_default()
    }

    /// A job for an admitted request.
    pub fn job(&self, seq: u64, cookie: u64, op: Op, bytes: u64, payload: Vec<u8>, held: Held<'s>) -> Job<'s> {
        Job { seq, cookie, op, bytes, payload, held }
    }

    /// Hands an admitted request to a worker, starting one if none is idle.
    pub fn submit<'scope>(&'scope self, scope: &'scope Scope<'scope, '_>, job: Job<'s>)
    where
        's: 'scope,
    {
        let mut state = self.state.lock();
        state.queue.push_back(job);
        if state.idle_workers == 0 && state.workers < self.shared.limits.max_requests_in_flight {
            state.workers += 1;
            drop(state);
            scope.spawn(move || self.work());
        } else {
            self.changed.notify_all();
        }
    }

    /// Forgets an admitted request that will never run (its payload did not arrive).
    pub fn abandon(&self, job: Job<'s>) {
        self.answered(job.seq, job.bytes, None);
    }

    /// No more requests come: waits until every request in flight is answered, then sends
    /// what the writer holds. Workers end once idle.
    pub fn finish(&self) {
        let mut state = self.state.lock();
        state.closing = true;
        self.changed.notify_all();
        while !state.in_flight.is_empty() {
            self.changed.wait(&mut state);
        }
        drop(state);
        let _ = self.replies.lock().flush();
    }

    /// Sends a reply (header, then payload if any). Errors end the connection.
    pub fn reply(&self, parts: &[&[u8]]) -> Result<(), Close> {
        self.replies_waiting.fetch_add(1, Ordering::AcqRel);
        let mut writer = self.replies.lock();
        let mut result = parts.iter().try_for_each(|part| writer.write_all(part));
        let others = self.replies_waiting.fetch_sub(1, Ordering::AcqRel) - 1;
        if result.is_ok() && others == 0 {
            result = writer.flush();
        }
        drop(writer);
        result.map_err(|error| self.end(Close::from(error), Shutdown::Both))
    }

    /// Sends an error reply.
    pub fn reply_error(&self, cookie: u64, errno: u32) -> Result<(), Close> {
        debug_assert_ne!(errno, 0);
        Counters::add(&self.shared.counters.error_replies, 1);
        self.reply(&[&proto::simple_reply(errno, cookie)])
    }

    /// Records why the connection ends (the first reason wins) and shuts the socket down as
    /// `how` says, which wakes the connection's thread from its read.
    fn end(&self, close: Close, how: Shutdown) -> Close {
        let mut state = self.state.lock();
        let close = state.ended.get_or_insert(close).clone();
        self.changed.notify_all();
        drop(state);
        let _ = self.stream.shutdown(how);
        close
    }

    /// A worker: runs jobs until the connection closes.
    fn work(&self) {
        let mut buf = Vec::new();
        loop {
            let job = {
                let mut state = self.state.lock();
                loop {
                    if let Some(job) = state.queue.pop_front() {
                        break job;
                    }
                    if state.closing {
                        state.workers -= 1;
                        return;
                    }
                    state.idle_workers += 1;
                    self.changed.wait(&mut state);
                    state.idle_workers -= 1;
                }
            };
            let (seq, bytes) = (job.seq, job.bytes);
            let spare = self.run(job, &mut buf);
            if buf.len() > KEPT_BUFFER_BYTES {
                buf = Vec::new();
            }
            self.activity.touch(self.shared.started);
            self.answered(seq, bytes, spare);
        }
    }

    /// Marks a request answered, counting it out of order if an earlier one is still in flight.
    fn answered(&self, seq: u64, bytes: u64, spare: Option<Vec<u8>>) {
        let mut state = self.state.lock();
        state.in_flight.remove(&seq);
        state.bytes_in_flight -= bytes;
        if state.in_flight.first_key_value().is_some_and(|(&first, _)| first < seq) {
            Counters::add(&self.shared.counters.replies_out_of_order, 1);
        }
        if let Some(spare) = spare
            && state.spare_buffers.len() < self.shared.limits.max_requests_in_flight
        {
            state.spare_buffers.push(spare);
        }
        self.shared.counters.requests_in_flight.fetch_sub(1, Ordering::Relaxed);
        self.changed.notify_all();
    }

    /// Runs one request and replies; gives back a write's buffer if it is worth keeping. A
    /// failure to reply has already ended the connection, so it needs no answer here.
    fn run(&self, job: Job<'s>, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
        let counters = &self.shared.counters;
        let export = self.export;
        let Job { cookie, op, payload, held, .. } = job;
        let (result, bytes_counter, len) = match op {
            Op::Read { offset, len } => {
                drop(held);
                let _ = self.read(cookie, offset, len, buf);
                return None;
            }
            Op::Write { offset, len, fua } => {
                (export.write(offset, &payload[..len], fua), Some(&counters.bytes_written), len as u64)
            }
            Op::Flush => (export.flush(), None, 0),
            Op::Trim { offset, len, fua } => (export.trim(offset, len, fua), Some(&counters.bytes_trimmed), len),
            Op::WriteZeroes { offset, len, may_trim, fua } => {
                (export.write_zeroes(offset, len, may_trim, fua), Some(&counters.bytes_zeroed), len)
            }
            // The hint is accepted and ignored: the export has no cache to fill.
            Op::Cache => (Ok(()), None, 0),
        };
        drop(held);
        let _ = match result {
            Ok(()) => {
                if let Some(counter) = bytes_counter {
                    Counters::add(counter, len);
                }
                self.reply(&[&proto::simple_reply(0, cookie)])
            }
            Err(error) => self.export_failed(cookie, &error),
        };
        (payload.capacity() <= KEPT_BUFFER_BYTES && payload.capacity() > 0).then_some(payload)
    }

    /// Reads first and replies after, so that an error is never found once the reply header
    /// has promised data. The payload's memory is taken from the server's budget first.
    fn read(&self, cookie: u64, offset: u64, len: usize, buf: &mut Vec<u8>) -> Result<(), Close> {
        let mut held = Held::none(&self.shared.budget);
        let deadline = Instant::now() + self.shared.limits.request_timeout;
        if !self.shared.budget.take(&mut held, len as u64, deadline) {
            return Err(self.end(Close::TimedOut, Shutdown::Both));
        }
        if buf.len() < len {
            buf.resize(len, 0);
        }
        match self.export.read(offset, &mut buf[..len]) {
            Ok(()) => {
                Counters::add(&self.shared.counters.bytes_read, len as u64);
                self.reply(&[&proto::simple_reply(0, cookie), &buf[..len]])
            }
            Err(error) => self.export_failed(cookie, &error),
        }
    }

    /// Replies with the export's error. An export that is gone (its volume was deleted) ends
    /// the connection after the reply: nothing it could serve remains.
    fn export_failed(&self, cookie: u64, error: &ExportError) -> Result<(), Close> {
        Counters::add(&self.shared.counters.export_errors, 1);
        self.reply_error(cookie, error.errno())?;
        if error.kind() == ExportErrorKind::Shutdown {
            let _ = self.replies.lock().flush();
            return Err(self.end(Close::Gone, Shutdown::Read));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: u64, len: usize) -> Extent {
        Extent::of(Op::Read { offset, len })
    }

    fn write(offset: u64, len: usize) -> Extent {
        Extent::of(Op::Write { offset, len, fua: false })
    }

    #[test]
    fn only_overlapping_requests_that_change_data_are_ordered() {
        assert!(!read(0, 4096).must_follow(&read(0, 4096)), "reads of one range overtake each other");
        assert!(read(0, 4096).must_follow(&write(4095, 1)));
        assert!(write(0, 4096).must_follow(&read(100, 1)));
        assert!(write(0, 4096).must_follow(&write(0, 4096)));
        assert!(!write(0, 4096).must_follow(&write(4096, 4096)), "adjacent is not overlapping");
        let trim = Extent::of(Op::Trim { offset: 8192, len: u64::MAX - 8192, fua: false });
        assert!(write(u64::MAX - 10, 5).must_follow(&trim), "ranges up to the end of the address space");
        let flush = Extent::of(Op::Flush);
        assert!(flush.must_follow(&trim) && flush.must_follow(&write(0, 1)));
        assert!(!flush.must_follow(&read(0, 1)) && !flush.must_follow(&flush));
        assert!(!read(0, 1).must_follow(&flush), "a flush holds up nothing received after it");
        assert!(!Extent::of(Op::Cache).must_follow(&write(0, 1)));
    }
}
