//! Cells of B+tree pages: a slot array of u16 offsets after the header, sorted by key, and the
//! cells themselves packed down from the page's end.
//!
//! - A leaf cell is `key length (u8), value length (u16), key, value`.
//! - An internal cell is `key length (u8), child (u64), key`: the child holds the keys at or
//!   above the cell's key and below the next cell's; the page's link is the child of the keys
//!   below the first cell's.
//!
//! Inserting writes the cell below the cell area and shifts the slots after it; removing shifts
//! the slots back and counts the cell's bytes as garbage, which [`Page::compacted`] reclaims by
//! rewriting the page. These are the byte changes redo.rs turns into ranges, so a change to a
//! page costs its cell, the slots it shifted and the header, not the page.

use super::{HEADER_BYTES, MAX_KEY_BYTES, MAX_VALUE_BYTES, PAGE_SIZE, Page, PageKind};

/// Bytes of a leaf cell before its key.
pub(crate) const LEAF_CELL_HEADER: usize = 3;
/// Bytes of an internal cell before its key.
pub(crate) const INTERNAL_CELL_HEADER: usize = 9;

/// A leaf cell's bytes.
pub(crate) fn leaf_cell(key: &[u8], value: &[u8]) -> Vec<u8> {
    assert!(key.len() <= MAX_KEY_BYTES && value.len() <= MAX_VALUE_BYTES, "checked by the caller");
    let mut cell = Vec::with_capacity(LEAF_CELL_HEADER + key.len() + value.len());
    cell.push(key.len() as u8);
    cell.extend_from_slice(&(value.len() as u16).to_le_bytes());
    cell.extend_from_slice(key);
    cell.extend_from_slice(value);
    cell
}

/// An internal cell's bytes.
pub(crate) fn internal_cell(key: &[u8], child: u64) -> Vec<u8> {
    assert!(key.len() <= MAX_KEY_BYTES, "checked by the caller");
    let mut cell = Vec::with_capacity(INTERNAL_CELL_HEADER + key.len());
    cell.push(key.len() as u8);
    cell.extend_from_slice(&child.to_le_bytes());
    cell.extend_from_slice(key);
    cell
}

/// A cell's key, given its bytes and its page's kind.
pub(crate) fn cell_key(cell: &[u8], kind: PageKind) -> &[u8] {
    let header = if kind == PageKind::Leaf { LEAF_CELL_HEADER } else { INTERNAL_CELL_HEADER };
    &cell[header..header + cell[0] as usize]
}

impl Page {
    fn header_len(&self) -> usize {
        if self.kind() == PageKind::Leaf { LEAF_CELL_HEADER } else { INTERNAL_CELL_HEADER }
    }

    fn slot(&self, index: usize) -> usize {
        assert!(index < self.count(), "slot {index} of {}", self.count());
        self.u16_at(HEADER_BYTES + 2 * index) as usize
    }

    fn cell_len_at(&self, offset: usize) -> usize {
        let key = self.bytes[offset] as usize;
        match self.kind() {
            PageKind::Leaf => {
                let value = u16::from_le_bytes([self.bytes[offset + 1], self.bytes[offset + 2]]) as usize;
                LEAF_CELL_HEADER + key + value
            }
            _ => INTERNAL_CELL_HEADER + key,
        }
    }

    /// The `index`th cell's bytes.
    pub(crate) fn cell(&self, index: usize) -> &[u8] {
        let offset = self.slot(index);
        &self.bytes[offset..offset + self.cell_len_at(offset)]
    }

    pub fn key(&self, index: usize) -> &[u8] {
        let offset = self.slot(index);
        let start = offset + self.header_len();
        &self.bytes[start..start + self.bytes[offset] as usize]
    }

    /// A leaf's `index`th value.
    pub fn value(&self, index: usize) -> &[u8] {
        assert_eq!(self.kind(), PageKind::Leaf);
        let offset = self.slot(index);
        let key = self.bytes[offset] as usize;
        let len = u16::from_le_bytes([self.bytes[offset + 1], self.bytes[offset + 2]]) as usize;
        let start = offset + LEAF_CELL_HEADER + key;
        &self.bytes[start..start + len]
    }

