//! The whole database in process: the workload on local storage with zero mismatches in
//! several shapes (lagging readers, storage whose ingest trails the durable LSN, small caches,
//! RW restarts, storage going away and coming back), and the checker's twins: each injects a bug
//! an RO node (or the run's handling of a commit in doubt) could have and expects the checker to
//! see it.

use std::sync::Arc;

use tundra_env::{Env, seed_from_env};
use tundra_store::ids::VolumeId;

use super::*;
use crate::storage::{LocalConfig, LocalStorage, VolumeGeometry};
use crate::{Bug, PAGE_SIZE, inject};

const VOLUME: VolumeId = VolumeId(7);

fn storage(config: LocalConfig, seed: u64) -> Arc<LocalStorage> {
    let storage = LocalStorage::new(Env::simulated(seed), config);
    storage.create_volume(VOLUME, VolumeGeometry { page_size: PAGE_SIZE, page_count: 4096 }).unwrap();
    Arc::new(storage)
}

fn small(seed: u64) -> WorkloadConfig {
    WorkloadConfig {
        seed,
        key_space: 5_000,
        initial_keys: 2_500,
        transactions: 1_000,
        writes_per_txn: 4,
        reads_per_txn: 8,
        ro_nodes: 3,
        ro_lag_commits: 4,
        range_rows: 15,
        value_bytes_min: 8,
        value_bytes_max: 300,
        rw: RwConfig { pool_pages: 64 },
        ro: RoConfig { cache_pages: 32, window_batches: 16 },
        ..WorkloadConfig::default()
    }
}

fn run(config: &WorkloadConfig, local: LocalConfig) -> WorkloadReport {
    let storage = storage(local, config.seed);
    let report = run_workload(storage.clone(), VOLUME, config).unwrap();
    let stats = storage.stats(VOLUME).unwrap();
    assert_eq!(stats.live_leases, 0, "every RO node released its lease");
    assert!(stats.pages_folded > 0, "storage folded pages: {stats:?}");
    report
}

fn assert_clean(report: &WorkloadReport, config: &WorkloadConfig) {
    println!("seed {}: {report:?}", config.seed);
    assert_eq!(report.mismatches, 0, "first: {:?} (TUNDRA_SEED={} replays)", report.first_mismatch, config.seed);
    assert!(report.commits > config.transactions * 9 / 10, "{report:?}");
    assert!(report.reads_checked >= config.transactions * u64::from(config.reads_per_txn), "{report:?}");
    assert!(report.range_scans > 0 && report.point_selects > 0 && report.rows_checked > 0);
    assert!(report.ro_page_reads > 0 && report.ro_records_applied > 0, "{report:?}");
    assert!(report.image_records > 0 && report.records > report.image_records, "splits and small changes");
    assert_eq!(report.stale_writer_commits, 0);
}

#[test]
fn lagging_readers_read_what_the_model_holds_at_their_lsn() {
    let config = small(seed_from_env(0x6b76_0001));
    let report = run(&config, LocalConfig::default());
    assert_clean(&report, &config);
    assert_eq!(report.ro_resyncs, 0, "leases hold the readers' history");
}

#[test]
fn readers_take_pages_storage_serves_from_an_older_lsn() {
    // Storage hands batches to its page versions eight batches late, so reads that promise
    // an older not-modified-since are served below the reader's LSN.
    let config = WorkloadConfig { ro_lag_commits: 1, ..small(seed_from_env(0x6b76_0002)) };
    let local = LocalConfig { ingest_lag_batches: 8, ..LocalConfig::default() };
    let storage = storage(local, config.seed);
    let report = run_workload(storage.clone(), VOLUME, &config).unwrap();
    assert_clean(&report, &config);
    let stats = storage.stats(VOLUME).unwrap();
    assert!(stats.not_yet_waits > 0, "some reads waited for ingest: {stats:?}");
    assert!(report.ro_pages_served_older > 0, "{report:?}");
}

#[test]
fn a_restarted_writer_recovers_from_storage_and_fences_the_old_one() {
    let config = WorkloadConfig { rw_restart_every: 40, ..small(seed_from_env(0x6b76_0003)) };
    let report = run(&config, LocalConfig::default());
    assert_clean(&report, &config);
    assert_eq!(report.rw_restarts, config.transactions / 40);
}

#[test]
fn a_reader_that_lags_too_far_resyncs_and_reads_on() {
    // A reader may lag 64 KiB of redo; keeping 40 commits behind passes that.
    let config = WorkloadConfig { ro_lag_commits: 40, transactions: 150, ..small(seed_from_env(0x6b76_0004)) };
    let lease = tundra_redo::LeaseConfig { max_lag: 64 << 10, ..tundra_redo::LeaseConfig::default() };
    let report = run(&config, LocalConfig { lease, ..LocalConfig::default() });
    println!("{report:?}");
    assert_eq!(report.mismatches, 0, "{:?}", report.first_mismatch);
    assert!(report.ro_resyncs > 0, "{report:?}");
}

/// The checker's twins: each bug must show as mismatches.
fn with_bug(bug: Bug) -> WorkloadReport {
    let config = WorkloadConfig { transactions: 120, ..small(0x6b76_0005) };
    let _bug = inject(bug);
    let report = run_workload(storage(LocalConfig::default(), config.seed), VOLUME, &config).unwrap();
    println!("{bug:?}: {} mismatches, first {:?}", report.mismatches, report.first_mismatch);
    report
}

