//! Page I/O of replicated volumes, on any node: a request is cut into pages, grouped by chunk
//! and sent to the chunk's leader (or done here if this node leads), which writes whole pages
//! in one proposal (merging pieces of pages into the page it reads first) and reads after
//! confirming its leadership. A leader that dies, a leadership that moves, a peer that does
//! not answer: the entry node asks again, at the new leader once one is known, for up to
//! [`STALL_LIMIT`], so its clients see a stall, not an error.
//!
//! Every write to a page takes the page's lock on the leader for its whole round, so a piece
//! merged into a page is never merged into a version another write is replacing. Every write
//! carries a request id, the same on each attempt: a leader asked again checks whether an
//! earlier attempt took effect before proposing it again (`Host::write_pages_once`), so a
//! write whose answer was lost in a failover is applied once.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tundra_node::VolumeRef;
use tundra_store::ids::{ChunkId, Lsn, PageNo, VolumeId};

use crate::cluster::ClusterNode;
use crate::messages::{Answer, Forward, HeavyDone, PageWrite, Refusal};

/// How long an entry node keeps asking for a chunk before it answers an error.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);
/// The pause between two tries.
const RETRY_PAUSE: Duration = Duration::from_millis(25);
/// Pages sent to a leader in one request (and proposed in one entry).
const PAGES_PER_REQUEST: usize = 64;

/// Pages being written on this node as a leader.
#[derive(Default)]
pub(crate) struct PageLocks {
    held: Mutex<HashSet<(u64, u32)>>,
    freed: Notify,
}

pub(crate) struct PageGuard<'a> {
    locks: &'a PageLocks,
    pages: Vec<(u64, u32)>,
}

impl PageLocks {
    async fn lock(&self, chunk: ChunkId, pages: &[u32]) -> PageGuard<'_> {
        let wanted: Vec<(u64, u32)> = pages.iter().map(|&page| (chunk.0, page)).collect();
        loop {
            let freed = self.freed.notified();
            {
                let mut held = self.held.lock();
                if wanted.iter().all(|key| !held.contains(key)) {
                    held.extend(wanted.iter().copied());
                    return PageGuard { locks: self, pages: wanted };
                }
            }
            freed.await;
        }
    }
}

impl Drop for PageGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        for key in &self.pages {
            held.remove(key);
        }
        drop(held);
        self.locks.freed.notify_waiters();
    }
}

pub(crate) fn refusal(error: tundra_raft::Error) -> Refusal {
    match error {
        tundra_raft::Error::NotLeader { leader, .. } => Refusal::NotLeader { leader },
        tundra_raft::Error::Invalid(why) => Refusal::Invalid(why),
        // No replica holds a good copy: asking again would not help.
        tundra_raft::Error::Corrupted(why) => Refusal::Invalid(format!("corrupted: {why}")),
        // A group not started here yet (its volume is being created) will be soon.
        other => Refusal::Unavailable(other.to_string()),
    }
}

impl ClusterNode {
    /// A replicated volume whose pages redo makes takes no page writes: its pages carry the
    /// LSNs of the records folded into them, on every replica from its redo group.
    fn writable(&self, volume: u32, chunk: ChunkId) -> Result<VolumeRef, Refusal> {
        let volume = self.replicated(volume, chunk)?;
        if self.node.takes_redo(&volume) {
            return Err(Refusal::Invalid(format!(
                "volume {:?} takes redo: its pages are made from its redo stream, not written",
                volume.volume.name
            )));
        }
        Ok(volume)
    }

