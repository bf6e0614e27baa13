//! The transmission phase: requests in, simple replies out, as each request finishes.
//!
//! The connection's thread reads and checks every request before the export sees it
//! ([`check`]); a bad one gets an error reply and the connection goes on. A write's payload is
//! always read, even when the write is refused (also past 32 MiB: it is drained through a small
//! buffer, never held in memory), so that the stream stays in step. Only a bad request magic
//! closes the connection, since nothing after it can be trusted; the requests already in flight
//! are answered first. A checked request goes to the connection's pipeline (pipeline.rs), whose
//! workers run requests side by side and reply in the order they finish.

use std::io::{self, BufRead, BufReader, BufWriter, Read};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::connection::Close;
use crate::handshake::{Negotiated, drain};
use crate::limits::Held;
use crate::pipeline::{Extent, Pipeline};
use crate::proto::{self, Request};
use crate::server::{Activity, Shared};

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
/// This thread reads and checks requests; the pipeline's workers run them and reply.
pub(crate) fn serve(
    reader: &mut BufReader<&TcpStream>,
    writer: BufWriter<&TcpStream>,
    stream: &TcpStream,
    negotiated: &Negotiated,
    shared: &Shared,
    activity: &Activity,
) -> Result<(), Close> {
    let pipeline = Pipeline::new(shared, &*negotiated.export, stream, activity, writer);
    let result = std::thread::scope(|scope| {
        let result = read_requests(reader, &pipeline, scope, negotiated.size, shared);
        pipeline.finish();
        result
    });
    // A worker's reason (the export is gone, a reply could not be sent) explains whatever the
    // reading side saw after it shut the socket down.
    match pipeline.ended() {
        Some(close) => Err(close),
        None => result,
    }
}

fn read_requests<'s, 'scope>(
    reader: &mut BufReader<&TcpStream>,
    pipeline: &'scope Pipeline<'s>,
    scope: &'scope std::thread::Scope<'scope, '_>,
    size: u64,
    shared: &'s Shared,
) -> Result<(), Close>
where
    's: 'scope,
{
    let counters = &shared.counters;
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Some(close) = pipeline.ended() {
            return Err(close);
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
            return Ok(());
        }
        let op = match check(&request, size) {
            Ok(op) => op,
            Err(errno) => {
                if request.command == proto::CMD_WRITE {
                    drain(reader, u64::from(request.length))?;
                }
                pipeline.reply_error(request.cookie, errno)?;
                continue;
            }
        };
        let bytes = match op {
            Op::Read { len, .. } | Op::Write { len, .. } => len as u64,
            _ => 0,
        };
        let seq = pipeline.admit(Extent::of(op), bytes)?;
        let mut held = Held::none(&shared.budget);
        let mut payload = Vec::new();
        if let Op::Write { len, .. } = op {
            payload = pipeline.buffer();
            if let Err(close) = receive(reader, &mut payload, len, &mut held, shared) {
                // Admitted but never run: answered by nobody, so the pipeline must forget it.
                let job = pipeline.job(seq, request.cookie, Op::Cache, bytes, Vec::new(), held);
                pipeline.abandon(job);
                return Err(close);
            }
        }
        pipeline.submit(scope, pipeline.job(seq, request.cookie, op, bytes, payload, held));
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

/// Reads a write's `len` payload bytes into `buf`, a step at a time: each step's bytes are
/// taken from the budget (waiting at most the request timeout for room) before the buffer
/// grows, so memory only ever holds data that arrived, and all connections together hold at
/// most the budget.
fn receive<'s, R: Read>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    len: usize,
    held: &mut Held<'s>,
    shared: &'s Shared,
) -> Result<(), Close> {
    let mut have = 0;
    while have < len {
        let step = (len - have).min(PAYLOAD_STEP_BYTES);
        let deadline = Instant::now() + shared.limits.request_timeout;
        if !shared.budget.take(held, step as u64, deadline) {
            return Err(Close::TimedOut);
        }
        if buf.len() < have + step {
            buf.resize(have + step, 0);
        }
        reader.read_exact(&mut buf[have..have + step])?;
        have += step;
    }
    Ok(())
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
