//! A node's Raft log, shared by every chunk group it hosts, with group commit across groups.
//!
//! openraft waits for each append to be durable before it counts it toward a quorum, so a
//! log per group would cost an fsync per group per round (design notes, §6). Here every group's
//! appends, votes, truncations and purges are records of one append stream on one medium
//! ([`LogMedia`]); a single writer task takes whatever the groups queued while it was
//! flushing, appends it all and flushes once, then tells each group its writes are durable. A
//! busy node pays one flush for many groups' rounds, as a store's journal does for many
//! writers.
//!
//! The in-memory index of every group's entries ([`NodeLog`]'s groups) is what openraft reads;
//! it is rebuilt from the medium's durable records when the node restarts.
//!
//! **A leader's own entries are sent before they are durable** (seed 000 §3.2.1, Figure 4:
//! the leader forwards the compressed blocks and persists them itself at the same time).
//! openraft 0.9's core sends nothing to the followers until the leader's append is flushed, so
//! a write at queue depth 1 would pay the leader's sync and then the follower's, one after the
//! other. Here an append of entries the node proposed as the group's leader in its current
//! term, none of them a membership change, is reported flushed at once and made durable by the
//! writer as usual, while the core replicates it. openraft then counts the leader toward a
//! quorum before its copy is durable, so nothing that quorum decides leaves the node until the
//! leader's copy is durable too: the group's state machine applies (and so answers a client)
//! only entries durable here ([`DurableApply`]), and the commit position sent to the followers
//! goes no further than the entries durable here ([`NodeLog::durable_commit`]), so no replica
//! applies an entry that a majority does not hold durably. A membership change is never
//! reported early, since the leader acts on its commit itself. And a leader that restarts
//! never resumes its term ([`GroupLogStore`]'s `read_vote`): it may have lost entries its
//! followers hold, and proposing again in that term would give other entries their log ids.
//! See ARCHITECTURE.md, "Replication".

mod file;
mod mem;
mod store;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::storage::LogFlushed;
use openraft::{Entry, LogId, Vote};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

pub use file::{FileLog, FileLogBug, LogFile, MemLogFile, OsLogFile};
pub use mem::{LogFault, MemLog};
pub use store::{DurableApply, GroupLogStore};

use crate::types::{GroupId, NodeId, TypeConfig};

/// One record of the shared log: a change to one group's log or vote. Its encoding on a
/// durable medium is `crate::codec`'s (docs/format.md, "Raft log").
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LogRecord {
    /// Entries appended to a group's log, after every entry it holds.
    Entries {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
        entries: Vec<Entry<TypeConfig>>,
    },
    /// The group's vote.
    Vote {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
        vote: Vote<NodeId>,
    },
    /// The group's entries from `since` on are removed (a new leader overwrote them).
    Truncate {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
        since: u64,
    },
    /// The group's entries up to and including `upto` are purged (a snapshot covers them).
    Purge {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
        upto: LogId<NodeId>,
    },
    /// The group's committed position, kept so that a restarted node applies as far at once.
    Committed {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
        committed: Option<LogId<NodeId>>,
    },
    /// The group's entries, purge point and committed position are forgotten; its vote is
    /// kept. Written when this node's replica of the group is dropped (a move took it
    /// elsewhere) and only once the group's committed membership no longer names the node, so
    /// nothing a quorum decided depends on this log any more; the vote stays so that the node
    /// never votes twice in one term. A replica started here again later starts empty, as a
    /// new node's would (log format version 2; version 3 writes [`LogRecord::ResetHeld`]
    /// instead whenever the replica held an entry).
    Reset {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
    },
    /// [`LogRecord::Reset`] of a replica that held entries up to index `held` (log format
    /// version 3; a `Reset` of an older file knows no index). A replica started here again
    /// neither campaigns nor votes until its log reaches `held` again: entries it held, and a
    /// quorum may have counted, could be missing from what a leader sends it first (an old
    /// snapshot), which may even name it a voter of the membership that it has since left.
    ResetHeld {
        #[serde(with = "crate::codec::chunk")]
        group: GroupId,
        held: u64,
    },
}

