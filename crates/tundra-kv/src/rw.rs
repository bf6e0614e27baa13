//! The read-write node: the volume's one writer. It keeps a bounded buffer pool of committed
//! pages, runs transactions of puts and deletes over a private overlay of the pages they
//! change, and commits one by appending one redo batch: the commit returns once storage says
//! the batch is durable (`Ok`), and only then do the changed pages enter the pool and the batch
//! go to the RO nodes that follow. The node never writes a page; storage builds pages from the
//! redo.
//!
//! LSNs are the node's to assign (redo.rs: bytes of redo). Opening a node takes the writer
//! epoch after the highest storage has seen and appends an empty batch with it at once, so
//! every older writer is fenced before the new one reads anything; it then reads the meta page
//! as of the durable LSN (or formats an empty database at LSN 0). A writer that is fenced, sees
//! a gap, or cannot tell whether a commit became durable stops: its state may no longer be the
//! stream's, and a new node recovers from storage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use tundra_redo::{AppendOutcome, RedoBatch, WriterEpoch};
use tundra_store::ids::{Lsn, VolumeId};

use crate::page::{MAX_KEY_BYTES, MAX_VALUE_BYTES, Meta, PAGE_SIZE, Page, PageKind};
use crate::pool::PagePool;
use crate::redo::{PageChange, build_batch};
use crate::storage::{PageStorage, ReadAt, VolumeGeometry, check_served};
use crate::tree::{self, Pages, PagesMut};
use crate::{Error, ErrorKind, Result};

/// How an RW node behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RwConfig {
    /// Pages the buffer pool holds at most.
    pub pool_pages: usize,
}

impl Default for RwConfig {
    fn default() -> RwConfig {
        RwConfig { pool_pages: 1024 }
    }
}

/// What an RW node did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwStats {
    pub commits: u64,
    pub records: u64,
    pub image_records: u64,
    /// Bytes of redo committed: the LSN's advance.
    pub redo_bytes: u64,
    /// Pages read from storage (pool misses).
    pub page_reads: u64,
    /// Commits sent again after storage refused them as busy (its unapplied redo at its bound).
    pub busy_retries: u64,
}

/// How many times a commit refused as busy is sent again, and the pause before each.
const BUSY_RETRIES: u32 = 30;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// The volume's writer; see the module's description.
pub struct RwNode<S: PageStorage + ?Sized> {
    storage: Arc<S>,
    volume: VolumeId,
    geometry: VolumeGeometry,
    epoch: WriterEpoch,
    committed_lsn: Lsn,
    pool: PagePool,
    followers: Vec<Sender<Arc<RedoBatch>>>,
    stopped: Option<String>,
    /// The end LSN of a commit whose append failed on the connection: storage may or may not
    /// hold it. Whoever opens the next writer finds out from the durable LSN.
    in_doubt: Option<Lsn>,
    stats: RwStats,
}

