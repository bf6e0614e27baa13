//! The slot area's tests: round trips, overflow and refusals that write nothing, clearing,
//! every bit flip of a slot refused (or its records recovered from the log), misdirected and
//! misplaced blocks refused, arbitrary bytes behind a valid checksum never panicking the
//! decoder, and the device reads a rebuild costs with slots on and off. `TUNDRA_FUZZ_CASES`
//! sets the fuzz cases (default 3000); `TUNDRA_SEED` replays a seed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tundra_device::fault::{Fault, FaultyDevice};
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba, Usage};
use tundra_env::{Rng, seed_from_env};
use tundra_store::ids::{Lsn, VolumeId};
use tundra_store::store::Watermarks;

use super::format::{CRC_AT, HEADER_BYTES, decode_slot, encode_slot};
use super::*;
use crate::codec::encoded_record_len;
use crate::log::LogGeometry;
use crate::versions::{Decision, GetPage, PageVersions, SlotCleanup, SpillRead, SpillTo};
use crate::{ErrorKind, Payload, RedoBatch, RedoLog, WriterEpoch};

const PAGE_SIZE: u32 = 4096;
const SLOTS: u64 = 16;
/// Where the area starts on its device: not at 0, so a slot's LBA and its page differ.
const FIRST: Lba = Lba(5);

/// A record of `page` at `lsn` changing `len` bytes.
fn delta(lsn: u64, page: u64, len: usize) -> RedoRecord {
    let bytes = (0..len).map(|i| (lsn as usize + i) as u8).collect();
    RedoRecord { lsn: Lsn(lsn), page, payload: Payload::Ranges(vec![((lsn % 100) as u32, bytes)]) }
}

fn fresh() -> (Arc<MemDevice>, SlotArea) {
    let device = Arc::new(MemDevice::new(FIRST.0 + SLOTS + 3));
    let area = SlotArea::new(device.clone(), FIRST, SLOTS, PAGE_SIZE).unwrap();
    (device, area)
}

fn block_at(device: &dyn BlockDevice, lba: Lba) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(lba, &mut block).unwrap();
    block
}

fn written_blocks(device: &MemDevice) -> BTreeSet<u64> {
    device.snapshot().into_iter().filter(|(_, block)| block.iter().any(|&b| b != 0)).map(|(lba, _)| lba).collect()
}

fn lsns(records: &[RedoRecord]) -> Vec<u64> {
    records.iter().map(|r| r.lsn.0).collect()
}

fn bytes_of(records: &[RedoRecord]) -> u32 {
    records.iter().map(encoded_record_len).sum::<usize>() as u32
}

#[test]
fn merged_records_read_back_in_order_and_pages_stay_apart() {
    let (device, area) = fresh();
    assert_eq!(area.read(3).unwrap(), [], "a slot never written is empty");
    let first = [delta(10, 3, 20), delta(12, 3, 5)];
    assert_eq!(area.merge(3, &first).unwrap(), Merge::Merged { records: 2, bytes: bytes_of(&first) });
    let second = [delta(20, 3, 100)];
    area.merge(3, &second).unwrap();
    let all = [first[0].clone(), first[1].clone(), second[0].clone()];
    assert_eq!(area.read(3).unwrap(), all);
    area.merge(4, &[delta(11, 4, 3)]).unwrap();
    assert_eq!(lsns(&area.read(4).unwrap()), [11]);
    assert_eq!(area.read(3).unwrap(), all, "a neighbour's merge leaves the slot alone");
    // Page i's slot is block first_lba + i, and no other block was written.
    assert_eq!(area.lba(3).unwrap(), Lba(FIRST.0 + 3));
    assert_eq!(written_blocks(&device), BTreeSet::from([FIRST.0 + 3, FIRST.0 + 4]));
    // Nothing to merge writes nothing and answers what the slot holds.
    assert_eq!(area.merge::<RedoRecord>(5, &[]).unwrap(), Merge::Merged { records: 0, bytes: 0 });
    assert_eq!(area.merge::<RedoRecord>(3, &[]).unwrap(), Merge::Merged { records: 3, bytes: bytes_of(&all) });
    assert_eq!(written_blocks(&device).len(), 2);
    let stats = area.stats();
    assert_eq!((stats.merges, stats.overflows), (3, 0));
}

