//! Reads of several ranges of a file at once through io_uring: one submission for all of them,
//! so that storage with queues (an SSD, a virtio disk) serves them side by side instead of one
//! after another. Each thread keeps a small ring of its own. Where io_uring cannot be used (an
//! old kernel, a sandbox that forbids it) the caller reads with `pread`, decided once for the
//! process.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

/// Reads in flight at once from one thread.
const RING_ENTRIES: u32 = 32;

/// How long a ring that refuses to be waited on is given before the process stops.
const WAIT_RETRIES: u32 = 20_000;

/// Set once a ring could not be created: every later batch reads with `pread`.
static UNAVAILABLE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// What became of a batch.
pub(crate) enum Outcome {
    /// Every range was read in full.
    Read,
    /// io_uring cannot be used here; nothing was read: the caller reads with `pread`.
    Unavailable,
}

/// Reads every `(offset, buffer)` of `fd` in full, [`RING_ENTRIES`] at a time; a short read is
/// finished with `finish` (a `pread` of the rest, which fails at the end of the file). Returns
/// the first error of any read only once every read submitted has completed: the kernel never
/// writes into a buffer after this returns.
pub(crate) fn read_all(
    fd: RawFd,
    reads: &mut [(u64, &mut [u8])],
    finish: impl Fn(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<Outcome> {
    if UNAVAILABLE.load(Ordering::Relaxed) || reads.iter().any(|(_, buf)| buf.len() > u32::MAX as usize) {
        return Ok(Outcome::Unavailable);
    }
    RING.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else { return Ok(Outcome::Unavailable) };
        if slot.is_none() {
            match IoUring::new(RING_ENTRIES) {
                Ok(ring) => *slot = Some(ring),
                Err(_) => {
                    UNAVAILABLE.store(true, Ordering::Relaxed);
                    return Ok(Outcome::Unavailable);
                }
            }
        }
        let Some(ring) = slot.as_mut() else { return Ok(Outcome::Unavailable) };
        let mut first_error: Option<io::Error> = None;
        for batch in reads.chunks_mut(RING_ENTRIES as usize) {
            let results = read_batch(ring, fd, batch);
            for ((offset, buf), result) in batch.iter_mut().zip(results) {
                let outcome = match usize::try_from(result) {
                    Err(_) => Err(io::Error::from_raw_os_error(-result)),
                    Ok(n) if n < buf.len() => finish(*offset + n as u64, &mut buf[n..]),
                    Ok(_) => Ok(()),
                };
                if let Err(error) = outcome {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(Outcome::Read),
        }
    })
}

/// Submits one batch (at most [`RING_ENTRIES`]) and waits for all of it: each read's result,
/// bytes read or a negated errno, in the batch's order.
fn read_batch(ring: &mut IoUring, fd: RawFd, batch: &mut [(u64, &mut [u8])]) -> Vec<i32> {
    {
        let mut queue = ring.submission();
        for (k, (offset, buf)) in batch.iter_mut().enumerate() {
            // The length fits: `read_all` sends longer buffers to `pread`.
            let entry = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), buf.len() as u32)
                .offset(*offset)
                .build()
                .user_data(k as u64);
            // SAFETY: the buffer stays borrowed, and alive, until its read completes: this
            // function returns only once every entry it pushed has completed. A batch is at
            // most the ring's size and the ring is empty between batches, so the push fits.
            if unsafe { queue.push(&entry) }.is_err() {
                unreachable_ring("a batch did not fit its ring");
            }
        }
    }
    let mut results = vec![0i32; batch.len()];
    let mut done = 0;
    let mut retries = 0;
    while done < batch.len() {
        match ring.submit_and_wait(batch.len() - done) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            // A transient shortage (EAGAIN, EBUSY): the reads in flight still complete.
            Err(_) if retries < WAIT_RETRIES => {
                retries += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(error) => unreachable_ring(&format!("waiting for reads on io_uring failed: {error}")),
        }
        for completion in ring.completion() {
            if let Some(slot) = results.get_mut(completion.user_data() as usize) {
                *slot = completion.result();
                done += 1;
            }
        }
    }
    results
}

/// A ring that can no longer be waited on leaves reads in flight into memory this process
/// will reuse: it stops rather than risk writing wrong bytes anywhere.
fn unreachable_ring(why: &str) -> ! {
    eprintln!("tundra-device: {why}; stopping the process so that no read lands in reused memory");
    std::process::abort()
}