/// Where a node's shared log lives. An implementation keeps records in the order appended and
/// after a crash holds a prefix of them that includes every record appended before the last
/// successful flush. The simulation's is in memory ([`MemLog`]); a node's is a file in its data
/// directory ([`FileLog`]).
pub trait LogMedia: Send + Sync + 'static {
    /// Appends records to the log's volatile tail.
    fn append(&self, records: &[LogRecord]) -> Result<(), String>;
    /// Makes every record appended so far durable.
    fn flush(&self) -> Result<(), String>;
    /// The durable records, in order, read when the node starts.
    fn replay(&self) -> Result<Vec<LogRecord>, String>;
    /// Whether the medium holds so many dead records (of purged or overwritten entries) that
    /// it should be rewritten with the live ones only.
    fn wants_compaction(&self) -> bool {
        false
    }
    /// Replaces everything the medium holds, atomically and durably, with `live`: records
    /// that rebuild every group's log as the node knows it.
    fn compact(&self, live: &[LogRecord]) -> Result<(), String> {
        let _ = live;
        Ok(())
    }
    /// How much longer than usual the next flush takes (the simulation's slow syncs).
    fn flush_stall(&self) -> Duration {
        Duration::ZERO
    }
    /// Whether flushes wait until released (the simulation's stalled medium).
    fn flush_held(&self) -> bool {
        false
    }
}

/// One group's log as the node knows it in memory.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupLog {
    pub entries: BTreeMap<u64, Entry<TypeConfig>>,
    pub vote: Option<Vote<NodeId>>,
    pub purged: Option<LogId<NodeId>>,
    pub committed: Option<LogId<NodeId>>,
    /// The index of the last entry the medium holds durably (all before it are durable too).
    pub durable: Option<u64>,
    /// Whether the group was ever reset here ([`LogRecord::Reset`]): a replica started again
    /// from such a log votes only once its log names it a voter (`Host::handle`).
    pub reset: bool,
    /// The highest index this node's replica held when it was reset ([`LogRecord::ResetHeld`]):
    /// a replica started again campaigns and votes only once its log reaches it.
    pub reset_held: Option<u64>,
}

impl GroupLog {
    /// The log id of the last entry held (the purge point when none is).
    pub(crate) fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.entries.values().next_back().map(|e| e.log_id).or(self.purged)
    }

    fn apply(&mut self, record: &LogRecord) {
        match record {
            LogRecord::Entries { entries, .. } => {
                for entry in entries {
                    self.entries.insert(entry.log_id.index, entry.clone());
                }
            }
            LogRecord::Vote { vote, .. } => self.vote = Some(*vote),
            LogRecord::Truncate { since, .. } => {
                self.entries.split_off(since);
            }
            LogRecord::Purge { upto, .. } => {
                self.entries = self.entries.split_off(&(upto.index + 1));
                if self.purged.is_none_or(|purged| purged.index < upto.index) {
                    self.purged = Some(*upto);
                }
            }
            LogRecord::Committed { committed, .. } => self.committed = *committed,
            LogRecord::Reset { .. } | LogRecord::ResetHeld { .. } => {
                self.entries.clear();
                self.purged = None;
                self.committed = None;
                self.reset = true;
                if let LogRecord::ResetHeld { held, .. } = record {
                    self.reset_held = Some(self.reset_held.map_or(*held, |h| h.max(*held)));
                }
            }
        }
    }
}

/// What a record does to its group's durable mark once a flush made it durable: records are
/// flushed in order, so after appended entries every entry up to the last one is durable.
fn advance_durable(durable: &mut Option<u64>, record: &LogRecord) {
    match record {
        LogRecord::Entries { entries, .. } => {
            if let Some(last) = entries.last() {
                *durable = Some(last.log_id.index);
            }
        }
        LogRecord::Truncate { since, .. } => {
            if durable.is_some_and(|d| d >= *since) {
                *durable = since.checked_sub(1);
            }
        }
        LogRecord::Purge { upto, .. } => {
            if durable.is_none_or(|d| d < upto.index) {
                *durable = Some(upto.index);
            }
        }
        LogRecord::Reset { .. } | LogRecord::ResetHeld { .. } => *durable = None,
        LogRecord::Vote { .. } | LogRecord::Committed { .. } => {}
    }
}

fn group_of(record: &LogRecord) -> GroupId {
    match record {
        LogRecord::Entries { group, .. }
        | LogRecord::Vote { group, .. }
        | LogRecord::Truncate { group, .. }
        | LogRecord::Purge { group, .. }
        | LogRecord::Committed { group, .. }
        | LogRecord::Reset { group }
        | LogRecord::ResetHeld { group, .. } => *group,
    }
}

