//! A small buffer of decompressed heavy segments (seed 000 §3.2.3: "a temporary buffer for
//! decompressed segments effectively optimizes such sequential access patterns"). Reading the
//! pages of a heavy segment in order decompresses it once instead of once per page.
//!
//! It evicts the least recently used segment by scanning all entries: the capacity is a handful
//! of segments (each up to 64 MiB), so a scan is cheaper than keeping an ordered list. It does no
//! locking of its own; a shared cache sits behind the caller's mutex.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{HeavySegment, Result};

/// Counters of a [`SegmentCache`] since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Segments held now.
    pub segments: usize,
}

struct Entry {
    segment: Arc<HeavySegment>,
    last_used: u64,
}

/// Decompressed heavy segments keyed by the caller's segment id, at most `capacity` of them.
pub struct SegmentCache {
    capacity: usize,
    entries: HashMap<u64, Entry>,
    /// Advances on every use; an entry's `last_used` orders it for eviction.
    clock: u64,
    stats: CacheStats,
}

impl SegmentCache {
    /// A cache of at most `capacity_segments` segments; 0 keeps nothing.
    pub fn new(capacity_segments: usize) -> SegmentCache {
        SegmentCache { capacity: capacity_segments, entries: HashMap::new(), clock: 0, stats: CacheStats::default() }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The segment with this id, counting a hit or a miss.
    pub fn get(&mut self, id: u64) -> Option<Arc<HeavySegment>> {
        let now = self.tick();
        match self.entries.get_mut(&id) {
            Some(entry) => {
                entry.last_used = now;
                self.stats.hits += 1;
                Some(Arc::clone(&entry.segment))
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Keeps `segment` under `id`, replacing what was there and evicting the least recently used
    /// segment when full.
    pub fn insert(&mut self, id: u64, segment: Arc<HeavySegment>) {
        if self.capacity == 0 {
            return;
        }
        let now = self.tick();
        if !self.entries.contains_key(&id) && self.entries.len() >= self.capacity {
            self.evict_least_recently_used();
        }
        self.entries.insert(id, Entry { segment, last_used: now });
        assert!(self.entries.len() <= self.capacity);
    }

    fn evict_least_recently_used(&mut self) {
        let oldest = self.entries.iter().min_by_key(|(_, entry)| entry.last_used).map(|(&id, _)| id);
        if let Some(id) = oldest {
            self.entries.remove(&id);
            self.stats.evictions += 1;
        }
    }

    /// The cached segment, or the one `load` decompresses, which is then cached.
    pub fn get_or_load(&mut self, id: u64, load: impl FnOnce() -> Result<HeavySegment>) -> Result<Arc<HeavySegment>> {
        if let Some(segment) = self.get(id) {
            return Ok(segment);
        }
        let segment = Arc::new(load()?);
        self.insert(id, Arc::clone(&segment));
        Ok(segment)
    }

    /// Forgets a segment, as when its blocks are freed and its id may be reused.
    pub fn remove(&mut self, id: u64) -> Option<Arc<HeavySegment>> {
        self.entries.remove(&id).map(|entry| entry.segment)
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats { segments: self.entries.len(), ..self.stats }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heavy::{HeavyConfig, compress_segment, decompress_segment};
    use crate::{Error, PageSize};

    fn segment(fill: u8) -> HeavySegment {
        let data = vec![fill; 8192 * 2];
        let compressed = compress_segment(&data, PageSize::Kib8, HeavyConfig { level: 1 }).unwrap();
        decompress_segment(&compressed, PageSize::Kib8, 2).unwrap()
    }

    #[test]
    fn hits_misses_and_least_recently_used_eviction() {
        let mut cache = SegmentCache::new(2);
        assert!(cache.get(1).is_none());
        cache.insert(1, Arc::new(segment(1)));
        cache.insert(2, Arc::new(segment(2)));
        assert_eq!(cache.get(1).unwrap().page(0).unwrap()[0], 1);
        // 2 is now the least recently used.
        cache.insert(3, Arc::new(segment(3)));
        assert!(cache.get(2).is_none());
        assert!(cache.get(1).is_some());
        assert!(cache.get(3).is_some());
        assert_eq!(cache.stats(), CacheStats { hits: 3, misses: 2, evictions: 1, segments: 2 });
        assert!(cache.remove(3).is_some());
        assert_eq!(cache.stats().segments, 1);
    }

    #[test]
    fn get_or_load_loads_once() {
        let mut cache = SegmentCache::new(4);
        let mut loads = 0;
        for _ in 0..3 {
            let got = cache
                .get_or_load(7, || {
                    loads += 1;
                    Ok(segment(7))
                })
                .unwrap();
            assert_eq!(got.page_count(), 2);
        }
        assert_eq!(loads, 1);
        let failed = cache.get_or_load(8, || Err(Error::corrupted("bad segment")));
        assert!(failed.is_err());
        assert!(cache.get(8).is_none(), "a failed load caches nothing");
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let mut cache = SegmentCache::new(0);
        cache.insert(1, Arc::new(segment(1)));
        assert!(cache.get(1).is_none());
        assert_eq!(cache.stats().segments, 0);
    }
}
