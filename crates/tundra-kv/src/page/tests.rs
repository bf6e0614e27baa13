//! The page format: cells in and out, compaction, and the check on reading: zeros are a page
//! never written, every bit flip is refused, and pages whose checksum is right but whose
//! structure is not are refused too.

use super::*;

fn leaf(pairs: &[(&[u8], &[u8])]) -> Page {
    let cells: Vec<Vec<u8>> = pairs.iter().map(|(k, v)| leaf_cell(k, v)).collect();
    Page::from_cells(PageKind::Leaf, 9, &cells)
}

fn stamped(mut page: Page) -> Page {
    page.stamp(Lsn(1234));
    page
}

#[test]
fn cells_go_in_sorted_and_come_out_whole() {
    let mut page = leaf(&[(b"b", b"two"), (b"d", b"four")]);
    assert_eq!(page.search(b"c"), Err(1));
    assert!(page.insert_cell(1, &leaf_cell(b"c", b"three")));
    assert!(page.insert_cell(0, &leaf_cell(b"a", b"")));
    let keys: Vec<&[u8]> = (0..page.count()).map(|i| page.key(i)).collect();
    assert_eq!(keys, [&b"a"[..], b"b", b"c", b"d"]);
    assert_eq!(page.value(2), b"three");
    assert_eq!(page.search(b"d"), Ok(3));
    page.overwrite_value(1, b"TWO");
    assert_eq!(page.value(1), b"TWO");
    let free = page.free_bytes();
    page.remove_cell(2);
    assert_eq!(page.free_bytes(), free + 2, "only the slot returns at once");
    assert_eq!(page.reclaimable_bytes(), free + 2 + leaf_cell(b"c", b"three").len());
    let compacted = page.compacted();
    assert_eq!(compacted.free_bytes(), page.reclaimable_bytes());
    assert_eq!(compacted.cells(), page.cells());
    assert_eq!(compacted.link(), 9);
    let decoded = Page::decode(stamped(compacted).bytes().to_vec(), 3).unwrap().unwrap();
    assert_eq!(decoded.lsn(), Lsn(1234));
    Page::decode(stamped(page).bytes().to_vec(), 3).unwrap().unwrap();
}

#[test]
fn a_full_page_refuses_a_cell_and_stays_as_it_was() {
    let value = vec![7u8; MAX_VALUE_BYTES];
    let mut page = Page::new(PageKind::Leaf, 0);
    let mut count = 0u32;
    while page.insert_cell(count as usize, &leaf_cell(&count.to_be_bytes(), &value)) {
        count += 1;
    }
    assert!(count >= 14, "{count} of the largest cells fit");
    let before = page.clone();
    assert!(!page.insert_cell(0, &leaf_cell(b"\0", &value)));
    assert_eq!(page, before);
}

#[test]
fn internal_pages_route_keys_to_children() {
    let cells = vec![internal_cell(b"g", 20), internal_cell(b"p", 30)];
    let page = Page::from_cells(PageKind::Internal, 10, &cells);
    assert_eq!(page.child_for(b"a"), 10);
    assert_eq!(page.child_for(b"g"), 20);
    assert_eq!(page.child_for(b"h"), 20);
    assert_eq!(page.child_for(b"p"), 30);
    assert_eq!(page.child_for(b"zz"), 30);
}

#[test]
fn zeros_are_a_page_never_written_and_a_short_page_is_damage() {
    assert!(Page::decode(vec![0; PAGE_SIZE], 1).unwrap().is_none());
    let error = Page::decode(vec![0; PAGE_SIZE - 1], 1).unwrap_err();
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted);
}

#[test]
fn every_bit_flip_is_refused() {
    let page = stamped(leaf(&[(b"alpha", b"one"), (b"beta", &[5u8; 300]), (b"gamma", b"three")]));
    // Every bit of the header and the cells, and every 61st bit elsewhere.
    let cells_from = page.cell_start() * 8;
    let bits = (0..PAGE_SIZE * 8).filter(|&bit| bit < HEADER_BYTES * 16 || bit >= cells_from || bit % 61 == 0);
    for bit in bits {
        let mut bytes = page.bytes().to_vec();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let error = Page::decode(bytes, 5).unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Corrupted, "bit {bit}");
    }
}

/// A change that breaks a page's structure.
type Damage = Box<dyn Fn(&mut Page)>;

/// A page damaged by `damage`, restamped so that its checksum is right: only the format
/// check can refuse it.
fn refused_after(damage: impl Fn(&mut Page)) -> String {
    let mut page = leaf(&[(b"alpha", b"one"), (b"beta", b"two"), (b"gamma", b"three")]);
    damage(&mut page);
    page.stamp(Lsn(77));
    Page::decode(page.bytes().to_vec(), 4).unwrap_err().to_string()
}

#[test]
fn a_well_checksummed_page_of_the_wrong_shape_is_refused() {
    let slot = |i: usize| HEADER_BYTES + 2 * i;
    let cases: Vec<(&str, Damage)> = vec![
        ("magic", Box::new(|p: &mut Page| p.put_u16(MAGIC_AT, 0x1234))),
        ("version", Box::new(|p: &mut Page| p.bytes[VERSION_AT] = 2)),
        ("kind", Box::new(|p: &mut Page| p.bytes[KIND] = 9)),
        ("slots", Box::new(|p: &mut Page| p.set_count(4090))),
        ("outside", Box::new(move |p: &mut Page| p.put_u16(slot(0), 40))),
        (
            "past the page",
            Box::new(move |p: &mut Page| {
                p.put_u16(slot(0), (PAGE_SIZE - 6) as u16);
                p.bytes[PAGE_SIZE - 6..PAGE_SIZE - 3].copy_from_slice(&[1, 10, 0]);
            }),
        ),
        (
            "not above",
            Box::new(move |p: &mut Page| {
                let first = p.u16_at(slot(0));
                p.put_u16(slot(1), first);
            }),
        ),
        ("do not fill", Box::new(|p: &mut Page| p.set_garbage(5))),
        (
            "key of",
            Box::new(|p: &mut Page| {
                let at = p.u16_at(HEADER_BYTES) as usize;
                p.bytes[at] = 200;
            }),
        ),
        ("reserved", Box::new(|p: &mut Page| p.put_u16(RESERVED, 1))),
    ];
    for (expected, damage) in cases {
        let message = refused_after(damage);
        assert!(message.contains(expected), "{expected:?} not in {message:?}");
    }
    let internal = Page::from_cells(PageKind::Internal, 0, &[internal_cell(b"k", 5)]);
    let error = Page::decode(stamped(internal).bytes().to_vec(), 2).unwrap_err();
    assert!(error.to_string().contains("without children"), "{error}");
}

#[test]
fn the_meta_page_names_the_root_within_the_volume() {
    let mut page = Page::new(PageKind::Meta, 0);
    Meta { root: 1, next_free: 2 }.write(&mut page);
    let page = Page::decode(stamped(page).bytes().to_vec(), 0).unwrap().unwrap();
    assert_eq!(Meta::read(&page, 10).unwrap(), Meta { root: 1, next_free: 2 });
    assert!(Meta::read(&page, 1).is_err(), "next free page past the volume");
    let mut bad = Page::new(PageKind::Meta, 0);
    Meta { root: 3, next_free: 2 }.write(&mut bad);
    assert!(Meta::read(&bad, 10).is_err(), "a root not yet allocated");
    assert!(Meta::read(&leaf(&[]), 10).is_err(), "a leaf where the meta page belongs");
}