    /// An internal page's `index`th child.
    pub fn child(&self, index: usize) -> u64 {
        assert_eq!(self.kind(), PageKind::Internal);
        let offset = self.slot(index) + 1;
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.bytes[offset..offset + 8]);
        u64::from_le_bytes(word)
    }

    /// `Ok(index)` of the cell holding `key`, or `Err(index)` where it would go.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut low, mut high) = (0, self.count());
        while low < high {
            let middle = (low + high) / 2;
            match self.key(middle).cmp(key) {
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
                std::cmp::Ordering::Equal => return Ok(middle),
            }
        }
        Err(low)
    }

    /// The child of an internal page that holds `key`.
    pub fn child_for(&self, key: &[u8]) -> u64 {
        let below = match self.search(key) {
            Ok(index) => index + 1,
            Err(index) => index,
        };
        if below == 0 { self.link() } else { self.child(below - 1) }
    }

    /// Bytes free between the slots and the cells.
    pub fn free_bytes(&self) -> usize {
        self.cell_start() - HEADER_BYTES - 2 * self.count()
    }

    /// Bytes free once the page is compacted.
    pub fn reclaimable_bytes(&self) -> usize {
        self.free_bytes() + self.garbage()
    }

    /// Inserts `cell` as the `index`th; false (and nothing changed) if it does not fit the
    /// free bytes.
    pub(crate) fn insert_cell(&mut self, index: usize, cell: &[u8]) -> bool {
        let count = self.count();
        assert!(index <= count, "cell {index} of {count}");
        if cell.len() + 2 > self.free_bytes() {
            return false;
        }
        let start = self.cell_start() - cell.len();
        self.bytes[start..start + cell.len()].copy_from_slice(cell);
        self.set_cell_start(start);
        let slots = HEADER_BYTES + 2 * index;
        self.bytes.copy_within(slots..HEADER_BYTES + 2 * count, slots + 2);
        self.put_u16(slots, start as u16);
        self.set_count(count + 1);
        true
    }

    /// Removes the `index`th cell; its bytes become garbage until the page is compacted.
    pub(crate) fn remove_cell(&mut self, index: usize) {
        let count = self.count();
        let len = self.cell(index).len();
        let slots = HEADER_BYTES + 2 * index;
        self.bytes.copy_within(slots + 2..HEADER_BYTES + 2 * count, slots);
        self.bytes[HEADER_BYTES + 2 * (count - 1)..HEADER_BYTES + 2 * count].fill(0);
        self.set_count(count - 1);
        self.set_garbage(self.garbage() + len);
    }

    /// Overwrites a leaf's `index`th value with one of the same length, in place.
    pub(crate) fn overwrite_value(&mut self, index: usize, value: &[u8]) {
        let offset = self.slot(index);
        let key = self.bytes[offset] as usize;
        let start = offset + LEAF_CELL_HEADER + key;
        assert_eq!(self.value(index).len(), value.len(), "an in-place overwrite keeps the length");
        self.bytes[start..start + value.len()].copy_from_slice(value);
    }

    /// Every cell's bytes, in key order.
    pub(crate) fn cells(&self) -> Vec<Vec<u8>> {
        (0..self.count()).map(|i| self.cell(i).to_vec()).collect()
    }

    /// A page of `kind` linked to `link` holding `cells` (in key order) packed, no garbage.
    pub(crate) fn from_cells(kind: PageKind, link: u64, cells: &[Vec<u8>]) -> Page {
        let mut page = Page::new(kind, link);
        for (i, cell) in cells.iter().enumerate() {
            assert!(page.insert_cell(i, cell), "cells chosen to fit a page");
        }
        page
    }

    /// The page rewritten with its live cells only.
    pub(crate) fn compacted(&self) -> Page {
        Page::from_cells(self.kind(), self.link(), &self.cells())
    }

    /// Checks every cell of a leaf or internal page: inside the cell area, lengths within the
    /// limits, keys strictly increasing, and the area's bytes all accounted for (cells plus
    /// garbage), so no two cells overlap.
    pub(super) fn cells_problem(&self, kind: PageKind) -> Option<String> {
        let (count, start) = (self.count(), self.cell_start());
        let header = if kind == PageKind::Leaf { LEAF_CELL_HEADER } else { INTERNAL_CELL_HEADER };
        let mut used = 0usize;
        let mut previous: Option<&[u8]> = None;
        for index in 0..count {
            let offset = self.u16_at(HEADER_BYTES + 2 * index) as usize;
            if offset < start || offset + header > PAGE_SIZE {
                return Some(format!("cell {index} at byte {offset} lies outside the cell area"));
            }
            let key_len = self.bytes[offset] as usize;
            if key_len > MAX_KEY_BYTES {
                return Some(format!("cell {index} has a key of {key_len} bytes"));
            }
            if kind == PageKind::Leaf {
                let value_len = u16::from_le_bytes([self.bytes[offset + 1], self.bytes[offset + 2]]) as usize;
                if value_len > MAX_VALUE_BYTES {
                    return Some(format!("cell {index} has a value of {value_len} bytes"));
                }
            } else if self.u64_at(offset + 1) == 0 {
                return Some(format!("cell {index} points at page 0"));
            }
            let len = self.cell_len_at(offset);
            if offset + len > PAGE_SIZE {
                return Some(format!("cell {index} at byte {offset} runs past the page"));
            }
            let key = &self.bytes[offset + header..offset + header + key_len];
            if previous.is_some_and(|previous| previous >= key) {
                return Some(format!("cell {index}'s key is not above the one before"));
            }
            previous = Some(key);
            used += len;
        }
        if used + self.garbage() != PAGE_SIZE - start {
            return Some(format!(
                "cells of {used} bytes and {} of garbage do not fill the cell area of {} bytes",
                self.garbage(),
                PAGE_SIZE - start
            ));
        }
        None
    }
}
