//! [`Lss`], the log-structured element store on a block device: put, get, delete and flush of
//! elements (a key of up to 255 bytes and a value filling at most one slot), an in-memory index
//! rebuilt on open from the segments, and [`LogCore`]'s decisions carried out on the device.
//!
//! Durability: puts and deletes are acknowledged by a later [`Lss::flush`], as writes to a disk
//! with a volatile cache are. Three orderings keep every acknowledged element through a crash
//! (docs/lss.md argues them): a dead version is zeroed or trimmed only after a flush made the
//! version that replaced it durable; a collected segment is trimmed only after a flush made the
//! copies of its live elements durable; and it is reused only after a flush made that trim
//! durable. A delete writes a tombstone, kept live while an older version of its key may still be
//! on the device.
//!
//! `mod.rs` holds the API and the write path; `maintain.rs` carries out trims and collections,
//! `recovery.rs` opens a store from its device, `format.rs` has the bytes.

mod format;
mod maintain;
mod recovery;

#[cfg(test)]
mod crash_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use tundra_device::buf::BlockBuf;
use tundra_device::{BlockDevice, Lba};

use crate::core::{CoreCounters, LogCore, WriteKind};
use crate::error::{Error, ErrorKind, Result};
use crate::geometry::{LogGeometry, SECTOR_BYTES, SectorNo, SlotAddr};
use crate::meter::Meter;
use crate::policy::Policy;

pub use format::{DATA_START_LBA, ELEMENT_HEADER_BYTES, MAX_KEY_BYTES, max_value_bytes};
use format::{Element, decode_element, encode_element};

const NO_OWNER: u32 = u32::MAX;

/// What the index knows of one key.
#[derive(Clone, Debug)]
struct Entry {
    key: Vec<u8>,
    /// The slot of the newest version (an element or a tombstone), `None` once a tombstone was
    /// dropped.
    current: Option<SlotAddr>,
    seq: u64,
    tombstone: bool,
    /// Slots on the device holding any version of this key, current or dead, not yet cleared.
    versions: u32,
}

/// The sector being filled, kept in memory until its last slot is placed.
struct OpenSector {
    sector: Option<SectorNo>,
    bytes: BlockBuf,
}

/// I/O the store issued, counted as it issued it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    pub sector_writes: u64,
    /// Rewrites of the sector being filled that a flush forced before it was full.
    pub partial_sector_writes: u64,
    pub sector_reads: u64,
    pub sector_trims: u64,
    pub flushes: u64,
}

/// A snapshot of the store.
#[derive(Clone, Copy, Debug)]
pub struct StoreStats {
    pub geometry: LogGeometry,
    pub live_elements: u64,
    /// Live slots: elements and the tombstones still needed.
    pub live_slots: u64,
    pub physical_slots: u64,
    pub footprint_slots: u64,
    pub gamma: f64,
    pub gamma_t: f64,
    pub core: CoreCounters,
    pub io: IoCounters,
}

/// Samples of the store's space while a caller measures: the device's own accounting, and the
/// core's count of uncleared slots (what the model reports).
#[derive(Clone, Copy, Debug, Default)]
pub struct Meters {
    pub device: Meter,
    pub slots: Meter,
}

/// The log-structured store.
pub struct Lss {
    device: Arc<dyn BlockDevice>,
    geometry: LogGeometry,
    core: LogCore,
    index: HashMap<Vec<u8>, u32>,
    entries: Vec<Entry>,
    free_handles: Vec<u32>,
    /// For each slot holding a version (live or dead), the handle of its key's entry.
    owner: Vec<u32>,
    next_seq: u64,
    live_elements: u64,
    open_sector: OpenSector,
    io: IoCounters,
    meters: Option<Meters>,
    /// Set when a device error struck in the middle of a change: memory may be ahead of the
    /// device, so the store refuses everything until it is reopened.
    failed: Option<String>,
}

impl Lss {
    /// Lays an empty store over `device` (whose first block and segments must fit) and opens it.
    pub fn format(device: Arc<dyn BlockDevice>, geometry: LogGeometry, policy: Policy) -> Result<Lss> {
        policy.validate()?;
        let needed = DATA_START_LBA + geometry.total_sectors();
        if device.block_count() < needed {
            return Err(Error::invalid(format!(
                "the device has {} blocks; this store needs {needed}",
                device.block_count()
            )));
        }
        // Trimmed blocks read as zeros: no element of an earlier use survives in the segments.
        device.trim(Lba(DATA_START_LBA), geometry.total_sectors())?;
        device.flush()?;
        device.write(Lba(0), &format::encode_superblock(&geometry))?;
        device.flush()?;
        Lss::open(device, policy)
    }