    /// The volume of a request on `chunk`, checked: replicated here, not being deleted, and
    /// the chunk inside the size this node serves (the catalog's, resize.rs).
    fn replicated(&self, volume: u32, chunk: ChunkId) -> Result<VolumeRef, Refusal> {
        let served = self
            .served_bytes(volume)
            .ok_or_else(|| Refusal::Invalid(format!("volume id {volume} is not replicated on node {}", self.me)))?;
        self.refuse_deleting(volume)?;
        let v = self.node.volume(VolumeId(volume)).map_err(|e| Refusal::Invalid(e.to_string()))?;
        if chunk.volume() != v.volume.id {
            return Err(Refusal::Invalid(format!("chunk {} is not a chunk of volume {:?}", chunk.0, v.volume.name)));
        }
        if u64::from(chunk.index()) * v.volume.chunk_bytes >= served {
            let what = format!("chunk {} of volume {:?}", chunk.index(), v.volume.name);
            return Err(self.past_served(volume, what, served));
        }
        Ok(v)
    }

    /// Refuses pages of `chunk` past its end or past the size this node serves.
    fn check_pages(&self, volume: &VolumeRef, chunk: ChunkId, pages: impl Iterator<Item = u32>) -> Result<(), Refusal> {
        let id = volume.volume.id.0;
        let served_pages = self.served_bytes(id).unwrap_or(0) / volume.page_size() as u64;
        let per_chunk = volume.volume.pages_per_chunk();
        for page in pages {
            if u64::from(page) >= per_chunk {
                return Err(Refusal::Invalid("a page past its chunk".into()));
            }
            if u64::from(chunk.index()) * per_chunk + u64::from(page) >= served_pages {
                let what = format!("page {page} of chunk {} of volume {:?}", chunk.index(), volume.volume.name);
                return Err(self.past_served(id, what, served_pages * volume.page_size() as u64));
            }
        }
        Ok(())
    }

    /// The leader's side of a write: pieces merged into their pages, then one proposal.
    pub(crate) async fn lead_write(
        &self,
        volume: u32,
        chunk: ChunkId,
        writes: Vec<PageWrite>,
        request: u64,
        retry: bool,
    ) -> Result<Answer, Refusal> {
        let volume = self.writable(volume, chunk)?;
        let page_size = volume.page_size();
        self.check_pages(&volume, chunk, writes.iter().map(|w| w.page))?;
        for write in &writes {
            let end = write.within as usize + write.bytes.len();
            if end > page_size || write.bytes.is_empty() {
                return Err(Refusal::Invalid(format!(
                    "a write of {} bytes at {} of page {}",
                    write.bytes.len(),
                    write.within,
                    write.page
                )));
            }
        }
        let pages: Vec<u32> = writes.iter().map(|w| w.page).collect();
        let _locked = self.locks.lock(chunk, &pages).await;
        let partial: Vec<PageNo> =
            writes.iter().filter(|w| w.bytes.len() != page_size).map(|w| PageNo(w.page)).collect();
        let mut current = if partial.is_empty() {
            Vec::new()
        } else {
            self.host.read_pages(chunk, &partial).await.map_err(refusal)?
        }
        .into_iter();
        let mut batch = Vec::with_capacity(writes.len());
        for write in writes {
            let content = if write.bytes.len() == page_size {
                write.bytes
            } else {
                let mut page = current.next().flatten().unwrap_or_else(|| vec![0; page_size]);
                page[write.within as usize..write.within as usize + write.bytes.len()].copy_from_slice(&write.bytes);
                page
            };
            batch.push((PageNo(write.page), content, Lsn(self.lsn.fetch_add(1, Ordering::Relaxed))));
        }
        self.host.write_pages_once(chunk, &batch, request, retry).await.map_err(refusal)?;
        Ok(Answer::Done)
    }

    pub(crate) async fn lead_read(&self, volume: u32, chunk: ChunkId, pages: Vec<u32>) -> Result<Answer, Refusal> {
        let volume = self.replicated(volume, chunk)?;
        self.check_pages(&volume, chunk, pages.iter().copied())?;
        let pages: Vec<PageNo> = pages.into_iter().map(PageNo).collect();
        Ok(Answer::Pages(self.host.read_pages(chunk, &pages).await.map_err(refusal)?))
    }