/// What a group's purge asks first: how far its state machine's applies are durable (made so
/// now), since the log is their write-ahead log (a replica applies committed entries without a
/// store sync, seed 000 §3.2.1). The purge goes no further than that index.
pub type PurgeGuard = Arc<dyn Fn(LogId<NodeId>) -> Result<Option<u64>, String> + Send + Sync>;

/// Who hears that a write is durable.
enum Done {
    Append(LogFlushed<TypeConfig>),
    Wait(oneshot::Sender<Result<(), String>>),
    /// A leader's append already reported flushed: nobody hears, but it is flushed at once,
    /// as its group's applies and commits wait on it.
    Ahead,
    Nobody,
}

/// An injected bug of a simulation twin: a leader's early-reported appends without one of the
/// two rules that keep them safe (the module's documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AheadBug {
    #[default]
    None,
    /// The state machine applies (and the leader answers) entries not yet durable here.
    ApplyUnflushed,
    /// The followers are told of commits past the entries durable here.
    CommitUnflushed,
    /// A leader restarted with its vote still committed resumes its term.
    ResumeTerm,
}

struct Write {
    record: LogRecord,
    done: Done,
}

/// Counts of the shared log's work: how many writes one flush made durable is the group
/// commit's gain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    pub records: u64,
    pub flushes: u64,
}

/// A node's shared log: the in-memory index of every group's log and the queue to the writer
/// task that makes their records durable.
pub struct NodeLog {
    groups: Mutex<BTreeMap<GroupId, GroupLog>>,
    guards: Mutex<BTreeMap<GroupId, PurgeGuard>>,
    queue: mpsc::UnboundedSender<Write>,
    records: AtomicU64,
    flushes: Arc<AtomicU64>,
    writer: tokio::task::JoinHandle<()>,
    /// Counts the writer's flushes that moved durable marks; waiters on a mark watch it.
    flushed: tokio::sync::watch::Sender<u64>,
    /// Why the medium failed, once it has: no mark moves again.
    failed: Mutex<Option<String>>,
    /// Whether a leader's own appends are reported flushed before they are (module docs).
    ahead: std::sync::atomic::AtomicBool,
    bug: Mutex<AheadBug>,
}

impl NodeLog {
    /// Opens the log on `media`, rebuilding every group's log from its durable records, and
    /// starts the writer task on the current tokio runtime. `flush_latency` is how long a
    /// flush takes (zero on a real medium, whose flush takes its own time; the simulation's
    /// time for an fsync).
    pub fn open(media: Arc<dyn LogMedia>, flush_latency: Duration) -> Result<Arc<NodeLog>, String> {
        let mut groups: BTreeMap<GroupId, GroupLog> = BTreeMap::new();
        for record in media.replay()? {
            let log = groups.entry(group_of(&record)).or_default();
            log.apply(&record);
            advance_durable(&mut log.durable, &record);
        }
        let (queue, writes) = mpsc::unbounded_channel();
        let flushes = Arc::new(AtomicU64::new(0));
        Ok(Arc::new_cyclic(|me: &std::sync::Weak<NodeLog>| {
            let writer = tokio::spawn(write_loop(media, writes, flush_latency, flushes.clone(), me.clone()));
            NodeLog {
                groups: Mutex::new(groups),
                guards: Mutex::default(),
                queue,
                records: AtomicU64::new(0),
                flushes,
                writer,
                flushed: tokio::sync::watch::Sender::new(0),
                failed: Mutex::new(None),
                ahead: std::sync::atomic::AtomicBool::new(true),
                bug: Mutex::new(AheadBug::None),
            }
        }))
    }

    /// Whether a leader's own appends are reported flushed before they are (on by default;
    /// off, a write pays the leader's sync before the followers see it, as openraft 0.9 does
    /// alone). For measurements and tests.
    pub fn set_ahead(&self, on: bool) {
        self.ahead.store(on, Ordering::Relaxed);
    }

    pub(crate) fn ahead(&self) -> bool {
        self.ahead.load(Ordering::Relaxed)
    }

    /// Injects a bug for a simulation twin.
    pub fn set_ahead_bug(&self, bug: AheadBug) {
        *self.bug.lock() = bug;
    }

    pub(crate) fn ahead_bug(&self) -> AheadBug {
        *self.bug.lock()
    }

