//! FUSE over io_uring: the kernel's requests for an exported file taken and answered through
//! rings of this process instead of reads and writes of `/dev/fuse` (Linux 6.14 and later;
//! the kernel's `Documentation/filesystems/fuse/fuse-io-uring.rst` and the UAPI header
//! `linux/fuse.h` define it).
//!
//! The kernel keeps one queue of requests per possible CPU and hands a request to the queue of
//! the CPU it was made on. A server registers entries in each queue: each entry is a 128-byte
//! `IORING_OP_URING_CMD` submission naming the queue, and two buffers, a header (the request's
//! `fuse_in_header` and its operation's fixed arguments, then the entry's own fields) and a
//! payload (a write's data, or a read's answer). The submission completes when the kernel has
//! put a request in the entry's buffers; the server answers in the same buffers and submits
//! `COMMIT_AND_FETCH`, which delivers the answer and makes the entry wait for the next request,
//! in one system call where `/dev/fuse` takes a write and a read.
//!
//! Each thread here owns one ring and one entry, so it serves one request at a time and
//! blocks in the backend as a `/dev/fuse` thread does (an fsync waits for a device flush)
//! while the other entries of its queue take further requests. The kernel accepts entries only
//! after the handshake, which `fuser` has done when the session exists, and sends through the
//! rings once every queue has an entry. Unmounting ends the connection, and with it every
//! entry's wait (`ENOTCONN`).
//!
//! Which requests a single-file export answers, and how: `getattr`, `setattr`, `open`, `read`,
//! `write`, `fsync`, `flush`, `release`, `fallocate` and `statfs` as the `fuser` side does;
//! every other operation with `ENOSYS`, as `fuser` answers operations a filesystem does not
//! implement.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use tundra_device::buf::BlockBuf;

use super::{ATTR_TTL, ExportBackend, MAX_REQUEST_BYTES, Served};
use fuser::Errno;

/// `struct fuse_uring_req_header`: the in/out header area, the operation's header area, then
/// `struct fuse_uring_ent_in_out`.
const IN_OUT_BYTES: usize = 128;
const OP_BYTES: usize = 128;
const ENT_IN_OUT: usize = IN_OUT_BYTES + OP_BYTES;
const HEADER_BYTES: usize = ENT_IN_OUT + 32;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// FUSE operation codes (`enum fuse_opcode`) the export answers.
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FSYNC: u32 = 20;
const FUSE_FLUSH: u32 = 25;
const FUSE_FALLOCATE: u32 = 43;
/// `FATTR_SIZE` in `fuse_setattr_in.valid`.
const FATTR_SIZE: u32 = 1 << 3;
const S_IFREG: u32 = 0o100_000;

/// The rings' threads of one export.
pub(super) struct Ring {
    threads: Vec<JoinHandle<()>>,
}

impl Ring {
    /// Registers `per_queue` entries in every CPU's queue of the connection `fd` is a
    /// `/dev/fuse` descriptor of, each on a thread of its own, and returns once all are
    /// registered. On an error, entries registered already stay and end with the connection;
    /// until every queue has one the kernel keeps using `/dev/fuse`.
    pub(super) fn start<B: ExportBackend>(fd: OwnedFd, served: Arc<Served<B>>, per_queue: usize) -> io::Result<Ring> {
        let queues = possible_cpus()?;
        let fd = Arc::new(fd);
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut threads = Vec::new();
        for qid in 0..queues {
            for n in 0..per_queue {
                let (fd, served, ready) = (fd.clone(), served.clone(), ready_tx.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("tundra-fuse-q{qid}.{n}"))
                    .spawn(move || serve(&fd, qid, &served, ready))?;
                threads.push(thread);
            }
        }
        drop(ready_tx);
        for _ in 0..threads.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(io::Error::other("a FUSE ring thread ended before registering")),
            }
        }
        Ok(Ring { threads })
    }

    /// Waits for every thread to end (after the connection has ended).
    pub(super) fn join(self) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// The CPUs the kernel may run on (`/sys/devices/system/cpu/possible`, e.g. `0-1`): the
/// kernel keeps that many queues and refuses a queue number beyond them.
fn possible_cpus() -> io::Result<u16> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut highest = None;
    for range in text.trim().split(',') {
        let last = range.rsplit('-').next().unwrap_or(range);
        let cpu: u16 =
            last.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("possible CPUs {text:?}")))?;
        highest = highest.max(Some(cpu));
    }
    highest
        .and_then(|cpu| cpu.checked_add(1))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("possible CPUs {text:?}")))
}