#[test]
fn a_merge_that_would_overflow_writes_nothing() {
    let (device, area) = fresh();
    // Fill the slot to within 30 bytes of its end.
    let big = SLOT_RECORD_BYTES - 30 - 2 * 29;
    let held = [delta(1, 2, big / 2), delta(2, 2, big - big / 2)];
    area.merge(2, &held).unwrap();
    let before = block_at(device.as_ref(), Lba(FIRST.0 + 2));
    let too_much = [delta(5, 2, 1), delta(6, 2, 1)];
    let needed = (bytes_of(&held) + bytes_of(&too_much)) as u64;
    assert!(needed > SLOT_RECORD_BYTES as u64);
    assert_eq!(area.merge(2, &too_much).unwrap(), Merge::Overflow { needed_bytes: needed });
    assert_eq!(block_at(device.as_ref(), Lba(FIRST.0 + 2)), before);
    assert_eq!(area.read(2).unwrap(), held);
    // One of them fits, exactly to the slot's last byte; then nothing more does.
    area.merge(2, &too_much[..1]).unwrap();
    assert_eq!(bytes_of(&area.read(2).unwrap()), SLOT_RECORD_BYTES as u32);
    assert!(matches!(area.merge(2, &[delta(9, 2, 1)]).unwrap(), Merge::Overflow { .. }));
    // A whole page never fits a slot of a 4 KiB page: an empty slot stays empty.
    let image = RedoRecord { lsn: Lsn(3), page: 7, payload: Payload::Image(vec![1; PAGE_SIZE as usize]) };
    assert!(matches!(area.merge(7, &[image]).unwrap(), Merge::Overflow { .. }));
    assert!(block_at(device.as_ref(), Lba(FIRST.0 + 7)).iter().all(|&b| b == 0));
    assert_eq!(area.stats().overflows, 3);
}

#[test]
fn records_that_break_a_rule_are_refused_and_write_nothing() {
    let (device, area) = fresh();
    area.merge(1, &[delta(10, 1, 4)]).unwrap();
    let before = device.snapshot();
    let past_page = RedoRecord { lsn: Lsn(20), page: 1, payload: Payload::Ranges(vec![(PAGE_SIZE - 1, vec![0; 2])]) };
    for (what, page, records) in [
        ("another page's record", 1, vec![delta(20, 2, 4)]),
        ("LSNs out of order", 1, vec![delta(22, 1, 4), delta(21, 1, 4)]),
        ("a repeated LSN", 1, vec![delta(22, 1, 4), delta(22, 1, 4)]),
        ("an LSN the slot already passed", 1, vec![delta(10, 1, 4)]),
        ("a range past the page", 1, vec![past_page]),
        ("a page outside the area", SLOTS, vec![delta(20, SLOTS, 4)]),
    ] {
        let error = area.merge(page, &records).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{what}: {error}");
        assert_eq!(device.snapshot(), before, "{what} wrote something");
    }
    assert_eq!(area.read(SLOTS).unwrap_err().kind(), ErrorKind::Invalid);
    let small = Arc::new(MemDevice::new(8));
    assert!(SlotArea::new(small, Lba(4), 5, PAGE_SIZE).is_err(), "an area past the device's end");
}