    pub(crate) async fn lead_trim(&self, volume: u32, chunk: ChunkId, pages: Vec<u32>) -> Result<Answer, Refusal> {
        let volume = self.writable(volume, chunk)?;
        self.check_pages(&volume, chunk, pages.iter().copied())?;
        let _locked = self.locks.lock(chunk, &pages).await;
        self.host.trim_pages(chunk, pages.into_iter().map(PageNo).collect()).await.map_err(refusal)?;
        Ok(Answer::Done)
    }

    /// Heavy compression of `count` pages of `chunk` from `first`, as its leader (seed 000
    /// §3.2.3): the host reads, compresses once and proposes each segment; no page lock is
    /// held, as a segment takes only pages still at the version it names. A retry after a
    /// failover plans again and finds the pages already in segments.
    pub(crate) async fn lead_heavy(
        &self,
        volume: u32,
        chunk: ChunkId,
        first: u32,
        count: u32,
    ) -> Result<Answer, Refusal> {
        let volume = self.writable(volume, chunk)?;
        let end = first.checked_add(count).ok_or_else(|| Refusal::Invalid("the page range overflows".into()))?;
        if count > 0 {
            self.check_pages(&volume, chunk, [first, end - 1].into_iter())?;
        }
        let report = self.host.heavy_compress(chunk, PageNo(first), count).await.map_err(refusal)?;
        Ok(Answer::Heavy(HeavyDone {
            pages: report.pages,
            segments: report.segments,
            bytes_before: report.bytes_before,
            bytes_after: report.bytes_after,
        }))
    }

    /// Heavy compression of `count` pages of a replicated volume from `first`: each chunk's
    /// piece by its leader, the figures summed.
    pub fn heavy_compress(&self, volume: &VolumeRef, first: u64, count: u64) -> Result<HeavyDone, Refusal> {
        let id = volume.volume.id.0;
        let served_pages = self.served_bytes(id).unwrap_or(0) / volume.page_size() as u64;
        let end = first.checked_add(count).filter(|&end| end <= served_pages).ok_or_else(|| {
            Refusal::Invalid(format!(
                "pages {first} to {} are outside volume {:?}, which has {served_pages} pages",
                first.saturating_add(count),
                volume.volume.name
            ))
        })?;
        let per_chunk = volume.volume.pages_per_chunk();
        let mut done = HeavyDone::default();
        let mut index = first;
        while index < end {
            let (chunk, page) = volume.volume.locate(index).map_err(|e| Refusal::Invalid(e.to_string()))?;
            let n = (per_chunk - u64::from(page.0)).min(end - index);
            let forward = Forward::Heavy { volume: id, chunk: chunk.0, first: page.0, count: n as u32 };
            match self.block_on(self.to_leader(chunk, forward))? {
                Answer::Heavy(part) => {
                    done.pages += part.pages;
                    done.segments += part.segments;
                    done.bytes_before += part.bytes_before;
                    done.bytes_after += part.bytes_after;
                }
                other => return Err(Refusal::Unavailable(format!("heavy compression answered {}", kind(&other)))),
            }
            index += n;
        }
        Ok(done)
    }

