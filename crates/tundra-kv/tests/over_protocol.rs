//! The database over the native protocol: `ClientStorage` talks version 2 to a server on
//! 127.0.0.1 whose service is local storage (tundra-redo's log, page versions and leases), so
//! every call the compute node makes crosses the wire (records encoded and decoded, reads at an
//! LSN with their refusals, leases) the way it will against a node. The workload must find no
//! mismatch, and a second writer through its own connection must fence the first.

use std::sync::Arc;

use tundra_client::Client;
use tundra_env::Env;
use tundra_kv::storage::check_served;
use tundra_kv::{
    ClientStorage, ErrorKind, LocalConfig, LocalStorage, PAGE_SIZE, PageStorage, ReadAt, RoConfig, RwConfig, RwNode,
    VolumeGeometry, WorkloadConfig, run_workload,
};
use tundra_proto::{
    AppendOutcome, BatchLsns, HeavyResult, LeaseRenewal, PageLsns, ReaderLease, RedoAppend, RedoStatus, Server,
    Service, ServiceError, VolumeInfo, VolumeMode, VolumeSpec, WriteMode,
};
use tundra_redo::{LeaseId, ReaderId, RedoBatch, WriterEpoch, codec};
use tundra_store::ids::{Lsn, VolumeId};

const VOLUME: VolumeId = VolumeId(4);
const PAGES: u64 = 4096;

/// Local storage served over the protocol: one volume, the redo calls only.
struct LocalService {
    storage: LocalStorage,
}

fn refused(error: tundra_kv::Error) -> ServiceError {
    let message = error.to_string();
    match error.kind() {
        ErrorKind::TooOld { lsn_min } => ServiceError::too_old(lsn_min.0, message),
        ErrorKind::NotYet { complete_lsn } => ServiceError::not_yet(complete_lsn.0, message),
        ErrorKind::LeaseLost { lsn_min } => ServiceError::lease_lost(lsn_min.0, message),
        ErrorKind::Invalid => ServiceError::invalid(message),
        ErrorKind::Corrupted => ServiceError::corrupted(message),
        _ => ServiceError::io(message),
    }
}

fn info() -> VolumeInfo {
    VolumeInfo {
        id: VOLUME.0,
        name: "kv".into(),
        size_bytes: PAGES * PAGE_SIZE as u64,
        page_size: PAGE_SIZE as u32,
        mode: VolumeMode::Normal,
    }
}

fn unsupported() -> ServiceError {
    ServiceError::invalid("this test service keeps one volume and serves redo only")
}

impl Service for LocalService {
    fn volume_lookup(&self, name: &str) -> Result<VolumeInfo, ServiceError> {
        if name == "kv" { Ok(info()) } else { Err(ServiceError::not_found(name.to_string())) }
    }
    fn volume_create(&self, _: VolumeSpec) -> Result<VolumeInfo, ServiceError> {
        Err(unsupported())
    }
    fn volume_list(&self) -> Result<Vec<VolumeInfo>, ServiceError> {
        Ok(vec![info()])
    }
    fn volume_resize(&self, _: &str, _: u64) -> Result<VolumeInfo, ServiceError> {
        Err(unsupported())
    }
    fn volume_delete(&self, _: &str) -> Result<(), ServiceError> {
        Err(unsupported())
    }
    fn read_page(&self, _: u32, _: u64, _: &mut Vec<u8>) -> Result<(), ServiceError> {
        Err(unsupported())
    }
    fn write_page(&self, _: u32, _: u64, _: WriteMode, _: &[u8]) -> Result<(), ServiceError> {
        Err(unsupported())
    }
    fn trim(&self, _: u32, _: u64, _: u64) -> Result<(), ServiceError> {
        Err(unsupported())
    }
    fn flush(&self, _: Option<u32>) -> Result<(), ServiceError> {
        Ok(())
    }
    fn heavy_compress(&self, _: u32, _: u64, _: u64) -> Result<HeavyResult, ServiceError> {
        Err(unsupported())
    }
    fn stats(&self, _: Option<u32>) -> Result<String, ServiceError> {
        Ok("{}".into())
    }

    fn append_redo(&self, append: &RedoAppend<'_>) -> Result<AppendOutcome, ServiceError> {
        let records = codec::decode_records(append.records, append.record_count, PAGE_SIZE as u32)
            .map_err(|e| ServiceError::invalid(e.to_string()))?;
        let batch = RedoBatch {
            volume: VolumeId(append.volume),
            epoch: WriterEpoch(append.writer_epoch),
            prev_lsn: Lsn(append.prev_lsn),
            end_lsn: Lsn(append.end_lsn),
            records,
        };
        codec::check_batch(&batch, PAGE_SIZE as u32).map_err(|e| ServiceError::invalid(e.to_string()))?;
        Ok(match self.storage.append_redo(&batch).map_err(refused)? {
            tundra_redo::AppendOutcome::Ok { durable_lsn } => AppendOutcome::Ok { durable_lsn: durable_lsn.0 },
            tundra_redo::AppendOutcome::Gap { expected_prev_lsn } => {
                AppendOutcome::Gap { expected_prev_lsn: expected_prev_lsn.0 }
            }
            tundra_redo::AppendOutcome::Fenced { epoch } => AppendOutcome::Fenced { epoch: epoch.0 },
        })
    }

