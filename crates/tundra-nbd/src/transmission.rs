//! The transmission phase: requests in, simple replies out, one at a time and in order.
//!
//! Every request is checked before the export sees it ([`check`]); a bad one gets an error reply
//! and the connection goes on. A write's payload is always read, even when the write is refused
//! (also past 32 MiB: it is drained through a small buffer, never held in memory), so that the
//! stream stays in step. Only a bad request magic closes the connection, since nothing after it
//! can be trusted.
//!
//! Replies gather in a buffered writer, flushed whenever no complete request header is left in
//! the read buffer: a client that pipelines gets a burst of replies in one system call, a
//! client that waits for each reply gets it at once.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::connection::Close;
use crate::error::{ExportError, ExportErrorKind};
use crate::export::Export;
use crate::handshake::{Negotiated, drain};
use crate::limits::Held;
use crate::proto::{self, Request};
use crate::server::{Activity, Shared};
use crate::stats::Counters;

/// What a request that passed [`check`] asks of the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read { offset: u64, len: usize },
    Write { offset: u64, len: usize, fua: bool },
    Flush,
    Trim { offset: u64, len: u64, fua: bool },
    WriteZeroes { offset: u64, len: u64, may_trim: bool, fua: bool },
    Cache,
}

/// Checks a request against the export's `size`; the error is the NBD error value to reply.
///
/// Flags: `NBD_CMD_FLAG_FUA` on any command (the protocol requires accepting it everywhere),
/// `NBD_CMD_FLAG_NO_HOLE` on write-zeroes; anything else is `EINVAL`. Lengths: zero is `EINVAL`
/// (the protocol leaves it unspecified); reads, writes and caches over 32 MiB are `EINVAL`;
/// trims and write-zeroes, which carry no payload, may cover the whole export (mkfs and the
/// kernel's discard and zero-out through nbdfuse send them for whole devices). A range past the end is `ENOSPC` for writes and
/// write-zeroes, `EINVAL` otherwise. A flush must have zero offset and length.
pub(crate) fn check(request: &Request, size: u64) -> Result<Op, u32> {
    let allowed_flags = match request.command {
        proto::CMD_READ | proto::CMD_WRITE | proto::CMD_FLUSH | proto::CMD_TRIM | proto::CMD_CACHE => {
            proto::CMD_FLAG_FUA
        }
        proto::CMD_WRITE_ZEROES => proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE,
        _ => return Err(proto::EINVAL),
    };
    if request.flags & !allowed_flags != 0 {
        return Err(proto::EINVAL);
    }
    let fua = request.flags & proto::CMD_FLAG_FUA != 0;
    let offset = request.offset;
    let len = u64::from(request.length);
    if request.command == proto::CMD_FLUSH {
        return if offset == 0 && len == 0 { Ok(Op::Flush) } else { Err(proto::EINVAL) };
    }
    if len == 0 {
        return Err(proto::EINVAL);
    }
    let no_payload = matches!(request.command, proto::CMD_TRIM | proto::CMD_WRITE_ZEROES);
    if !no_payload && request.length > proto::MAX_REQUEST_BYTES {
        return Err(proto::EINVAL);
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        let past_end = match request.command {
            proto::CMD_WRITE | proto::CMD_WRITE_ZEROES => proto::ENOSPC,
            _ => proto::EINVAL,
        };
        return Err(past_end);
    }
    let op = match request.command {
        proto::CMD_READ => Op::Read { offset, len: request.length as usize },
        proto::CMD_WRITE => Op::Write { offset, len: request.length as usize, fua },
        proto::CMD_TRIM => Op::Trim { offset, len, fua },
        proto::CMD_WRITE_ZEROES => {
            Op::WriteZeroes { offset, len, may_trim: request.flags & proto::CMD_FLAG_NO_HOLE == 0, fua }
        }
        _ => Op::Cache,
    };
    Ok(op)
}

/// Payload bytes taken from the budget and read from the socket at once: a write's buffer grows
/// by this much as its data arrives, never sized from the header alone.
const PAYLOAD_STEP_BYTES: usize = 256 << 10;

/// Serves requests until the client disconnects, stalls inside a request, or the server stops.
pub(crate) fn serve<R: Read, W: Write>(
    reader: &mut BufReader<R>,
    writer: &mut W,
    negotiated: &Negotiated,
    shared: &Shared,
    activity: &Activity,
) -> Result<(), Close> {
    let counters = &shared.counters;
    let mut session = Session { writer, export: &*negotiated.export, size: negotiated.size, shared, buf: Vec::new() };
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            session.writer.flush()?;
            return Ok(());
        }
        if reader.buffer().len() < proto::REQUEST_HEADER_LEN {
            session.writer.flush()?;
        }
        match fill(reader)? {
            Fill::Idle => continue,
            Fill::Closed => return Ok(()),
            Fill::Data => {}
        }
        let mut header = [0u8; proto::REQUEST_HEADER_LEN];
        reader.read_exact(&mut header)?;
        let Some(request) = Request::parse(&header) else {
            return Err(Close::Violation("bad request magic".into()));
        };
        counters.count_request(request.command);
        if request.command == proto::CMD_DISC {
            session.writer.flush()?;
            return Ok(());
        }
        session.request(reader, &request)?;
        activity.touch(shared.started);
    }
}

