//! The node's write-back cache for block-device clients: what a drive's volatile write cache is
//! to a host. NBD promises a write is durable only after a FLUSH (or with FUA), and a kernel
//! filesystem sends one exactly where it needs durability (a journal commit, an fsync). So byte
//! writes land here, merged into whole pages in memory (a filesystem's 4 KiB blocks fill 8 and
//! 16 KiB pages in two or four writes), and reach the store (compressed, journalled, durable)
//! when a flush asks, when the cache passes its limit, or from the background pass about once a
//! second. Pages are compressed once per flush rather than once per block written.
//!
//! Rules that keep it correct:
//! - A dirty page stays readable here until the store holds it: a flush writes a page to the
//!   store first and removes the entry after, and only if no newer write replaced it meanwhile
//!   (generations).
//! - Flushes of one volume run one at a time; each writes every page of the volume dirty when
//!   it started. A flush of every volume (the background pass, the limit) is a flush of each
//!   volume in turn, so a client's flush of one volume (a database's WAL commit) never waits
//!   for another volume's pages to be written (seed 000 §3.3.1: redo writes bypass the data
//!   path). Volumes share a gate only when their ids fall on the same one of [`GATES`].
//! - Operations that change the store directly (page-protocol writes, heavy compression, volume
//!   deletion) first take the page's entry out under its shard's lock, so a cached older
//!   version can never overwrite them later; they run between flushes of their volume, not
//!   during one.
//! - A whole-page trim is cached as a page that reads as zeros, and becomes a store trim (blocks
//!   freed) when flushed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use tundra_store::ids::VolumeId;

/// A page of a volume: (volume, page index in the volume).
pub type Key = (VolumeId, u64);

/// What a dirty page will become in the store.
#[derive(Clone)]
pub enum Content {
    Page(Arc<Vec<u8>>),
    /// Trimmed: reads as zeros; the store frees its blocks.
    Trimmed,
}

struct Dirty {
    content: Content,
    generation: u64,
}

/// Accounting for a trimmed entry, which holds no page.
const TRIMMED_BYTES: u64 = 64;
const SHARDS: usize = 64;
/// Flush gates, each shared by the volumes whose id falls on it.
pub const GATES: usize = 16;

pub struct WriteBack {
    shards: Vec<Mutex<ShardMap>>,
    bytes: AtomicU64,
    generation: AtomicU64,
    /// Per volume (by id, [`GATES`] of them): a flush of the volume takes its gate exclusively,
    /// direct store operations on it share it.
    gates: Vec<RwLock<()>>,
    limit_bytes: u64,
    /// Pieces of pages written (less than a page), merged into a page here.
    pieces: AtomicU64,
    /// Of those, the pieces whose page was not cached here, so that the page was read from the
    /// store first (from its page cache when that held it, from the device otherwise).
    piece_reads: AtomicU64,
}

/// One shard's dirty pages, by volume then page: a flush of one volume (a database's WAL
/// commit) visits that volume's pages only, not every dirty page of the data volumes beside it.
/// A volume left with no page here is dropped, so the volumes listed are the dirty ones.
#[derive(Default)]
struct ShardMap(HashMap<VolumeId, HashMap<u64, Dirty>>);

impl ShardMap {
    fn get(&self, (volume, page): Key) -> Option<&Dirty> {
        self.0.get(&volume)?.get(&page)
    }

    fn get_mut(&mut self, (volume, page): Key) -> Option<&mut Dirty> {
        self.0.get_mut(&volume)?.get_mut(&page)
    }

    fn insert(&mut self, (volume, page): Key, dirty: Dirty) -> Option<Dirty> {
        self.0.entry(volume).or_default().insert(page, dirty)
    }

    fn remove(&mut self, (volume, page): Key) -> Option<Dirty> {
        let pages = self.0.get_mut(&volume)?;
        let removed = pages.remove(&page);
        if pages.is_empty() {
            self.0.remove(&volume);
        }
        removed
    }
}

/// A dirty page as a flush found it.
pub struct Snapshot {
    pub key: Key,
    pub content: Content,
    generation: u64,
}

fn cost(content: &Content) -> u64 {
    match content {
        Content::Page(page) => page.len() as u64,
        Content::Trimmed => TRIMMED_BYTES,
    }
}

impl WriteBack {
    pub fn new(limit_bytes: u64) -> WriteBack {
        WriteBack::with_gates(limit_bytes, GATES)
    }