#[test]
fn clearing_trims_or_keeps_the_records_above_the_lsn() {
    let (device, area) = fresh();
    let records = [delta(3, 6, 8), delta(5, 6, 8), delta(9, 6, 8)];
    area.merge(6, &records).unwrap();
    let before = block_at(device.as_ref(), Lba(FIRST.0 + 6));
    assert_eq!(area.clear_through(6, Lsn(2)).unwrap(), 3);
    assert_eq!(block_at(device.as_ref(), Lba(FIRST.0 + 6)), before, "nothing dropped, nothing written");
    assert_eq!(area.clear_through(6, Lsn(5)).unwrap(), 1);
    assert_eq!(area.read(6).unwrap(), records[2..]);
    // The records kept can be merged after, as before.
    area.merge(6, &[delta(12, 6, 8)]).unwrap();
    assert_eq!(lsns(&area.read(6).unwrap()), [9, 12]);
    assert_eq!(area.clear_through(6, Lsn(12)).unwrap(), 0);
    assert!(block_at(device.as_ref(), Lba(FIRST.0 + 6)).iter().all(|&b| b == 0), "an emptied slot is trimmed");
    area.merge(6, &[delta(13, 6, 8)]).unwrap();
    area.merge(8, &[delta(14, 8, 8)]).unwrap();
    area.clear(6).unwrap();
    assert_eq!(area.read(6).unwrap(), []);
    assert_eq!(lsns(&area.read(8).unwrap()), [14]);
    area.clear_all().unwrap();
    assert!(written_blocks(&device).is_empty());
}

/// A slot of `page` at its LBA holding a few records, and the records.
fn sample_slot(page: u64) -> (Vec<u8>, Vec<RedoRecord>) {
    let records = vec![delta(40, page, 7), delta(41, page, 30), delta(45, page, 1)];
    let refs: Vec<&RedoRecord> = records.iter().collect();
    let block = encode_slot(Lba(FIRST.0 + page), page, &records, &super::format::encode_records(&refs));
    (block, records)
}

#[test]
fn every_bit_flip_of_a_slot_is_refused_naming_its_lba() {
    let page = 9;
    let lba = Lba(FIRST.0 + page);
    let (block, records) = sample_slot(page);
    assert_eq!(decode_slot(&block, lba, page, PAGE_SIZE).unwrap().records, records);
    for bit in 0..BLOCK_SIZE * 8 {
        let mut flipped = block.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        match decode_slot(&flipped, lba, page, PAGE_SIZE) {
            Err(error) => {
                assert_eq!(error.kind(), ErrorKind::Corrupted, "bit {bit}: {error}");
                assert!(error.message().contains(&lba.to_string()), "bit {bit}: {error}");
            }
            // The checksum covers every byte, padding included, so no flip goes unnoticed;
            // were one to, it would have to leave the records as they were.
            Ok(contents) => assert_eq!(contents.records, records, "bit {bit} changed the records unnoticed"),
        }
    }
}

#[test]
fn a_damaged_slot_is_recovered_from_the_redo_log() {
    let (_log_device, log) = log_with(&[vec![delta(40, 9, 7), delta(41, 9, 30)], vec![delta(45, 9, 1)]]);
    let (device, area) = fresh();
    let (block, records) = sample_slot(9);
    let lba = Lba(FIRST.0 + 9);
    let read = SpillRead::Slot {
        page: 9,
        lsns: records.iter().map(|r| r.lsn).collect(),
        from_log: None,
        image: None,
        records_cell: None,
    };
    let mut rng = Rng::new(seed_from_env(0x5107));
    for _ in 0..200 {
        let mut flipped = block.clone();
        let bit = rng.below(BLOCK_SIZE as u64 * 8) as usize;
        flipped[bit / 8] ^= 1 << (bit % 8);
        device.write(lba, &flipped).unwrap();
        let fetched = fetch(&read, Some(&area), &log).unwrap();
        let error = fetched.slot_error.as_ref().expect("the flip was noticed");
        assert_eq!(error.kind(), ErrorKind::Corrupted);
        let picked: Vec<RedoRecord> = read.pick(&fetched.records).unwrap().into_iter().cloned().collect();
        assert_eq!(picked, records, "bit {bit}: the log gave other records");
        assert_eq!((fetched.slot_reads, fetched.log_batches), (1, 2));
    }
}

