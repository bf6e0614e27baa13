//! A bounded cache of decompressed pages, least recently used out first, with hit statistics
//! (seed 000 §3.3.3: the storage software's memory cache spares reads and decompression).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::ids::{ChunkId, PageNo};

type Key = (ChunkId, PageNo);

/// Hits and misses since the cache was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub pages: u64,
}

pub struct PageCache {
    capacity: usize,
    pages: HashMap<Key, (Arc<[u8]>, u64)>,
    /// Last use stamp -> page: the first entry is the least recently used.
    order: BTreeMap<u64, Key>,
    clock: u64,
    stats: CacheStats,
}

impl PageCache {
    pub fn new(capacity_pages: usize) -> PageCache {
        PageCache {
            capacity: capacity_pages,
            pages: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn get(&mut self, key: Key) -> Option<Arc<[u8]>> {
        let Some((page, stamp)) = self.pages.get_mut(&key) else {
            self.stats.misses += 1;
            return None;
        };
        self.order.remove(stamp);
        self.clock += 1;
        *stamp = self.clock;
        self.order.insert(self.clock, key);
        self.stats.hits += 1;
        Some(page.clone())
    }

    pub fn insert(&mut self, key: Key, page: Arc<[u8]>) {
        if self.capacity == 0 {
            return;
        }
        self.invalidate(key);
        while self.pages.len() >= self.capacity {
            let (_, oldest) = self.order.pop_first().expect("a full cache has an oldest page");
            self.pages.remove(&oldest);
            self.stats.evictions += 1;
        }
        self.clock += 1;
        self.pages.insert(key, (page, self.clock));
        self.order.insert(self.clock, key);
    }

    /// Gives a page the cache holds new content (a use of it); a page it does not hold stays
    /// out.
    pub fn replace(&mut self, key: Key, page: impl FnOnce() -> Arc<[u8]>) {
        if self.pages.contains_key(&key) {
            self.insert(key, page());
        }
    }

    pub fn invalidate(&mut self, key: Key) {
        if let Some((_, stamp)) = self.pages.remove(&key) {
            self.order.remove(&stamp);
        }
    }

    /// The most pages the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats { pages: self.pages.len() as u64, ..self.stats }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: u32) -> Key {
        (ChunkId(1), PageNo(p))
    }

    #[test]
    fn least_recently_used_goes_first() {
        let mut cache = PageCache::new(2);
        cache.insert(key(1), Arc::from(vec![1u8]));
        cache.insert(key(2), Arc::from(vec![2u8]));
        assert!(cache.get(key(1)).is_some());
        cache.insert(key(3), Arc::from(vec![3u8]));
        assert!(cache.get(key(2)).is_none(), "2 was the least recently used");
        assert_eq!(&*cache.get(key(1)).unwrap(), &[1u8]);
        cache.invalidate(key(1));
        assert!(cache.get(key(1)).is_none());
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.evictions, stats.pages), (2, 2, 1, 1));
    }
}
