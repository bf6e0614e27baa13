//! The meta page, page 0: where the tree's root is and which page is allocated next. Its
//! body follows the common header (kind meta, no cells):
//!
//! | bytes  | field                                          |
//! |--------|------------------------------------------------|
//! | 32..40 | root page                                      |
//! | 40..48 | next free page: pages below it are in use      |
//!
//! Pages are never freed (the tree does not merge), so allocation is a counter.

use super::{HEADER_BYTES, Page, PageKind};
use crate::{Error, Result};

const ROOT: usize = HEADER_BYTES;
const NEXT_FREE: usize = HEADER_BYTES + 8;

/// What the meta page says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub root: u64,
    pub next_free: u64,
}

impl Meta {
    /// Reads a checked meta page, and checks its fields against the volume's page count.
    pub fn read(page: &Page, page_count: u64) -> Result<Meta> {
        page.expect_kind(PageKind::Meta, 0)?;
        let meta = Meta { root: page.u64_at(ROOT), next_free: page.u64_at(NEXT_FREE) };
        if meta.root == 0 || meta.root >= meta.next_free || meta.next_free > page_count {
            return Err(Error::corrupted(format!(
                "the meta page names root {} and next free page {} in a volume of {page_count} pages",
                meta.root, meta.next_free
            )));
        }
        Ok(meta)
    }

    /// Writes the fields into a meta page.
    pub fn write(&self, page: &mut Page) {
        assert_eq!(page.kind(), PageKind::Meta);
        page.bytes[ROOT..ROOT + 8].copy_from_slice(&self.root.to_le_bytes());
        page.bytes[NEXT_FREE..NEXT_FREE + 8].copy_from_slice(&self.next_free.to_le_bytes());
    }
}
