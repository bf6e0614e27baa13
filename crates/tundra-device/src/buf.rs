//! Block-aligned heap memory, as `O_DIRECT` requires of the memory it transfers to and from.

use std::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::BLOCK_SIZE;

/// Zeroed heap memory whose start is aligned to [`BLOCK_SIZE`].
pub struct BlockBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a `BlockBuf` owns its memory outright, as a `Vec<u8>` does.
unsafe impl Send for BlockBuf {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for BlockBuf {}

impl BlockBuf {
    /// A zeroed buffer of `len` bytes; `len` is non-zero.
    pub fn zeroed(len: usize) -> BlockBuf {
        assert!(len > 0, "a block buffer holds at least one byte");
        let layout = Layout::from_size_align(len, BLOCK_SIZE).expect("a block buffer's layout");
        // SAFETY: the layout's size is non-zero, as `alloc_zeroed` requires.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| handle_alloc_error(layout));
        BlockBuf { ptr, layout }
    }
}

impl Deref for BlockBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised bytes that this value owns.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout and is freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
