//! Repair of bad pages from another replica (seed 000 §3.2.1: a chunk has three copies, so a
//! page whose stored image fails its checksum on one replica is rewritten from another's),
//! on the read path and by a rate-limited background scrub.
//!
//! A replica that finds a page it cannot verify asks each other voter of the chunk for the
//! page's stored image ([`Rpc::FetchPage`]): the bytes as stored (never compressed again) with
//! their encoding, checksum and LSN, which the peer verifies before it sends them. The copy is
//! taken only if it is the same version as the bad image (same encoding, length, checksum and
//! LSN: a lagging or a more advanced peer holds another version, and is passed over) and if it
//! decompresses to content that matches its checksum here too. The store then rewrites its own
//! copy with one journal commit ([`Store::repair_page`](tundra_store::store::Store::repair_page)).
//!
//! A page of a heavy segment is repaired with its whole segment: every replica stores the same
//! segment bytes (the leader proposes them, snapshots and repairs copy them), so the peer
//! answers the segment as stored (`PutHeavy` of the page and the segment), the replica checks
//! every page of its own that points into the bad segment against the copy at its own
//! position, and points those that verify at the copy's new blocks
//! ([`Store::repair_segment`](tundra_store::store::Store::repair_segment)). The scrub reads each
//! segment once per pass, past the cache of decompressed segments.
//!
//! Why replicas stay identical and a repair never goes back in time: a repair is not a Raft
//! entry but a local rewrite of content every replica already holds, at the same LSN, so the
//! chunk's content and its apply mark are the same before and after. It races only with this
//! replica's own applies, and the store installs it only while the page's entry is still the
//! bad one, under the gate every write holds from its journal commit to its install: a newer
//! entry applied meanwhile wins, in memory and after a replay, and the repair is dropped
//! (`Superseded`). When every peer answered and none has a good copy, the read fails with
//! [`Error::Corrupted`], never with wrong data; when a peer did not answer or holds another
//! version (it may be catching up), with [`Error::Unavailable`], which is worth asking again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tundra_store::ErrorKind;
use tundra_store::command::{PagePut, StoreCommand};
use tundra_store::ids::{ChunkId, PageNo};
use tundra_store::index::{Encoding, PageEntry};
use tundra_store::pages::Pages;
use tundra_store::store::RepairOutcome;

use crate::host::{Error, Host};
use crate::network::{Envelope, Reply, Rpc, Transport};
use crate::types::GroupId;

/// How long a replica waits for one peer's copy of a page.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// What repair and the scrub did on this node since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RepairStats {
    /// Full passes of the scrub over every page of every chunk this node holds.
    pub scrub_passes: u64,
    /// Pages the scrub read and verified.
    pub pages_scrubbed: u64,
    /// Pages whose stored image failed its checksum, found by the scrub.
    pub bad_found_by_scrub: u64,
    /// Pages whose stored image failed its checksum, found by a read.
    pub bad_found_by_reads: u64,
    /// Bad pages rewritten from a peer's copy.
    pub pages_repaired: u64,
    /// Repairs that found no good copy: every peer answered and none had one of the same
    /// version (a read of the page failed as corrupted; the scrub tries again on its next pass).
    pub unrepairable: u64,
    /// Repairs put off: a peer did not answer or holds another version of the page (it may be
    /// catching up), or this node did not know the chunk's voters yet (it is starting). A read
    /// of the page failed as unavailable, worth asking again; the scrub tries again on its next
    /// pass.
    pub repairs_deferred: u64,
    /// Pages whose stored image was unreadable or failed its checksum when a snapshot of its
    /// chunk was captured here (state_machine.rs): repaired first, then captured.
    pub bad_found_by_snapshots: u64,
}

