//! The tree against a BTreeMap under seeded random puts, overwrites and deletes, on pages held
//! in a map (no storage, no redo): every lookup and scan agrees, every page passes the format
//! check, the tree grows to three levels (internal pages split), and a volume out of pages refuses a split with
//! `Full`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tundra_env::{Rng, seed_from_env};
use tundra_store::ids::Lsn;

use super::*;
use crate::page::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
use crate::{ErrorKind, Result};

struct MemPages {
    pages: HashMap<u64, Arc<Page>>,
    page_count: u64,
}

impl MemPages {
    fn new(page_count: u64) -> MemPages {
        let mut meta = Page::new(PageKind::Meta, 0);
        Meta { root: 1, next_free: 2 }.write(&mut meta);
        let pages = HashMap::from([(0, Arc::new(meta)), (1, Arc::new(Page::new(PageKind::Leaf, 0)))]);
        MemPages { pages, page_count }
    }

    /// Every page stamped and decoded: the format check on each.
    fn check(&self) {
        for (&number, page) in &self.pages {
            let mut stamped = Page::clone(page);
            stamped.stamp(Lsn(1));
            Page::decode(stamped.bytes().to_vec(), number).unwrap().unwrap();
        }
    }

    fn depth(&mut self) -> usize {
        let meta = read_meta(self).unwrap();
        let (path, _) = descend(self, &meta, b"").unwrap();
        path.len() + 1
    }
}

impl Pages for MemPages {
    fn read(&mut self, number: u64) -> Result<Arc<Page>> {
        Ok(self.pages.get(&number).cloned().unwrap_or_else(|| panic!("page {number} read before written")))
    }

    fn page_count(&self) -> u64 {
        self.page_count
    }
}

impl PagesMut for MemPages {
    fn write(&mut self, number: u64) -> Result<&mut Page> {
        Ok(Arc::make_mut(self.pages.get_mut(&number).expect("written pages exist")))
    }

    fn replace(&mut self, number: u64, page: Page) {
        self.pages.insert(number, Arc::new(page));
    }
}

fn key(rng: &mut Rng, space: u64) -> Vec<u8> {
    let id = rng.below(space);
    let mut key = format!("{id:08}").into_bytes();
    key.resize(8 + (id % (MAX_KEY_BYTES as u64 - 7)) as usize, b'~');
    key
}

#[test]
fn the_tree_agrees_with_a_btreemap() {
    let seed = seed_from_env(0x7472_6565);
    let mut rng = Rng::new(seed);
    let mut pages = MemPages::new(1 << 20);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for step in 0..12_000 {
        let key = key(&mut rng, 4_000);
        match rng.below(10) {
            0..=5 => {
                let len = match model.get(&key) {
                    Some(old) if rng.chance(0.3) => old.len(),
                    _ => rng.below(MAX_VALUE_BYTES as u64 + 1) as usize,
                };
                let value = rng.bytes(len);
                write::put(&mut pages, &key, &value).unwrap();
                model.insert(key, value);
            }
            6..=7 => assert_eq!(write::delete(&mut pages, &key).unwrap(), model.remove(&key).is_some()),
            8 => assert_eq!(read::lookup(&mut pages, &key).unwrap().as_ref(), model.get(&key), "seed {seed}"),
            _ => {
                let limit = rng.below(60) as usize;
                let expected: Vec<_> =
                    model.range(key.clone()..).take(limit).map(|(k, v)| (k.clone(), v.clone())).collect();
                assert_eq!(read::scan(&mut pages, &key, limit).unwrap(), expected, "seed {seed} step {step}");
            }
        }
        if step % 2_000 == 0 {
            pages.check();
        }
    }
    pages.check();
    let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(read::scan(&mut pages, b"", usize::MAX).unwrap(), all);
}

#[test]
fn internal_pages_split_too() {
    // Keys and values of the largest size: about ten records a leaf, a hundred children an
    // internal page, so 6,000 keys need three levels.
    let mut rng = Rng::new(seed_from_env(0x6465_6570));
    let mut pages = MemPages::new(1 << 20);
    let mut model = BTreeMap::new();
    for _ in 0..6_000 {
        let mut key = rng.below(1 << 40).to_be_bytes().to_vec();
        key.resize(MAX_KEY_BYTES, b'k');
        let value = rng.bytes(MAX_VALUE_BYTES);
        write::put(&mut pages, &key, &value).unwrap();
        model.insert(key, value);
    }
    pages.check();
    assert!(pages.depth() >= 3, "the tree reached {} levels", pages.depth());
    let all: Vec<_> = model.into_iter().collect();
    assert_eq!(read::scan(&mut pages, b"", usize::MAX).unwrap(), all);
}

#[test]
fn a_volume_out_of_pages_refuses_the_split() {
    let mut pages = MemPages::new(3);
    let value = vec![1u8; MAX_VALUE_BYTES];
    let mut stored = 0u32;
    let error = loop {
        match write::put(&mut pages, &stored.to_be_bytes(), &value) {
            Ok(()) => stored += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(error.kind(), ErrorKind::Full, "{error}");
    assert!(stored >= 14);
}

#[test]
fn a_child_outside_the_pages_in_use_is_damage() {
    let mut pages = MemPages::new(100);
    let root = Page::from_cells(PageKind::Internal, 1, &[crate::page::internal_cell(b"m", 50)]);
    pages.replace(2, root);
    let mut meta = Page::new(PageKind::Meta, 0);
    Meta { root: 2, next_free: 3 }.write(&mut meta);
    pages.replace(0, meta);
    assert!(read::lookup(&mut pages, b"a").unwrap().is_none());
    let error = read::lookup(&mut pages, b"z").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupted, "{error}");
}