    fn redo_status(&self, volume: u32) -> Result<RedoStatus, ServiceError> {
        let status = self.storage.redo_status(VolumeId(volume)).map_err(refused)?;
        Ok(RedoStatus {
            writer_epoch: status.writer_epoch.0,
            durable_lsn: status.durable_lsn.0,
            complete_lsn: status.complete_lsn.0,
            lsn_min: status.lsn_min.0,
        })
    }

    fn get_page_at_lsn(
        &self,
        volume: u32,
        page: u64,
        at: tundra_proto::ReadAt,
        out: &mut Vec<u8>,
    ) -> Result<PageLsns, ServiceError> {
        let read = ReadAt {
            request_lsn: Lsn(at.request_lsn),
            not_modified_since: Lsn(at.not_modified_since),
            lease: at.lease.map(LeaseId),
        };
        let served = self.storage.get_page(VolumeId(volume), page, read).map_err(refused)?;
        check_served(&served, read, PAGE_SIZE, page).map_err(refused)?;
        out.extend_from_slice(&served.data);
        Ok(PageLsns { served_lsn: served.served_lsn.0, page_lsn: served.page_lsn.0 })
    }

    fn get_pages_at_lsn(
        &self,
        _: u32,
        _: &[u64],
        _: tundra_proto::ReadAt,
        _: &mut Vec<u8>,
    ) -> Result<BatchLsns, ServiceError> {
        Err(unsupported())
    }

    fn register_reader(&self, volume: u32, reader_id: u64, start_lsn: u64) -> Result<ReaderLease, ServiceError> {
        let lease =
            self.storage.register_reader(VolumeId(volume), ReaderId(reader_id), Lsn(start_lsn)).map_err(refused)?;
        Ok(ReaderLease {
            lease_id: lease.id.0,
            granted_lsn: lease.granted_lsn.0,
            valid_for_ms: lease.valid_for.as_millis() as u64,
        })
    }

    fn renew_reader(&self, volume: u32, lease_id: u64, apply_lsn: u64) -> Result<LeaseRenewal, ServiceError> {
        let renewal =
            self.storage.renew_reader(VolumeId(volume), LeaseId(lease_id), Lsn(apply_lsn)).map_err(refused)?;
        Ok(LeaseRenewal { valid_for_ms: renewal.valid_for.as_millis() as u64, lsn_min: renewal.lsn_min.0 })
    }

    fn release_reader(&self, volume: u32, lease_id: u64) -> Result<(), ServiceError> {
        self.storage.release_reader(VolumeId(volume), LeaseId(lease_id)).map_err(refused)
    }
}

fn serve(config: LocalConfig) -> Server {
    let storage = LocalStorage::new(Env::simulated(11), config);
    storage.create_volume(VOLUME, VolumeGeometry { page_size: PAGE_SIZE, page_count: PAGES }).unwrap();
    Server::start("127.0.0.1:0", Arc::new(LocalService { storage })).unwrap()
}

fn connect(server: &Server) -> Arc<ClientStorage> {
    Arc::new(ClientStorage::new(Client::connect(server.local_addr()).unwrap()).unwrap())
}

#[test]
fn the_workload_over_the_protocol_finds_no_mismatch() {
    let server = serve(LocalConfig { ingest_lag_batches: 4, ..LocalConfig::default() });
    let storage = connect(&server);
    assert_eq!(storage.volume_id("kv").unwrap(), VOLUME);
    let config = WorkloadConfig {
        seed: tundra_env::seed_from_env(0x6b76_7072),
        key_space: 2_000,
        initial_keys: 1_000,
        transactions: 150,
        reads_per_txn: 8,
        ro_nodes: 2,
        ro_lag_commits: 3,
        rw: RwConfig { pool_pages: 32 },
        ro: RoConfig { cache_pages: 16, window_batches: 8 },
        rw_restart_every: 50,
        ..WorkloadConfig::default()
    };
    let report = run_workload(storage, VOLUME, &config).unwrap();
    println!("seed {}: {report:?}", config.seed);
    assert_eq!(report.mismatches, 0, "{:?}", report.first_mismatch);
    assert!(report.reads_checked > 1_000 && report.ro_page_reads > 0 && report.ro_pages_served_older > 0);
    assert_eq!(report.rw_restarts, 3);
}

#[test]
fn a_second_writer_on_its_own_connection_fences_the_first() {
    let server = serve(LocalConfig::default());
    let (first_storage, second_storage) = (connect(&server), connect(&server));
    let mut first = RwNode::open(first_storage, VOLUME, RwConfig::default()).unwrap();
    let mut txn = first.begin().unwrap();
    txn.put(b"k", b"first").unwrap();
    txn.commit().unwrap();
    let mut second = RwNode::open(second_storage.clone(), VOLUME, RwConfig::default()).unwrap();
    assert_eq!(second.epoch(), WriterEpoch(first.epoch().0 + 1));
    let mut txn = first.begin().unwrap();
    txn.put(b"k", b"stale").unwrap();
    let error = txn.commit().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Fenced { epoch: second.epoch() }, "{error}");
    assert_eq!(second.get(b"k").unwrap().as_deref(), Some(&b"first"[..]));
    let status = second_storage.redo_status(VOLUME).unwrap();
    assert_eq!(status.durable_lsn, second.committed_lsn());
    // A read at LSN 0 is refused by the protocol's own rules, as the node will refuse it.
    let at = ReadAt { request_lsn: Lsn(0), not_modified_since: Lsn(0), lease: None };
    assert_eq!(second_storage.get_page(VOLUME, 0, at).unwrap_err().kind(), ErrorKind::Invalid);
}