#[test]
fn a_misdirected_write_is_refused_where_it_lands_and_missed_where_it_belonged() {
    let faulty = Arc::new(FaultyDevice::new(MemDevice::new(FIRST.0 + SLOTS + 3), 1));
    let area = SlotArea::new(faulty.clone(), FIRST, SLOTS, PAGE_SIZE).unwrap();
    area.merge(5, &[delta(7, 5, 4)]).unwrap();
    // Page 3's next slot write lands in page 5's block.
    faulty.inject(Fault::Misdirect { blocks: FIRST.0 + 3..FIRST.0 + 4, offset: 2 });
    area.merge(3, &[delta(8, 3, 4)]).unwrap();
    faulty.clear_faults();
    let error = area.read(5).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupted);
    assert!(error.message().contains("page 3") && error.message().contains("misdirected"), "{error}");
    // Page 3's own block never got the write: the plan that names the record sees it missing.
    let lost = area.read(3).unwrap();
    let read = SpillRead::Slot { page: 3, lsns: vec![Lsn(8)], from_log: None, image: None, records_cell: None };
    let error = read.pick(&lost).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupted, "{error}");
}

#[test]
fn a_slot_of_another_page_or_another_area_is_refused() {
    let (device, area) = fresh();
    area.merge(2, &[delta(7, 2, 4)]).unwrap();
    let slot = block_at(device.as_ref(), Lba(FIRST.0 + 2));
    // Copied to page 4's block: it names page 2 and verifies only at page 2's LBA.
    device.write(Lba(FIRST.0 + 4), &slot).unwrap();
    let error = area.read(4).unwrap_err();
    assert!(error.message().contains("holds the slot of page 2"), "{error}");
    // Another area on the device (another volume's) whose page 2 sits elsewhere: the block
    // verifies only where it was written.
    let other = SlotArea::new(device.clone(), Lba(FIRST.0 + 1), SLOTS, PAGE_SIZE).unwrap();
    device.write(Lba(FIRST.0 + 1 + 2), &slot).unwrap();
    let error = other.read(2).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupted);
    assert!(error.message().contains("fails its checksum"), "{error}");
}