    /// Waits until `group`'s entries up to `index` are durable here; an error if the medium
    /// failed (they may never be).
    pub async fn wait_durable(&self, group: GroupId, index: u64) -> Result<(), String> {
        let mut flushed = self.flushed.subscribe();
        loop {
            if let Some(why) = self.failed.lock().clone() {
                return Err(format!("the node's Raft log failed: {why}"));
            }
            if self.with_group(group, |log| log.durable.is_some_and(|d| d >= index)) {
                return Ok(());
            }
            if flushed.changed().await.is_err() {
                return Err("the node's log writer stopped".into());
            }
        }
    }

    /// The commit position a leader may tell its followers of: `committed`, or the last of
    /// `group`'s entries durable here if that is earlier (module docs). `None` tells them
    /// nothing new.
    pub fn durable_commit(&self, group: GroupId, committed: Option<LogId<NodeId>>) -> Option<LogId<NodeId>> {
        let committed = committed?;
        if self.ahead_bug() == AheadBug::CommitUnflushed {
            return Some(committed);
        }
        self.with_group(group, |log| {
            let durable = log.durable?;
            if durable >= committed.index {
                return Some(committed);
            }
            log.entries.get(&durable).map(|e| e.log_id).or(log.purged.filter(|p| p.index == durable))
        })
    }

    /// Moves the durable marks by the records a flush made durable, and wakes their waiters.
    fn mark_durable(&self, records: &[LogRecord]) {
        {
            let mut groups = self.groups.lock();
            for record in records {
                advance_durable(&mut groups.entry(group_of(record)).or_default().durable, record);
            }
        }
        self.flushed.send_modify(|n| *n += 1);
    }

    /// The medium failed to flush: what was reported flushed early may never be durable.
    fn fail(&self, why: String) {
        self.failed.lock().get_or_insert(why);
        self.flushed.send_modify(|n| *n += 1);
    }

    pub fn stats(&self) -> LogStats {
        LogStats { records: self.records.load(Ordering::Relaxed), flushes: self.flushes.load(Ordering::Relaxed) }
    }

    /// Stops the writer: what it had not flushed is never flushed (a crash, or a shutdown
    /// after every group stopped).
    pub fn stop(&self) {
        self.writer.abort();
    }

    /// Records that rebuild every group's log as it stands in memory: what a compaction
    /// writes. Records queued but not yet written are in memory already; writing them again
    /// after these changes nothing, as each record sets state (a vote, a purge point, the
    /// entries at given indexes, a truncation followed by the entries that replace it).
    fn live_records(&self) -> Vec<LogRecord> {
        let groups = self.groups.lock();
        let mut records = Vec::new();
        for (&group, log) in groups.iter() {
            if let Some(vote) = log.vote {
                records.push(LogRecord::Vote { group, vote });
            }
            match log.reset_held {
                Some(held) => records.push(LogRecord::ResetHeld { group, held }),
                None if log.reset => records.push(LogRecord::Reset { group }),
                None => {}
            }
            if let Some(upto) = log.purged {
                records.push(LogRecord::Purge { group, upto });
            }
            if !log.entries.is_empty() {
                records.push(LogRecord::Entries { group, entries: log.entries.values().cloned().collect() });
            }
            records.push(LogRecord::Committed { group, committed: log.committed });
        }
        records
    }

    /// Forgets `group`'s entries, purge point and committed position, keeping its vote
    /// ([`LogRecord::Reset`]), and waits until that is durable. The caller has stopped the
    /// group's replica here.
    pub async fn reset(&self, group: GroupId) -> Result<(), String> {
        self.guards.lock().remove(&group);
        // The highest index held, before this reset or any earlier one.
        let held = self.with_group(group, |log| log.last_log_id().map(|id| id.index).max(log.reset_held));
        let record = match held {
            Some(held) => LogRecord::ResetHeld { group, held },
            None => LogRecord::Reset { group },
        };
        let (sender, receiver) = oneshot::channel();
        self.submit(record, Done::Wait(sender))?;
        receiver.await.map_err(|_| "the node's log writer stopped".to_string())?
    }

    /// Whether `group` was ever reset here.
    pub fn was_reset(&self, group: GroupId) -> bool {
        self.with_group(group, |log| log.reset)
    }

    /// Where a replica of `group` started again after a reset here may campaign and vote from
    /// ([`LogRecord::ResetHeld`]): the highest index it held; None when it was never reset, or
    /// only by a log of format version 2.
    pub fn reset_held(&self, group: GroupId) -> Option<u64> {
        self.with_group(group, |log| log.reset_held)
    }