    /// Opens a formatted store, rebuilding its index from every segment.
    pub fn open(device: Arc<dyn BlockDevice>, policy: Policy) -> Result<Lss> {
        recovery::open(device, policy)
    }

    pub fn geometry(&self) -> LogGeometry {
        self.geometry
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// The largest value a key of `key_len` bytes can have.
    pub fn max_value_bytes(&self, key_len: usize) -> usize {
        max_value_bytes(self.geometry.slot_bytes, key_len)
    }

    /// Stores `value` under `key`, replacing any earlier value. Durable after the next flush.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check_usable()?;
        self.check_element(key, value)?;
        // A new key adds an element and a slot; a key whose tombstone is still live adds an
        // element in the tombstone's place. Tombstones may use the room between the two limits,
        // so that deletes never need it.
        let current = self.index.get(key).and_then(|&h| {
            let entry = &self.entries[h as usize];
            entry.current.map(|_| entry.tombstone)
        });
        if current != Some(false) && self.live_elements >= self.core.live_limit() {
            return Err(Error::full(format!(
                "the store holds {} elements, the most its {} segments of {} slots keep at gamma_th {}",
                self.live_elements,
                self.geometry.segment_count,
                self.geometry.slots_per_segment(),
                self.core.policy().gamma_th
            )));
        }
        if current.is_none() && self.core.live_slots_total() >= self.core.hard_limit() {
            return Err(Error::full(format!(
                "the store's {} live slots, tombstones included, fill its segments",
                self.core.live_slots_total()
            )));
        }
        self.check_physical_room()?;
        self.guarded(|store| store.write_version(key, value, false))
    }

