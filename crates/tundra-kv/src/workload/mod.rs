//! A sysbench-like workload on one RW node and several RO nodes, every read checked against a
//! model of every committed version ([`model`]) at the LSN of the node that answered it.
//!
//! The run is one thread and one seed: the RW node loads the initial keys, then commits
//! transactions of updates, inserts and deletes (write-only, as sysbench's `oltp_write_only`);
//! between commits the RO nodes move forward, each staying at least `ro_lag_commits` commits
//! behind and moving only some of the time, and answer point selects and range scans
//! (read-only). Every answer is compared with the model at the RO node's LSN; a read that fails
//! its page checks counts as a mismatch too, since it did not give the model's answer. An RO
//! node that loses its lease resyncs and reads on. Optionally the RW node restarts every few
//! transactions: the new node recovers from storage, the old one must then be fenced, and the
//! recovered state is checked against the model.

pub mod lagging;
pub mod model;

use std::collections::BTreeMap;
use std::sync::Arc;

use tundra_env::Rng;
use tundra_redo::ReaderId;
use tundra_store::ids::{Lsn, VolumeId};

pub use model::Model;

use crate::ro::{RoConfig, RoNode};
use crate::rw::{RwConfig, RwNode};
use crate::storage::PageStorage;
use crate::{Error, ErrorKind, MAX_VALUE_BYTES, Result};

/// Relative weights of the operations: writes run on the RW node, reads on the RO nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    pub point_select: u32,
    pub range: u32,
    pub update: u32,
    pub insert: u32,
    pub delete: u32,
}

impl Default for Mix {
    /// sysbench's `oltp_read_write` proportions: ten point selects and four ranges to two
    /// updates, one insert and one delete.
    fn default() -> Mix {
        Mix { point_select: 10, range: 4, update: 2, insert: 1, delete: 1 }
    }
}

impl std::str::FromStr for Mix {
    type Err = String;

    /// Weights by name, `point_select=10,range=4,update=2,insert=1,delete=1`; a weight not
    /// named keeps its default. Point selects and ranges share the RO reads, updates, inserts
    /// and deletes the RW's writes: each pair or trio needs one weight above zero.
    fn from_str(text: &str) -> std::result::Result<Mix, String> {
        let mut mix = Mix::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) =
                part.split_once('=').ok_or_else(|| format!("{part:?}: expected NAME=WEIGHT, as in update=2"))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: the weight must be a whole number from 0 to {}", u32::MAX))?;
            let slot = match name.trim() {
                "point_select" => &mut mix.point_select,
                "range" => &mut mix.range,
                "update" => &mut mix.update,
                "insert" => &mut mix.insert,
                "delete" => &mut mix.delete,
                other => {
                    return Err(format!(
                        "{other:?} is no operation of the mix (point_select, range, update, insert, delete)"
                    ));
                }
            };
            *slot = weight;
        }
        if mix.point_select.checked_add(mix.range).is_none_or(|sum| sum == 0) {
            return Err("point_select and range weights must add up to between 1 and 2^32 - 1".into());
        }
        if mix.update.checked_add(mix.insert).and_then(|s| s.checked_add(mix.delete)).is_none_or(|sum| sum == 0) {
            return Err("update, insert and delete weights must add up to between 1 and 2^32 - 1".into());
        }
        Ok(mix)
    }
}

/// A run's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadConfig {
    pub seed: u64,
    /// Keys are numbered `0..key_space`.
    pub key_space: u64,
    /// Keys loaded before the run.
    pub initial_keys: u64,
    pub transactions: u64,
    pub writes_per_txn: u32,
    /// RO reads between two commits, spread over the RO nodes.
    pub reads_per_txn: u32,
    pub ro_nodes: u32,
    /// Every RO node stays at least this many commits behind the RW node.
    pub ro_lag_commits: u32,
    pub range_rows: u32,
    /// Values are this many bytes, at least and at most.
    pub value_bytes_min: usize,
    pub value_bytes_max: usize,
    pub mix: Mix,
    pub rw: RwConfig,
    pub ro: RoConfig,
    /// Restart the RW node after every this many transactions (0: never).
    pub rw_restart_every: u64,
    /// Storage may go away and come back (a node killed and restarted): a call that finds it
    /// unavailable reopens the RW node, settles a commit in doubt from the durable LSN and
    /// resyncs RO nodes, instead of ending the run. The storage must reconnect
    /// (`ClientStorage::reconnecting`).
    pub survive_restarts: bool,
}