#[test]
fn the_checker_sees_a_reader_reading_at_the_wrong_lsn() {
    let report = with_bug(Bug::ReadsLatest);
    assert!(report.mismatches > 0, "{report:?}");
}

#[test]
fn the_checker_sees_a_reader_that_does_not_apply_redo_to_its_cache() {
    let report = with_bug(Bug::SkipsRedo);
    assert!(report.mismatches > 0, "{report:?}");
}

#[test]
fn the_checker_sees_a_reader_applying_records_twice() {
    let report = with_bug(Bug::ReappliesRecords);
    assert!(report.mismatches > 0, "{report:?}");
}

/// Storage that goes away now and then, as a node killed and restarted does: every `period`-th
/// append fails on the connection, half of the time after storage made it durable (its answer
/// lost) and half before (never received), and the calls after it fail too for a while. The
/// readers' leases are dropped as a restart drops them.
struct Flaky {
    inner: Arc<LocalStorage>,
    period: u64,
    appends: std::sync::atomic::AtomicU64,
    down_for: std::sync::atomic::AtomicU64,
    leases: parking_lot::Mutex<Vec<tundra_redo::LeaseId>>,
}

impl Flaky {
    fn unavailable() -> Error {
        Error::new(ErrorKind::Unavailable, "connection failed: the node went away")
    }

    /// Counts one call against an outage in progress.
    fn down(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.down_for.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
    }
}

impl PageStorage for Flaky {
    fn geometry(&self, volume: VolumeId) -> Result<VolumeGeometry> {
        if self.down() {
            return Err(Flaky::unavailable());
        }
        self.inner.geometry(volume)
    }

    fn append_redo(&self, batch: &tundra_redo::RedoBatch) -> Result<tundra_redo::AppendOutcome> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.down() {
            return Err(Flaky::unavailable());
        }
        let n = self.appends.fetch_add(1, Relaxed) + 1;
        if !n.is_multiple_of(self.period) || batch.records.is_empty() {
            return self.inner.append_redo(batch);
        }
        if n.is_multiple_of(2 * self.period) {
            self.inner.append_redo(batch)?;
        }
        // The node restarts: leases are gone, and a few calls find it down.
        for lease in self.leases.lock().drain(..) {
            let _ = self.inner.release_reader(batch.volume, lease);
        }
        self.down_for.store(3, Relaxed);
        Err(Flaky::unavailable())
    }

    fn get_page(&self, volume: VolumeId, page: u64, at: crate::storage::ReadAt) -> Result<crate::storage::ServedPage> {
        if self.down() {
            return Err(Flaky::unavailable());
        }
        self.inner.get_page(volume, page, at)
    }

    fn register_reader(
        &self,
        volume: VolumeId,
        reader: tundra_redo::ReaderId,
        start_lsn: Lsn,
    ) -> Result<crate::storage::ReaderLease> {
        if self.down() {
            return Err(Flaky::unavailable());
        }
        let lease = self.inner.register_reader(volume, reader, start_lsn)?;
        self.leases.lock().push(lease.id);
        Ok(lease)
    }

    fn renew_reader(
        &self,
        volume: VolumeId,
        lease: tundra_redo::LeaseId,
        apply_lsn: Lsn,
    ) -> Result<crate::storage::Renewal> {
        if self.down() {
            return Err(Flaky::unavailable());
        }
        self.inner.renew_reader(volume, lease, apply_lsn)
    }

    fn release_reader(&self, volume: VolumeId, lease: tundra_redo::LeaseId) -> Result<()> {
        if self.down() {
            return Err(Flaky::unavailable());
        }
        self.leases.lock().retain(|l| *l != lease);
        self.inner.release_reader(volume, lease)
    }

    fn redo_status(&self, volume: VolumeId) -> Result<crate::storage::RedoStatus> {
        if self.down() {
            return Err(Flaky::unavailable());
        }
        self.inner.redo_status(volume)
    }
}

fn flaky_run(seed: u64) -> WorkloadReport {
    let config = WorkloadConfig { survive_restarts: true, ..small(seed) };
    let flaky = Arc::new(Flaky {
        inner: storage(LocalConfig::default(), seed),
        period: 97,
        appends: Default::default(),
        down_for: Default::default(),
        leases: Default::default(),
    });
    run_workload(flaky, VOLUME, &config).unwrap()
}

#[test]
fn a_run_rides_through_storage_going_away_and_settles_commits_in_doubt() {
    let seed = seed_from_env(41);
    let report = flaky_run(seed);
    println!("seed {seed}: {report:?}");
    assert_eq!(report.mismatches, 0, "first: {:?} (TUNDRA_SEED={seed} replays)", report.first_mismatch);
    assert!(report.storage_outages >= 5, "{report:?}");
    assert!(report.commits_in_doubt_landed > 0 && report.commits_in_doubt_lost > 0, "both outcomes: {report:?}");
    assert!(report.ro_resyncs > 0, "{report:?}");
}

#[test]
fn twin_taking_every_commit_in_doubt_as_landed_is_caught() {
    let _bug = inject(Bug::InDoubtAlwaysLanded);
    let report = flaky_run(seed_from_env(41));
    assert!(report.mismatches > 0, "the checker must see commits that never landed: {report:?}");
}