    /// Deletes `key`; true when it held a value. Durable after the next flush. A delete writes a
    /// tombstone, whose slot a full store keeps room for.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.check_usable()?;
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(format!("a {}-byte key: keys hold at most {MAX_KEY_BYTES} bytes", key.len())));
        }
        let exists = self.index.get(key).is_some_and(|&h| {
            let entry = &self.entries[h as usize];
            entry.current.is_some() && !entry.tombstone
        });
        if !exists {
            return Ok(false);
        }
        self.guarded(|store| store.write_version(key, &[], true))?;
        Ok(true)
    }

    /// The value stored under `key`, verified.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_usable()?;
        let Some(&handle) = self.index.get(key) else { return Ok(None) };
        let entry = &self.entries[handle as usize];
        let Some(slot) = entry.current.filter(|_| !entry.tombstone) else { return Ok(None) };
        let element = self.read_slot(slot)?;
        match element {
            Some(e) if e.key == key && e.seq == entry.seq && !e.tombstone => Ok(Some(e.value)),
            other => Err(Error::corrupted(format!(
                "element slot {} should hold version {} of a {}-byte key and holds {}",
                slot.0,
                entry.seq,
                key.len(),
                other.map_or("nothing".to_string(), |e| format!("version {} of a {}-byte key", e.seq, e.key.len()))
            ))),
        }
    }

    /// Makes every put and delete so far durable.
    pub fn flush(&mut self) -> Result<()> {
        self.check_usable()?;
        self.guarded(|store| store.sync())
    }

    /// Keys with a value.
    pub fn len(&self) -> u64 {
        self.live_elements
    }

    pub fn is_empty(&self) -> bool {
        self.live_elements == 0
    }

    /// Every key with a value, in no particular order.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.entries.iter().filter(|e| e.current.is_some() && !e.tombstone).map(|e| e.key.clone()).collect()
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            geometry: self.geometry,
            live_elements: self.live_elements,
            live_slots: self.core.live_slots_total(),
            physical_slots: self.core.physical_slots(),
            footprint_slots: self.core.footprint_slots(),
            gamma: self.core.gamma(),
            gamma_t: self.core.gamma_t(),
            core: self.core.counters(),
            io: self.io,
        }
    }

    /// Starts sampling the space used: [`Lss::sample`] takes regular samples, and every
    /// collection adds its peak.
    pub fn start_measuring(&mut self) {
        self.meters = Some(Meters::default());
    }

    /// Stops sampling and returns the samples.
    pub fn finish_measuring(&mut self) -> Meters {
        self.meters.take().unwrap_or_default()
    }

    /// Takes one regular sample of the space used, if measuring.
    pub fn sample(&mut self) {
        let (device, slots) = self.space();
        if let Some(meters) = self.meters.as_mut() {
            meters.device.sample(device.0, device.1, device.2);
            meters.slots.sample(slots.0, slots.1, slots.2);
        }
    }

    /// (physical, footprint, live) bytes by the device's accounting and by the slots'.
    fn space(&self) -> ((u64, u64, u64), (u64, u64, u64)) {
        let slot = u64::from(self.geometry.slot_bytes);
        let live = self.core.live_slots_total() * slot;
        let footprint = self.core.footprint_slots() * slot;
        let device = self.device.usage().physical_used_bytes;
        ((device, footprint, live), (self.core.physical_slots() * slot, footprint, live))
    }

    /// Recounts the core and checks the index against it; panics on a mismatch. For tests.
    pub fn check_invariants(&self) {
        self.core.check_invariants();
        let mut versions = vec![0u32; self.entries.len()];
        for (slot, &owner) in self.owner.iter().enumerate() {
            let state = self.core.slot_state(SlotAddr(slot as u64));
            let holds = matches!(state, crate::core::SlotState::Live | crate::core::SlotState::Dead);
            assert_eq!(owner != NO_OWNER, holds, "slot {slot} ({state:?}) and its owner {owner}");
            if owner != NO_OWNER {
                versions[owner as usize] += 1;
            }
        }
        let mut live = 0;
        for (handle, entry) in self.entries.iter().enumerate() {
            if self.free_handles.contains(&(handle as u32)) {
                continue;
            }
            assert_eq!(entry.versions, versions[handle], "versions of entry {handle}");
            assert_eq!(self.index.get(&entry.key), Some(&(handle as u32)), "entry {handle} is indexed");
            if let Some(slot) = entry.current {
                assert_eq!(self.core.slot_state(slot), crate::core::SlotState::Live, "entry {handle}'s slot");
                live += u64::from(!entry.tombstone);
            }
        }
        assert_eq!(live, self.live_elements, "live elements");
    }

    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(Error::closed(format!("the store stopped after an error ({why}); reopen it"))),
            None => Ok(()),
        }
    }

    fn check_element(&self, key: &[u8], value: &[u8]) -> Result<()> {
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(format!("a {}-byte key: keys hold at most {MAX_KEY_BYTES} bytes", key.len())));
        }
        let max = self.max_value_bytes(key.len());
        if value.len() > max {
            return Err(Error::invalid(format!(
                "a {}-byte value with a {}-byte key: an element fills one {}-byte slot, so at most {max} value bytes",
                value.len(),
                key.len(),
                self.geometry.slot_bytes
            )));
        }
        Ok(())
    }

    /// Refuses a put when the device is short of physical space: the collector may need two
    /// segments' worth before it gives any back.
    fn check_physical_room(&self) -> Result<()> {
        let usage = self.device.usage();
        let needed = 2 * self.geometry.segment_bytes() + usage.physical_capacity_bytes / 64;
        let left = usage.physical_capacity_bytes.saturating_sub(usage.physical_used_bytes);
        if left < needed {
            return Err(Error::full(format!(
                "the drive has {left} bytes of physical space left; the store keeps {needed} for garbage collection"
            )));
        }
        Ok(())
    }

    /// Runs a change; a device error in it stops the store.
    fn guarded<T>(&mut self, change: impl FnOnce(&mut Lss) -> Result<T>) -> Result<T> {
        let result = change(self);
        if let Err(error) = &result
            && error.kind() != ErrorKind::Invalid
        {
            self.failed.get_or_insert_with(|| error.to_string());
        }
        result
    }

    /// Writes a new version of `key` (a value or a tombstone) and retires the one it replaces.
    fn write_version(&mut self, key: &[u8], value: &[u8], tombstone: bool) -> Result<()> {
        let handle = self.entry_for(key);
        let seq = self.next_seq;
        self.next_seq += 1;
        let element = Element { tombstone, key: key.to_vec(), value: value.to_vec(), seq, epoch: 0 };
        let slot = self.append(element, WriteKind::User)?;
        let entry = &mut self.entries[handle as usize];
        let old = entry.current.replace(slot);
        let was_live = old.is_some() && !entry.tombstone;
        entry.seq = seq;
        entry.tombstone = tombstone;
        entry.versions += 1;
        self.owner[slot.0 as usize] = handle;
        self.live_elements = self.live_elements + u64::from(!tombstone) - u64::from(was_live);
        if let Some(old) = old {
            self.core.kill(old);
        }
        self.maintain()
    }

    /// Places an element in the open segment and writes its sector once full.
    fn append(&mut self, element: Element, kind: WriteKind) -> Result<SlotAddr> {
        let slot = self.core.place(kind)?;
        self.write_slot(slot, element)?;
        Ok(slot)
    }

    /// Writes an element into the slot the core placed it in, through the sector being filled.
    fn write_slot(&mut self, slot: SlotAddr, mut element: Element) -> Result<()> {
        element.epoch = self.core.segment_epoch(self.geometry.segment_of(slot));
        let sector = self.geometry.sector_of(slot);
        if self.open_sector.sector != Some(sector) {
            assert_eq!(self.geometry.slot_in_sector(slot), 0, "a new sector starts at its first slot");
            self.open_sector.sector = Some(sector);
            self.open_sector.bytes.fill(0);
        }
        let at = self.geometry.slot_in_sector(slot) * self.geometry.slot_bytes as usize;
        encode_element(&element, slot, &mut self.open_sector.bytes[at..at + self.geometry.slot_bytes as usize]);
        if self.geometry.slot_in_sector(slot) + 1 == self.geometry.slots_per_sector() as usize {
            self.device.write(sector_lba(sector), &self.open_sector.bytes)?;
            self.io.sector_writes += 1;
            self.open_sector.sector = None;
        }
        Ok(())
    }

    /// The entry of `key`, made if it has none.
    fn entry_for(&mut self, key: &[u8]) -> u32 {
        if let Some(&handle) = self.index.get(key) {
            return handle;
        }
        let entry = Entry { key: key.to_vec(), current: None, seq: 0, tombstone: false, versions: 0 };
        let handle = match self.free_handles.pop() {
            Some(handle) => {
                self.entries[handle as usize] = entry;
                handle
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.index.insert(key.to_vec(), handle);
        handle
    }

    /// A slot's version is gone from the device (cleared, or its segment trimmed).
    fn destroy(&mut self, slot: SlotAddr) {
        let handle = std::mem::replace(&mut self.owner[slot.0 as usize], NO_OWNER);
        assert_ne!(handle, NO_OWNER, "slot {} held a version", slot.0);
        let entry = &mut self.entries[handle as usize];
        entry.versions -= 1;
        if entry.current.is_none() && entry.versions == 0 {
            self.index.remove(&entry.key);
            self.free_handles.push(handle);
        }
    }

    /// Writes the sector being filled (if any) and flushes the device: everything issued so far
    /// is durable.
    fn sync(&mut self) -> Result<()> {
        if let Some(sector) = self.open_sector.sector {
            self.device.write(sector_lba(sector), &self.open_sector.bytes)?;
            self.io.partial_sector_writes += 1;
        }
        self.device.flush()?;
        self.io.flushes += 1;
        self.core.flushed();
        Ok(())
    }

    /// Reads one slot, from the sector being filled or from the device.
    fn read_slot(&self, slot: SlotAddr) -> Result<Option<Element>> {
        let sector = self.geometry.sector_of(slot);
        let at = self.geometry.slot_in_sector(slot) * self.geometry.slot_bytes as usize;
        let range = at..at + self.geometry.slot_bytes as usize;
        if self.open_sector.sector == Some(sector) {
            return decode_element(&self.open_sector.bytes[range], slot);
        }
        let mut buf = BlockBuf::zeroed(SECTOR_BYTES as usize);
        self.device.read(sector_lba(sector), &mut buf)?;
        decode_element(&buf[range], slot)
    }
}

fn sector_lba(sector: SectorNo) -> Lba {
    Lba(DATA_START_LBA + sector.0)
}
