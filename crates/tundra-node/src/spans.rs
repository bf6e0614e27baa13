//! How a byte range of a volume falls on its pages: a leading piece of a page, a run of whole
//! pages, a trailing piece of a page. Byte I/O (bytes.rs) walks every range this way: reads and
//! writes page by page ([`PageSpans`]), zeroing with the run of whole pages in one piece
//! ([`ByteRange::split`]), so the arithmetic lives here once.

use std::ops::Range;

/// `len` bytes of one page: from byte `within` of page `index`, which are bytes `at..at + len`
/// of the range (of the caller's buffer, for a read or a write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageSpan {
    pub index: u64,
    pub within: usize,
    pub len: usize,
    pub at: u64,
    page_size: usize,
}

impl PageSpan {
    /// The whole page, rather than a piece merged into it.
    pub fn is_whole(&self) -> bool {
        self.within == 0 && self.len == self.page_size
    }

    /// Where the span's bytes are in the caller's buffer.
    pub fn buffer(&self) -> Range<usize> {
        // A buffer's positions fit in usize: the range of a buffer is no longer than it.
        let at = self.at as usize;
        at..at + self.len
    }
}

/// A byte range of a volume, cut at page boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteRange {
    pub offset: u64,
    pub len: u64,
    pub page_size: u64,
}

/// A byte range in its three parts, each possibly empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    /// The piece before the first page boundary, or the whole range when it lies inside one
    /// page without covering it.
    pub head: Option<PageSpan>,
    /// The whole pages, by index; `whole_at` is where the first of them starts in the range.
    pub whole: Range<u64>,
    pub whole_at: u64,
    /// The piece after the last page boundary.
    pub tail: Option<PageSpan>,
}

impl ByteRange {
    /// `len` bytes at byte `offset`, in pages of `page_size` bytes. The caller has checked the
    /// range against the volume, so its end is a byte of it.
    pub fn new(offset: u64, len: u64, page_size: usize) -> ByteRange {
        assert!(page_size > 0);
        assert!(offset.checked_add(len).is_some());
        ByteRange { offset, len, page_size: page_size as u64 }
    }

    pub fn split(&self) -> Split {
        let ps = self.page_size;
        let end = self.offset + self.len;
        let piece = |at_byte: u64, len: u64| PageSpan {
            index: at_byte / ps,
            within: (at_byte % ps) as usize,
            len: len as usize,
            at: at_byte - self.offset,
            page_size: ps as usize,
        };
        let mut at = self.offset;
        let mut head = None;
        // A range that starts inside a page, or ends before its first page does, begins with
        // a piece of that page.
        if at < end && (!at.is_multiple_of(ps) || end - at < ps) {
            let len = (ps - at % ps).min(end - at);
            head = Some(piece(at, len));
            at += len;
        }
        let pages = (end - at) / ps;
        let whole = at / ps..at / ps + pages;
        let whole_at = at - self.offset;
        at += pages * ps;
        let tail = (at < end).then(|| piece(at, end - at));
        let piece_bytes = |span: Option<PageSpan>| span.map_or(0, |s| s.len as u64);
        assert_eq!(piece_bytes(head) + pages * ps + piece_bytes(tail), self.len);
        Split { head, whole, whole_at, tail }
    }

    /// Every page the range touches, in order, whole pages one by one.
    pub fn pages(&self) -> PageSpans {
        let split = self.split();
        PageSpans {
            page_size: self.page_size,
            head: split.head,
            whole: split.whole,
            whole_at: split.whole_at,
            tail: split.tail,
        }
    }
}

/// The pages of a [`ByteRange`], in order.
pub(crate) struct PageSpans {
    page_size: u64,
    head: Option<PageSpan>,
    whole: Range<u64>,
    whole_at: u64,
    tail: Option<PageSpan>,
}

impl Iterator for PageSpans {
    type Item = PageSpan;

