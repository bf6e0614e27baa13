//! Reads of the tree: a point lookup and a range scan, both as of the LSN the pages are at.

use super::{Pages, checked_child, descend, read_meta};
use crate::page::PageKind;
use crate::{Error, Result};

/// The value of `key`, if the tree holds it.
pub(crate) fn lookup(pages: &mut impl Pages, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let meta = read_meta(pages)?;
    let (_, leaf) = descend(pages, &meta, key)?;
    let page = pages.read(leaf)?;
    Ok(page.search(key).ok().map(|index| page.value(index).to_vec()))
}

/// Up to `limit` records with keys at or above `start`, in key order.
pub(crate) fn scan(pages: &mut impl Pages, start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let meta = read_meta(pages)?;
    let (_, mut number) = descend(pages, &meta, start)?;
    let mut rows = Vec::new();
    // Every leaf is visited at most once on a sound tree; more is a loop in the links.
    for _ in 0..meta.next_free {
        let page = pages.read(number)?;
        page.expect_kind(PageKind::Leaf, number)?;
        let first = page.search(start).unwrap_or_else(|index| index);
        for index in first..page.count() {
            if rows.len() == limit {
                return Ok(rows);
            }
            rows.push((page.key(index).to_vec(), page.value(index).to_vec()));
        }
        if page.link() == 0 || rows.len() == limit {
            return Ok(rows);
        }
        number = checked_child(page.link(), number, &meta)?;
    }
    Err(Error::corrupted("the leaves' links form a loop"))
}