/// One entry: its buffers, and the descriptors of them the registration hands the kernel.
struct Entry {
    header: BlockBuf,
    payload: BlockBuf,
    iovecs: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new() -> Entry {
        let mut header = BlockBuf::zeroed(HEADER_BYTES.next_multiple_of(4096));
        let mut payload = BlockBuf::zeroed(MAX_REQUEST_BYTES as usize);
        let iovecs = Box::new([
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_BYTES },
            libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
        ]);
        Entry { header, payload, iovecs }
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.header[at..at + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.header[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// The command for `cmd_op` on queue `qid`, committing `commit_id` (0 for a registration).
fn command(fd: &OwnedFd, entry: &Entry, cmd_op: u32, qid: u16, commit_id: u64) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req: flags, commit_id, qid, padding.
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut sqe = opcode::UringCmd80::new(types::Fd(fd.as_raw_fd()), cmd_op).cmd(cmd);
    if cmd_op == CMD_REGISTER {
        sqe = sqe.addr(Some(entry.iovecs.as_ptr() as u64));
    }
    let sqe = sqe.build().user_data(u64::from(cmd_op));
    if cmd_op != CMD_REGISTER {
        return sqe;
    }
    // A registration names its two buffers: `addr` points at the iovecs and `len` counts them.
    // The builder has no `len` for this operation, so it is set in the submission's bytes
    // (`struct io_uring_sqe`: `len` is the u32 at byte 24).
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `repr(C)`, exactly the 128 bytes of a `struct io_uring_sqe` with
    // its command area, and any bytes make a valid value of it.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// Submits what is queued, waits for a completion and returns its result: `None` when the wait
/// was interrupted or found none, to wait again.
fn next_result(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<Option<i32>> {
    match ring.submit_and_wait(1) {
        Ok(_) => Ok(ring.completion().next().map(|cqe| cqe.result())),
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A thread's life: register one entry in queue `qid`, say so on `ready`, then answer every
/// request the kernel puts in it until the connection ends.
fn serve<B: ExportBackend>(fd: &OwnedFd, qid: u16, served: &Served<B>, ready: mpsc::Sender<io::Result<()>>) {
    let mut entry = Entry::new();
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = match IoUring::builder().build(2) {
        Ok(ring) => ring,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut last = command(fd, &entry, CMD_REGISTER, qid, 0);
    // SAFETY: the entry's buffers and iovecs live as long as the ring: both are dropped when
    // this function returns, and the ring first (it was declared after them).
    let pushed = unsafe { ring.submission().push(&last) };
    let registered = match pushed.map_err(|_| io::Error::other("a full submission queue")) {
        Ok(()) => ring.submit().map(drop),
        Err(e) => Err(e),
    };
    // A refused registration completes at once. An accepted one completes when the kernel puts
    // a request in the entry, which may already have happened (the last queue's entry makes the
    // rings ready): that completion is the first request to answer.
    let first = ring.completion().next().map(|cqe| cqe.result());
    let registered = match (registered, first) {
        (Err(e), _) => Err(e),
        (Ok(()), Some(result)) if result < 0 => Err(io::Error::from_raw_os_error(-result)),
        (Ok(()), _) => Ok(()),
    };
    let failed = registered.is_err();
    let _ = ready.send(registered);
    if failed {
        return;
    }
    let mut pending = first;
    loop {
        let result = match pending.take().map_or_else(|| next_result(&mut ring), |result| Ok(Some(result))) {
            Ok(Some(result)) => result,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("tundra: FUSE ring of queue {qid}: {e}; the thread stops");
                return;
            }
        };
        let next = match result {
            0 => {
                let commit_id = answer(served, &mut entry);
                command(fd, &entry, CMD_COMMIT_AND_FETCH, qid, commit_id)
            }
            result if result == -libc::EINTR || result == -libc::EAGAIN => last.clone(),
            // The connection ended (an unmount) or the ring is being torn down.
            result if result == -libc::ENOTCONN || result == -libc::ENODEV || result == -libc::ECANCELED => return,
            result => {
                eprintln!(
                    "tundra: FUSE ring of queue {qid}: {}; the thread stops",
                    io::Error::from_raw_os_error(-result)
                );
                return;
            }
        };
        last = next;
        // SAFETY: as for the registration.
        if unsafe { ring.submission().push(&last) }.is_err() {
            eprintln!("tundra: FUSE ring of queue {qid}: a full submission queue; the thread stops");
            return;
        }
    }
}

/// Answers the request in `entry`'s buffers, in place, and returns its commit id. The
/// answer's arguments go into the payload and their length into the entry's fields; an error
/// goes into the out header with no payload.
fn answer<B: ExportBackend>(served: &Served<B>, entry: &mut Entry) -> u64 {
    // struct fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, ...
    let opcode = entry.u32_at(4);
    let unique = entry.u64_at(8);
    let nodeid = entry.u64_at(16);
    // struct fuse_uring_ent_in_out: flags, commit_id, payload_sz.
    let commit_id = entry.u64_at(ENT_IN_OUT + 8);
    let payload_in = (entry.u32_at(ENT_IN_OUT + 16) as usize).min(entry.payload.len());
    let op = ENT_IN_OUT - OP_BYTES;
    served.counters.io_uring_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let result: Result<usize, Errno> = match opcode {
        FUSE_GETATTR => served.getattr(nodeid).map(|attr| put_attr(&attr, &mut entry.payload)),
        FUSE_SETATTR => {
            // struct fuse_setattr_in: valid, padding, fh, size, ...
            let size = (entry.u32_at(op) & FATTR_SIZE != 0).then(|| entry.u64_at(op + 16));
            served.setattr(size).map(|attr| put_attr(&attr, &mut entry.payload))
        }
        FUSE_OPEN => {
            served.open();
            // struct fuse_open_out: fh, open_flags, backing_id: no flags (see the fuser side).
            entry.payload[..16].fill(0);
            Ok(16)
        }
        FUSE_READ => {
            // struct fuse_read_in: fh, offset, size, ...
            let (offset, size) = (entry.u64_at(op + 8), entry.u32_at(op + 16) as usize);
            let size = size.min(entry.payload.len());
            served.read(offset, &mut entry.payload[..size])
        }
        FUSE_WRITE => {
            // struct fuse_write_in: fh, offset, size, ...; the data is the payload.
            let (offset, size) = (entry.u64_at(op + 8), entry.u32_at(op + 16) as usize);
            let size = size.min(payload_in);
            served.write(offset, &entry.payload[..size]).map(|written| {
                // struct fuse_write_out: size, padding.
                entry.payload[..4].copy_from_slice(&written.to_ne_bytes());
                entry.payload[4..8].fill(0);
                8
            })
        }
        FUSE_FSYNC => served.fsync().map(|()| 0),
        FUSE_FLUSH | FUSE_RELEASE => Ok(0),
        FUSE_FALLOCATE => {
            // struct fuse_fallocate_in: fh, offset, length, mode, padding.
            let (offset, length, mode) = (entry.u64_at(op + 8), entry.u64_at(op + 16), entry.u32_at(op + 24));
            served.fallocate(offset, length, mode as i32).map(|()| 0)
        }
        FUSE_STATFS => {
            // struct fuse_statfs_out, as fuser's default: no blocks or files, bsize 512,
            // namelen 255.
            entry.payload[..80].fill(0);
            entry.payload[40..44].copy_from_slice(&512u32.to_ne_bytes());
            entry.payload[44..48].copy_from_slice(&255u32.to_ne_bytes());
            Ok(80)
        }
        _ => Err(Errno::ENOSYS),
    };
    let (error, payload_out) = match result {
        Ok(len) => (0i32, len),
        Err(errno) => (-errno.code(), 0),
    };
    // struct fuse_out_header: len, error, unique.
    let out = &mut entry.header[..16];
    out[0..4].copy_from_slice(&((16 + payload_out) as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&error.to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    entry.header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(payload_out as u32).to_ne_bytes());
    commit_id
}

/// Writes `struct fuse_attr_out` for `attr` into `payload`; returns its length.
fn put_attr(attr: &fuser::FileAttr, payload: &mut [u8]) -> usize {
    let seconds = |time: std::time::SystemTime| time.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (atime, mtime, ctime) = (seconds(attr.atime), seconds(attr.mtime), seconds(attr.ctime));
    let mut out = Vec::with_capacity(104);
    out.extend_from_slice(&ATTR_TTL.as_secs().to_ne_bytes());
    out.extend_from_slice(&ATTR_TTL.subsec_nanos().to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    // struct fuse_attr.
    for value in [u64::from(attr.ino), attr.size, attr.blocks, atime.as_secs(), mtime.as_secs(), ctime.as_secs()] {
        out.extend_from_slice(&value.to_ne_bytes());
    }
    let mode = S_IFREG | u32::from(attr.perm);
    for value in [
        atime.subsec_nanos(),
        mtime.subsec_nanos(),
        ctime.subsec_nanos(),
        mode,
        attr.nlink,
        attr.uid,
        attr.gid,
        attr.rdev,
        attr.blksize,
        0,
    ] {
        out.extend_from_slice(&value.to_ne_bytes());
    }
    payload[..out.len()].copy_from_slice(&out);
    out.len()
}