/// A node's repair counters, its scrub task, and (for the simulation's twin test) a switch
/// that turns repair off.
#[derive(Default)]
pub struct Repair {
    scrub_passes: AtomicU64,
    pages_scrubbed: AtomicU64,
    bad_found_by_scrub: AtomicU64,
    bad_found_by_reads: AtomicU64,
    pages_repaired: AtomicU64,
    unrepairable: AtomicU64,
    repairs_deferred: AtomicU64,
    bad_found_by_snapshots: AtomicU64,
    disabled: AtomicBool,
    scrub: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Repair {
    pub fn stats(&self) -> RepairStats {
        RepairStats {
            scrub_passes: self.scrub_passes.load(Ordering::Relaxed),
            pages_scrubbed: self.pages_scrubbed.load(Ordering::Relaxed),
            bad_found_by_scrub: self.bad_found_by_scrub.load(Ordering::Relaxed),
            bad_found_by_reads: self.bad_found_by_reads.load(Ordering::Relaxed),
            pages_repaired: self.pages_repaired.load(Ordering::Relaxed),
            unrepairable: self.unrepairable.load(Ordering::Relaxed),
            repairs_deferred: self.repairs_deferred.load(Ordering::Relaxed),
            bad_found_by_snapshots: self.bad_found_by_snapshots.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn stop_scrub(&self) {
        if let Some(task) = self.scrub.lock().take() {
            task.abort();
        }
    }
}

/// Why a peer gave no copy: it did not answer (or may have one later), or it answered that its
/// own copy is bad.
enum Fetch {
    Unreachable(String),
    NoGoodCopy(String),
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Host {
    /// What repair and the scrub did on this node.
    pub fn repair_stats(&self) -> RepairStats {
        self.repair.stats()
    }

    /// Turns repair off: bad pages stay bad. The simulation's injected bug, which its twin
    /// test expects a check to catch.
    #[cfg(test)]
    pub(crate) fn disable_repair(&self) {
        self.repair.disabled.store(true, Ordering::Relaxed);
    }

    /// A read of one page that repairs the page from a peer when its image here is bad.
    pub(crate) async fn read_or_repair(
        &self,
        path: &Pages,
        chunk: ChunkId,
        page: PageNo,
    ) -> Result<Option<Vec<u8>>, Error> {
        match path.read_page(chunk, page) {
            Err(error) if error.kind() == ErrorKind::Corrupted => {
                bump(&self.repair.bad_found_by_reads);
                self.repair_page(path, chunk, page).await?;
                path.read_page(chunk, page).map_err(|e| Error::Corrupted(e.to_string()))
            }
            other => other.map_err(|e| Error::Unavailable(e.to_string())),
        }
    }

    /// Rewrites a bad page from the first peer that holds a good copy of the same version.
    async fn repair_page(&self, path: &Pages, chunk: ChunkId, page: PageNo) -> Result<RepairOutcome, Error> {
        let peers = match self.peers_of(chunk) {
            Ok(peers) => peers,
            Err(error) => {
                bump(&self.repair.repairs_deferred);
                return Err(error);
            }
        };
        self.repairer().repair_page(path, chunk, page, &peers).await
    }

    /// What a chunk's state machine repairs with (a snapshot capture's bad pages).
    pub(crate) fn repairer(&self) -> Repairer {
        Repairer { id: self.id(), transport: self.transport().clone(), repair: self.repair.clone() }
    }

    /// The other voters of a chunk's group, in id order. Unavailable while the group has not
    /// published its membership yet (its Raft core is starting, and its metrics name no voter):
    /// "no peer" then would turn a repair that can wait into a page called corrupted.
    fn peers_of(&self, chunk: ChunkId) -> Result<Vec<u64>, Error> {
        let raft = self.raft(chunk)?;
        let voters: Vec<u64> = raft.metrics().borrow().membership_config.membership().voter_ids().collect();
        if voters.is_empty() {
            return Err(Error::Unavailable(format!(
                "chunk {}: node {} does not know the chunk's voters yet (it is starting)",
                chunk.0,
                self.id()
            )));
        }
        Ok(voters.into_iter().filter(|&id| id != self.id()).collect())
    }

    /// A peer's request for this replica's copy of a page: its stored image, verified, as an
    /// encoded `PutPages` of the chunk (of no page when this replica holds none); for a page
    /// of a heavy segment, the segment as a `PutHeavy` naming that page alone.
    pub(crate) fn copy_for_peer(&self, chunk: GroupId, page: PageNo) -> Result<Vec<u8>, String> {
        self.raft(chunk).map_err(|e| e.to_string())?;
        let path = self.pages_of(chunk);
        if path.store().entry(chunk, page).is_some_and(|e| e.encoding == Encoding::Heavy)
            && let Some((heavy, segment)) = path.good_segment(chunk, page).map_err(|e| e.to_string())?
        {
            return Ok(StoreCommand::PutHeavy { chunk, pages: vec![heavy], segment }.encode());
        }
        let copy = path.good_image(chunk, page).map_err(|e| e.to_string())?;
        Ok(StoreCommand::PutPages { chunk, pages: copy.into_iter().collect() }.encode())
    }

    /// Reads and verifies one page past the cache, and repairs it from a peer when it is bad.
    async fn scrub_page(&self, path: &Pages, chunk: ChunkId, page: PageNo) {
        bump(&self.repair.pages_scrubbed);
        match path.verify_stored(chunk, page) {
            Err(error) if error.kind() == ErrorKind::Corrupted => {
                bump(&self.repair.bad_found_by_scrub);
                // An unrepairable page is counted and tried again on the next pass.
                let _ = self.repair_page(path, chunk, page).await;
            }
            // A page that is sound, gone, or unreadable for another reason (the node is
            // stopping) is not the scrub's to fix.
            _ => {}
        }
    }

    /// Reads and verifies one heavy segment (`pages`, every page of the chunk pointing into
    /// it) past the caches, and repairs it from a peer when a page fails in it.
    async fn scrub_segment(&self, path: &Pages, chunk: ChunkId, pages: &[(PageNo, PageEntry)]) {
        self.repair.pages_scrubbed.fetch_add(pages.len() as u64, Ordering::Relaxed);
        if let Err(error) = path.verify_segment(chunk, pages)
            && error.kind() == ErrorKind::Corrupted
        {
            bump(&self.repair.bad_found_by_scrub);
            let _ = self.repair_page(path, chunk, pages[0].0).await;
        }
    }

    /// One scrub pass over every page of every chunk this node holds, one page every `pace`
    /// (a heavy segment at once, its pages' time together).
    pub async fn scrub_pass(&self, pace: Duration) {
        for chunk in self.groups() {
            let path = self.pages_of(chunk);
            let mut segments: std::collections::BTreeMap<u64, Vec<(PageNo, PageEntry)>> = Default::default();
            for (page, entry) in path.store().chunk_entries(chunk) {
                if entry.encoding == Encoding::Heavy {
                    segments.entry(entry.run.first_lba().0).or_default().push((page, entry));
                    continue;
                }
                self.scrub_page(&path, chunk, page).await;
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
                }
            }
            for pages in segments.into_values() {
                self.scrub_segment(&path, chunk, &pages).await;
                if !pace.is_zero() {
                    tokio::time::sleep(pace * pages.len() as u32).await;
                }
            }
        }
        bump(&self.repair.scrub_passes);
    }

    /// Starts the background scrub on the current runtime: passes over every page at
    /// `pages_per_second`, forever, until [`Host::shutdown`]. Zero turns it off.
    pub fn start_scrub(self: &Arc<Host>, pages_per_second: u64) {
        if pages_per_second == 0 {
            return;
        }
        let pace = Duration::from_secs(1) / u32::try_from(pages_per_second).unwrap_or(u32::MAX);
        let host = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            loop {
                let Some(host) = host.upgrade() else { return };
                host.scrub_pass(pace).await;
                drop(host);
                // Between passes, and so that a node holding no pages does not spin.
                tokio::time::sleep(pace.max(Duration::from_millis(100))).await;
            }
        });
        if let Some(old) = self.repair.scrub.lock().replace(task) {
            old.abort();
        }
    }
}

/// Rewrites bad pages from peers' copies: what the reads, the scrub and a snapshot capture
/// (state_machine.rs) share. Cheap to clone.
#[derive(Clone)]
pub struct Repairer {
    id: u64,
    transport: Arc<dyn Transport>,
    repair: Arc<Repair>,
}

impl Repairer {
    /// Rewrites a bad page from the first of `peers` that holds a good copy of the same
    /// version. `Superseded` when the page was written again meanwhile (or is sound after all).
    pub(crate) async fn repair_page(
        &self,
        path: &Pages,
        chunk: ChunkId,
        page: PageNo,
        peers: &[u64],
    ) -> Result<RepairOutcome, Error> {
        let Some(bad) = path.store().entry(chunk, page) else {
            bump(&self.repair.unrepairable);
            return Err(Error::Corrupted(format!(
                "page {} of chunk {}: its journal record is damaged",
                page.0, chunk.0
            )));
        };
        // A heavy page is checked, and repaired, with every page of its segment.
        let segment = (bad.encoding == Encoding::Heavy).then(|| path.segment_pages(chunk, &bad));
        let sound = match &segment {
            Some(pages) => path.verify_segment(chunk, pages),
            None => path.verify_stored(chunk, page).map(|_| ()),
        };
        if sound.is_ok() {
            return Ok(RepairOutcome::Superseded);
        }
        if self.repair.disabled.load(Ordering::Relaxed) {
            bump(&self.repair.unrepairable);
            return Err(Error::Corrupted(format!(
                "page {} of chunk {} fails its checksum on node {} and is not repaired (repair is off for it)",
                page.0, chunk.0, self.id
            )));
        }
        if let Some(pages) = segment {
            return self.repair_segment(path, chunk, page, bad, &pages, peers).await;
        }
        // Why each peer gave no copy, and whether any might give one later (it did not answer,
        // or holds another version while it catches up): then the read is worth asking again.
        let (mut why, mut transient) = (Vec::new(), false);
        for &peer in peers {
            let copy = match self.fetch(peer, chunk, page).await {
                Ok(copy) => copy,
                Err(Fetch::Unreachable(error)) => {
                    transient = true;
                    why.push(format!("node {peer}: {error}"));
                    continue;
                }
                Err(Fetch::NoGoodCopy(error)) => {
                    why.push(format!("node {peer}: {error}"));
                    continue;
                }
            };
            let same = copy.lsn == bad.lsn
                && copy.image.checksum == bad.checksum
                && copy.image.encoding == bad.encoding
                && copy.image.bytes.len() == usize::from(bad.stored_len);
            if !same {
                transient = true;
                why.push(format!("node {peer}: holds LSN {}", copy.lsn.0));
                continue;
            }
            if let Err(error) = path.verify_image(chunk, &copy) {
                why.push(format!("node {peer}: its copy fails here: {error}"));
                continue;
            }
            let outcome = path.store().repair_page(chunk, bad, &copy).map_err(|e| Error::Unavailable(e.to_string()))?;
            if outcome == RepairOutcome::Repaired {
                bump(&self.repair.pages_repaired);
            }
            return Ok(outcome);
        }
        Err(self.no_good_copy(chunk, page, bad, &why, transient))
    }