    /// A cache with `gates` flush gates (tests: one gate is the cache before flushes of
    /// different volumes could run side by side).
    fn with_gates(limit_bytes: u64, gates: usize) -> WriteBack {
        assert!(gates > 0, "a write-back cache needs a flush gate");
        WriteBack {
            shards: (0..SHARDS).map(|_| Mutex::new(ShardMap::default())).collect(),
            bytes: AtomicU64::new(0),
            generation: AtomicU64::new(1),
            gates: (0..gates).map(|_| RwLock::new(())).collect(),
            limit_bytes,
            pieces: AtomicU64::new(0),
            piece_reads: AtomicU64::new(0),
        }
    }

    fn shard_of(key: Key) -> usize {
        let hash = u64::from(key.0.0).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ key.1.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (hash >> 32) as usize % SHARDS
    }

    /// The shard holding `key`, locked: the caller may read the store and change the entry
    /// with no other writer of that page in between.
    pub fn lock(&self, key: Key) -> ShardGuard<'_> {
        ShardGuard { cache: self, map: self.shards[Self::shard_of(key)].lock(), key }
    }

    /// What a reader sees for `key`, if it is dirty.
    pub fn get(&self, key: Key) -> Option<Content> {
        self.shards[Self::shard_of(key)].lock().get(key).map(|d| d.content.clone())
    }

    /// Counts a piece of a page merged here; `read` when its page had to be read from the store.
    pub fn count_piece(&self, read: bool) {
        self.pieces.fetch_add(1, Ordering::Relaxed);
        if read {
            self.piece_reads.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Pieces merged since the node started, and those that read their page from the store.
    pub fn piece_counts(&self) -> (u64, u64) {
        (self.pieces.load(Ordering::Relaxed), self.piece_reads.load(Ordering::Relaxed))
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn over_limit(&self) -> bool {
        self.dirty_bytes() > self.limit_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.dirty_bytes() == 0
    }

    fn gate_of(&self, volume: VolumeId) -> usize {
        volume.0 as usize % self.gates.len()
    }

    /// Held by a flush of `volume`: no other flush of it and no direct store operation on it
    /// runs meanwhile.
    pub fn flushing(&self, volume: VolumeId) -> RwLockWriteGuard<'_, ()> {
        self.gates[self.gate_of(volume)].write()
    }

    /// Held by a direct store operation on `volume`: no flush of it runs meanwhile.
    pub fn direct(&self, volume: VolumeId) -> RwLockReadGuard<'_, ()> {
        self.gates[self.gate_of(volume)].read()
    }

    /// The volumes with dirty pages now, in id order.
    pub fn dirty_volumes(&self) -> Vec<VolumeId> {
        let mut volumes = std::collections::BTreeSet::new();
        for shard in &self.shards {
            volumes.extend(shard.lock().0.keys().copied());
        }
        volumes.into_iter().collect()
    }

    /// Every dirty page of one volume, as of now (the caller holds [`WriteBack::flushing`] of
    /// it).
    pub fn snapshot(&self, volume: VolumeId) -> Vec<Snapshot> {
        let mut all = Vec::new();
        for shard in &self.shards {
            if let Some(pages) = shard.lock().0.get(&volume) {
                all.extend(pages.iter().map(|(&page, dirty)| Snapshot {
                    key: (volume, page),
                    content: dirty.content.clone(),
                    generation: dirty.generation,
                }));
            }
        }
        // In page order, so that a flush writes neighbours together.
        all.sort_unstable_by_key(|s| (s.key.0.0, s.key.1));
        all
    }

    /// Forgets a flushed page, unless a newer write replaced it since the snapshot.
    pub fn flushed(&self, snapshot: &Snapshot) {
        let mut map = self.shards[Self::shard_of(snapshot.key)].lock();
        if map.get(snapshot.key).is_some_and(|d| d.generation == snapshot.generation)
            && let Some(dirty) = map.remove(snapshot.key)
        {
            self.bytes.fetch_sub(cost(&dirty.content), Ordering::Relaxed);
        }
    }

    /// Drops every entry of a volume (it is being deleted).
    pub fn discard_volume(&self, volume: VolumeId) {
        for shard in &self.shards {
            if let Some(pages) = shard.lock().0.remove(&volume) {
                let freed: u64 = pages.values().map(|dirty| cost(&dirty.content)).sum();
                self.bytes.fetch_sub(freed, Ordering::Relaxed);
            }
        }
    }
}

