//! [`ClientStorage`]: [`PageStorage`] over the native protocol (docs/protocol.md, version 2)
//! through one blocking [`Client`] connection. Redo records travel in docs/format.md's "Redo
//! records" encoding (tundra-redo's codec); the client already refuses a page served outside
//! what its read allowed, and the nodes check every served page again.
//!
//! One connection serves one call at a time (a mutex around it), which is what a compute node
//! of this size needs: its RW node commits one batch at a time and each RO node reads a page at
//! a time. A call on a connection that fails is `Unavailable` (for a commit, its outcome is
//! unknown). Made with [`ClientStorage::reconnecting`], the storage then connects again on the
//! next call, waiting up to a bound for the node to come back (a node restarted after a crash),
//! and counts how often it did; made with [`ClientStorage::new`], the connection is not reopened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tundra_client::Client;
use tundra_redo::{AppendOutcome, LeaseId, ReaderId, RedoBatch, WriterEpoch, codec};
use tundra_store::ids::{Lsn, VolumeId};

use super::{PageStorage, ReadAt, ReaderLease, RedoStatus, Renewal, ServedPage, VolumeGeometry};
use crate::{Error, ErrorKind, Result};

/// Storage on a node, through one connection.
pub struct ClientStorage {
    /// `None` after the connection failed, until the next call connects again.
    client: Mutex<Option<Client>>,
    /// Where to connect again, and how long to keep trying; `None`: never.
    reconnect: Option<(String, Duration)>,
    reconnects: AtomicU64,
}

impl ClientStorage {
    /// Storage over `client`, which must speak protocol version 2.
    pub fn new(client: Client) -> Result<ClientStorage> {
        check_version(&client)?;
        Ok(ClientStorage { client: Mutex::new(Some(client)), reconnect: None, reconnects: AtomicU64::new(0) })
    }

    /// Storage on the node at `addr` that outlives its connection: after a call fails on a
    /// broken connection, the next call connects again, trying for up to `wait` before it is
    /// `Unavailable`.
    pub fn reconnecting(addr: &str, wait: Duration) -> Result<ClientStorage> {
        let client = connect(addr)?;
        Ok(ClientStorage {
            client: Mutex::new(Some(client)),
            reconnect: Some((addr.to_string(), wait)),
            reconnects: AtomicU64::new(0),
        })
    }

    /// How many times the storage connected again after losing its connection.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The id of the volume named `name`.
    pub fn volume_id(&self, name: &str) -> Result<VolumeId> {
        self.call(|client| client.volume_lookup(name)).map(|info| VolumeId(info.id))
    }

    /// Runs `request` on the connection, connecting again first if the last one failed and
    /// the storage reconnects. A request that fails with the connection (not with an answer
    /// the node gave) drops it.
    fn call<T>(&self, request: impl FnOnce(&mut Client) -> std::result::Result<T, tundra_client::Error>) -> Result<T> {
        let mut guard = self.client.lock();
        let client = match guard.as_mut() {
            Some(client) => client,
            None => {
                let Some((addr, wait)) = &self.reconnect else {
                    return Err(Error::new(ErrorKind::Unavailable, "the connection to the node was lost"));
                };
                self.reconnects.fetch_add(1, Ordering::Relaxed);
                guard.insert(connect_within(addr, *wait)?)
            }
        };
        let result = request(client);
        if let Err(
            tundra_client::Error::Io(_) | tundra_client::Error::Protocol(_) | tundra_client::Error::Closed { .. },
        ) = &result
        {
            *guard = None;
        }
        result.map_err(Error::from)
    }
}

fn check_version(client: &Client) -> Result<()> {
    if !client.supports_redo() {
        return Err(Error::invalid(format!(
            "the node speaks protocol version {}; redo needs version 2",
            client.version()
        )));
    }
    Ok(())
}

fn connect(addr: &str) -> Result<Client> {
    let client = Client::connect(addr)?;
    check_version(&client)?;
    Ok(client)
}

