//! [`ClientStorage`]: [`PageStorage`] over the native protocol (docs/protocol.md, version 2)
//! through one blocking [`Client`] connection. Redo records travel in docs/format.md's "Redo
//! records" encoding (tundra-redo's codec); the client already refuses a page served outside
//! what its read allowed, and the nodes check every served page again.
//!
//! One connection serves one call at a time (a mutex around it), which is what a compute node
//! of this size needs: its RW node commits one batch at a time and each RO node reads a page at
//! a time. A connection that fails is not reopened here: the error reaches the node, which
//! stops (a commit's outcome is unknown) or reports it.

use std::time::Duration;

use parking_lot::Mutex;
use tundra_client::Client;
use tundra_redo::{AppendOutcome, LeaseId, ReaderId, RedoBatch, WriterEpoch, codec};
use tundra_store::ids::{Lsn, VolumeId};

use super::{PageStorage, ReadAt, ReaderLease, RedoStatus, Renewal, ServedPage, VolumeGeometry};
use crate::{Error, ErrorKind, Result};

/// Storage on a node, through one connection.
pub struct ClientStorage {
    client: Mutex<Client>,
}

impl ClientStorage {
    /// Storage over `client`, which must speak protocol version 2.
    pub fn new(client: Client) -> Result<ClientStorage> {
        if !client.supports_redo() {
            return Err(Error::invalid(format!(
                "the node speaks protocol version {}; redo needs version 2",
                client.version()
            )));
        }
        Ok(ClientStorage { client: Mutex::new(client) })
    }

    /// The id of the volume named `name`.
    pub fn volume_id(&self, name: &str) -> Result<VolumeId> {
        Ok(VolumeId(self.client.lock().volume_lookup(name)?.id))
    }
}

impl PageStorage for ClientStorage {
    fn geometry(&self, volume: VolumeId) -> Result<VolumeGeometry> {
        let volumes = self.client.lock().volume_list()?;
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
        Ok(match self.client.lock().append_redo(&append)? {
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
        let served = self.client.lock().get_page_at_lsn(volume.0, page, read)?;
        Ok(ServedPage { served_lsn: Lsn(served.served_lsn), page_lsn: Lsn(served.page_lsn), data: served.data })
    }

    fn register_reader(&self, volume: VolumeId, reader: ReaderId, start_lsn: Lsn) -> Result<ReaderLease> {
        let lease = self.client.lock().register_reader(volume.0, reader.0, start_lsn.0)?;
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
        let renewal = self.client.lock().renew_reader(volume.0, lease.0, apply_lsn.0)?;
        Ok(Renewal { valid_for: Duration::from_millis(renewal.valid_for_ms), lsn_min: Lsn(renewal.lsn_min) })
    }

    fn release_reader(&self, volume: VolumeId, lease: LeaseId) -> Result<()> {
        Ok(self.client.lock().release_reader(volume.0, lease.0)?)
    }

    fn redo_status(&self, volume: VolumeId) -> Result<RedoStatus> {
        let status = self.client.lock().redo_status(volume.0)?;
        Ok(RedoStatus {
            writer_epoch: WriterEpoch(status.writer_epoch),
            durable_lsn: Lsn(status.durable_lsn),
            complete_lsn: Lsn(status.complete_lsn),
            lsn_min: Lsn(status.lsn_min),
        })
    }
}
