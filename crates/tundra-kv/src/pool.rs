//! The page cache both kinds of node keep: a bounded map of checked pages, least recently used
//! evicted first. Every page in it is clean: a node never writes a page to storage (storage
//! builds pages from redo), so any page can be dropped and read again as of the node's LSN.
//!
//! For the RW node it also remembers the LSN of pages it evicted (Neon's "last written LSN"
//! cache): reading such a page again, the node promises storage the page did not change since
//! that LSN, so storage need not wait for anything newer. The map is bounded too; an entry
//! dropped from it raises a floor that stands for every page not in the map.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tundra_store::ids::Lsn;

use crate::page::Page;

pub(crate) struct PagePool {
    capacity: usize,
    pages: HashMap<u64, (Arc<Page>, u64)>,
    /// Pages by their last use.
    by_use: BTreeMap<u64, u64>,
    tick: u64,
    evicted: HashMap<u64, Lsn>,
    evicted_capacity: usize,
    /// Every page neither cached nor in `evicted` last changed at or below this LSN.
    floor: Lsn,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl PagePool {
    /// A pool of up to `capacity` pages, whose pages not seen yet last changed at or below
    /// `floor`.
    pub(crate) fn new(capacity: usize, floor: Lsn) -> PagePool {
        assert!(capacity >= 8, "a tree descent holds a few pages at once");
        PagePool {
            capacity,
            pages: HashMap::new(),
            by_use: BTreeMap::new(),
            tick: 0,
            evicted: HashMap::new(),
            evicted_capacity: capacity * 4,
            floor,
            hits: 0,
            misses: 0,
        }
    }

    pub(crate) fn get(&mut self, number: u64) -> Option<Arc<Page>> {
        self.tick += 1;
        let tick = self.tick;
        let Some((page, used)) = self.pages.get_mut(&number) else {
            self.misses += 1;
            return None;
        };
        self.by_use.remove(used);
        *used = tick;
        self.by_use.insert(tick, number);
        self.hits += 1;
        Some(page.clone())
    }

    /// A cached page to change in place (the RO node applying redo), if cached.
    pub(crate) fn get_mut(&mut self, number: u64) -> Option<&mut Page> {
        self.pages.get_mut(&number).map(|(page, _)| Arc::make_mut(page))
    }

    pub(crate) fn insert(&mut self, number: u64, page: Arc<Page>) {
        self.tick += 1;
        if let Some((_, used)) = self.pages.insert(number, (page, self.tick)) {
            self.by_use.remove(&used);
        }
        self.by_use.insert(self.tick, number);
        self.evicted.remove(&number);
        while self.pages.len() > self.capacity {
            let (_, victim) = self.by_use.pop_first().expect("a full pool has pages");
            let (page, _) = self.pages.remove(&victim).expect("indexed pages are cached");
            self.remember(victim, page.lsn());
        }
    }

    pub(crate) fn remove(&mut self, number: u64) {
        if let Some((page, used)) = self.pages.remove(&number) {
            self.by_use.remove(&used);
            self.remember(number, page.lsn());
        }
    }

    /// Drops every page (the RO node resyncing): none of them is as of the new LSN.
    pub(crate) fn clear(&mut self, floor: Lsn) {
        self.pages.clear();
        self.by_use.clear();
        self.evicted.clear();
        self.floor = floor;
    }

    fn remember(&mut self, number: u64, lsn: Lsn) {
        self.evicted.insert(number, lsn);
        if self.evicted.len() > self.evicted_capacity {
            // Any entry will do: the floor covers it from now on.
            let dropped = *self.evicted.keys().next().expect("over capacity");
            let lsn = self.evicted.remove(&dropped).expect("just seen");
            self.floor = self.floor.max(lsn);
        }
    }

    /// The LSN at or after which `number` last changed, as far as this node knows: a read of
    /// it may promise storage it did not change since.
    pub(crate) fn last_written(&self, number: u64) -> Lsn {
        self.evicted.get(&number).copied().unwrap_or(self.floor).max(self.floor)
    }

    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }
}