/// Connects to `addr`, trying every 100 ms for up to `wait`.
fn connect_within(addr: &str, wait: Duration) -> Result<Client> {
    let started = Instant::now();
    loop {
        match connect(addr) {
            Ok(client) => return Ok(client),
            Err(error) if error.kind() == ErrorKind::Unavailable && started.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => {
                return Err(error.context(format_args!("connecting again to {addr} for {} s", wait.as_secs())));
            }
        }
    }
}

impl PageStorage for ClientStorage {
    fn geometry(&self, volume: VolumeId) -> Result<VolumeGeometry> {
        let volumes = self.call(|client| client.volume_list())?;
        let info = volumes
            .iter()
            .find(|info| info.id == volume.0)
            .ok_or_else(|| Error::invalid(format!("the node has no volume {}", volume.0)))?;
        Ok(VolumeGeometry { page_size: info.page_size as usize, page_count: info.page_count() })
    }

    fn append_redo(&self, batch: &RedoBatch) -> Result<AppendOutcome> {
        let mut records = Vec::new();
        for record in &batch.records {
            codec::encode_record(record, &mut records);
        }
        let record_count = u32::try_from(batch.records.len()).map_err(|_| Error::invalid("too many records"))?;
        let append = tundra_proto::RedoAppend {
            volume: batch.volume.0,
            writer_epoch: batch.epoch.0,
            prev_lsn: batch.prev_lsn.0,
            end_lsn: batch.end_lsn.0,
            record_count,
            records: &records,
        };
        Ok(match self.call(|client| client.append_redo(&append))? {
            tundra_proto::AppendOutcome::Ok { durable_lsn } => AppendOutcome::Ok { durable_lsn: Lsn(durable_lsn) },
            tundra_proto::AppendOutcome::Gap { expected_prev_lsn } => {
                AppendOutcome::Gap { expected_prev_lsn: Lsn(expected_prev_lsn) }
            }
            tundra_proto::AppendOutcome::Fenced { epoch } => AppendOutcome::Fenced { epoch: WriterEpoch(epoch) },
        })
    }

    fn get_page(&self, volume: VolumeId, page: u64, at: ReadAt) -> Result<ServedPage> {
        let read = tundra_proto::ReadAt {
            request_lsn: at.request_lsn.0,
            not_modified_since: at.not_modified_since.0,
            lease: at.lease.map(|lease| lease.0),
        };
        let served = self.call(|client| client.get_page_at_lsn(volume.0, page, read))?;
        Ok(ServedPage { served_lsn: Lsn(served.served_lsn), page_lsn: Lsn(served.page_lsn), data: served.data })
    }

    fn register_reader(&self, volume: VolumeId, reader: ReaderId, start_lsn: Lsn) -> Result<ReaderLease> {
        let lease = self.call(|client| client.register_reader(volume.0, reader.0, start_lsn.0))?;
        if lease.granted_lsn < start_lsn.0 {
            return Err(Error::new(
                ErrorKind::Corrupted,
                format!("a lease asked from LSN {start_lsn} was granted from {}", lease.granted_lsn),
            ));
        }
        Ok(ReaderLease {
            id: LeaseId(lease.lease_id),
            granted_lsn: Lsn(lease.granted_lsn),
            valid_for: Duration::from_millis(lease.valid_for_ms),
        })
    }

    fn renew_reader(&self, volume: VolumeId, lease: LeaseId, apply_lsn: Lsn) -> Result<Renewal> {
        let renewal = self.call(|client| client.renew_reader(volume.0, lease.0, apply_lsn.0))?;
        Ok(Renewal { valid_for: Duration::from_millis(renewal.valid_for_ms), lsn_min: Lsn(renewal.lsn_min) })
    }

    fn release_reader(&self, volume: VolumeId, lease: LeaseId) -> Result<()> {
        self.call(|client| client.release_reader(volume.0, lease.0)).map(|_| ())
    }

    fn redo_status(&self, volume: VolumeId) -> Result<RedoStatus> {
        let status = self.call(|client| client.redo_status(volume.0))?;
        Ok(RedoStatus {
            writer_epoch: WriterEpoch(status.writer_epoch),
            durable_lsn: Lsn(status.durable_lsn),
            complete_lsn: Lsn(status.complete_lsn),
            lsn_min: Lsn(status.lsn_min),
        })
    }
}
