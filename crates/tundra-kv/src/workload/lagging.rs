//! Read-only nodes lagging behind a write-only RW node (seed 000 §5, Figure 15): the setup in
//! which storage must serve pages at old LSNs while the redo between those LSNs and the newest
//! has left its memory cache, which is what per-page log slots (Opt#3) are for.
//!
//! One RW thread commits write-only transactions (updates of random keys) as fast as storage
//! makes them durable and notes each commit's time. Each of `threads` RO threads runs its own
//! RO node (its own connection, lease and small page cache) and moves it to the newest commit
//! at least `lag` old before each read-only transaction: `point_selects` point selects and one
//! range scan of `range_rows` rows, as sysbench's `oltp_read_only` mixes them. The latency of
//! each RO transaction is recorded after a warm-up; the report gives its percentiles. Reads are
//! not checked against a model here (the workload of `mod.rs` does that): this run measures.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tundra_env::Rng;
use tundra_redo::ReaderId;
use tundra_store::ids::{Lsn, VolumeId};

use super::key;
use crate::ro::{RoConfig, RoNode};
use crate::rw::{RwConfig, RwNode};
use crate::storage::PageStorage;
use crate::{Error, ErrorKind, Result};

/// How a lagging-readers run goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaggingConfig {
    pub seed: u64,
    /// Keys loaded before the run, numbered below this.
    pub keys: u64,
    pub value_bytes: usize,
    /// Updates per RW transaction.
    pub writes_per_txn: u32,
    /// RO threads, each with its own RO node.
    pub threads: u32,
    /// How far behind the newest commit each RO node reads.
    pub lag: Duration,
    pub warmup: Duration,
    pub measure: Duration,
    /// RW commits per second at most (0: as fast as storage takes them). A fixed rate gives
    /// runs that compare storage settings the same write load.
    pub rw_commits_per_s: u32,
    pub point_selects: u32,
    pub range_rows: u32,
    pub rw: RwConfig,
    pub ro: RoConfig,
}

impl Default for LaggingConfig {
    fn default() -> LaggingConfig {
        LaggingConfig {
            seed: 1,
            keys: 50_000,
            value_bytes: 100,
            writes_per_txn: 4,
            threads: 1,
            lag: Duration::from_secs(1),
            warmup: Duration::from_secs(3),
            measure: Duration::from_secs(10),
            rw_commits_per_s: 0,
            point_selects: 10,
            range_rows: 100,
            // The RW node holds the whole tree, as a primary's buffer pool holds its working set:
            // its commits never wait on a page read, so the write load is the same whatever
            // storage does with old versions.
            rw: RwConfig { pool_pages: 16_384 },
            ro: RoConfig { cache_pages: 64, window_batches: 64 },
        }
    }
}

/// What a lagging-readers run measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LaggingReport {
    pub threads: u32,
    pub lag_ms: u64,
    /// RW commits in the measured window, and the redo bytes they made per second.
    pub rw_commits: u64,
    pub redo_bytes_per_s: f64,
    /// RO transactions in the measured window, and their latency percentiles.
    pub ro_txns: u64,
    pub ro_txns_per_s: f64,
    pub ro_p50_us: f64,
    pub ro_p95_us: f64,
    pub ro_p99_us: f64,
    /// Pages the RO nodes read from storage in the window, per RO transaction.
    pub ro_page_reads_per_txn: f64,
    /// How far behind the newest commit the RO nodes actually read, on average, in LSN bytes
    /// and milliseconds.
    pub ro_lag_lsn_bytes: f64,
    pub ro_resyncs: u64,
}

/// Commits with their times, shared by the RW thread and the RO threads.
struct Timeline {
    commits: Mutex<VecDeque<(Instant, Lsn)>>,
    newest: AtomicU64,
}

impl Timeline {
    /// The newest commit made at least `lag` ago (`None` before there is one).
    fn at_lag(&self, lag: Duration) -> Option<Lsn> {
        let now = Instant::now();
        let commits = self.commits.lock();
        let cut = commits.partition_point(|(at, _)| now.duration_since(*at) >= lag);
        cut.checked_sub(1).map(|i| commits[i].1)
    }