    /// The error of a repair that found no good copy (counted as unrepairable, or as deferred
    /// when it is worth asking again: a peer did not answer or holds another version,
    /// `transient`).
    fn no_good_copy(&self, chunk: ChunkId, page: PageNo, bad: PageEntry, why: &[String], transient: bool) -> Error {
        bump(if transient { &self.repair.repairs_deferred } else { &self.repair.unrepairable });
        let message = format!(
            "page {} of chunk {} fails its checksum on node {} and no other replica gave a good copy of LSN {} ({})",
            page.0,
            chunk.0,
            self.id,
            bad.lsn.0,
            why.join("; ")
        );
        if transient { Error::Unavailable(message) } else { Error::Corrupted(message) }
    }

    /// Rewrites a heavy segment that fails here from the first of `peers` whose copy holds
    /// the bad page at the same version (module doc): every page of this replica pointing
    /// into the bad segment that verifies in the copy at its own position is repaired.
    async fn repair_segment(
        &self,
        path: &Pages,
        chunk: ChunkId,
        page: PageNo,
        bad: PageEntry,
        pages: &[(PageNo, PageEntry)],
        peers: &[u64],
    ) -> Result<RepairOutcome, Error> {
        let (mut why, mut transient) = (Vec::new(), false);
        for &peer in peers {
            let (heavy, segment) = match self.fetch_command(peer, chunk, page).await {
                Ok(StoreCommand::PutHeavy { chunk: of, mut pages, segment }) if of == chunk && pages.len() == 1 => {
                    (pages.pop().expect("one page"), segment)
                }
                Ok(_) => {
                    // A page image, or nothing: the peer holds another version (not archived
                    // yet, or written since), as a lagging or an advanced replica does.
                    transient = true;
                    why.push(format!("node {peer}: holds another version of the page"));
                    continue;
                }
                Err(Fetch::Unreachable(error)) => {
                    transient = true;
                    why.push(format!("node {peer}: {error}"));
                    continue;
                }
                Err(Fetch::NoGoodCopy(error)) => {
                    why.push(format!("node {peer}: {error}"));
                    continue;
                }
            };
            if heavy.page != page || heavy.lsn != bad.lsn || heavy.checksum != bad.checksum {
                transient = true;
                why.push(format!("node {peer}: holds LSN {}", heavy.lsn.0));
                continue;
            }
            let good = match path.check_segment_copy(chunk, &segment, pages) {
                Ok(good) if good.iter().any(|&(p, _)| p == page) => good,
                Ok(_) => {
                    why.push(format!("node {peer}: its segment does not hold page {} as here", page.0));
                    continue;
                }
                Err(error) => {
                    why.push(format!("node {peer}: its copy fails here: {error}"));
                    continue;
                }
            };
            let repaired =
                path.store().repair_segment(chunk, &good, &segment).map_err(|e| Error::Unavailable(e.to_string()))?;
            if repaired == 0 {
                return Ok(RepairOutcome::Superseded);
            }
            self.repair.pages_repaired.fetch_add(repaired as u64, Ordering::Relaxed);
            return Ok(RepairOutcome::Repaired);
        }
        Err(self.no_good_copy(chunk, page, bad, &why, transient))
    }

