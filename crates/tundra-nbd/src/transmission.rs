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
use std::sync::atomic::{AtomicBool, Ordering};

use crate::connection::Close;
use crate::export::Export;
use crate::handshake::{Negotiated, drain};
use crate::proto::{self, Request};
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

/// Serves requests until the client disconnects or the server stops.
pub(crate) fn serve<R: Read, W: Write>(
    reader: &mut BufReader<R>,
    writer: &mut W,
    negotiated: &Negotiated,
    counters: &Counters,
    stopping: &AtomicBool,
) -> Result<(), Close> {
    let mut session = Session { writer, export: &*negotiated.export, size: negotiated.size, counters, buf: Vec::new() };
    loop {
        if stopping.load(Ordering::Relaxed) {
            session.writer.flush()?;
            return Ok(());
        }
        if reader.buffer().len() < proto::REQUEST_HEADER_LEN {
            session.writer.flush()?;
        }
        if fill(reader)?.is_empty() {
            // The client closed between requests without NBD_CMD_DISC: a hard disconnect.
            return Ok(());
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
    }
}

/// `fill_buf`, retried when a signal interrupts it.
fn fill<R: Read>(reader: &mut BufReader<R>) -> io::Result<&[u8]> {
    loop {
        match reader.fill_buf() {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
            Ok(_) => break,
        }
    }
    Ok(reader.buffer())
}

struct Session<'a, W> {
    writer: &'a mut W,
    export: &'a dyn Export,
    size: u64,
    counters: &'a Counters,
    /// Payload of the current read or write, reused; at most 32 MiB.
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
        let (export, counters) = (self.export, self.counters);
        let (result, bytes_counter) = match op {
            Op::Read { offset, len } => return Ok(self.read(request.cookie, offset, len)?),
            Op::Write { offset, len, fua } => {
                let data = self.payload(len);
                reader.read_exact(data)?;
                (export.write(offset, data, fua), Some(&counters.bytes_written))
            }
            Op::Flush => (export.flush(), None),
            Op::Trim { offset, len, fua } => (export.trim(offset, len, fua), Some(&counters.bytes_trimmed)),
            Op::WriteZeroes { offset, len, may_trim, fua } => {
                (export.write_zeroes(offset, len, may_trim, fua), Some(&counters.bytes_zeroed))
            }
            // The hint is accepted and ignored: the export has no cache to fill.
            Op::Cache => (Ok(()), None),
        };
        match result {
            Ok(()) => {
                if let Some(counter) = bytes_counter {
                    Counters::add(counter, u64::from(request.length));
                }
                self.writer.write_all(&proto::simple_reply(0, request.cookie))?;
            }
            Err(error) => {
                Counters::add(&counters.export_errors, 1);
                self.reply_error(request.cookie, error.errno())?;
            }
        }
        Ok(())
    }

    /// Reads first and replies after, so that an error is never found once the reply header
    /// has promised data.
    fn read(&mut self, cookie: u64, offset: u64, len: usize) -> io::Result<()> {
        let export = self.export;
        let data = self.payload(len);
        match export.read(offset, data) {
            Ok(()) => {
                self.writer.write_all(&proto::simple_reply(0, cookie))?;
                self.writer.write_all(&self.buf[..len])?;
                Counters::add(&self.counters.bytes_read, len as u64);
                Ok(())
            }
            Err(error) => {
                Counters::add(&self.counters.export_errors, 1);
                self.reply_error(cookie, error.errno())
            }
        }
    }

    fn payload(&mut self, len: usize) -> &mut [u8] {
        debug_assert!(len <= proto::MAX_REQUEST_BYTES as usize);
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        &mut self.buf[..len]
    }

    fn reply_error(&mut self, cookie: u64, errno: u32) -> io::Result<()> {
        debug_assert_ne!(errno, 0);
        Counters::add(&self.counters.error_replies, 1);
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
