//! The node's volume table: create, resize and delete, and the identity that binds a request
//! to one volume.
//!
//! A volume id is never given out twice (each store keeps a floor of the ids it gave out, in
//! its journal), and a [`VolumeRef`] carries a flag that its volume's deletion clears. So a
//! connection or a native client holding a deleted volume gets a clear error on every request,
//! and can never read or change a volume created after it under the same name or a reused id.
//! Chunk ids are derived from volume ids, so they are never reused either.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tundra_device::size::format_size;
use tundra_store::ids::VolumeId;
use tundra_store::volume::{DEFAULT_CHUNK_BYTES, Volume, VolumeMode, validate_name};

use crate::{Device, Error, Node, Result, VolumeRef};

/// Someone told when a volume is deleted (by name): e.g. the NBD server, to close the
/// volume's connections.
pub type DeletedListener = Box<dyn Fn(&str) + Send + Sync>;

impl std::fmt::Debug for VolumeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeRef")
            .field("volume", &self.volume)
            .field("device", &self.device)
            .field("live", &self.is_live())
            .finish()
    }
}

impl VolumeRef {
    /// False once the volume is deleted.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Every I/O entry point starts here: a request bound to a deleted volume fails.
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.is_live() {
            Ok(())
        } else {
            Err(Error::Closed(format!(
                "volume {:?} (id {}) was deleted; reconnect to another volume",
                self.volume.name, self.volume.id.0
            )))
        }
    }
}

impl Node {
    /// Rebuilds the volume table from the two stores. A volume keeps its latency histograms
    /// and its liveness flag across rebuilds; a volume no longer in either store is marked
    /// deleted, so every reference to it fails from then on.
    pub(crate) fn refresh_volumes(&self) {
        let mut table = BTreeMap::new();
        let mut tracked = self.tracked.lock();
        for device in [Device::Drive, Device::Fast] {
            for volume in self.store(device).volumes() {
                let pages = self.paths[&(device, volume.page_size)].clone();
                let (latency, live) =
                    tracked.entry(volume.id).or_insert_with(|| (Default::default(), Arc::new(AtomicBool::new(true))));
                let (latency, live) = (latency.clone(), live.clone());
                table.insert(volume.id, VolumeRef { volume, device, pages, latency, live });
            }
        }
        tracked.retain(|id, (_, live)| {
            let keep = table.contains_key(id);
            if !keep {
                live.store(false, Ordering::Release);
            }
            keep
        });
        *self.volumes.write() = table;
    }

    pub fn volumes(&self) -> Vec<VolumeRef> {
        self.volumes.read().values().cloned().collect()
    }

    pub fn volume(&self, id: VolumeId) -> Result<VolumeRef> {
        self.volumes.read().get(&id).cloned().ok_or_else(|| {
            Error::NotFound(format!(
                "no volume with id {} (it was deleted or never existed; ids are never reused): \
                 look the volume up by name again",
                id.0
            ))
        })
    }