/// What waiting for the next request found.
enum Fill {
    /// Bytes to read.
    Data,
    /// The client closed between requests without NBD_CMD_DISC: a hard disconnect.
    Closed,
    /// Nothing within the read timeout: an idle client, which may stay as long as it likes.
    Idle,
}

/// `fill_buf` between requests, retried when a signal interrupts it.
fn fill<R: Read>(reader: &mut BufReader<R>) -> io::Result<Fill> {
    loop {
        match reader.fill_buf() {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Ok(Fill::Idle);
            }
            Err(error) => return Err(error),
            Ok(buffer) => return Ok(if buffer.is_empty() { Fill::Closed } else { Fill::Data }),
        }
    }
}

struct Session<'a, W> {
    writer: &'a mut W,
    export: &'a dyn Export,
    size: u64,
    shared: &'a Shared,
    /// Payload of the current read or write, reused up to [`PAYLOAD_STEP_BYTES`]; a larger one
    /// is let go after its request.
    buf: Vec<u8>,
}

impl<W: Write> Session<'_, W> {
    fn request<R: Read>(&mut self, reader: &mut R, request: &Request) -> Result<(), Close> {
        let op = match check(request, self.size) {
            Ok(op) => op,
            Err(errno) => {
                if request.command == proto::CMD_WRITE {
                    drain(reader, u64::from(request.length))?;
                }
                return Ok(self.reply_error(request.cookie, errno)?);
            }
        };
        let (export, counters) = (self.export, &self.shared.counters);
        let budget = &self.shared.budget;
        let mut held = Held::none(budget);
        let (result, bytes_counter) = match op {
            Op::Read { offset, len } => return self.read(request.cookie, offset, len),
            Op::Write { offset, len, fua } => {
                self.receive(reader, len, &mut held)?;
                (export.write(offset, &self.buf[..len], fua), Some(&counters.bytes_written))
            }
            Op::Flush => (export.flush(), None),
            Op::Trim { offset, len, fua } => (export.trim(offset, len, fua), Some(&counters.bytes_trimmed)),
            Op::WriteZeroes { offset, len, may_trim, fua } => {
                (export.write_zeroes(offset, len, may_trim, fua), Some(&counters.bytes_zeroed))
            }
            // The hint is accepted and ignored: the export has no cache to fill.
            Op::Cache => (Ok(()), None),
        };
        self.let_go_of_large_buffer();
        drop(held);
        match result {
            Ok(()) => {
                if let Some(counter) = bytes_counter {
                    Counters::add(counter, u64::from(request.length));
                }
                self.writer.write_all(&proto::simple_reply(0, request.cookie))?;
                Ok(())
            }
            Err(error) => self.export_failed(request.cookie, &error),
        }
    }

    /// Reads a write's `len` payload bytes into `buf`, a step at a time: each step's bytes are
    /// taken from the budget (waiting at most the request timeout for room) before the buffer
    /// grows, so memory only ever holds data that arrived, and all connections together hold
    /// at most the budget.
    fn receive<R: Read>(&mut self, reader: &mut R, len: usize, held: &mut Held<'_>) -> Result<(), Close> {
        let mut have = 0;
        while have < len {
            let step = (len - have).min(PAYLOAD_STEP_BYTES);
            let deadline = Instant::now() + self.shared.limits.request_timeout;
            if !self.shared.budget.take(held, step as u64, deadline) {
                return Err(Close::TimedOut);
            }
            if self.buf.len() < have + step {
                self.buf.resize(have + step, 0);
            }
            reader.read_exact(&mut self.buf[have..have + step])?;
            have += step;
        }
        Ok(())
    }

    /// Reads first and replies after, so that an error is never found once the reply header
    /// has promised data.
    fn read(&mut self, cookie: u64, offset: u64, len: usize) -> Result<(), Close> {
        let export = self.export;
        let mut held = Held::none(&self.shared.budget);
        let deadline = Instant::now() + self.shared.limits.request_timeout;
        if !self.shared.budget.take(&mut held, len as u64, deadline) {
            return Err(Close::TimedOut);
        }
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let result = export.read(offset, &mut self.buf[..len]);
        match result {
            Ok(()) => {
                self.writer.write_all(&proto::simple_reply(0, cookie))?;
                self.writer.write_all(&self.buf[..len])?;
                Counters::add(&self.shared.counters.bytes_read, len as u64);
                self.let_go_of_large_buffer();
                Ok(())
            }
            Err(error) => {
                self.let_go_of_large_buffer();
                self.export_failed(cookie, &error)
            }
        }
    }

    /// Keeps a small buffer for the next request and frees a large one, whose budget the
    /// request gives back.
    fn let_go_of_large_buffer(&mut self) {
        if self.buf.len() > PAYLOAD_STEP_BYTES {
            self.buf = Vec::new();
        }
    }

    /// Replies with the export's error. An export that is gone (its volume was deleted) ends
    /// the connection after the reply: nothing it could serve remains.
    fn export_failed(&mut self, cookie: u64, error: &ExportError) -> Result<(), Close> {
        Counters::add(&self.shared.counters.export_errors, 1);
        self.reply_error(cookie, error.errno())?;
        if error.kind() == ExportErrorKind::Shutdown {
            self.writer.flush()?;
            return Err(Close::Gone);
        }
        Ok(())
    }

    fn reply_error(&mut self, cookie: u64, errno: u32) -> io::Result<()> {
        debug_assert_ne!(errno, 0);
        Counters::add(&self.shared.counters.error_replies, 1);
        self.writer.write_all(&proto::simple_reply(errno, cookie))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 1 << 20;

    fn request(command: u16, flags: u16, offset: u64, length: u32) -> Request {
        Request { flags, command, cookie: 1, offset, length }
    }

    #[test]
    fn valid_requests_become_operations() {
        assert_eq!(check(&request(proto::CMD_READ, 0, 0, 4096), SIZE), Ok(Op::Read { offset: 0, len: 4096 }));
        assert_eq!(
            check(&request(proto::CMD_WRITE, proto::CMD_FLAG_FUA, 1, 3), SIZE),
            Ok(Op::Write { offset: 1, len: 3, fua: true })
        );
        assert_eq!(check(&request(proto::CMD_FLUSH, 0, 0, 0), SIZE), Ok(Op::Flush));
        assert_eq!(
            check(&request(proto::CMD_TRIM, 0, 0, SIZE as u32), SIZE),
            Ok(Op::Trim { offset: 0, len: SIZE, fua: false })
        );
        assert_eq!(
            check(&request(proto::CMD_WRITE_ZEROES, proto::CMD_FLAG_NO_HOLE, SIZE - 1, 1), SIZE),
            Ok(Op::WriteZeroes { offset: SIZE - 1, len: 1, may_trim: false, fua: false })
        );
        assert_eq!(check(&request(proto::CMD_CACHE, proto::CMD_FLAG_FUA, 0, 1), SIZE), Ok(Op::Cache));
        assert_eq!(
            check(&request(proto::CMD_READ, proto::CMD_FLAG_FUA, 0, 1), SIZE),
            Ok(Op::Read { offset: 0, len: 1 })
        );
    }

    #[test]
    fn ranges_past_the_end_are_refused() {
        assert_eq!(check(&request(proto::CMD_READ, 0, SIZE, 1), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_READ, 0, u64::MAX, 2), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_TRIM, 0, SIZE - 1, 2), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_CACHE, 0, SIZE - 1, 2), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_WRITE, 0, SIZE - 1, 2), SIZE), Err(proto::ENOSPC));
        assert_eq!(check(&request(proto::CMD_WRITE_ZEROES, 0, u64::MAX, 1), SIZE), Err(proto::ENOSPC));
    }

    #[test]
    fn zero_lengths_oversized_lengths_and_bad_flush_are_invalid() {
        for command in [proto::CMD_READ, proto::CMD_WRITE, proto::CMD_TRIM, proto::CMD_WRITE_ZEROES, proto::CMD_CACHE] {
            assert_eq!(check(&request(command, 0, 0, 0), SIZE), Err(proto::EINVAL), "command {command}");
        }
        let big = u64::from(proto::MAX_REQUEST_BYTES) * 4;
        for command in [proto::CMD_READ, proto::CMD_WRITE, proto::CMD_CACHE] {
            assert_eq!(check(&request(command, 0, 0, proto::MAX_REQUEST_BYTES + 1), big), Err(proto::EINVAL));
            assert!(check(&request(command, 0, 0, proto::MAX_REQUEST_BYTES), big).is_ok());
        }
        for command in [proto::CMD_TRIM, proto::CMD_WRITE_ZEROES] {
            assert!(check(&request(command, 0, 0, u32::MAX), u64::from(u32::MAX)).is_ok());
        }
        assert_eq!(check(&request(proto::CMD_FLUSH, 0, 0, 1), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_FLUSH, 0, 1, 0), SIZE), Err(proto::EINVAL));
    }

    #[test]
    fn unknown_commands_and_flags_are_invalid() {
        for command in [7, 8, 9, 0x100, u16::MAX] {
            assert_eq!(check(&request(command, 0, 0, 1), SIZE), Err(proto::EINVAL));
        }
        assert_eq!(check(&request(proto::CMD_WRITE, proto::CMD_FLAG_NO_HOLE, 0, 1), SIZE), Err(proto::EINVAL));
        // NBD_CMD_FLAG_DF without structured replies, NBD_CMD_FLAG_FAST_ZERO not advertised.
        assert_eq!(check(&request(proto::CMD_READ, 1 << 2, 0, 1), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_WRITE_ZEROES, 1 << 4, 0, 1), SIZE), Err(proto::EINVAL));
        assert_eq!(check(&request(proto::CMD_TRIM, 0x80, 0, 1), SIZE), Err(proto::EINVAL));
    }
}
