//! Opening a store: the superblock, then every segment read and every slot verified. The newest
//! version of each key (the highest sequence number; of two copies of one version, the one in
//! the segment opened later) is live, every other version is dead, and an empty slot is empty.
//! The core is rebuilt from those states ([`LogCore::recovered`]), and the sector it resumes
//! filling is read back into memory.

use std::collections::HashMap;
use std::sync::Arc;

use tundra_device::buf::BlockBuf;
use tundra_device::{BlockDevice, Lba};

use crate::core::{LogCore, SlotState};
use crate::error::{Error, Result};
use crate::geometry::{SECTOR_BYTES, SectorNo, SlotAddr};
use crate::policy::Policy;

use super::format::{DATA_START_LBA, decode_element, decode_superblock};
use super::{Entry, IoCounters, Lss, NO_OWNER, OpenSector, sector_lba};

/// Sectors read at once while scanning.
const SCAN_SECTORS: u64 = 64;

pub(super) fn open(device: Arc<dyn BlockDevice>, policy: Policy) -> Result<Lss> {
    policy.validate()?;
    let mut block = BlockBuf::zeroed(SECTOR_BYTES as usize);
    device.read(Lba(0), &mut block)?;
    let geometry = decode_superblock(&block)?;
    let needed = DATA_START_LBA + geometry.total_sectors();
    if device.block_count() < needed {
        return Err(Error::invalid(format!(
            "the device has {} blocks and the store's superblock names {needed}",
            device.block_count()
        )));
    }
    let mut scan = Scan {
        slots: vec![SlotState::Unwritten; geometry.total_slots() as usize],
        epochs: vec![None; geometry.segment_count as usize],
        owner: vec![NO_OWNER; geometry.total_slots() as usize],
        index: HashMap::new(),
        entries: Vec::new(),
        current_epochs: Vec::new(),
        next_seq: 1,
    };
    let slot_bytes = geometry.slot_bytes as usize;
    let mut buf = BlockBuf::zeroed((SCAN_SECTORS * u64::from(SECTOR_BYTES)) as usize);
    let mut first = 0;
    while first < geometry.total_sectors() {
        let count = SCAN_SECTORS.min(geometry.total_sectors() - first);
        let bytes = &mut buf[..(count * u64::from(SECTOR_BYTES)) as usize];
        device.read(sector_lba(SectorNo(first)), bytes)?;
        for (i, slot_buf) in bytes.chunks_exact(slot_bytes).enumerate() {
            let slot = SlotAddr(geometry.first_slot_of_sector(SectorNo(first)).0 + i as u64);
            if let Some(element) = decode_element(slot_buf, slot)? {
                scan.found(geometry.segment_of(slot).0 as usize, slot, element);
            }
        }
        first += count;
    }
    let live_elements = scan.entries.iter().filter(|e| e.current.is_some() && !e.tombstone).count() as u64;
    let core = LogCore::recovered(geometry, policy, scan.slots, scan.epochs)?;
    let mut open_sector = OpenSector { sector: None, bytes: BlockBuf::zeroed(SECTOR_BYTES as usize) };
    if let Some((segment, cursor)) = core.open()
        && !cursor.is_multiple_of(geometry.slots_per_sector())
    {
        let sector =
            SectorNo(geometry.first_sector_of_segment(segment).0 + u64::from(cursor / geometry.slots_per_sector()));
        device.read(sector_lba(sector), &mut open_sector.bytes)?;
        open_sector.sector = Some(sector);
    }
    Ok(Lss {
        device,
        geometry,
        core,
        index: scan.index,
        entries: scan.entries,
        free_handles: Vec::new(),
        owner: scan.owner,
        next_seq: scan.next_seq,
        live_elements,
        open_sector,
        io: IoCounters::default(),
        meters: None,
        failed: None,
    })
}

/// What the scan has found so far.
struct Scan {
    slots: Vec<SlotState>,
    epochs: Vec<Option<u64>>,
    owner: Vec<u32>,
    index: HashMap<Vec<u8>, u32>,
    entries: Vec<Entry>,
    /// The epoch of each entry's current version, to choose between two copies of one version.
    current_epochs: Vec<u64>,
    next_seq: u64,
}

impl Scan {
    fn found(&mut self, segment: usize, slot: SlotAddr, element: super::Element) {
        self.epochs[segment] = Some(self.epochs[segment].map_or(element.epoch, |e| e.max(element.epoch)));
        self.next_seq = self.next_seq.max(element.seq + 1);
        let handle = match self.index.get(&element.key) {
            Some(&handle) => handle,
            None => {
                let handle = self.entries.len() as u32;
                self.entries.push(Entry {
                    key: element.key.clone(),
                    current: None,
                    seq: 0,
                    tombstone: false,
                    versions: 0,
                });
                self.current_epochs.push(0);
                self.index.insert(element.key.clone(), handle);
                handle
            }
        };
        self.owner[slot.0 as usize] = handle;
        let entry = &mut self.entries[handle as usize];
        entry.versions += 1;
        let newer =
            entry.current.is_none() || (element.seq, element.epoch) > (entry.seq, self.current_epochs[handle as usize]);
        if !newer {
            self.slots[slot.0 as usize] = SlotState::Dead;
            return;
        }
        if let Some(previous) = entry.current.replace(slot) {
            self.slots[previous.0 as usize] = SlotState::Dead;
        }
        self.slots[slot.0 as usize] = SlotState::Live;
        entry.seq = element.seq;
        entry.tombstone = element.tombstone;
        self.current_epochs[handle as usize] = element.epoch;
    }
}
