//! Changes to the tree inside a transaction: put (insert, or overwrite an existing key) and
//! delete, with page splits. Merges are left out: a page emptied by deletes stays in the tree
//! (and keeps routing its key range), and pages are never freed, so a volume's pages are
//! allocated from the meta page's counter until it is full.
//!
//! What each step changes, and so what redo it produces (docs/kv.md): an overwrite of a value
//! of the same length changes the value's bytes; an insert writes the cell and shifts the
//! slots after it; a delete shifts the slots back; a page that has room only after dropping
//! its garbage is rewritten compacted (an image); a page with no room splits: the left half
//! keeps the page's number and the right half takes a new page, both rewritten (images), and
//! the separator goes into the parent as an insert there, splitting it in turn if need be. A
//! root that splits gets a new root page (an image) and the meta page a new root number.

use super::{PagesMut, descend, read_meta};
use crate::page::{Meta, Page, PageKind, internal_cell, leaf_cell};
use crate::{Error, ErrorKind, Result};

/// Puts `key` with `value`, replacing the value it had. Key and value are within their limits
/// (checked by the caller).
pub(crate) fn put(pages: &mut impl PagesMut, key: &[u8], value: &[u8]) -> Result<()> {
    let meta = read_meta(pages)?;
    let (mut path, leaf) = descend(pages, &meta, key)?;
    let page = pages.read(leaf)?;
    let index = match page.search(key) {
        Ok(index) if page.value(index) == value => return Ok(()),
        Ok(index) if page.value(index).len() == value.len() => {
            pages.write(leaf)?.overwrite_value(index, value);
            return Ok(());
        }
        Ok(index) => {
            pages.write(leaf)?.remove_cell(index);
            index
        }
        Err(index) => index,
    };
    insert(pages, &mut path, leaf, index, leaf_cell(key, value))
}

/// Deletes `key`; true if the tree held it.
pub(crate) fn delete(pages: &mut impl PagesMut, key: &[u8]) -> Result<bool> {
    let meta = read_meta(pages)?;
    let (_, leaf) = descend(pages, &meta, key)?;
    let page = pages.read(leaf)?;
    match page.search(key) {
        Ok(index) => {
            pages.write(leaf)?.remove_cell(index);
            Ok(true)
        }
        Err(_) => Ok(false),
    }
}

/// Inserts `cell` as the `index`th of page `number`, whose ancestors are `path`: in place if it
/// fits, after compacting if that makes room, else by splitting the page.
fn insert(pages: &mut impl PagesMut, path: &mut Vec<u64>, number: u64, index: usize, cell: Vec<u8>) -> Result<()> {
    let page = pages.read(number)?;
    if page.free_bytes() >= cell.len() + 2 {
        assert!(pages.write(number)?.insert_cell(index, &cell), "the cell fits the free bytes");
        return Ok(());
    }
    if page.reclaimable_bytes() >= cell.len() + 2 {
        let mut compacted = page.compacted();
        assert!(compacted.insert_cell(index, &cell), "the cell fits once compacted");
        pages.replace(number, compacted);
        return Ok(());
    }
    let mut cells = page.cells();
    cells.insert(index, cell);
    let right = allocate(pages)?;
    let (left_page, right_page, separator) = split(page.kind(), page.link(), right, &cells);
    pages.replace(number, left_page);
    pages.replace(right, right_page);
    let separator_cell = internal_cell(&separator, right);
    match path.pop() {
        Some(parent) => {
            let index = match pages.read(parent)?.search(&separator) {
                Err(index) => index,
                Ok(_) => {
                    return Err(Error::corrupted(format!("page {parent} already routes the separator of a split")));
                }
            };
            insert(pages, path, parent, index, separator_cell)
        }
        None => {
            let root = allocate(pages)?;
            pages.replace(root, Page::from_cells(PageKind::Internal, number, &[separator_cell]));
            let mut meta = read_meta(pages)?;
            meta.root = root;
            meta.write(pages.write(0)?);
            Ok(())
        }
    }
}

/// Splits `cells` (one too many for a page) into a left page keeping the old page's place and
/// a right page numbered `right`; returns both and the separator key for the parent. A leaf's
/// halves link left to right; an internal page's middle cell moves up, its child becoming the
/// right page's leftmost.
fn split(kind: PageKind, link: u64, right: u64, cells: &[Vec<u8>]) -> (Page, Page, Vec<u8>) {
    let at = split_point(kind, cells);
    let key = |cell: &[u8]| crate::page::cell_key(cell, kind).to_vec();
    match kind {
        PageKind::Leaf => {
            let left_page = Page::from_cells(kind, right, &cells[..at]);
            let right_page = Page::from_cells(kind, link, &cells[at..]);
            (left_page, right_page, key(&cells[at]))
        }
        _ => {
            let middle = &cells[at];
            let mut child = [0u8; 8];
            child.copy_from_slice(&middle[1..9]);
            let left_page = Page::from_cells(kind, link, &cells[..at]);
            let right_page = Page::from_cells(kind, u64::from_le_bytes(child), &cells[at + 1..]);
            (left_page, right_page, key(middle))
        }
    }
}

/// The first cell of the right half: where the bytes (cells and slots) pass half the total,
/// leaving each half at least one cell (an internal split also needs one for the middle).
fn split_point(kind: PageKind, cells: &[Vec<u8>]) -> usize {
    let total: usize = cells.iter().map(|cell| cell.len() + 2).sum();
    let mut bytes = 0;
    let mut at = 0;
    while at < cells.len() && bytes + cells[at].len() + 2 <= total / 2 {
        bytes += cells[at].len() + 2;
        at += 1;
    }
    let last = if kind == PageKind::Leaf { cells.len() - 1 } else { cells.len() - 2 };
    at.clamp(1, last)
}

/// A new page number from the meta page's counter; `Full` when the volume has none left.
fn allocate(pages: &mut impl PagesMut) -> Result<u64> {
    let mut meta: Meta = read_meta(pages)?;
    if meta.next_free >= pages.page_count() {
        return Err(Error::new(
            ErrorKind::Full,
            format!(
                "all {} pages of the volume are in use (pages are not freed: the tree does not merge)",
                meta.next_free
            ),
        ));
    }
    let number = meta.next_free;
    meta.next_free += 1;
    meta.write(pages.write(0)?);
    Ok(number)
}