    /// One peer's copy of a page, as the store command it answered (bytes from the network:
    /// every check, no panic).
    async fn fetch_command(&self, peer: u64, chunk: ChunkId, page: PageNo) -> Result<StoreCommand, Fetch> {
        let envelope = Envelope { from: self.id, to: peer, group: chunk, rpc: Rpc::FetchPage { page: page.0 } };
        let bytes = match tokio::time::timeout(FETCH_TIMEOUT, self.transport.call(envelope)).await {
            Ok(Ok(Reply::Page(Ok(bytes)))) => bytes,
            Ok(Ok(Reply::Page(Err(why)))) => return Err(Fetch::NoGoodCopy(why)),
            Ok(Ok(_)) => return Err(Fetch::NoGoodCopy("a reply of another kind".into())),
            Ok(Err(why)) => return Err(Fetch::Unreachable(why)),
            Err(_) => return Err(Fetch::Unreachable("no answer in time".into())),
        };
        StoreCommand::decode(&bytes).map_err(|error| Fetch::NoGoodCopy(error.to_string()))
    }

    /// One peer's copy of a page, decoded (bytes from the network: every check, no panic).
    async fn fetch(&self, peer: u64, chunk: ChunkId, page: PageNo) -> Result<PagePut, Fetch> {
        match self.fetch_command(peer, chunk, page).await {
            Ok(StoreCommand::PutPages { chunk: of, mut pages }) if of == chunk && pages.len() <= 1 => {
                // A peer without the page may not have applied its write yet.
                pages
                    .pop()
                    .filter(|put| put.page == page)
                    .ok_or_else(|| Fetch::Unreachable("holds no such page".into()))
            }
            // The peer holds the page in a heavy segment: another version of it than this
            // replica's own image (a heavy compression this replica has not applied yet, which
            // replaces the bad image when it does), so worth asking again, not a missing copy.
            Ok(StoreCommand::PutHeavy { chunk: of, .. }) if of == chunk => {
                Err(Fetch::Unreachable("holds the page in a heavy segment, another version".into()))
            }
            Ok(_) => Err(Fetch::NoGoodCopy("a copy of another chunk, or of another kind".into())),
            Err(fetch) => Err(fetch),
        }
    }

    /// Counts a bad page a snapshot capture found.
    pub(crate) fn found_by_snapshot(&self) {
        bump(&self.repair.bad_found_by_snapshots);
    }
}