/// One page's shard, locked.
pub struct ShardGuard<'a> {
    cache: &'a WriteBack,
    map: MutexGuard<'a, ShardMap>,
    key: Key,
}

impl ShardGuard<'_> {
    pub fn get(&self) -> Option<&Content> {
        self.map.get(self.key).map(|d| &d.content)
    }

    /// The page's dirty bytes to change in place (copied first if a flush holds them).
    pub fn page_mut(&mut self) -> Option<&mut Vec<u8>> {
        let generation = self.cache.generation.fetch_add(1, Ordering::Relaxed);
        match self.map.get_mut(self.key) {
            Some(Dirty { content: Content::Page(page), generation: g }) => {
                *g = generation;
                Some(Arc::make_mut(page))
            }
            _ => None,
        }
    }

    pub fn put(&mut self, content: Content) {
        let generation = self.cache.generation.fetch_add(1, Ordering::Relaxed);
        self.cache.bytes.fetch_add(cost(&content), Ordering::Relaxed);
        if let Some(old) = self.map.insert(self.key, Dirty { content, generation }) {
            self.cache.bytes.fetch_sub(cost(&old.content), Ordering::Relaxed);
        }
    }

    pub fn remove(&mut self) {
        if let Some(old) = self.map.remove(self.key) {
            self.cache.bytes.fetch_sub(cost(&old.content), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a flush of `volume` could start now (its gate is free).
    fn can_flush(cache: &WriteBack, volume: VolumeId) -> bool {
        cache.gates[cache.gate_of(volume)].try_write().is_some()
    }

    fn flush_of_one_volume_leaves_the_other_free(cache: &WriteBack) -> bool {
        let (wal, data) = (VolumeId(1), VolumeId(2));
        let _data_flushing = cache.flushing(data);
        // The same volume stays excluded, from flushes and from direct operations.
        assert!(!can_flush(cache, data));
        assert!(cache.gates[cache.gate_of(data)].try_read().is_none());
        can_flush(cache, wal)
    }

    #[test]
    fn a_flush_of_one_volume_does_not_hold_up_another() {
        assert!(flush_of_one_volume_leaves_the_other_free(&WriteBack::new(1 << 20)));
    }

    /// The twin: one gate for every volume, as before, and the check sees the WAL's flush wait.
    #[test]
    fn one_shared_gate_holds_up_the_other_volume() {
        assert!(!flush_of_one_volume_leaves_the_other_free(&WriteBack::with_gates(1 << 20, 1)));
    }

    #[test]
    fn dirty_volumes_are_listed_once_in_id_order() {
        let cache = WriteBack::new(1 << 20);
        for key in [(VolumeId(3), 7), (VolumeId(1), 2), (VolumeId(3), 9), (VolumeId(1), 200)] {
            cache.lock(key).put(Content::Trimmed);
        }
        assert_eq!(cache.dirty_volumes(), vec![VolumeId(1), VolumeId(3)]);
        assert_eq!(cache.snapshot(VolumeId(3)).iter().map(|s| s.key.1).collect::<Vec<_>>(), vec![7, 9]);
    }

    /// A volume whose pages are all flushed, removed or discarded is no longer dirty, and the
    /// bytes counted for it are given back.
    #[test]
    fn a_volume_emptied_every_way_is_no_longer_listed() {
        let cache = WriteBack::new(1 << 20);
        for key in [(VolumeId(1), 2), (VolumeId(2), 5), (VolumeId(3), 7), (VolumeId(3), 9)] {
            cache.lock(key).put(Content::Page(Arc::new(vec![1u8; 8192])));
        }
        let snapshot = cache.snapshot(VolumeId(3));
        // A page written again after the snapshot stays dirty when the snapshot is flushed.
        cache.lock((VolumeId(3), 9)).put(Content::Trimmed);
        snapshot.iter().for_each(|s| cache.flushed(s));
        assert_eq!(cache.dirty_volumes(), vec![VolumeId(1), VolumeId(2), VolumeId(3)]);
        assert_eq!(cache.get((VolumeId(3), 7)).map(|_| ()), None);
        cache.flushed(&cache.snapshot(VolumeId(3))[0]);
        cache.lock((VolumeId(2), 5)).remove();
        assert_eq!(cache.dirty_volumes(), vec![VolumeId(1)]);
        assert_eq!(cache.dirty_bytes(), 8192);
        cache.discard_volume(VolumeId(1));
        assert!(cache.dirty_volumes().is_empty());
        assert!(cache.is_empty());
    }
}
