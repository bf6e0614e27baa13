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
//! - Flushes run one at a time; each writes every page dirty when it started (of one volume,
//!   for a client's flush of that volume; of all, for the background pass and the limit).
//! - Operations that change the store directly (page-protocol writes, heavy compression, volume
//!   deletion) first take the page's entry out under its shard's lock, so a cached older
//!   version can never overwrite them later; they run between flushes, not during one.
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

pub struct WriteBack {
    shards: Vec<Mutex<HashMap<Key, Dirty>>>,
    bytes: AtomicU64,
    generation: AtomicU64,
    /// Flushes take it exclusively; direct store operations share it.
    gate: RwLock<()>,
    limit_bytes: u64,
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
        WriteBack {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            bytes: AtomicU64::new(0),
            generation: AtomicU64::new(1),
            gate: RwLock::new(()),
            limit_bytes,
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
        self.shards[Self::shard_of(key)].lock().get(&key).map(|d| d.content.clone())
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

    /// Held by a flush: no direct store operation runs meanwhile.
    pub fn flushing(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write()
    }

    /// Held by a direct store operation: no flush runs meanwhile.
    pub fn direct(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// Every dirty page, or every dirty page of one volume, as of now (the caller holds
    /// [`WriteBack::flushing`]).
    pub fn snapshot(&self, only: Option<VolumeId>) -> Vec<Snapshot> {
        let mut all = Vec::new();
        for shard in &self.shards {
            for (&key, dirty) in shard.lock().iter() {
                if only.is_none_or(|volume| key.0 == volume) {
                    all.push(Snapshot { key, content: dirty.content.clone(), generation: dirty.generation });
                }
            }
        }
        // In page order, so that a flush writes neighbours together.
        all.sort_unstable_by_key(|s| (s.key.0.0, s.key.1));
        all
    }

    /// Forgets a flushed page, unless a newer write replaced it since the snapshot.
    pub fn flushed(&self, snapshot: &Snapshot) {
        let mut map = self.shards[Self::shard_of(snapshot.key)].lock();
        if map.get(&snapshot.key).is_some_and(|d| d.generation == snapshot.generation)
            && let Some(dirty) = map.remove(&snapshot.key)
        {
            self.bytes.fetch_sub(cost(&dirty.content), Ordering::Relaxed);
        }
    }

    /// Drops every entry of a volume (it is being deleted).
    pub fn discard_volume(&self, volume: VolumeId) {
        for shard in &self.shards {
            shard.lock().retain(|key, dirty| {
                let keep = key.0 != volume;
                if !keep {
                    self.bytes.fetch_sub(cost(&dirty.content), Ordering::Relaxed);
                }
                keep
            });
        }
    }
}

/// One page's shard, locked.
pub struct ShardGuard<'a> {
    cache: &'a WriteBack,
    map: MutexGuard<'a, HashMap<Key, Dirty>>,
    key: Key,
}

impl ShardGuard<'_> {
    pub fn get(&self) -> Option<&Content> {
        self.map.get(&self.key).map(|d| &d.content)
    }

    /// The page's dirty bytes to change in place (copied first if a flush holds them).
    pub fn page_mut(&mut self) -> Option<&mut Vec<u8>> {
        let generation = self.cache.generation.fetch_add(1, Ordering::Relaxed);
        match self.map.get_mut(&self.key) {
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
        if let Some(old) = self.map.remove(&self.key) {
            self.cache.bytes.fetch_sub(cost(&old.content), Ordering::Relaxed);
        }
    }
}