    /// Sends `forward` about `chunk` to its leader, again and again until it is done, refused
    /// as invalid, or [`STALL_LIMIT`] passed.
    pub(crate) async fn to_leader(&self, chunk: ChunkId, mut forward: Forward) -> Result<Answer, Refusal> {
        let deadline = tokio::time::Instant::now() + STALL_LIMIT;
        let mut hint: Option<u64> = None;
        let mut first = true;
        let mut attempt = 0usize;
        loop {
            attempt += 1;
            // Every attempt after the first may follow one that took effect unseen.
            if let Forward::Write { retry, .. } = &mut forward {
                *retry = !first;
            }
            first = false;
            let guess = hint.take().or_else(|| self.local_leader(chunk)).or_else(|| self.replica_guess(chunk, attempt));
            let result = match guess {
                Some(leader) => self.ask(leader, forward.clone()).await,
                None => Err(Refusal::Unavailable(format!("chunk {} has no leader now", chunk.0))),
            };
            let last = match result {
                Err(Refusal::NotLeader { leader }) => {
                    hint = leader;
                    "the chunk's leadership moved".to_string()
                }
                Err(Refusal::Unavailable(why)) => why,
                done => return done,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(Refusal::Unavailable(format!(
                    "chunk {} stayed unavailable for {STALL_LIMIT:?}: {last}",
                    chunk.0
                )));
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// A replica of `chunk` to ask when this node knows no leader (it holds no replica, or
    /// its replica knows none yet): each attempt the next one of the catalog's replica set,
    /// which answers with the leader it knows.
    fn replica_guess(&self, chunk: ChunkId, attempt: usize) -> Option<u64> {
        let catalog = self.catalog.lock();
        // A volume's redo group: its own replica set (a node that left it runs no replica).
        let replicas = match tundra_raft::redo_machine::redo_volume(chunk) {
            Some(volume) => catalog.get(volume)?.redo_replicas(),
            None => catalog.get(chunk.volume().0)?.replicas_of(chunk.index()),
        };
        let others: Vec<u64> = replicas.iter().copied().filter(|&node| node != self.me).collect();
        (!others.is_empty()).then(|| others[attempt % others.len()])
    }

    /// Writes `data` at byte `offset` of a replicated volume; durable on a majority of its
    /// replicas when it returns.
    pub fn write_bytes(&self, volume: &VolumeRef, offset: u64, data: &[u8]) -> Result<(), Refusal> {
        let pieces = self.cut(volume, offset, data.len() as u64)?;
        let mut at = 0usize;
        let mut writes: Vec<(ChunkId, PageWrite)> = Vec::with_capacity(pieces.len());
        for (chunk, page, within, len) in pieces {
            writes.push((chunk, PageWrite { page: page.0, within: within as u32, bytes: data[at..at + len].to_vec() }));
            at += len;
        }
        self.send_writes(volume, writes)
    }

    /// Makes `len` bytes from `offset` read as zeros: whole pages are trimmed, pieces written.
    pub fn zero_bytes(&self, volume: &VolumeRef, offset: u64, len: u64) -> Result<(), Refusal> {
        let page_size = volume.page_size();
        let mut whole: Vec<(ChunkId, u32)> = Vec::new();
        let mut writes = Vec::new();
        for (chunk, page, within, piece) in self.cut(volume, offset, len)? {
            if piece == page_size {
                whole.push((chunk, page.0));
            } else {
                writes.push((chunk, PageWrite { page: page.0, within: within as u32, bytes: vec![0; piece] }));
            }
        }
        self.send_writes(volume, writes)?;
        for run in by_chunk(whole) {
            let (chunk, pages) = run;
            let forward = Forward::Trim { volume: volume.volume.id.0, chunk: chunk.0, pages };
            self.block_on(self.to_leader(chunk, forward))?;
        }
        Ok(())
    }

    fn send_writes(&self, volume: &VolumeRef, writes: Vec<(ChunkId, PageWrite)>) -> Result<(), Refusal> {
        for (chunk, pages) in by_chunk(writes) {
            let request = self.next_request.fetch_add(2, Ordering::Relaxed);
            let forward = Forward::Write { volume: volume.volume.id.0, chunk: chunk.0, pages, request, retry: false };
            self.block_on(self.to_leader(chunk, forward))?;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes from byte `offset` of a replicated volume, from the chunks'
    /// leaders (linearizable).
    pub fn read_bytes(&self, volume: &VolumeRef, offset: u64, out: &mut [u8]) -> Result<(), Refusal> {
        let pieces = self.cut(volume, offset, out.len() as u64)?;
        let wanted: Vec<(ChunkId, u32)> = pieces.iter().map(|(chunk, page, _, _)| (*chunk, page.0)).collect();
        let mut contents = Vec::with_capacity(wanted.len());
        for (chunk, pages) in by_chunk(wanted) {
            let forward = Forward::Read { volume: volume.volume.id.0, chunk: chunk.0, pages: pages.clone() };
            match self.block_on(self.to_leader(chunk, forward))? {
                Answer::Pages(read) if read.len() == pages.len() => contents.extend(read),
                other => return Err(Refusal::Unavailable(format!("a read answered {}", kind(&other)))),
            }
        }
        let mut at = 0usize;
        for ((_, _, within, len), content) in pieces.into_iter().zip(contents) {
            match content {
                Some(page) if page.len() >= within + len => {
                    out[at..at + len].copy_from_slice(&page[within..within + len])
                }
                Some(_) => return Err(Refusal::Unavailable("a page of another size".into())),
                None => out[at..at + len].fill(0),
            }
            at += len;
        }
        Ok(())
    }
}

fn kind(answer: &Answer) -> &'static str {
    match answer {
        Answer::Done => "done",
        Answer::Pages(_) => "pages of another count",
        Answer::VolumeId(_) => "a volume id",
        Answer::Status(_) => "a status",
        Answer::Redo(_) => "a redo answer",
        Answer::Usage(_) => "a usage",
        Answer::Members { .. } => "a membership",
        Answer::Manager(_) => "a manager answer",
        Answer::ChunkSizes(_) => "chunk sizes",
        Answer::Deleting(_) => "a delete state",
        Answer::Resize(_) => "a volume's sizes",
        Answer::Catalog(_) => "a catalog",
        Answer::DeletedVolumes(_) => "deleted volume ids",
        Answer::Heavy(_) => "heavy compression figures",
        Answer::Peers(_) => "a list of nodes",
    }
}

impl ClusterNode {
    /// The pages a byte range covers: chunk, page, offset in the page, length. The range must
    /// lie inside the size this node serves (resize.rs), not only inside its store.
    fn cut(&self, volume: &VolumeRef, offset: u64, len: u64) -> Result<Vec<(ChunkId, PageNo, usize, usize)>, Refusal> {
        let id = volume.volume.id.0;
        // The store's volume as it is now: a reference taken before a resize (an NBD
        // export's) knows the old size only.
        let volume = &self.node.volume(volume.volume.id).map_err(|e| Refusal::Invalid(e.to_string()))?;
        let served = self.served_bytes(id).unwrap_or(0).min(volume.volume.size_bytes);
        let what = || format!("bytes {offset}..+{len} of volume {:?}", volume.volume.name);
        let end = offset.checked_add(len).ok_or_else(|| Refusal::Invalid(format!("{} are outside it", what())))?;
        if end > served {
            return Err(self.past_served(id, format!("{} are outside it", what()), served));
        }
        let page_size = volume.page_size() as u64;
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < end {
            let index = at / page_size;
            let within = at % page_size;
            let piece = (page_size - within).min(end - at);
            let (chunk, page) = volume.volume.locate(index).map_err(|e| Refusal::Invalid(e.to_string()))?;
            pieces.push((chunk, page, within as usize, piece as usize));
            at += piece;
        }
        Ok(pieces)
    }
}

/// Consecutive items of one chunk, in runs of at most [`PAGES_PER_REQUEST`].
fn by_chunk<T>(items: Vec<(ChunkId, T)>) -> Vec<(ChunkId, Vec<T>)> {
    let mut runs: Vec<(ChunkId, Vec<T>)> = Vec::new();
    for (chunk, item) in items {
        match runs.last_mut() {
            Some((last, run)) if *last == chunk && run.len() < PAGES_PER_REQUEST => run.push(item),
            _ => runs.push((chunk, vec![item])),
        }
    }
    runs
}