impl<S: PageStorage + ?Sized> RwNode<S> {
    /// Takes the volume over as its writer (see the module's description).
    pub fn open(storage: Arc<S>, volume: VolumeId, config: RwConfig) -> Result<RwNode<S>> {
        let geometry = storage.geometry(volume)?;
        if geometry.page_size != PAGE_SIZE || geometry.page_count < 3 {
            return Err(Error::invalid(format!(
                "volume {} has {} pages of {} bytes; the database needs at least 3 pages of {PAGE_SIZE}",
                volume.0, geometry.page_count, geometry.page_size
            )));
        }
        let status = storage.redo_status(volume)?;
        let epoch = WriterEpoch(status.writer_epoch.0 + 1);
        let durable = status.durable_lsn;
        let fence = RedoBatch { volume, epoch, prev_lsn: durable, end_lsn: durable, records: Vec::new() };
        match storage.append_redo(&fence)? {
            AppendOutcome::Ok { .. } => {}
            AppendOutcome::Gap { expected_prev_lsn } => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("another writer appended up to LSN {expected_prev_lsn} while this one opened: retry"),
                ));
            }
            AppendOutcome::Fenced { epoch } => {
                return Err(Error::new(ErrorKind::Fenced { epoch }, "a newer writer took the volume while opening"));
            }
        }
        let mut node = RwNode {
            storage,
            volume,
            geometry,
            epoch,
            committed_lsn: durable,
            pool: PagePool::new(config.pool_pages, durable),
            followers: Vec::new(),
            stopped: None,
            in_doubt: None,
            stats: RwStats::default(),
        };
        if durable == Lsn(0) {
            node.format()?;
        } else {
            let meta = node.committed_page(0)?;
            Meta::read(&meta, geometry.page_count).map_err(|e| e.context("recovering the database"))?;
        }
        Ok(node)
    }

    /// Commits an empty database: the meta page and an empty root leaf.
    fn format(&mut self) -> Result<()> {
        let mut txn = self.begin()?;
        let mut meta = Page::new(PageKind::Meta, 0);
        Meta { root: 1, next_free: 2 }.write(&mut meta);
        txn.replace(0, meta);
        txn.replace(1, Page::new(PageKind::Leaf, 0));
        txn.commit()?;
        Ok(())
    }

    /// Starts a transaction; nothing it does is seen by anyone until it commits.
    pub fn begin(&mut self) -> Result<Txn<'_, S>> {
        self.check_running()?;
        Ok(Txn { node: self, dirty: BTreeMap::new(), before: BTreeMap::new(), imaged: BTreeSet::new(), broken: None })
    }

    /// A channel that receives every batch this node commits from now on, in order, once it
    /// is durable: what an RO node follows.
    pub fn follow(&mut self) -> Receiver<Arc<RedoBatch>> {
        let (sender, receiver) = channel();
        self.followers.push(sender);
        receiver
    }

    /// The value of `key` as of the last commit.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_running()?;
        tree::read::lookup(&mut Committed { node: self }, key)
    }

    /// Up to `limit` records from `start` on, as of the last commit.
    pub fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check_running()?;
        tree::read::scan(&mut Committed { node: self }, start, limit)
    }

    pub fn committed_lsn(&self) -> Lsn {
        self.committed_lsn
    }

    pub fn epoch(&self) -> WriterEpoch {
        self.epoch
    }

    pub fn volume(&self) -> VolumeId {
        self.volume
    }

    pub fn stats(&self) -> RwStats {
        self.stats
    }

    /// Pages in the buffer pool now.
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// The end LSN of the commit whose outcome is unknown, if the node stopped on one: it
    /// committed exactly when storage's durable LSN reaches it.
    pub fn in_doubt(&self) -> Option<Lsn> {
        self.in_doubt
    }

    fn check_running(&self) -> Result<()> {
        match &self.stopped {
            None => Ok(()),
            Some(reason) => Err(Error::new(ErrorKind::Closed, format!("the RW node stopped: {reason}"))),
        }
    }

    /// Stops the node for good and returns `error`.
    fn stop(&mut self, error: Error) -> Error {
        self.stopped = Some(error.to_string());
        error
    }

    /// The page as of the last commit: from the pool, or read from storage as of the committed
    /// LSN, promising it did not change since the node last knew it to.
    fn committed_page(&mut self, number: u64) -> Result<Arc<Page>> {
        if let Some(page) = self.pool.get(number) {
            return Ok(page);
        }
        let at = ReadAt {
            request_lsn: self.committed_lsn,
            not_modified_since: self.pool.last_written(number).min(self.committed_lsn),
            lease: None,
        };
        let (page, _) = read_page(self.storage.as_ref(), self.volume, number, at, self.geometry.page_size)?;
        self.stats.page_reads += 1;
        let page = Arc::new(page);
        self.pool.insert(number, page.clone());
        Ok(page)
    }
}

/// Reads a page, asking again when storage answers `NotYet` (it has already waited a bounded
/// time; a few more tries cover an applier that is catching up).
pub(crate) fn read_retrying<S: PageStorage + ?Sized>(
    storage: &S,
    volume: VolumeId,
    number: u64,
    at: ReadAt,
) -> Result<crate::storage::ServedPage> {
    const TRIES: usize = 3;
    let mut tries = 0;
    loop {
        match storage.get_page(volume, number, at) {
            Err(error) if matches!(error.kind(), ErrorKind::NotYet { .. }) && tries + 1 < TRIES => tries += 1,
            other => return other.map_err(|e| e.context(format_args!("reading page {number}"))),
        }
    }
}