    /// The index of the last entry `group`'s log holds (its purge point when it holds none).
    pub fn last_index(&self, group: GroupId) -> Option<u64> {
        self.with_group(group, |log| log.last_log_id().map(|id| id.index))
    }

    /// Sets what a purge of `group`'s entries must ensure first.
    pub fn set_purge_guard(&self, group: GroupId, guard: PurgeGuard) {
        self.guards.lock().insert(group, guard);
    }

    /// How far `group`'s applies are durable, made so now by its purge guard (everything, for
    /// a group without one).
    fn durable_applied(&self, group: GroupId, upto: LogId<NodeId>) -> Result<Option<u64>, String> {
        let guard = self.guards.lock().get(&group).cloned();
        guard.map_or(Ok(Some(upto.index)), |guard| guard(upto))
    }

    /// The log id of `group`'s entry at `index`, if the log holds it.
    fn log_id_at(&self, group: GroupId, index: u64) -> Option<LogId<NodeId>> {
        self.with_group(group, |log| log.entries.get(&index).map(|entry| entry.log_id))
    }

    pub(crate) fn with_group<T>(&self, group: GroupId, f: impl FnOnce(&mut GroupLog) -> T) -> T {
        f(self.groups.lock().entry(group).or_default())
    }

    /// Applies a record to the in-memory index at once (readable on return, as openraft asks)
    /// and queues it for the writer; `done` hears when it is durable.
    fn submit(&self, record: LogRecord, done: Done) -> Result<(), String> {
        self.with_group(group_of(&record), |log| log.apply(&record));
        self.records.fetch_add(1, Ordering::Relaxed);
        self.queue.send(Write { record, done }).map_err(|_| "the node's log writer has stopped".to_string())
    }
}

/// The writer task: every write queued while the previous flush ran goes out with one flush.
async fn write_loop(
    media: Arc<dyn LogMedia>,
    mut writes: mpsc::UnboundedReceiver<Write>,
    flush_latency: Duration,
    flushes: Arc<AtomicU64>,
    log: std::sync::Weak<NodeLog>,
) {
    // Records appended since the last flush, whose durable marks that flush moves.
    let mut unflushed: Vec<LogRecord> = Vec::new();
    while let Some(first) = writes.recv().await {
        let mut batch = vec![first];
        while let Ok(write) = writes.try_recv() {
            batch.push(write);
        }
        let records: Vec<LogRecord> = batch.iter().map(|w| w.record.clone()).collect();
        let t0 = std::time::Instant::now();
        crate::lat::mark("log.write");
        let mut result = media.append(&records);
        crate::lat::note("log.append", t0);
        unflushed.extend(records);
        // Records nobody waits for (a truncation, a purge) are durable with the next flush: a
        // batch of only those is appended unflushed.
        let waited = batch.iter().any(|w| !matches!(w.done, Done::Nobody));
        if waited {
            let stall = media.flush_stall();
            if !flush_latency.is_zero() || !stall.is_zero() {
                tokio::time::sleep(flush_latency + stall).await;
            }
            while media.flush_held() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if result.is_ok() {
                let t1 = std::time::Instant::now();
                result = media.flush();
                crate::lat::mark("log.flushed");
                crate::lat::note("log.flush(fdatasync)", t1);
            }
            flushes.fetch_add(1, Ordering::Relaxed);
            if let Some(log) = log.upgrade() {
                match &result {
                    Ok(()) => log.mark_durable(&std::mem::take(&mut unflushed)),
                    Err(why) => {
                        log.fail(why.clone());
                        unflushed.clear();
                    }
                }
            }
        }
        for write in batch {
            match write.done {
                Done::Append(callback) => callback.log_io_completed(result.clone().map_err(std::io::Error::other)),
                Done::Wait(sender) => {
                    let _ = sender.send(result.clone());
                }
                Done::Ahead | Done::Nobody => {}
            }
        }
        if media.wants_compaction() {
            let Some(log) = log.upgrade() else { return };
            if let Err(error) = media.compact(&log.live_records()) {
                // The old log is still whole (a compaction replaces it atomically): the node
                // goes on with it and tries again after the next flush.
                eprintln!("tundra: compacting the Raft log failed: {error}");
            }
        }
    }
}
