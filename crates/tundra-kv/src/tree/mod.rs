//! The B+tree over pages: reads ([`read`]: lookup, scan) for both kinds of node, writes
//! ([`write`]: insert or overwrite, delete, splits) for the RW node's transactions. The tree
//! sees pages through [`Pages`] and [`PagesMut`], so it knows nothing of caches, storage or
//! redo: the RW node's transaction and the RO node's reader implement them.
//!
//! Shape: the meta page (0) names the root; internal pages route by key (a cell's child holds
//! the keys at or above its key, the page's link the keys below its first); leaves hold the
//! records in key order and link to their right sibling, so a scan walks the leaves. Every
//! child number is checked against the meta page's next free page before it is followed, and
//! a descent deeper than [`MAX_DEPTH`] is damage, so a damaged page cannot send a read into a
//! loop or off the volume.

pub(crate) mod read;
pub(crate) mod write;

use std::sync::Arc;

use crate::page::{Meta, Page, PageKind};
use crate::{Error, Result};

/// Levels a tree of 8 KiB pages never reaches (at 14 keys per page, 16 levels hold 14^16).
pub(crate) const MAX_DEPTH: usize = 16;

/// Checked pages as of one LSN, read-only.
pub(crate) trait Pages {
    /// The page `number`; an error if it cannot be read or was never written.
    fn read(&mut self, number: u64) -> Result<Arc<Page>>;
    fn page_count(&self) -> u64;
}

/// Pages a transaction changes.
pub(crate) trait PagesMut: Pages {
    /// The page to change in place; its change is logged as byte ranges.
    fn write(&mut self, number: u64) -> Result<&mut Page>;
    /// Puts a page rewritten whole (or a new one); its change is logged as an image.
    fn replace(&mut self, number: u64, page: Page);
}

pub(crate) fn read_meta(pages: &mut impl Pages) -> Result<Meta> {
    let page = pages.read(0)?;
    Meta::read(&page, pages.page_count())
}

/// A child number from a page, checked before it is followed.
fn checked_child(child: u64, parent: u64, meta: &Meta) -> Result<u64> {
    if child == 0 || child >= meta.next_free {
        return Err(Error::corrupted(format!(
            "page {parent} points at page {child}, outside the pages in use (1..{})",
            meta.next_free
        )));
    }
    Ok(child)
}

/// The internal pages from the root down to the leaf that holds `key`, and that leaf.
pub(crate) fn descend(pages: &mut impl Pages, meta: &Meta, key: &[u8]) -> Result<(Vec<u64>, u64)> {
    let mut path = Vec::new();
    let mut number = meta.root;
    for _ in 0..MAX_DEPTH {
        let page = pages.read(number)?;
        match page.kind() {
            PageKind::Leaf => return Ok((path, number)),
            PageKind::Internal => {
                path.push(number);
                number = checked_child(page.child_for(key), number, meta)?;
            }
            PageKind::Meta => return Err(Error::corrupted(format!("the tree reaches the meta page from {number}"))),
        }
    }
    Err(Error::corrupted(format!("the tree is deeper than {MAX_DEPTH} levels")))
}

#[cfg(test)]
mod tests;