impl Default for WorkloadConfig {
    fn default() -> WorkloadConfig {
        WorkloadConfig {
            seed: 1,
            key_space: 20_000,
            initial_keys: 10_000,
            transactions: 2_000,
            writes_per_txn: 4,
            reads_per_txn: 16,
            ro_nodes: 2,
            ro_lag_commits: 8,
            range_rows: 20,
            value_bytes_min: 16,
            value_bytes_max: 200,
            mix: Mix::default(),
            rw: RwConfig::default(),
            ro: RoConfig::default(),
            rw_restart_every: 0,
            survive_restarts: false,
        }
    }
}

/// What a run did and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadReport {
    pub commits: u64,
    /// Answers compared with the model: RO point selects and scans, RW reads and deletes.
    pub reads_checked: u64,
    /// Of those, the RO nodes' reads alone: `point_selects + range_scans`.
    pub ro_reads: u64,
    pub mismatches: u64,
    pub point_selects: u64,
    pub range_scans: u64,
    pub rows_checked: u64,
    pub ro_resyncs: u64,
    pub rw_restarts: u64,
    /// Times storage went away and the run went on (with `survive_restarts`).
    pub storage_outages: u64,
    /// Commits whose append failed with the connection: those storage turned out to hold, and
    /// those it did not. Either way the data must show the whole commit or none of it.
    pub commits_in_doubt_landed: u64,
    pub commits_in_doubt_lost: u64,
    /// Commits by a writer after a newer one took over: must stay 0.
    pub stale_writer_commits: u64,
    pub final_lsn: Lsn,
    pub redo_bytes: u64,
    pub records: u64,
    pub image_records: u64,
    pub ro_page_reads: u64,
    pub ro_records_applied: u64,
    /// RO page reads storage served below the reader's LSN (allowed by `not_modified_since`).
    pub ro_pages_served_older: u64,
    /// The first mismatch, described.
    pub first_mismatch: Option<String>,
}

impl WorkloadReport {
    fn mismatch(&mut self, what: String) {
        self.mismatches += 1;
        self.first_mismatch.get_or_insert(what);
    }
}

/// The key numbered `id`: a fixed prefix with the number, then up to 40 bytes that depend on
/// it, so keys vary in length and their order is the numbers' order.
pub fn key(id: u64) -> Vec<u8> {
    let mut key = format!("key{id:010}").into_bytes();
    key.resize(key.len() + (id.wrapping_mul(7) % 41) as usize, b'.');
    key
}

struct Run<'a, S: PageStorage + ?Sized> {
    storage: Arc<S>,
    volume: VolumeId,
    config: &'a WorkloadConfig,
    rng: Rng,
    model: Model,
    rw: RwNode<S>,
    ros: Vec<RoNode<S>>,
    report: WorkloadReport,
    /// Redo counted from RW nodes already replaced.
    retired: crate::RwStats,
}

/// Runs the workload on `volume` (an empty one, or one this function ran on: the model starts
/// empty either way, so a volume with other data would mismatch).
pub fn run_workload<S: PageStorage + ?Sized>(
    storage: Arc<S>,
    volume: VolumeId,
    config: &WorkloadConfig,
) -> Result<WorkloadReport> {
    run_workload_with(storage, volume, config, &mut |_| {})
}

/// [`run_workload`], calling `progress` with the report so far after every transaction (a
/// terminal's progress line).
pub fn run_workload_with<S: PageStorage + ?Sized>(
    storage: Arc<S>,
    volume: VolumeId,
    config: &WorkloadConfig,
    progress: &mut dyn FnMut(&WorkloadReport),
) -> Result<WorkloadReport> {
    assert!(config.initial_keys <= config.key_space && config.value_bytes_min <= config.value_bytes_max);
    assert!(config.value_bytes_max <= MAX_VALUE_BYTES);
    let rw = RwNode::open(storage.clone(), volume, config.rw)?;
    let mut run = Run {
        storage,
        volume,
        config,
        rng: Rng::new(config.seed),
        model: Model::default(),
        rw,
        ros: Vec::new(),
        report: WorkloadReport::default(),
        retired: crate::RwStats::default(),
    };
    run.load()?;
    for index in 0..config.ro_nodes {
        let feed = run.rw.follow();
        let ro = RoNode::open(run.storage.clone(), volume, ReaderId(u64::from(index) + 1), feed, config.ro)?;
        run.ros.push(ro);
    }
    for transaction in 0..config.transactions {
        run.write_transaction()?;
        if config.rw_restart_every > 0 && (transaction + 1) % config.rw_restart_every == 0 {
            run.restart_rw()?;
        }
        run.move_readers()?;
        for _ in 0..config.reads_per_txn {
            run.ro_read()?;
        }
        run.rw_read()?;
        run.report.ro_reads = run.report.point_selects + run.report.range_scans;
        progress(&run.report);
    }
    run.finish()
}

