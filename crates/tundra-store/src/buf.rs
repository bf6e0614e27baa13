//! Block-aligned scratch memory for the store's device I/O. A device that bypasses the kernel's
//! page cache (`O_DIRECT`) transfers only to and from memory aligned to its blocks, and copies
//! anything else through a bounce buffer of its own, split into pieces: handing it aligned
//! memory saves that copy, and lets a run of pages written together go to the device as one
//! write.

use std::cell::RefCell;

use tundra_device::BLOCK_SIZE;
use tundra_device::buf::BlockBuf;

/// Scratch buffers kept per thread above this size are dropped after use, so that one large
/// request does not pin its memory on every thread that ever served one.
const KEEP_BYTES: usize = 1 << 20;

thread_local! {
    static SCRATCH: RefCell<Option<BlockBuf>> = const { RefCell::new(None) };
}

/// Calls `f` with this thread's aligned scratch buffer of at least `len` bytes (a multiple of
/// [`BLOCK_SIZE`]; its contents are whatever the last user left). Reentrant calls get a
/// buffer of their own.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let taken = SCRATCH.with(|cell| cell.try_borrow_mut().ok().and_then(|mut slot| slot.take()));
    let mut buf = match taken {
        Some(buf) if buf.len() >= len => buf,
        _ => BlockBuf::zeroed(len.max(BLOCK_SIZE)),
    };
    let result = f(&mut buf[..len]);
    if buf.len() <= KEEP_BYTES {
        SCRATCH.with(|cell| {
            if let Ok(mut slot) = cell.try_borrow_mut() {
                *slot = Some(buf);
            }
        });
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_reused() {
        let buf = BlockBuf::zeroed(3 * BLOCK_SIZE);
        assert_eq!(buf.as_ptr().addr() % BLOCK_SIZE, 0);
        assert!(buf.iter().all(|&b| b == 0));
        let first = with_scratch(2 * BLOCK_SIZE, |s| {
            assert_eq!(s.len(), 2 * BLOCK_SIZE);
            s.fill(7);
            s.as_ptr().addr()
        });
        assert_eq!(first % BLOCK_SIZE, 0);
        // The same memory comes back, with what was left in it; a nested call gets its own.
        with_scratch(BLOCK_SIZE, |s| {
            assert_eq!(s.as_ptr().addr(), first);
            assert_eq!(s[0], 7);
            with_scratch(BLOCK_SIZE, |inner| assert_ne!(inner.as_ptr().addr(), first));
        });
        // A larger request gets a larger buffer, still aligned.
        with_scratch(8 * BLOCK_SIZE, |s| assert_eq!(s.as_ptr().addr() % BLOCK_SIZE, 0));
    }
}
