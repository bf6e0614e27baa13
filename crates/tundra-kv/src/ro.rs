//! A read-only node. It follows the RW node's commits (a channel of committed batches, as
//! PolarDB's RW node ships redo to its ROs), holds a reader lease on the volume renewed with the
//! LSN it has applied, and answers point reads and range scans as of that LSN: snapshot
//! consistent, because it moves from one commit's end to the next.
//!
//! Its pages come from a bounded cache, to which it applies the redo of every batch it moves
//! past (a record is applied only if it is newer than the page's LSN), and from storage, which
//! serves a page as of the node's LSN. The node keeps the last few batches it applied, and with
//! them asks storage as Neon's compute does: "as of my LSN, and the page has not changed since
//! its last record I know of" (`not_modified_since`), so storage need not wait for redo it has
//! not applied yet when the page did not change there, and may serve the page from an older
//! LSN. The node checks that no record it holds is missing from such a page.
//!
//! A node that loses its lease (it lagged too far, or the lease expired) resyncs: it registers
//! again at the durable LSN, drops its cache and the batches before that LSN, and reads on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use tundra_redo::versions::apply;
use tundra_redo::{ReaderId, RedoBatch};
use tundra_store::ids::{Lsn, VolumeId};

use crate::page::Page;
use crate::pool::PagePool;
use crate::rw::read_page;
use crate::storage::{PageStorage, ReadAt, ReaderLease, VolumeGeometry};
use crate::tree::{self, Pages};
use crate::{Bug, Error, ErrorKind, Result, injected};

/// How an RO node behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoConfig {
    /// Pages the cache holds at most.
    pub cache_pages: usize,
    /// Batches kept after they are applied, for pages read from storage at an older LSN.
    pub window_batches: usize,
}

impl Default for RoConfig {
    fn default() -> RoConfig {
        RoConfig { cache_pages: 256, window_batches: 64 }
    }
}

/// What an RO node did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoStats {
    pub batches_applied: u64,
    /// Records applied to cached pages.
    pub records_applied: u64,
    /// Records for pages not cached (storage will build those pages).
    pub records_skipped: u64,
    /// Pages read from storage.
    pub page_reads: u64,
    /// Pages storage served as of an LSN below the node's, allowed by `not_modified_since`.
    pub pages_served_older: u64,
    pub renewals: u64,
    pub resyncs: u64,
}

/// A read-only node; see the module's description.
pub struct RoNode<S: PageStorage + ?Sized> {
    storage: Arc<S>,
    volume: VolumeId,
    geometry: VolumeGeometry,
    reader: ReaderId,
    lease: ReaderLease,
    apply_lsn: Lsn,
    feed: Receiver<Arc<RedoBatch>>,
    /// Batches received and not yet applied, in LSN order.
    queued: VecDeque<Arc<RedoBatch>>,
    cache: PagePool,
    /// The last batches applied, oldest first; every record after `recent_floor` is in them.
    recent: VecDeque<Arc<RedoBatch>>,
    recent_floor: Lsn,
    config: RoConfig,
    stats: RoStats,
}

impl<S: PageStorage + ?Sized> RoNode<S> {
    /// A reader of the volume at its durable LSN, following `feed` (from [`crate::RwNode::follow`],
    /// taken before this call so no commit after that LSN is missed).
    pub fn open(
        storage: Arc<S>,
        volume: VolumeId,
        reader: ReaderId,
        feed: Receiver<Arc<RedoBatch>>,
        config: RoConfig,
    ) -> Result<RoNode<S>> {
        let geometry = storage.geometry(volume)?;
        let start = storage.redo_status(volume)?.durable_lsn;
        let lease = storage.register_reader(volume, reader, start)?;
        Ok(RoNode {
            cache: PagePool::new(config.cache_pages, lease.granted_lsn),
            storage,
            volume,
            geometry,
            reader,
            apply_lsn: lease.granted_lsn,
            lease,
            feed,
            queued: VecDeque::new(),
            recent: VecDeque::new(),
            recent_floor: lease.granted_lsn,
            config,
            stats: RoStats::default(),
        })
    }