/// Reads a page in use at `at` ([`read_retrying`]) and checks it: the answer fits the request,
/// the bytes are a page of this number, and the page's own LSN is the one storage says it
/// served. Returns the page and the LSN it was served as of.
pub(crate) fn read_page<S: PageStorage + ?Sized>(
    storage: &S,
    volume: VolumeId,
    number: u64,
    at: ReadAt,
    page_size: usize,
) -> Result<(Page, Lsn)> {
    let served = read_retrying(storage, volume, number, at)?;
    check_served(&served, at, page_size, number)?;
    let served_lsn = served.served_lsn;
    let page_lsn = served.page_lsn;
    let page = Page::decode(served.data, number)?
        .ok_or_else(|| Error::corrupted(format!("page {number} is in use but was never written")))?;
    if page.lsn() != page_lsn {
        return Err(Error::corrupted(format!(
            "page {number} says it is as of LSN {}, storage says {page_lsn}",
            page.lsn()
        )));
    }
    Ok((page, served_lsn))
}

/// The committed pages, read-only.
struct Committed<'a, S: PageStorage + ?Sized> {
    node: &'a mut RwNode<S>,
}

impl<S: PageStorage + ?Sized> Pages for Committed<'_, S> {
    fn read(&mut self, number: u64) -> Result<Arc<Page>> {
        self.node.committed_page(number)
    }

    fn page_count(&self) -> u64 {
        self.node.geometry.page_count
    }
}

/// A transaction: puts and deletes applied together by [`Txn::commit`], or not at all.
pub struct Txn<'a, S: PageStorage + ?Sized> {
    node: &'a mut RwNode<S>,
    /// The pages it changed, as changed.
    dirty: BTreeMap<u64, Arc<Page>>,
    /// The committed version of each page it changed in place.
    before: BTreeMap<u64, Arc<Page>>,
    /// Pages it rewrote whole or created: logged as images.
    imaged: BTreeSet<u64>,
    /// Set when an operation failed halfway: the overlay may hold half a change.
    broken: Option<String>,
}