    pub fn volume_by_name(&self, name: &str) -> Result<VolumeRef> {
        self.volumes
            .read()
            .values()
            .find(|v| v.volume.name == name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("no volume named {name:?}")))
    }

    /// Calls `listener` with a volume's name each time one is deleted, after its references
    /// were marked deleted (e.g. the NBD server closes the volume's export).
    pub fn on_volume_deleted(&self, listener: DeletedListener) {
        self.deleted_listeners.lock().push(listener);
    }

    /// The next volume id: above every id either store ever gave out. A cluster takes the
    /// largest of its nodes' for a replicated volume, which gets the same id on each.
    pub fn next_volume_id(&self) -> VolumeId {
        let stores = self.data.next_volume_id().max(self.fast.next_volume_id());
        let listed = self.volumes.read().keys().map(|id| id.0.saturating_add(1)).max().unwrap_or(0);
        VolumeId(stores.0.max(listed).max(1))
    }

    /// Creates a volume: mode normal on the drive, mode none on the fast device.
    pub fn volume_create(&self, name: &str, size_bytes: u64, page_size: u32, mode: VolumeMode) -> Result<VolumeRef> {
        self.volume_create_as(None, name, size_bytes, page_size, mode)
    }

    /// [`Node::volume_create`] with the id chosen by the caller (a cluster's, the same on every
    /// replica), which must be unused here; `None` takes the next.
    pub fn volume_create_as(
        &self,
        id: Option<VolumeId>,
        name: &str,
        size_bytes: u64,
        page_size: u32,
        mode: VolumeMode,
    ) -> Result<VolumeRef> {
        let _one = self.admin.lock();
        validate_name(name)?;
        if self.volume_by_name(name).is_ok() {
            return Err(Error::Exists(format!("a volume named {name:?} exists; choose another name or delete it")));
        }
        let device = if mode == VolumeMode::None { Device::Fast } else { Device::Drive };
        let id = match id {
            None => self.next_volume_id(),
            Some(id) if id >= self.next_volume_id() => id,
            Some(id) => {
                return Err(Error::Exists(format!("volume id {} was given out on this node already", id.0)));
            }
        };
        let volume =
            Volume { id, name: name.to_string(), size_bytes, page_size, chunk_bytes: DEFAULT_CHUNK_BYTES, mode };
        volume.validate()?;
        self.check_capacity(device, None, &volume)?;
        self.store(device).create_volume(volume)?;
        self.refresh_volumes();
        self.volume(id)
    }

    /// Grows a volume (shrinking would drop data and is refused).
    pub fn volume_resize(&self, name: &str, size_bytes: u64) -> Result<VolumeRef> {
        let _one = self.admin.lock();
        let current = self.volume_by_name(name)?;
        if size_bytes < current.volume.size_bytes {
            return Err(Error::Invalid(format!(
                "volume {name:?} is {}; shrinking it to {} would drop data and is not supported",
                format_size(current.volume.size_bytes),
                format_size(size_bytes)
            )));
        }
        let grown = Volume { size_bytes, ..current.volume.clone() };
        grown.validate()?;
        self.check_capacity(current.device, Some(current.volume.id), &grown)?;
        self.store(current.device).resize_volume(current.volume.id, size_bytes)?;
        self.refresh_volumes();
        self.volume(current.volume.id)
    }

    /// Whether [`Node::volume_resize`] of volume `name` to `size_bytes` would be accepted, without
    /// changing anything (a replicated volume's resize asks every node before any grows).
    pub fn volume_resize_check(&self, name: &str, size_bytes: u64) -> Result<()> {
        let _one = self.admin.lock();
        let current = self.volume_by_name(name)?;
        if size_bytes <= current.volume.size_bytes {
            return Ok(());
        }
        let grown = Volume { size_bytes, ..current.volume.clone() };
        grown.validate()?;
        self.check_capacity(current.device, Some(current.volume.id), &grown)
    }

    /// Deletes a volume and frees its pages. Every reference to it fails from the moment it is
    /// marked deleted, before its cached writes are dropped: a writer checks the mark under
    /// its page's write-back lock, so nothing of the volume is cached after the drop.
    pub fn volume_delete(&self, name: &str) -> Result<()> {
        let _one = self.admin.lock();
        let current = self.volume_by_name(name)?;
        current.live.store(false, Ordering::Release);
        let _no_flush = self.writeback.flushing(current.volume.id);
        self.writeback.discard_volume(current.volume.id);
        if let Err(error) = self.store(current.device).delete_volume(current.volume.id) {
            // The journal refused the delete (the store has stopped): the volume stays.
            current.live.store(true, Ordering::Release);
            return Err(error.into());
        }
        self.refresh_volumes();
        self.redo.forget(current.volume.id)?;
        for listener in self.deleted_listeners.lock().iter() {
            listener(name);
        }
        Ok(())
    }

    /// Refuses a volume the node cannot promise to hold: past the pages the journal's
    /// checkpoint can record (never allowed), or past the device's space, the drive's logical
    /// space for compressed volumes or the fast device's for mode none (allowed with
    /// `overcommit = true` in the device's config section, with a warning on the log).
    fn check_capacity(&self, device: Device, replacing: Option<VolumeId>, volume: &Volume) -> Result<()> {
        let (pages, bytes) = self
            .volumes
            .read()
            .values()
            .filter(|v| v.device == device && Some(v.volume.id) != replacing)
            .fold((0u64, 0u64), |(p, b), v| (p + v.volume.page_count(), b + v.volume.size_bytes));
        let (what, section, space, page_limit, capacity, overcommit) = match device {
            Device::Drive => (
                "compressed volumes",
                "drive",
                "drive's logical space",
                self.layout.drive_page_limit(),
                self.layout.drive_logical_bytes,
                self.overcommit.drive,
            ),
            Device::Fast => (
                "uncompressed volumes (mode none)",
                "fast",
                "fast device's space for them",
                self.layout.fast_page_limit(),
                self.layout.fast_volume_bytes,
                self.overcommit.fast,
            ),
        };
        let page_bytes = u64::from(volume.page_size);
        if pages + volume.page_count() > page_limit {
            let free = page_limit.saturating_sub(pages) * page_bytes;
            return Err(Error::NoSpace(format!(
                "{what} on this node can hold {} of {} pages in all (one journal checkpoint record per \
                 page); {} is left and this volume needs {}. Make it smaller or delete a volume",
                format_size(page_limit * page_bytes),
                format_size(page_bytes),
                format_size(free),
                format_size(volume.size_bytes)
            )));
        }
        let total = bytes + volume.size_bytes;
        if total <= capacity {
            return Ok(());
        }
        let free = capacity.saturating_sub(bytes);
        if !overcommit {
            return Err(Error::NoSpace(format!(
                "{what} would take {} of the {} {space}, which has {} free for this volume. Make it at \
                 most {}, delete a volume, or set `overcommit = true` under [{section}] in the node's \
                 config and restart it to allow more (writes then fail with no space once the pages \
                 no longer fit)",
                format_size(total),
                format_size(capacity),
                format_size(free),
                format_size(free)
            )));
        }
        eprintln!(
            "tundra: warning: volume {:?} overcommits the {space}: {what} now take {} of {} \
             (overcommit = true under [{section}]); writes fail with no space once the pages no longer fit",
            volume.name,
            format_size(total),
            format_size(capacity)
        );
        Ok(())
    }
}