impl<S: PageStorage + ?Sized> Run<'_, S> {
    fn value(&mut self) -> Vec<u8> {
        let len = self.rng.range(self.config.value_bytes_min as u64..self.config.value_bytes_max as u64 + 1);
        self.rng.bytes(len as usize)
    }

    /// Commits `changes` on the RW node and records them in the model. With
    /// `survive_restarts`, storage going away meanwhile is an outage the run rides through.
    fn commit(&mut self, changes: BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> Result<()> {
        let lsn = match self.try_commit(&changes) {
            Ok(lsn) => lsn,
            Err(error) if self.outage(&error) => return self.storage_came_back(Some(&changes)),
            Err(error) => return Err(error),
        };
        let previous = self.model.commits().last().copied().unwrap_or(Lsn(0));
        if lsn < previous {
            self.report.mismatch(format!("a commit at LSN {lsn}, below the last one the model holds, {previous}"));
            return Ok(());
        }
        if lsn == previous {
            // Nothing changed a page: every change must then be one the model already holds.
            let latest = |key: &[u8]| self.model.latest(key).map(|v| v.to_vec());
            if let Some((key, _)) = changes.iter().find(|(key, value)| latest(key) != **value) {
                let what = format!("a commit of key {:?} produced no redo", String::from_utf8_lossy(key));
                self.report.mismatch(what);
            }
            return Ok(());
        }
        self.model.commit(lsn, changes);
        self.report.commits += 1;
        Ok(())
    }

    fn try_commit(&mut self, changes: &BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> Result<Lsn> {
        let mut txn = self.rw.begin()?;
        for (key, value) in changes {
            match value {
                Some(value) => txn.put(key, value)?,
                None => {
                    txn.delete(key)?;
                }
            }
        }
        txn.commit()
    }

    /// Whether `error` is storage gone away, in a run that rides through that.
    fn outage(&self, error: &Error) -> bool {
        self.config.survive_restarts && matches!(error.kind(), ErrorKind::Unavailable | ErrorKind::Closed)
    }

    /// Storage went away while the RW node was working (on `changes`, if it was committing):
    /// a new RW node opens once storage is back (the connection retries), the commit in doubt
    /// is settled from the durable LSN, and the keys it changed must read as the whole commit
    /// or none of it. RO nodes follow the new writer and resync when they next fail.
    fn storage_came_back(&mut self, changes: Option<&BTreeMap<Vec<u8>, Option<Vec<u8>>>>) -> Result<()> {
        self.report.storage_outages += 1;
        let in_doubt = self.rw.in_doubt();
        let new = self.reopen_rw()?;
        let old = std::mem::replace(&mut self.rw, new);
        self.retire(&old);
        let durable = self.rw.committed_lsn();
        if let (Some(end), Some(changes)) = (in_doubt, changes) {
            if durable >= end || crate::injected(crate::Bug::InDoubtAlwaysLanded) {
                self.model.commit(end, changes.clone());
                self.report.commits += 1;
                self.report.commits_in_doubt_landed += 1;
            } else {
                self.report.commits_in_doubt_lost += 1;
            }
        }
        for (key, _) in changes.into_iter().flatten() {
            let value = self.rw.get(key)?;
            self.report.reads_checked += 1;
            if value.as_deref() != self.model.latest(key) {
                let what = format!(
                    "after storage came back (durable LSN {durable}, commit in doubt ending at {in_doubt:?}), key {:?} \
                     is not as the model has it: a commit landed in part, or a durable one was lost",
                    String::from_utf8_lossy(key)
                );
                self.report.mismatch(what);
            }
        }
        // The readers' leases died with the node, and a commit that landed in doubt never
        // reached their feeds: each starts again at the durable LSN.
        for index in 0..self.ros.len() {
            let feed = self.rw.follow();
            self.ros[index].attach(feed);
            self.resync_ro(index)?;
        }
        Ok(())
    }

    /// A new RW node, retried while storage is still coming back.
    fn reopen_rw(&self) -> Result<RwNode<S>> {
        let mut attempts = 0;
        loop {
            match RwNode::open(self.storage.clone(), self.volume, self.config.rw) {
                Err(error) if self.outage(&error) && attempts < 100 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                other => return other.map_err(|e| e.context("opening the RW node after storage came back")),
            }
        }
    }

    /// Counts a replaced RW node's redo into the report.
    fn retire(&mut self, old: &RwNode<S>) {
        let stats = old.stats();
        self.retired.commits += stats.commits;
        self.retired.records += stats.records;
        self.retired.image_records += stats.image_records;
        self.retired.redo_bytes += stats.redo_bytes;
    }

    fn load(&mut self) -> Result<()> {
        let mut ids: Vec<u64> = (0..self.config.key_space).collect();
        // A seeded shuffle, so the load inserts in random order and splits everywhere.
        for i in (1..ids.len()).rev() {
            ids.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        for chunk in ids[..self.config.initial_keys as usize].chunks(64) {
            let changes = chunk.iter().map(|&id| (key(id), Some(self.value()))).collect::<Vec<_>>();
            self.commit(changes.into_iter().collect())?;
        }
        Ok(())
    }

    /// One write-only transaction of the mix's updates, inserts and deletes.
    fn write_transaction(&mut self) -> Result<()> {
        let mix = self.config.mix;
        let total = u64::from(mix.update + mix.insert + mix.delete).max(1);
        let mut changes: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for _ in 0..self.config.writes_per_txn {
            let pick = self.rng.below(total);
            let id = self.rng.below(self.config.key_space);
            let present =
                |changes: &BTreeMap<Vec<u8>, Option<Vec<u8>>>, model: &Model, id: u64| match changes.get(&key(id)) {
                    Some(value) => value.is_some(),
                    None => model.latest(&key(id)).is_some(),
                };
            if pick < u64::from(mix.update) {
                // Half the updates keep the value's length: the in-place path.
                let value = match self.model.latest(&key(id)).map(<[u8]>::len) {
                    Some(len) if self.rng.chance(0.5) => self.rng.bytes(len),
                    _ => self.value(),
                };
                changes.insert(key(id), Some(value));
            } else if pick < u64::from(mix.update + mix.insert) {
                let fresh = (0..8)
                    .map(|_| self.rng.below(self.config.key_space))
                    .find(|&id| !present(&changes, &self.model, id));
                let value = self.value();
                changes.insert(key(fresh.unwrap_or(id)), Some(value));
            } else {
                changes.insert(key(id), None);
            }
        }
        self.commit(changes)
    }

    /// A new RW node takes over; the old one must be fenced, and the new one must hold what
    /// the model holds.
    fn restart_rw(&mut self) -> Result<()> {
        let new = RwNode::open(self.storage.clone(), self.volume, self.config.rw)?;
        let mut old = std::mem::replace(&mut self.rw, new);
        let stale = old.begin().and_then(|mut txn| {
            txn.put(&key(0), b"from a fenced writer")?;
            txn.commit()
        });
        match stale {
            Err(error) if matches!(error.kind(), ErrorKind::Fenced { .. }) => {}
            Err(error) => return Err(error.context("the old writer's commit after a restart")),
            Ok(lsn) => {
                self.report.stale_writer_commits += 1;
                self.report.mismatch(format!("a fenced writer committed at LSN {lsn}"));
            }
        }
        self.retire(&old);
        self.report.rw_restarts += 1;
        for ro in &mut self.ros {
            ro.attach(self.rw.follow());
        }
        let rows = self.rw.scan(b"", self.config.range_rows as usize * 4)?;
        let expected = self.model.scan(b"", self.config.range_rows as usize * 4, Lsn(u64::MAX));
        self.report.reads_checked += 1;
        if rows != expected {
            self.report.mismatch(format!(
                "after a restart the RW node scans {} rows, the model {}",
                rows.len(),
                expected.len()
            ));
        }
        Ok(())
    }

    /// Each RO node moves, some of the time, to the commit `ro_lag_commits` behind the newest.
    fn move_readers(&mut self) -> Result<()> {
        let commits = self.model.commits();
        let lag = self.config.ro_lag_commits as usize;
        let Some(&target) = commits.len().checked_sub(lag + 1).map(|i| &commits[i]) else { return Ok(()) };
        for index in 0..self.ros.len() {
            if !self.rng.chance(0.7) {
                continue;
            }
            if let Err(error) = self.ros[index].apply_through(target) {
                self.ro_failed(index, error, "applying redo")?;
            }
        }
        Ok(())
    }

    /// One read on a random RO node, checked against the model at its LSN.
    fn ro_read(&mut self) -> Result<()> {
        if self.ros.is_empty() {
            return Ok(());
        }
        let index = self.rng.below(self.ros.len() as u64) as usize;
        let mix = self.config.mix;
        let ranged = self.rng.below(u64::from(mix.point_select + mix.range).max(1)) >= u64::from(mix.point_select);
        let start = key(self.rng.below(self.config.key_space));
        let ro = &mut self.ros[index];
        let lsn = ro.apply_lsn();
        let limit = self.config.range_rows as usize;
        if ranged {
            match ro.scan(&start, limit) {
                Ok(rows) => {
                    let expected = self.model.scan(&start, limit, lsn);
                    self.report.range_scans += 1;
                    self.report.reads_checked += 1;
                    self.report.rows_checked += rows.len() as u64;
                    if rows != expected {
                        let what = format!(
                            "RO {index} at LSN {lsn}: a scan from {:?} gave {} rows, the model {}{}",
                            String::from_utf8_lossy(&start),
                            rows.len(),
                            expected.len(),
                            first_difference(&rows, &expected)
                        );
                        self.report.mismatch(what);
                    }
                }
                Err(error) => self.ro_failed(index, error, "scanning")?,
            }
        } else {
            match ro.get(&start) {
                Ok(value) => {
                    self.report.point_selects += 1;
                    self.report.reads_checked += 1;
                    if value.as_deref() != self.model.get(&start, lsn) {
                        let what = format!(
                            "RO {index} at LSN {lsn}: key {:?} reads {:?} bytes, the model has {:?}",
                            String::from_utf8_lossy(&start),
                            value.as_ref().map(Vec::len),
                            self.model.get(&start, lsn).map(<[u8]>::len)
                        );
                        self.report.mismatch(what);
                    }
                }
                Err(error) => self.ro_failed(index, error, "reading a key")?,
            }
        }
        Ok(())
    }

    /// An RO node's error: a lost lease or history resyncs it, damage counts as a mismatch and
    /// resyncs it, anything else ends the run.
    fn ro_failed(&mut self, index: usize, error: Error, doing: &str) -> Result<()> {
        match error.kind() {
            ErrorKind::TooOld { .. } | ErrorKind::LeaseLost { .. } => {}
            ErrorKind::Unavailable if self.config.survive_restarts => {}
            ErrorKind::Corrupted | ErrorKind::Closed => {
                let lsn = self.ros[index].apply_lsn();
                self.report.mismatch(format!("RO {index} at LSN {lsn}, {doing}: {error}"));
            }
            _ => return Err(error.context(format_args!("RO {index}, {doing}"))),
        }
        self.resync_ro(index)
    }

    /// Resyncs RO node `index`, retried while storage is still coming back.
    fn resync_ro(&mut self, index: usize) -> Result<()> {
        let mut attempts = 0;
        loop {
            match self.ros[index].resync() {
                Err(error) if self.outage(&error) && attempts < 100 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        self.report.ro_resyncs += 1;
        Ok(())
    }

    /// A point read on the RW node, checked against the model's newest state.
    fn rw_read(&mut self) -> Result<()> {
        let key = key(self.rng.below(self.config.key_space));
        let value = match self.rw.get(&key) {
            Ok(value) => value,
            Err(error) if self.outage(&error) => return self.storage_came_back(None),
            Err(error) => return Err(error),
        };
        self.report.reads_checked += 1;
        if value.as_deref() != self.model.latest(&key) {
            let what = format!("the RW node reads key {:?} unlike the model", String::from_utf8_lossy(&key));
            self.report.mismatch(what);
        }
        Ok(())
    }

    fn finish(mut self) -> Result<WorkloadReport> {
        let stats = self.rw.stats();
        self.report.final_lsn = self.rw.committed_lsn();
        self.report.ro_reads = self.report.point_selects + self.report.range_scans;
        self.report.redo_bytes = self.retired.redo_bytes + stats.redo_bytes;
        self.report.records = self.retired.records + stats.records;
        self.report.image_records = self.retired.image_records + stats.image_records;
        for ro in self.ros {
            let stats = ro.stats();
            self.report.ro_page_reads += stats.page_reads;
            self.report.ro_records_applied += stats.records_applied;
            self.report.ro_pages_served_older += stats.pages_served_older;
            ro.close()?;
        }
        Ok(self.report)
    }
}

/// Where two scans first differ, for a mismatch's description.
fn first_difference(rows: &[(Vec<u8>, Vec<u8>)], expected: &[(Vec<u8>, Vec<u8>)]) -> String {
    let at = rows.iter().zip(expected).position(|(a, b)| a != b).unwrap_or(rows.len().min(expected.len()));
    match (rows.get(at), expected.get(at)) {
        (Some((key, _)), _) => format!(" (first difference at row {at}, key {:?})", String::from_utf8_lossy(key)),
        (None, Some((key, _))) => format!(" (row {at}, key {:?}, is missing)", String::from_utf8_lossy(key)),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests;