    /// Follows another feed (the RW node restarted). What the old feed still holds is queued
    /// first: those batches are committed too.
    pub fn attach(&mut self, feed: Receiver<Arc<RedoBatch>>) {
        self.poll();
        self.feed = feed;
    }

    /// The LSN the node reads at.
    pub fn apply_lsn(&self) -> Lsn {
        self.apply_lsn
    }

    pub fn stats(&self) -> RoStats {
        self.stats
    }

    pub fn lease(&self) -> ReaderLease {
        self.lease
    }

    /// Takes every batch the feed holds into the queue; returns the end of the last queued.
    pub fn poll(&mut self) -> Lsn {
        // Empty and disconnected alike end the poll: a feed whose RW node stopped has nothing
        // more, and the node reads on at its LSN until it is attached to the next one.
        while let Ok(batch) = self.feed.try_recv() {
            self.queued.push_back(batch);
        }
        self.queued.back().map_or(self.apply_lsn, |batch| batch.end_lsn)
    }

    /// Applies the queued batches that end at or below `target`, then renews the lease with
    /// the new LSN. A batch that does not start where the node is (a gap in the feed), or one
    /// that leaves a page failing its checks, is an error after which the caller resyncs.
    pub fn apply_through(&mut self, target: Lsn) -> Result<()> {
        self.poll();
        let before = self.apply_lsn;
        while let Some(batch) = self.queued.front().cloned() {
            if batch.end_lsn > target {
                break;
            }
            self.queued.pop_front();
            if batch.end_lsn <= self.apply_lsn {
                continue;
            }
            if batch.prev_lsn != self.apply_lsn {
                return Err(Error::new(
                    ErrorKind::Closed,
                    format!("the feed skips from LSN {} to a batch after {}: resync", self.apply_lsn, batch.prev_lsn),
                ));
            }
            if let Err(error) = self.apply_batch(batch) {
                // Pages may hold part of the batch now: none of the cache is as of the node's
                // LSN any more. The batch is gone from the queue, so the caller resyncs.
                self.cache.clear(self.apply_lsn);
                return Err(error);
            }
        }
        if self.apply_lsn > before {
            self.renew()?;
        }
        Ok(())
    }

    fn apply_batch(&mut self, batch: Arc<RedoBatch>) -> Result<()> {
        for record in &batch.records {
            let Some(page) = self.cache.get_mut(record.page) else {
                self.stats.records_skipped += 1;
                continue;
            };
            if injected(Bug::SkipsRedo) || record.lsn <= page.lsn() {
                continue;
            }
            apply(page.bytes_mut(), &record.payload)?;
            if let Err(error) = page.check(record.page) {
                self.cache.remove(record.page);
                return Err(error.context(format_args!("applying the record at LSN {}", record.lsn)));
            }
            self.stats.records_applied += 1;
        }
        if injected(Bug::ReappliesRecords) {
            self.reapply_previous_batch()?;
        }
        self.apply_lsn = batch.end_lsn;
        self.stats.batches_applied += 1;
        self.recent.push_back(batch);
        while self.recent.len() > self.config.window_batches {
            let oldest = self.recent.pop_front().expect("more than the window");
            self.recent_floor = oldest.end_lsn;
        }
        Ok(())
    }

