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
pub use store::GroupLogStore;

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
}

/// One group's log as the node knows it in memory.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupLog {
    pub entries: BTreeMap<u64, Entry<TypeConfig>>,
    pub vote: Option<Vote<NodeId>>,
    pub purged: Option<LogId<NodeId>>,
    pub committed: Option<LogId<NodeId>>,
}

impl GroupLog {
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
        }
    }
}

fn group_of(record: &LogRecord) -> GroupId {
    match record {
        LogRecord::Entries { group, .. }
        | LogRecord::Vote { group, .. }
        | LogRecord::Truncate { group, .. }
        | LogRecord::Purge { group, .. }
        | LogRecord::Committed { group, .. } => *group,
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
    Nobody,
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
}

impl NodeLog {
    /// Opens the log on `media`, rebuilding every group's log from its durable records, and
    /// starts the writer task on the current tokio runtime. `flush_latency` is how long a
    /// flush takes (zero on a real medium, whose flush takes its own time; the simulation's
    /// time for an fsync).
    pub fn open(media: Arc<dyn LogMedia>, flush_latency: Duration) -> Result<Arc<NodeLog>, String> {
        let mut groups: BTreeMap<GroupId, GroupLog> = BTreeMap::new();
        for record in media.replay()? {
            groups.entry(group_of(&record)).or_default().apply(&record);
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
            }
        }))
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
    while let Some(first) = writes.recv().await {
        let mut batch = vec![first];
        while let Ok(write) = writes.try_recv() {
            batch.push(write);
        }
        let records: Vec<LogRecord> = batch.iter().map(|w| w.record.clone()).collect();
        let t0 = std::time::Instant::now();
        let mut result = media.append(&records);
        crate::lat::note("log.append", t0);
        // Records nobody waits for (a truncation, a purge) are durable with the next flush: a
        // batch of only those is appended unflushed.
        let waited = batch.iter().any(|w| !matches!(w.done, Done::Nobody));
        if waited {
            if !flush_latency.is_zero() {
                tokio::time::sleep(flush_latency).await;
            }
            if result.is_ok() {
                let t1 = std::time::Instant::now();
                result = media.flush();
                crate::lat::note("log.flush(fdatasync)", t1);
            }
            flushes.fetch_add(1, Ordering::Relaxed);
        }
        for write in batch {
            match write.done {
                Done::Append(callback) => callback.log_io_completed(result.clone().map_err(std::io::Error::other)),
                Done::Wait(sender) => {
                    let _ = sender.send(result.clone());
                }
                Done::Nobody => {}
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