    fn push(&self, lsn: Lsn, keep: Duration) {
        let now = Instant::now();
        let mut commits = self.commits.lock();
        commits.push_back((now, lsn));
        while commits.front().is_some_and(|(at, _)| now.duration_since(*at) > keep) && commits.len() > 1 {
            commits.pop_front();
        }
        self.newest.store(lsn.0, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct RoTally {
    latencies_us: Vec<f64>,
    page_reads: u64,
    lag_bytes: f64,
    resyncs: u64,
}

/// Runs the lagging-readers workload on `volume`, an empty volume (or one it ran on before).
/// `connect` gives each node its own storage handle (its own connection over the network).
pub fn run_lagging<S: PageStorage + ?Sized + 'static>(
    connect: &dyn Fn() -> Result<Arc<S>>,
    volume: VolumeId,
    config: &LaggingConfig,
) -> Result<LaggingReport> {
    if config.threads == 0 || config.keys == 0 {
        return Err(Error::invalid("a lagging-readers run needs at least one RO thread and one key"));
    }
    let mut rng = Rng::new(config.seed);
    let mut rw = RwNode::open(connect()?, volume, config.rw)?;
    // The load: every key once, in random order, 64 to a commit.
    let mut ids: Vec<u64> = (0..config.keys).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for chunk in ids.chunks(64) {
        let mut txn = rw.begin()?;
        for &id in chunk {
            txn.put(&key(id), &rng.bytes(config.value_bytes))?;
        }
        txn.commit()?;
    }
    let timeline = Arc::new(Timeline { commits: Mutex::new(VecDeque::new()), newest: AtomicU64::new(0) });
    timeline.push(rw.committed_lsn(), config.lag * 4);
    let mut readers = Vec::new();
    for index in 0..config.threads {
        let feed = rw.follow();
        let ro = RoNode::open(connect()?, volume, ReaderId(1000 + u64::from(index)), feed, config.ro)?;
        readers.push(ro);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let measure_from = start + config.warmup;
    let end = measure_from + config.measure;
    let outcome = std::thread::scope(|scope| -> Result<LaggingReport> {
        let writer = {
            let timeline = timeline.clone();
            let stop = stop.clone();
            let mut rng = rng.fork();
            scope.spawn(move || -> Result<(u64, u64)> {
                let mut commits = 0;
                let mut window_start_lsn = None;
                let mut window_end_lsn = Lsn(0);
                let paced = Instant::now();
                let mut made = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if config.rw_commits_per_s > 0 {
                        let due = paced + Duration::from_secs_f64(made as f64 / f64::from(config.rw_commits_per_s));
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                    }
                    made += 1;
                    let mut txn = rw.begin()?;
                    for _ in 0..config.writes_per_txn {
                        let id = rng.below(config.keys);
                        txn.put(&key(id), &rng.bytes(config.value_bytes))?;
                    }
                    let lsn = txn.commit()?;
                    timeline.push(lsn, config.lag * 4);
                    let now = Instant::now();
                    if now >= measure_from && now < end {
                        commits += 1;
                        window_start_lsn.get_or_insert(lsn);
                        window_end_lsn = lsn;
                    }
                }
                let redo = window_end_lsn.0.saturating_sub(window_start_lsn.map_or(window_end_lsn.0, |l| l.0));
                Ok((commits, redo))
            })
        };
        let mut handles = Vec::new();
        for (index, mut ro) in readers.into_iter().enumerate() {
            let timeline = timeline.clone();
            let mut rng = Rng::new(config.seed ^ (0x5eed_0000 + index as u64));
            handles.push(scope.spawn(move || -> Result<RoTally> {
                let mut tally = RoTally::default();
                let mut lag_samples = 0u64;
                while Instant::now() < end {
                    let Some(target) = timeline.at_lag(config.lag) else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    if let Err(error) = ro.apply_through(target) {
                        if matches!(
                            error.kind(),
                            ErrorKind::Closed | ErrorKind::LeaseLost { .. } | ErrorKind::TooOld { .. }
                        ) {
                            ro.resync()?;
                            tally.resyncs += 1;
                            continue;
                        }
                        return Err(error.context("an RO node moving forward"));
                    }
                    let reads_before = ro.stats().page_reads;
                    let began = Instant::now();
                    for _ in 0..config.point_selects {
                        ro.get(&key(rng.below(config.keys)))?;
                    }
                    ro.scan(&key(rng.below(config.keys)), config.range_rows as usize)?;
                    let took = began.elapsed();
                    if began >= measure_from && began < end {
                        tally.latencies_us.push(took.as_secs_f64() * 1e6);
                        tally.page_reads += ro.stats().page_reads - reads_before;
                        let newest = timeline.newest.load(Ordering::Relaxed);
                        tally.lag_bytes += newest.saturating_sub(ro.apply_lsn().0) as f64;
                        lag_samples += 1;
                    }
                }
                if lag_samples > 0 {
                    tally.lag_bytes /= lag_samples as f64;
                }
                let _ = ro.close();
                Ok(tally)
            }));
        }
        let mut tallies = Vec::new();
        let mut first_error = None;
        for handle in handles {
            match handle.join() {
                Ok(Ok(tally)) => tallies.push(tally),
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(_) => {
                    first_error.get_or_insert(Error::invalid("an RO thread panicked"));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let (rw_commits, redo_bytes) = match writer.join() {
            Ok(result) => result?,
            Err(_) => return Err(Error::invalid("the RW thread panicked")),
        };
        if let Some(error) = first_error {
            return Err(error);
        }
        Ok(report(config, tallies, rw_commits, redo_bytes))
    });
    stop.store(true, Ordering::Relaxed);
    outcome
}

fn report(config: &LaggingConfig, tallies: Vec<RoTally>, rw_commits: u64, redo_bytes: u64) -> LaggingReport {
    let seconds = config.measure.as_secs_f64();
    let mut latencies: Vec<f64> = tallies.iter().flat_map(|t| t.latencies_us.iter().copied()).collect();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1]
    };
    let txns = latencies.len() as u64;
    let page_reads: u64 = tallies.iter().map(|t| t.page_reads).sum();
    let readers = tallies.len().max(1) as f64;
    LaggingReport {
        threads: config.threads,
        lag_ms: config.lag.as_millis() as u64,
        rw_commits,
        redo_bytes_per_s: redo_bytes as f64 / seconds,
        ro_txns: txns,
        ro_txns_per_s: txns as f64 / seconds,
        ro_p50_us: percentile(0.50),
        ro_p95_us: percentile(0.95),
        ro_p99_us: percentile(0.99),
        ro_page_reads_per_txn: if txns == 0 { 0.0 } else { page_reads as f64 / txns as f64 },
        ro_lag_lsn_bytes: tallies.iter().map(|t| t.lag_bytes).sum::<f64>() / readers,
        ro_resyncs: tallies.iter().map(|t| t.resyncs).sum(),
    }
}