    /// The injected bug: the batch before the one just applied is applied again to the cached
    /// pages, without comparing LSNs, as a node replaying its feed after a hiccup would.
    fn reapply_previous_batch(&mut self) -> Result<()> {
        let Some(previous) = self.recent.back().cloned() else { return Ok(()) };
        for record in &previous.records {
            if let Some(page) = self.cache.get_mut(record.page) {
                apply(page.bytes_mut(), &record.payload)?;
                if let Err(error) = page.check(record.page) {
                    self.cache.remove(record.page);
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// Tells storage how far the node has applied; returns LSN_min.
    pub fn renew(&mut self) -> Result<Lsn> {
        let renewal = self.storage.renew_reader(self.volume, self.lease.id, self.apply_lsn)?;
        self.stats.renewals += 1;
        Ok(renewal.lsn_min)
    }

    /// Starts over at the volume's durable LSN with a new lease and an empty cache; returns
    /// the new LSN.
    pub fn resync(&mut self) -> Result<Lsn> {
        self.poll();
        let start = self.storage.redo_status(self.volume)?.durable_lsn;
        self.lease = self.storage.register_reader(self.volume, self.reader, start)?;
        self.apply_lsn = self.lease.granted_lsn;
        self.cache.clear(self.apply_lsn);
        self.recent.clear();
        self.recent_floor = self.apply_lsn;
        let apply_lsn = self.apply_lsn;
        self.queued.retain(|batch| batch.end_lsn > apply_lsn);
        self.stats.resyncs += 1;
        Ok(self.apply_lsn)
    }

    /// Ends the node's lease.
    pub fn close(self) -> Result<()> {
        self.storage.release_reader(self.volume, self.lease.id)
    }

    /// The value of `key` as of the node's LSN.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if self.apply_lsn == Lsn(0) {
            return Ok(None);
        }
        tree::read::lookup(self, key)
    }

    /// Up to `limit` records from `start` on, as of the node's LSN.
    pub fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if self.apply_lsn == Lsn(0) {
            return Ok(Vec::new());
        }
        tree::read::scan(self, start, limit)
    }

    /// The newest LSN at which the node knows `number` changed, or the floor below which it
    /// knows nothing: the page did not change after it, up to the node's LSN.
    fn not_modified_since(&self, number: u64) -> Lsn {
        let newest =
            self.recent.iter().rev().find_map(|batch| {
                batch.records.iter().rev().find(|record| record.page == number).map(|record| record.lsn)
            });
        newest.unwrap_or(self.recent_floor)
    }

    /// Reads a page from storage as of the node's LSN, checks it against what the node knows
    /// and caches it.
    fn fetch(&mut self, number: u64) -> Result<Arc<Page>> {
        let request_lsn = if injected(Bug::ReadsLatest) { Lsn(u64::MAX) } else { self.apply_lsn };
        let at =
            ReadAt { request_lsn, not_modified_since: self.not_modified_since(number), lease: Some(self.lease.id) };
        let (page, served_lsn) = read_page(self.storage.as_ref(), self.volume, number, at, self.geometry.page_size)?;
        self.stats.page_reads += 1;
        // Storage may serve the page as of an LSN below the node's (the read promised no change
        // since `not_modified_since`): then no record the node holds for it may lie above the
        // page's LSN, or storage served a version the node knows to be stale.
        if served_lsn < self.apply_lsn {
            self.stats.pages_served_older += 1;
        }
        let page_lsn = page.lsn();
        let apply_lsn = self.apply_lsn;
        let missed = self
            .recent
            .iter()
            .flat_map(|batch| &batch.records)
            .find(|record| record.page == number && record.lsn > page_lsn && record.lsn <= apply_lsn);
        if let Some(record) = missed {
            return Err(Error::corrupted(format!(
                "page {number} served as of LSN {} lacks the record at LSN {} the node applied",
                served_lsn, record.lsn
            )));
        }
        let page = Arc::new(page);
        self.cache.insert(number, page.clone());
        Ok(page)
    }
}

impl<S: PageStorage + ?Sized> Pages for RoNode<S> {
    fn read(&mut self, number: u64) -> Result<Arc<Page>> {
        match self.cache.get(number) {
            Some(page) => Ok(page),
            None => self.fetch(number),
        }
    }

    fn page_count(&self) -> u64 {
        self.geometry.page_count
    }
}