    fn next(&mut self) -> Option<PageSpan> {
        if let Some(head) = self.head.take() {
            return Some(head);
        }
        if let Some(index) = self.whole.next() {
            let at = self.whole_at;
            self.whole_at += self.page_size;
            let page_size = self.page_size as usize;
            return Some(PageSpan { index, within: 0, len: page_size, at, page_size });
        }
        self.tail.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 8192;
    const P: u64 = PAGE as u64;

    fn span(index: u64, within: usize, len: usize, at: u64) -> PageSpan {
        PageSpan { index, within, len, at, page_size: PAGE }
    }

    fn pages(offset: u64, len: u64) -> Vec<PageSpan> {
        ByteRange::new(offset, len, PAGE).pages().collect()
    }

    /// The spans tile the range: contiguous in it, each inside its page, and at the byte
    /// the range says.
    fn check_tiling(offset: u64, len: u64) {
        let spans = pages(offset, len);
        let mut next = 0;
        for s in &spans {
            assert_eq!(s.at, next);
            assert!(s.len > 0);
            assert!(s.within + s.len <= PAGE);
            assert_eq!(s.index * P + s.within as u64, offset + s.at);
            next += s.len as u64;
        }
        assert_eq!(next, len);
    }

    #[test]
    fn an_empty_range_touches_no_page() {
        assert_eq!(pages(0, 0), vec![]);
        assert_eq!(pages(3 * P + 17, 0), vec![]);
        let split = ByteRange::new(3 * P + 17, 0, PAGE).split();
        assert_eq!((split.head, split.whole.is_empty(), split.tail), (None, true, None));
    }

    #[test]
    fn a_range_inside_one_page_is_one_partial_head() {
        for (offset, len) in [(0, 1), (0, P - 1), (100, 200), (P - 1, 1), (2 * P + 1, P - 1)] {
            let spans = pages(offset, len);
            assert_eq!(spans, vec![span(offset / P, (offset % P) as usize, len as usize, 0)]);
            assert!(!spans[0].is_whole());
            let split = ByteRange::new(offset, len, PAGE).split();
            assert!(split.whole.is_empty());
            assert_eq!(split.tail, None);
        }
    }

    #[test]
    fn an_unaligned_range_has_a_head_whole_pages_and_a_tail() {
        let split = ByteRange::new(P + 100, 3 * P, PAGE).split();
        assert_eq!(split.head, Some(span(1, 100, PAGE - 100, 0)));
        assert_eq!(split.whole, 2..4);
        assert_eq!(split.whole_at, P - 100);
        assert_eq!(split.tail, Some(span(4, 0, 100, 3 * P - 100)));
        assert_eq!(
            pages(P + 100, 3 * P),
            vec![
                span(1, 100, PAGE - 100, 0),
                span(2, 0, PAGE, P - 100),
                span(3, 0, PAGE, 2 * P - 100),
                span(4, 0, 100, 3 * P - 100),
            ]
        );
    }

    #[test]
    fn two_pieces_without_a_whole_page_between() {
        assert_eq!(pages(P - 10, 20), vec![span(0, PAGE - 10, 10, 0), span(1, 0, 10, 10)]);
        assert_eq!(pages(P / 2, P), vec![span(0, PAGE / 2, PAGE / 2, 0), span(1, 0, PAGE / 2, P / 2)]);
    }

    #[test]
    fn an_aligned_start_or_end_leaves_out_that_piece() {
        let split = ByteRange::new(2 * P, P + 5, PAGE).split();
        assert_eq!((split.head, split.whole, split.tail), (None, 2..3, Some(span(3, 0, 5, P))));
        let split = ByteRange::new(2 * P - 5, P + 5, PAGE).split();
        assert_eq!((split.head, split.whole, split.tail), (Some(span(1, PAGE - 5, 5, 0)), 2..3, None));
    }

    #[test]
    fn an_exactly_aligned_range_is_whole_pages_only() {
        let split = ByteRange::new(4 * P, 3 * P, PAGE).split();
        assert_eq!((split.head, split.whole, split.whole_at, split.tail), (None, 4..7, 0, None));
        let spans = pages(4 * P, 3 * P);
        assert_eq!(spans, vec![span(4, 0, PAGE, 0), span(5, 0, PAGE, P), span(6, 0, PAGE, 2 * P)]);
        assert!(spans.iter().all(PageSpan::is_whole));
        assert_eq!(pages(0, P), vec![span(0, 0, PAGE, 0)]);
    }

    #[test]
    fn the_last_page_of_a_volume() {
        // A volume of 10 pages: ranges ending at its last byte name page 9 and no further.
        let size = 10 * P;
        assert_eq!(pages(size - P, P), vec![span(9, 0, PAGE, 0)]);
        assert_eq!(pages(size - 1, 1), vec![span(9, PAGE - 1, 1, 0)]);
        let spans = pages(size - P - 3, P + 3);
        assert_eq!(spans, vec![span(8, PAGE - 3, 3, 0), span(9, 0, PAGE, 3)]);
        let split = ByteRange::new(0, size, PAGE).split();
        assert_eq!((split.head, split.whole, split.tail), (None, 0..10, None));
        // At the end of the address space, nothing overflows.
        let top = u64::MAX / P * P;
        assert_eq!(pages(top - 1, 1), vec![span(top / P - 1, PAGE - 1, 1, 0)]);
    }

    #[test]
    fn buffer_ranges_follow_the_range() {
        let spans = pages(P - 4, P + 8);
        let ranges: Vec<Range<usize>> = spans.iter().map(PageSpan::buffer).collect();
        assert_eq!(ranges, vec![0..4, 4..PAGE + 4, PAGE + 4..PAGE + 8]);
    }

    #[test]
    fn spans_tile_every_small_range() {
        // Offsets and lengths on, just before and just after the first page boundaries.
        for offset in [0, 1, P - 1, P, P + 1, 2 * P - 1] {
            for len in [0, 1, P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 1, 5 * P + 3] {
                check_tiling(offset, len);
            }
        }
    }

    /// The simplest walk: from each position, the rest of its page or of the range.
    fn plain_walk(offset: u64, len: u64, page_size: u64) -> Vec<(u64, usize, usize, u64)> {
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let n = (page_size - at % page_size).min(offset + len - at);
            out.push((at / page_size, (at % page_size) as usize, n as usize, at - offset));
            at += n;
        }
        out
    }

    #[test]
    fn pages_match_a_plain_walk_and_the_split_groups_its_whole_pages() {
        // Small pages, so that every offset and length around several boundaries is tried.
        for page_size in [1u64, 2, 4, 5] {
            for offset in 0..4 * page_size {
                for len in 0..6 * page_size {
                    let range = ByteRange::new(offset, len, page_size as usize);
                    let walked: Vec<_> = range.pages().map(|s| (s.index, s.within, s.len, s.at)).collect();
                    let expected = plain_walk(offset, len, page_size);
                    assert_eq!(walked, expected, "offset {offset} len {len} page {page_size}");
                    // The split is the same walk with its whole pages as one run.
                    let split = range.split();
                    let whole: Vec<u64> = range.pages().filter(PageSpan::is_whole).map(|s| s.index).collect();
                    assert_eq!(split.whole.clone().collect::<Vec<_>>(), whole);
                    let pieces: Vec<PageSpan> = range.pages().filter(|s| !s.is_whole()).collect();
                    let ends: Vec<PageSpan> = split.head.into_iter().chain(split.tail).collect();
                    assert_eq!(pieces, ends);
                }
            }
        }
    }
}