fn fuzz_cases() -> u64 {
    std::env::var("TUNDRA_FUZZ_CASES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(3000)
}

/// Sets the header's checksum so the block verifies at `lba` as `page`'s, whatever it holds.
fn reseal(block: &mut [u8], lba: Lba, page: u64) {
    let mut seed = [0u8; 16];
    seed[0..8].copy_from_slice(&lba.0.to_le_bytes());
    seed[8..16].copy_from_slice(&page.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&seed), &block[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &block[HEADER_BYTES..]);
    block[CRC_AT..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn arbitrary_fields_behind_a_valid_checksum_never_panic_nor_give_another_pages_records() {
    let mut rng = Rng::new(seed_from_env(0x5107_f022));
    let page = 4;
    let lba = Lba(FIRST.0 + page);
    let (good, records) = sample_slot(page);
    for case in 0..fuzz_cases() {
        let mut block = good.clone();
        match case % 3 {
            // Random header fields after the magic.
            0 => rng.fill(&mut block[8..CRC_AT]),
            // Random bytes in the records.
            1 => {
                for _ in 0..1 + rng.below(8) {
                    let at = HEADER_BYTES + rng.below(120) as usize;
                    block[at] = rng.next_u32() as u8;
                }
            }
            // A small count or length, the rest random.
            _ => {
                block[12..16].copy_from_slice(&(rng.below(6) as u32).to_le_bytes());
                block[40..44].copy_from_slice(&(rng.below(200) as u32).to_le_bytes());
                rng.fill(&mut block[HEADER_BYTES..HEADER_BYTES + 100]);
            }
        }
        reseal(&mut block, lba, page);
        match decode_slot(&block, lba, page, PAGE_SIZE) {
            Ok(contents) => {
                assert!(contents.records.iter().all(|r| r.page == page), "case {case}: another page's record");
                assert!(contents.records.windows(2).all(|p| p[0].lsn < p[1].lsn), "case {case}: out of order");
                if block == good {
                    assert_eq!(contents.records, records);
                }
            }
            Err(error) => assert_eq!(error.kind(), ErrorKind::Corrupted, "case {case}: {error}"),
        }
    }
}

/// A device that counts the blocks read from it, to show what a rebuild costs.
struct Counting {
    inner: MemDevice,
    block_reads: AtomicU64,
}

impl BlockDevice for Counting {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, lba: Lba, buf: &mut [u8]) -> tundra_device::Result<()> {
        self.block_reads.fetch_add((buf.len() / BLOCK_SIZE) as u64, Ordering::Relaxed);
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: Lba, data: &[u8]) -> tundra_device::Result<()> {
        self.inner.write(lba, data)
    }
    fn trim(&self, lba: Lba, block_count: u64) -> tundra_device::Result<()> {
        self.inner.trim(lba, block_count)
    }
    fn flush(&self) -> tundra_device::Result<()> {
        self.inner.flush()
    }
    fn usage(&self) -> Usage {
        self.inner.usage()
    }
}

impl Counting {
    fn new(block_count: u64) -> Arc<Counting> {
        Arc::new(Counting { inner: MemDevice::new(block_count), block_reads: AtomicU64::new(0) })
    }
    fn reads(&self) -> u64 {
        self.block_reads.load(Ordering::Relaxed)
    }
}

const VOLUME: VolumeId = VolumeId(1);

/// A redo log on a counting device holding one batch per entry of `batches`.
fn log_with(batches: &[Vec<RedoRecord>]) -> (Arc<Counting>, RedoLog) {
    let geometry = LogGeometry { volume: VOLUME, page_size: PAGE_SIZE, log_blocks: 64 };
    let device = Counting::new(geometry.total_blocks());
    RedoLog::format(device.as_ref(), geometry).unwrap();
    let (log, _) = RedoLog::open(device.clone()).unwrap();
    let mut prev = Lsn(0);
    for records in batches {
        let end = records.last().map_or(Lsn(prev.0 + 1), |r| r.lsn);
        let batch =
            RedoBatch { volume: VOLUME, epoch: WriterEpoch(1), prev_lsn: prev, end_lsn: end, records: records.clone() };
        log.append(&batch).unwrap();
        prev = end;
    }
    (device, log)
}

/// A hot page (3) whose records are interleaved with other pages' in many batches, each batch
/// large enough to fill log blocks: its records spill, then a lagging reader reads it.
fn interleaved_batches() -> Vec<Vec<RedoRecord>> {
    let mut lsn = 0;
    (0..12)
        .map(|_| {
            (0..6)
                .map(|i| {
                    lsn += 1;
                    delta(lsn, if i == 0 { 3 } else { 4 + i }, if i == 0 { 40 } else { 900 })
                })
                .collect()
        })
        .collect()
}

/// The index of the volume the batches went to, with every record above `image_lsn`, LSN_min
/// held at 0 by a lagging reader, and page 3's records spilled `to` where they go.
fn spilled_index(batches: &[Vec<RedoRecord>], to: SpillTo, area: &SlotArea) -> PageVersions {
    let mut versions = PageVersions::new(PAGE_SIZE as usize, SLOTS, Watermarks::default()).spilling_to(to);
    for records in batches {
        let end = records.last().expect("batches hold records").lsn;
        versions.records_durable(records.iter().cloned().map(Arc::new).collect(), end).unwrap();
    }
    let hot_bytes: u64 = versions.records(3).iter().map(|r| crate::versions::record_cost_bytes(r)).sum();
    let mut spilled_page_3 = false;
    for task in versions.spill_candidates(versions.cached_bytes() - hot_bytes / 2) {
        if task.page != 3 {
            continue;
        }
        if to == SpillTo::Slots {
            assert!(matches!(area.merge(3, &task.records).unwrap(), Merge::Merged { .. }));
        }
        versions.spilled(3, task.through_lsn);
        spilled_page_3 = true;
    }
    assert!(spilled_page_3, "page 3 holds the oldest record in memory");
    assert_eq!(versions.records(3), [], "all its records fit its slot");
    versions
}

#[test]
fn a_page_rebuilt_from_its_image_and_its_slot_costs_two_device_reads_and_without_slots_more() {
    let batches = interleaved_batches();
    let (log_device, log) = log_with(&batches);
    let hot: Vec<RedoRecord> = batches.iter().flatten().filter(|r| r.page == 3).cloned().collect();
    let read_at = hot[7].lsn;
    let request = GetPage { request_lsn: read_at, not_modified_since: Lsn(0) };
    let mut device_reads = Vec::new();
    for to in [SpillTo::Slots, SpillTo::Log] {
        let device = Counting::new(FIRST.0 + SLOTS + 3);
        let area = SlotArea::new(device.clone(), FIRST, SLOTS, PAGE_SIZE).unwrap();
        let versions = spilled_index(&batches, to, &area);
        // The store holds page 3's image at LSN 0 in block 0, where a read of it costs one.
        let Decision::Serve { plan, page_lsn, .. } = versions.get_page(3, Some(Lsn(0)), request) else {
            panic!("{to:?}: not served")
        };
        assert_eq!(page_lsn, read_at);
        let spilled = plan.spilled.as_ref().expect("the version needs spilled records");
        assert_eq!(spilled.lsns().len(), 8);
        let (before_slots, before_log) = (device.reads(), log_device.reads());
        let image = block_at(device.as_ref(), Lba(0));
        let fetched = fetch(spilled, Some(&area), &log).unwrap();
        let page = plan.rebuild_with(Some(&image), &fetched.records, PAGE_SIZE as usize).unwrap();
        let expected = crate::versions::reconstruct(Some((Lsn(0), &image[..])), &hot[..8], read_at, PAGE_SIZE as usize);
        assert_eq!(page, expected.unwrap(), "{to:?}");
        let reads = device.reads() - before_slots + log_device.reads() - before_log;
        device_reads.push((to, plan.device_reads(), reads));
    }
    eprintln!("(where spilled, planned reads, device block reads): {device_reads:?}");
    // With slots: the image and the slot, two blocks, as the plan says.
    assert_eq!(device_reads[0], (SpillTo::Slots, 2, 2));
    // Without: the image and one batch per record, each spanning blocks of the log.
    let (_, planned, reads) = device_reads[1];
    assert_eq!(planned, 1 + 8);
    assert!(reads >= u64::from(planned), "{reads} block reads for {planned} planned");
}

#[test]
fn a_fold_through_the_slot_then_clears_it() {
    let batches = interleaved_batches();
    let (device, area) = fresh();
    let mut versions = spilled_index(&batches, SpillTo::Slots, &area);
    let hot: Vec<RedoRecord> = batches.iter().flatten().filter(|r| r.page == 3).cloned().collect();
    versions.set_lsn_min(hot[4].lsn);
    let task = versions.fold_candidates(16).into_iter().find(|t| t.page == 3).expect("page 3 folds");
    assert_eq!((task.through_lsn, task.records.len()), (hot[4].lsn, 0));
    let spilled = task.spilled.as_ref().expect("its records are in the slot");
    let fetched = area.read(3).unwrap();
    let folded = task.rebuild(None, &fetched, PAGE_SIZE as usize).unwrap();
    assert_eq!(folded, crate::versions::reconstruct(None, &hot[..5], hot[4].lsn, PAGE_SIZE as usize).unwrap());
    assert_eq!(spilled.lsns().len(), 5);
    let cleanup = versions.materialized(3, task.through_lsn);
    assert_eq!(cleanup, SlotCleanup::ClearThrough(hot[4].lsn));
    assert_eq!(area.clear_through(3, hot[4].lsn).unwrap(), hot.len() - 5);
    versions.set_lsn_min(hot[hot.len() - 1].lsn);
    let task = versions.fold_candidates(16).into_iter().find(|t| t.page == 3).expect("page 3 folds again");
    assert_eq!(versions.materialized(3, task.through_lsn), SlotCleanup::Clear);
    area.clear(3).unwrap();
    assert!(!written_blocks(&device).contains(&(FIRST.0 + 3)));
    assert_eq!(versions.invariant_problem(), None);
}