impl<S: PageStorage + ?Sized> Txn<'_, S> {
    /// Puts `key` with `value` (replacing any value it had). Keys up to [`MAX_KEY_BYTES`],
    /// values up to [`MAX_VALUE_BYTES`]; longer ones are `Invalid` and change nothing.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES {
            return Err(Error::invalid(format!(
                "a key of {} bytes and a value of {} (at most {MAX_KEY_BYTES} and {MAX_VALUE_BYTES})",
                key.len(),
                value.len()
            )));
        }
        self.guarded(|txn| tree::write::put(txn, key, value))
    }

    /// Deletes `key`; true if it was there.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.guarded(|txn| tree::write::delete(txn, key))
    }

    /// The value of `key`, this transaction's own changes included.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.guarded(|txn| tree::read::lookup(txn, key))
    }

    /// Up to `limit` records from `start` on, this transaction's own changes included.
    pub fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.guarded(|txn| tree::read::scan(txn, start, limit))
    }

    fn guarded<T>(&mut self, op: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if let Some(reason) = &self.broken {
            return Err(Error::invalid(format!("an earlier operation of this transaction failed ({reason})")));
        }
        op(self).inspect_err(|error| self.broken = Some(error.to_string()))
    }

    /// Commits: one redo batch for every page changed, appended to storage; returns the
    /// commit's LSN once the batch is durable. A transaction that changed nothing commits at
    /// the last commit's LSN without a batch. On any error nothing of it is applied.
    pub fn commit(self) -> Result<Lsn> {
        let Txn { node, mut dirty, before, imaged, broken } = self;
        if let Some(reason) = broken {
            return Err(Error::invalid(format!("a transaction whose operation failed cannot commit ({reason})")));
        }
        node.check_running()?;
        let mut changes: Vec<PageChange<'_>> = dirty
            .iter_mut()
            .map(|(&page, after)| PageChange {
                page,
                before: if imaged.contains(&page) { None } else { before.get(&page).map(|p| p.as_ref()) },
                after: Arc::make_mut(after),
            })
            .collect();
        let Some(batch) = build_batch(node.volume, node.epoch, node.committed_lsn, &mut changes) else {
            return Ok(node.committed_lsn);
        };
        drop(changes);
        // A batch refused as Busy changed nothing: it is sent again after a pause, as many
        // times as BUSY_RETRIES allows (the node waits a while itself before it refuses).
        let mut busy = 0;
        let appended = loop {
            match node.storage.append_redo(&batch) {
                Err(error) if error.kind() == ErrorKind::Busy && busy < BUSY_RETRIES => {
                    busy += 1;
                    node.stats.busy_retries += 1;
                    std::thread::sleep(BUSY_PAUSE);
                }
                appended => break appended,
            }
        };
        let outcome = match appended {
            Ok(outcome) => outcome,
            Err(error) if error.kind() == ErrorKind::Busy => {
                // Nothing was appended: the node stays usable.
                return Err(error.context("storage refused the commit as busy, again and again; nothing was committed"));
            }
            Err(error) => {
                node.in_doubt = Some(batch.end_lsn);
                let error = error.context("appending a commit, whose outcome is now unknown: reopen the node");
                return Err(node.stop(error));
            }
        };
        match outcome {
            AppendOutcome::Ok { durable_lsn } if durable_lsn >= batch.end_lsn => {}
            AppendOutcome::Ok { durable_lsn } => {
                let message = format!("a batch ending at LSN {} was answered durable to {durable_lsn}", batch.end_lsn);
                return Err(node.stop(Error::corrupted(message)));
            }
            AppendOutcome::Gap { expected_prev_lsn } => {
                let message = format!(
                    "the stream ends at LSN {expected_prev_lsn}, not at this writer's {}: another writer appended",
                    batch.prev_lsn
                );
                return Err(node.stop(Error::new(ErrorKind::Closed, message)));
            }
            AppendOutcome::Fenced { epoch } => {
                let message = format!("epoch {} is fenced; the volume belongs to a newer writer", node.epoch.0);
                return Err(node.stop(Error::new(ErrorKind::Fenced { epoch }, message)));
            }
        }
        node.committed_lsn = batch.end_lsn;
        for (number, page) in dirty {
            node.pool.insert(number, page);
        }
        let stats = &mut node.stats;
        stats.commits += 1;
        stats.records += batch.records.len() as u64;
        stats.image_records += batch.records.iter().filter(|r| r.will_init()).count() as u64;
        stats.redo_bytes += batch.end_lsn.0 - batch.prev_lsn.0;
        let batch = Arc::new(batch);
        node.followers.retain(|follower| follower.send(batch.clone()).is_ok());
        Ok(node.committed_lsn)
    }
}

impl<S: PageStorage + ?Sized> Pages for Txn<'_, S> {
    fn read(&mut self, number: u64) -> Result<Arc<Page>> {
        match self.dirty.get(&number) {
            Some(page) => Ok(page.clone()),
            None => self.node.committed_page(number),
        }
    }

    fn page_count(&self) -> u64 {
        self.node.geometry.page_count
    }
}

impl<S: PageStorage + ?Sized> PagesMut for Txn<'_, S> {
    fn write(&mut self, number: u64) -> Result<&mut Page> {
        if !self.dirty.contains_key(&number) {
            let committed = self.node.committed_page(number)?;
            self.before.insert(number, committed.clone());
            self.dirty.insert(number, committed);
        }
        Ok(Arc::make_mut(self.dirty.get_mut(&number).expect("just inserted")))
    }

    fn replace(&mut self, number: u64, page: Page) {
        self.imaged.insert(number);
        self.dirty.insert(number, Arc::new(page));
    }
}

#[cfg(test)]
mod tests;
