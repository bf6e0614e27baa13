//! The journal's tests: records, commits, checkpoints and the ring; crashes at every point
//! recover without error; one flipped bit anywhere in the log or the newest checkpoint is either
//! recovered exactly or refused naming the block, never a silent rollback.
use std::collections::BTreeMap;

use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_env::Rng;

use super::frame::{LogBlock, SuperblockRead, classify_log_block};
use super::ids::{CheckpointSlot, Epoch, Generation};
use super::*;
use crate::ids::{BlockRun, ChunkId, ExtentId, Lsn, PageNo, VolumeId};
use crate::index::{Encoding, PageEntry};
use crate::volume::{Volume, VolumeMode};

const GEOMETRY: JournalGeometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 8 };

fn set(page: u32, version: u64) -> Record {
    let entry = PageEntry {
        encoding: Encoding::Lz4,
        run: BlockRun::new(ExtentId(page / 4), (page % 4) as u8 * 8, 3),
        stored_len: 1234,
        checksum: page ^ 0x5555,
        lsn: Lsn(version),
    };
    Record::PageSet { chunk: ChunkId(7), page: PageNo(page), entry }
}

/// Applies records to a model index: what replay must reproduce.
fn apply(model: &mut BTreeMap<u32, Record>, records: &[Record]) {
    for record in records {
        match *record {
            Record::PageSet { page, .. } => {
                model.insert(page.0, record.clone());
            }
            Record::PageClear { page, .. } => {
                model.remove(&page.0);
            }
            _ => {}
        }
    }
}

fn replayed(replay: &Replay) -> BTreeMap<u32, Record> {
    let mut model = BTreeMap::new();
    apply(&mut model, &replay.checkpoint);
    apply(&mut model, &replay.log);
    model
}

#[test]
fn records_round_trip_and_garbage_is_an_error() {
    let volume = Volume {
        id: VolumeId(9),
        name: "wal-01".into(),
        size_bytes: 1 << 30,
        page_size: 8192,
        chunk_bytes: 1 << 30,
        mode: VolumeMode::None,
    };
    let records = [
        set(3, 9),
        Record::PageClear { chunk: ChunkId(1), page: PageNo(2) },
        Record::VolumeSet(volume),
        Record::VolumeDelete(VolumeId(4)),
        Record::ChunkMark { chunk: ChunkId(9), mark: vec![7; MAX_CHUNK_MARK_BYTES] },
        Record::ChunkMark { chunk: ChunkId(9), mark: Vec::new() },
        Record::PageData { chunk: ChunkId(9), page: PageNo(4), offset: 0, bytes: vec![0xA5; PAGE_DATA_MAX_BYTES] },
        Record::PageData { chunk: ChunkId(9), page: PageNo(4), offset: 4039, bytes: vec![1, 2, 3] },
    ];
    let mut bytes = Vec::new();
    for r in &records {
        r.encode(&mut bytes);
    }
    assert_eq!(decode_all(&bytes).unwrap(), records);
    assert!(Record::decode(&bytes[..10]).is_err());
    assert!(Record::decode(&[0xEEu8; 40]).is_err());
    // A piece longer than a log block holds, of no bytes, or past a stored image's longest.
    let piece = |offset: u16, len: u16| {
        let mut b = vec![9u8];
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.resize(b.len() + usize::from(len), 7);
        b
    };
    assert!(Record::decode(&piece(0, PAGE_DATA_MAX_BYTES as u16)).is_ok());
    for (offset, len) in [(0, PAGE_DATA_MAX_BYTES as u16 + 1), (0, 0), (u16::MAX - 2, 3)] {
        assert!(Record::decode(&piece(offset, len)).is_err(), "piece of {len} bytes at {offset}");
    }
    assert_eq!(PAGE_DATA_MAX_BYTES + 17, LOG_PAYLOAD_BYTES, "a largest piece fills a log block");
}

#[test]
fn commits_survive_reopen_through_checkpoints_and_ring_wraps() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
    Journal::format(device.as_ref(), GEOMETRY).unwrap();
    let mut model = BTreeMap::new();
    let (mut journal, _) = Journal::open(device.clone()).unwrap();
    for round in 0..40u64 {
        let records: Vec<Record> = (0..30).map(|i| set(((round * 7 + i) % 50) as u32, round)).collect();
        journal.commit(&records).unwrap();
        apply(&mut model, &records);
        if journal.usage_blocks().0 * 2 >= journal.usage_blocks().1 {
            let snapshot: Vec<Record> = model.values().cloned().collect();
            journal.checkpoint(&snapshot, journal.position()).unwrap();
        }
        if round % 9 == 0 {
            let (reopened, replay) = Journal::open(device.clone()).unwrap();
            assert_eq!(replayed(&replay), model, "round {round}");
            journal = reopened;
            // The policy is asked after a reopen too, as the store does when it opens: a replay
            // can leave the ring as full as a commit does.
            if journal.wants_checkpoint() {
                let snapshot: Vec<Record> = model.values().cloned().collect();
                journal.checkpoint(&snapshot, journal.position()).unwrap();
            }
        }
    }
}

#[test]
fn group_commit_from_many_threads() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GeometryBig::G.total_blocks()));
    Journal::format(device.as_ref(), GeometryBig::G).unwrap();
    let (journal, _) = Journal::open(device.clone()).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let journal = &journal;
            scope.spawn(move || {
                for i in 0..200u32 {
                    journal.commit(&[set(t * 1000 + i, 1)]).unwrap();
                }
            });
        }
    });
    let (_, replay) = Journal::open(device).unwrap();
    assert_eq!(replayed(&replay).len(), 800);
}

struct GeometryBig;
impl GeometryBig {
    const G: JournalGeometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 512 };
}

/// Crashes at random media writes: every page holds its newest acknowledged record, or the
/// record of the one commit that power cut short (which may or may not have landed). Nothing
/// else is allowed: neither a record never committed nor an older acknowledged one, so losing
/// the newest acknowledged commit fails the check.
#[test]
fn crash_points_lose_no_acknowledged_commit() {
    let interrupted = journal_crash_rounds(400);
    assert!(interrupted > 400, "power should often fail inside a commit: {interrupted}");
}

/// The crash oracle above catches the rollback it guards against: with recovery dropping the
/// newest record it replays, the same rounds fail.
#[test]
fn the_journal_crash_oracle_fails_when_recovery_drops_the_newest_commit() {
    set_drop_newest_record(true);
    let verdict = std::panic::catch_unwind(|| journal_crash_rounds(400));
    set_drop_newest_record(false);
    assert!(verdict.is_err(), "the journal's crash oracle missed a dropped acknowledged commit");
}

/// Runs `rounds` rounds of commits with power failing at random writes; panics on the first
/// page that breaks the oracle. Returns how many commits the power failures interrupted.
fn journal_crash_rounds(rounds: u64) -> u64 {
    const PAGES: u32 = 12;
    let mut rng = Rng::new(42);
    let mut interrupted = 0;
    for round in 0..rounds {
        let media = Arc::new(FaultyDevice::new(MemDevice::new(GEOMETRY.total_blocks()), round));
        Journal::format(media.as_ref(), GEOMETRY).unwrap();
        let mut acknowledged: BTreeMap<u32, Record> = BTreeMap::new();
        // The record of the commit a power failure interrupted, if any.
        let mut in_flight: Option<Record> = None;
        for _crash in 0..4 {
            let (journal, replay) = match Journal::open(media.clone()) {
                Ok(opened) => opened,
                Err(e) => panic!("round {round}: reopen failed: {e}"),
            };
            let state = replayed(&replay);
            for page in 0..PAGES {
                let got = state.get(&page);
                let landed = got.is_some() && got == in_flight.as_ref();
                assert!(got == acknowledged.get(&page) || landed, "round {round}: page {page} holds {got:?}");
            }
            acknowledged = state;
            in_flight = None;
            media.crash_after(rng.below(12));
            for step in 0..20u64 {
                let record = set(rng.below(u64::from(PAGES)) as u32, round * 100 + step);
                if journal.commit(std::slice::from_ref(&record)).is_err() {
                    in_flight = Some(record);
                    interrupted += 1;
                    break;
                }
                apply(&mut acknowledged, std::slice::from_ref(&record));
                if rng.chance(0.20) || journal.wants_checkpoint() {
                    let snapshot: Vec<Record> = acknowledged.values().cloned().collect();
                    if journal.checkpoint(&snapshot, journal.position()).is_err() {
                        break;
                    }
                }
            }
            drop(journal);
            media.recover().unwrap();
        }
    }
    interrupted
}

const MID: JournalGeometry = JournalGeometry { checkpoint_blocks: 16, log_blocks: 64 };

/// Commits `count` records of pages `first..first + count` at `version`, several blocks' worth.
fn commit_range(journal: &Journal, model: &mut BTreeMap<u32, Record>, first: u32, count: u32, version: u64) {
    let records: Vec<Record> = (first..first + count).map(|p| set(p, version)).collect();
    journal.commit(&records).unwrap();
    apply(model, &records);
}

/// The scenario at the journal: a first session commits and checkpoints, a second
/// (after a restart) commits several groups and stops without a checkpoint. Returns the
/// device, what a replay must give, and the (position, LBA) of the second session's blocks.
/// A device, the replay it must give, and (position, LBA) of the blocks of interest.
type Scenario = (Arc<MemDevice>, BTreeMap<u32, Record>, Vec<(LogPosition, Lba)>);

fn two_sessions() -> Scenario {
    let device = Arc::new(MemDevice::new(MID.total_blocks()));
    Journal::format(device.as_ref(), MID).unwrap();
    let mut model = BTreeMap::new();
    let (journal, _) = Journal::open(device.clone()).unwrap();
    commit_range(&journal, &mut model, 0, 700, 1);
    let snapshot: Vec<Record> = model.values().cloned().collect();
    journal.checkpoint(&snapshot, journal.position()).unwrap();
    drop(journal);
    let (journal, _) = Journal::open(device.clone()).unwrap();
    for group in 0..5u32 {
        // Every seventh page, rewritten.
        let records: Vec<Record> = (0..300).map(|i| set((i * 7 + group) % 700, 10 + u64::from(group))).collect();
        journal.commit(&records).unwrap();
        apply(&mut model, &records);
    }
    drop(journal);
    (device.clone(), model, blocks_of_newest_epoch(device.as_ref()))
}

/// (position, LBA) of the valid log blocks of the newest epoch, in log order.
fn blocks_of_newest_epoch(device: &dyn BlockDevice) -> Vec<(LogPosition, Lba)> {
    let mut found = Vec::new();
    let mut block = vec![0u8; BLOCK_SIZE];
    for i in 0..MID.log_blocks {
        let lba = MID.log_lba(LogPosition(i));
        device.read(lba, &mut block).unwrap();
        let position = LogPosition(u64::from_le_bytes(block[8..16].try_into().unwrap()));
        if let LogBlock::Valid { epoch, .. } = classify_log_block(&block, position, Epoch::default()) {
            found.push((epoch, position, lba));
        }
    }
    let newest = found.iter().map(|f| f.0).max().unwrap();
    let mut blocks: Vec<(LogPosition, Lba)> = found.into_iter().filter(|f| f.0 == newest).map(|f| (f.1, f.2)).collect();
    blocks.sort_unstable();
    blocks
}

fn flip(device: &dyn BlockDevice, lba: Lba, byte: usize) {
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(lba, &mut block).unwrap();
    block[byte] ^= 0x10;
    device.write(lba, &block).unwrap();
}

/// The oracle: after damage, the journal either replays exactly what was committed or refuses
/// with a corruption error naming the damaged block's LBA; anything else is a silent loss.
fn recovers_or_refuses(device: Arc<dyn BlockDevice>, model: &BTreeMap<u32, Record>, lba: Lba) -> Result<(), String> {
    match Journal::open(device) {
        Ok((_, replay)) if replayed(&replay) == *model => Ok(()),
        Ok((_, replay)) => Err(format!(
            "silent rollback: {} of {} pages as committed",
            {
                let got = replayed(&replay);
                model.iter().filter(|(p, r)| got.get(p) == Some(r)).count()
            },
            model.len()
        )),
        Err(e) if e.kind() == crate::ErrorKind::Corrupted && e.message().contains(&format!("(LBA {})", lba.0)) => {
            Ok(())
        }
        Err(e) => Err(format!("an error that does not name LBA {}: {e}", lba.0)),
    }
}

#[test]
fn a_flipped_bit_in_any_log_block_is_refused_naming_the_block() {
    let (_, _, blocks) = two_sessions();
    assert!(blocks.len() >= 5, "the second session spans several blocks: {blocks:?}");
    let middle = blocks[blocks.len() / 2];
    let newest = *blocks.last().unwrap();
    // (block, byte): a body byte, a header byte, for a middle block and the newest one.
    for (what, (position, lba), byte) in [
        ("middle body", middle, 900),
        ("middle header", middle, 10),
        ("newest body", newest, 3000),
        ("newest header", newest, 20),
    ] {
        let (device, model, _) = two_sessions();
        flip(device.as_ref(), lba, byte);
        recovers_or_refuses(device.clone(), &model, lba).unwrap_or_else(|e| panic!("{what}: {e}"));
        let error = Journal::open(device.clone()).err().unwrap_or_else(|| panic!("{what}: opened"));
        assert!(error.message().contains(&format!("position {position} (LBA {})", lba.0)), "{what}: {error}");
        assert!(error.message().contains("tundra repair --accept-loss"), "{what}: {error}");
        if what.starts_with("middle") {
            assert!(error.message().contains("later block(s) of the log follow it"), "{what}: {error}");
        }
        // Nothing changed: the refusal is the same the second time.
        assert_eq!(Journal::open(device).err().unwrap().message(), error.message(), "{what}");
    }
}

/// The oracle above catches the bug it guards against: with recovery treating a checksum
/// failure as the end of the log again, the same damage rolls back acknowledged commits.
#[test]
fn the_corruption_oracle_fails_when_damage_ends_the_log() {
    let (device, model, blocks) = two_sessions();
    let (_, lba) = blocks[blocks.len() / 2];
    flip(device.as_ref(), lba, 900);
    set_damage_ends_log(true);
    let verdict = recovers_or_refuses(device.clone(), &model, lba);
    set_damage_ends_log(false);
    assert!(verdict.is_err_and(|e| e.contains("silent rollback")), "the injected bug went unnoticed");
}

#[test]
fn accepting_the_loss_truncates_the_log_at_the_damage_and_reopens_cleanly() {
    let (device, model, blocks) = two_sessions();
    let (position, lba) = blocks[blocks.len() / 2];
    flip(device.as_ref(), lba, 900);
    let place = JournalPlace { name: "the test journal".into(), first_lba: Lba(1000) };
    let error = Journal::open_with(device.clone(), &place, false).err().unwrap();
    assert!(error.message().starts_with("the test journal: "), "{error}");
    assert!(error.message().contains(&format!("(LBA {})", lba.0 + 1000)), "{error}");
    let (journal, replay) = Journal::open_with(device.clone(), &place, true).unwrap();
    let lost = replay.lost.clone().unwrap();
    assert_eq!((lost.position, lost.lba), (position, lba.offset_by(1000)));
    assert!(lost.later_blocks >= 1 && lost.later_records > 0, "{lost:?}");
    assert!(
        replay.notes.iter().any(|n| n.contains("truncated the log, dropping the damaged block at position")),
        "{:?}",
        replay.notes
    );
    // What survives is what was committed, less some of the second session's records.
    let state = replayed(&replay);
    assert!(state.len() == model.len() && state != model);
    for (page, record) in &state {
        let (Record::PageSet { entry: got, .. }, Some(Record::PageSet { entry: latest, .. })) =
            (record, model.get(page))
        else {
            panic!("page {page}: {record:?}")
        };
        assert!(got.lsn <= latest.lsn, "page {page}: a version never committed");
    }
    // The truncation spared the log the older checkpoint needs: were the newest checkpoint
    // damaged before the next one is taken, the fallback still gives the truncated state.
    drop(journal);
    let current = newest_superblock(device.as_ref()).current;
    let mut saved = vec![0u8; BLOCK_SIZE];
    device.read(MID.checkpoint_lba(current), &mut saved).unwrap();
    flip(device.as_ref(), MID.checkpoint_lba(current), 60);
    let (_, fallback) = Journal::open(device.clone()).unwrap();
    assert_eq!(replayed(&fallback), state, "the previous checkpoint's replay after a repair");
    device.write(MID.checkpoint_lba(current), &saved).unwrap();
    let (journal, _) = Journal::open(device.clone()).unwrap();
    // The journal goes on from the damage; a reopen finds no damage and the new commits.
    let mut after = state.clone();
    commit_range(&journal, &mut after, 5000, 300, 99);
    drop(journal);
    let (_, replay) = Journal::open(device).unwrap();
    assert_eq!(replayed(&replay), after);
    assert!(replay.notes.is_empty() && replay.lost.is_none());
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
    for byte in [20, 3000] {
        let (device, model, _) = two_sessions();
        let superblock = newest_superblock(device.as_ref());
        let slot = superblock.current;
        // The checkpoint's header block, or its first block of records.
        let lba = MID.checkpoint_lba(slot).offset_by(u64::from(byte == 3000));
        flip(device.as_ref(), lba, byte);
        let (journal, replay) = Journal::open(device.clone()).unwrap();
        assert_eq!(replayed(&replay), model, "byte {byte}");
        let note = format!("journal checkpoint slot {slot} (LBA {}) is damaged", MID.checkpoint_lba(slot).0);
        assert!(
            replay.notes.iter().any(|n| n.contains(&note) && n.contains("recovered from the previous")),
            "{:?}",
            replay.notes
        );
        // The next checkpoint overwrites the damaged slot; the fallback stays.
        let snapshot: Vec<Record> = model.values().cloned().collect();
        journal.checkpoint(&snapshot, journal.position()).unwrap();
        drop(journal);
        let (_, replay) = Journal::open(device.clone()).unwrap();
        assert_eq!(replayed(&replay), model);
        assert!(replay.notes.is_empty(), "{:?}", replay.notes);
    }
}

#[test]
fn both_checkpoints_damaged_is_refused_naming_both() {
    let (device, _, _) = two_sessions();
    for slot in CheckpointSlot::BOTH {
        flip(device.as_ref(), MID.checkpoint_lba(slot), 30);
    }
    let error = Journal::open(device).err().unwrap();
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted);
    for slot in CheckpointSlot::BOTH {
        assert!(error.message().contains(&format!("slot {slot} (LBA {})", MID.checkpoint_lba(slot).0)), "{error}");
    }
}

fn newest_superblock(device: &dyn BlockDevice) -> frame::Superblock {
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut best: Option<frame::Superblock> = None;
    for lba in 0..2 {
        device.read(Lba(lba), &mut block).unwrap();
        if let SuperblockRead::Valid(s) = frame::Superblock::decode(&block)
            && best.is_none_or(|b| b.generation < s.generation)
        {
            best = Some(s);
        }
    }
    best.unwrap()
}

/// Checkpoints taken whenever the policy asks, across many laps of the ring: at every point
/// the newest checkpoint may be damaged and the older one with its longer replay recovers
/// exactly, because the ring never reuses a block the older checkpoint needs.
#[test]
fn the_ring_keeps_the_older_checkpoints_log_through_many_laps() {
    let mut rng = Rng::new(5);
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
    Journal::format(device.as_ref(), GEOMETRY).unwrap();
    let mut model = BTreeMap::new();
    let (mut journal, _) = Journal::open(device.clone()).unwrap();
    for round in 0..300u64 {
        let records: Vec<Record> =
            (0..1 + rng.below(150)).map(|i| set(((round * 13 + i) % 90) as u32, round)).collect();
        journal.commit(&records).unwrap();
        apply(&mut model, &records);
        if journal.wants_checkpoint() {
            let snapshot: Vec<Record> = model.values().cloned().collect();
            journal.checkpoint(&snapshot, journal.position()).unwrap();
        }
        if round % 7 == 0 {
            drop(journal);
            let slot = newest_superblock(device.as_ref()).current;
            // Saved, damaged, recovered from, restored: the damage only tests the fallback.
            let mut saved = vec![0u8; BLOCK_SIZE];
            device.read(GEOMETRY.checkpoint_lba(slot), &mut saved).unwrap();
            flip(device.as_ref(), GEOMETRY.checkpoint_lba(slot), 50);
            let (_, replay) = Journal::open(device.clone()).unwrap();
            assert_eq!(replayed(&replay), model, "round {round}: the previous checkpoint's replay");
            assert!(!replay.notes.is_empty());
            device.write(GEOMETRY.checkpoint_lba(slot), &saved).unwrap();
            let (reopened, replay) = Journal::open(device.clone()).unwrap();
            assert_eq!(replayed(&replay), model, "round {round}");
            journal = reopened;
            // The policy is asked after a reopen too, as the store does when it opens: a replay
            // can leave the ring as full as a commit does.
            if journal.wants_checkpoint() {
                let snapshot: Vec<Record> = model.values().cloned().collect();
                journal.checkpoint(&snapshot, journal.position()).unwrap();
            }
        }
    }
}

#[test]
fn an_older_journal_format_is_a_clear_error() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
    let mut body = b"TNDRJNL1".to_vec();
    body.extend_from_slice(&[0u8; 48]);
    device.write(Lba(1), &frame::seal_block(body)).unwrap();
    let error = Journal::open(device).err().unwrap();
    assert!(error.message().contains("journal format version 1; this build reads versions 2 to 5"), "{error}");
}

/// Every header field and record of a log block is checked before use: any byte of a valid
/// block, flipped, is damage, and arbitrary bytes never panic the decoder.
#[test]
fn log_blocks_and_records_decode_without_panics() {
    let mut records = Vec::new();
    for page in 0..50 {
        set(page, 3).encode(&mut records);
    }
    let (position, epoch) = (LogPosition(9), Epoch(4));
    let block = encode_log_block(position, epoch, &records);
    assert_eq!(&block[8..16], &9u64.to_le_bytes(), "the position's bytes");
    assert_eq!(&block[16..24], &4u64.to_le_bytes(), "the epoch's bytes");
    assert!(matches!(classify_log_block(&block, position, epoch), LogBlock::Valid { epoch: Epoch(4), .. }));
    assert_eq!(classify_log_block(&block, position.next(), Epoch::default()), LogBlock::End, "another position");
    assert_eq!(classify_log_block(&block, position, epoch.next()), LogBlock::End, "an older epoch");
    assert_eq!(classify_log_block(&[0u8; BLOCK_SIZE], position, Epoch::default()), LogBlock::End, "never written");
    let mut rng = Rng::new(3);
    for _ in 0..400 {
        let mut damaged = block.clone();
        let byte = rng.below(BLOCK_SIZE as u64) as usize;
        damaged[byte] ^= 1 << rng.below(8);
        let class = classify_log_block(&damaged, position, epoch);
        assert!(matches!(class, LogBlock::BodyDamaged { .. } | LogBlock::HeaderDamaged), "byte {byte}: {class:?}");
        let mut garbage = vec![0u8; 64];
        rng.fill(&mut garbage);
        let _ = decode_all(&garbage);
    }
}

/// The counters' types change nothing on the media: each is the little-endian u64 at the offset
/// docs/format.md gives, in the superblock, the checkpoint header and (above) the log block.
#[test]
fn counters_keep_their_documented_bytes() {
    let superblock = frame::Superblock {
        geometry: MID,
        generation: Generation(7),
        epoch: Epoch(5),
        current: CheckpointSlot::BOTH[1],
        positions: [LogPosition(300), LogPosition(411)],
    };
    let block = superblock.encode();
    let field = |i: usize| u64::from_le_bytes(block[16 + 8 * i..24 + 8 * i].try_into().unwrap());
    assert_eq!((0..7).map(field).collect::<Vec<_>>(), [16, 64, 7, 5, 1, 300, 411]);
    assert!(matches!(frame::Superblock::decode(&block), SuperblockRead::Valid(s) if s == superblock));
    let header = frame::CheckpointHeader { position: LogPosition(411), record_bytes: 0, record_count: 0, crc: 0 };
    assert_eq!(&header.encode()[16..24], &411u64.to_le_bytes());
    // A superblock naming a third slot is not a superblock.
    let mut body = block[..BLOCK_SIZE - 4].to_vec();
    body[48..56].copy_from_slice(&2u64.to_le_bytes());
    assert!(matches!(frame::Superblock::decode(&frame::seal_block(body)), SuperblockRead::Invalid));
}

/// A commit of no records writes nothing and leaves the log where it was: the next commit goes
/// after every block already written, on a fresh journal and right after a checkpoint alike.
#[test]
fn a_commit_of_no_records_leaves_the_log_as_it_was() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
    Journal::format(device.as_ref(), GEOMETRY).unwrap();
    let mut model = BTreeMap::new();
    let (journal, _) = Journal::open(device.clone()).unwrap();
    journal.commit(&[]).unwrap();
    assert_eq!(journal.position(), LogPosition(0));
    let records: Vec<Record> = (0..200).map(|page| set(page, 1)).collect();
    journal.commit(&records).unwrap();
    apply(&mut model, &records);
    let position = journal.position();
    journal.checkpoint(&model.values().cloned().collect::<Vec<_>>(), position).unwrap();
    journal.commit(&[]).unwrap();
    assert_eq!(journal.position(), position);
    commit_range(&journal, &mut model, 0, 10, 2);
    drop(journal);
    let (_, replay) = Journal::open(device).unwrap();
    assert_eq!(replayed(&replay), model);
}

/// The version field of both superblock copies, as written.
fn superblock_versions(device: &dyn BlockDevice) -> [u32; 2] {
    let mut block = vec![0u8; BLOCK_SIZE];
    [0, 1].map(|lba| {
        device.read(Lba(lba), &mut block).unwrap();
        u32::from_le_bytes(block[8..12].try_into().unwrap())
    })
}

/// A journal written by a version 2 build (its superblock, checkpoints and log blocks all say
/// 2) replays every record, and the first checkpoint carries it to the current version; a version this
/// build does not know is refused by its superblock.
#[test]
fn a_version_2_journal_replays_and_a_checkpoint_carries_it_to_the_current_version() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
    frame::set_write_version(2);
    Journal::format(device.as_ref(), GEOMETRY).unwrap();
    let mut model = BTreeMap::new();
    {
        let (journal, _) = Journal::open(device.clone()).unwrap();
        commit_range(&journal, &mut model, 0, 40, 1);
    }
    frame::set_write_version(0);
    assert_eq!(superblock_versions(device.as_ref()), [2, 2]);
    let (journal, replay) = Journal::open(device.clone()).unwrap();
    assert_eq!(replayed(&replay), model);
    // Records written now go into current-version blocks after the version 2 ones.
    commit_range(&journal, &mut model, 40, 10, 2);
    drop(journal);
    let (journal, replay) = Journal::open(device.clone()).unwrap();
    assert_eq!(replayed(&replay), model, "a log of version 2 and current-version blocks");
    let snapshot: Vec<Record> = model.values().cloned().collect();
    journal.checkpoint(&snapshot, journal.position()).unwrap();
    assert!(superblock_versions(device.as_ref()).contains(&frame::VERSION));
    drop(journal);
    let (_, replay) = Journal::open(device.clone()).unwrap();
    assert_eq!(replayed(&replay), model);

    frame::set_write_version(6);
    let newer: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
    Journal::format(newer.as_ref(), GEOMETRY).unwrap();
    frame::set_write_version(0);
    let error = Journal::open(newer).err().unwrap();
    assert!(error.message().contains("journal format version 6; this build reads versions 2 to 5"), "{error}");
}

/// Counters with valid checksums but beyond any real log (a superblock's positions, epoch or
/// generation, a checkpoint header's position, a log block's epoch) are damage, refused or
/// recovered around, never arithmetic that overflows.
#[test]
fn counters_beyond_any_real_log_are_damage_not_overflow() {
    for field in 0..4 {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
        Journal::format(device.as_ref(), GEOMETRY).unwrap();
        let mut superblock = newest_superblock(device.as_ref());
        match field {
            0 => superblock.positions[0] = LogPosition(u64::MAX - 1),
            1 => superblock.positions[1] = LogPosition(u64::MAX),
            2 => superblock.epoch = Epoch(u64::MAX),
            _ => superblock.generation = Generation(u64::MAX),
        }
        let block = superblock.encode();
        device.write(Lba(0), &block).unwrap();
        device.write(Lba(1), &block).unwrap();
        assert!(Journal::open(device).is_err(), "field {field}");
    }
    let (device, _, blocks) = two_sessions();
    let (position, lba) = *blocks.last().unwrap();
    let next = LogPosition(position.0 + 1);
    device.write(MID.log_lba(next), &encode_log_block(next, Epoch(u64::MAX), &[])).unwrap();
    assert!(Journal::open(device.clone()).is_err(), "a log block of an impossible epoch after {lba:?}");
}

/// A group commit too large for the partly filled block is torn with one of its blocks keeping
/// its old content, each block in turn: replay takes a prefix of the group's records or none,
/// never later records without earlier ones.
#[test]
fn a_torn_group_of_several_blocks_replays_a_prefix() {
    assert_eq!(torn_group_violations(), 0);
}

/// The torn-group oracle catches a group that rewrites the partly filled block although it
/// spans several blocks.
#[test]
fn the_torn_group_oracle_fails_when_a_large_group_shares_the_tail_block() {
    set_share_tail_always(true);
    let violations = torn_group_violations();
    set_share_tail_always(false);
    assert!(violations > 0, "the torn-group oracle missed later records replayed without earlier ones");
}

/// How many single-block tears of a multi-block group replayed records of the group that do
/// not form a prefix of it.
fn torn_group_violations() -> usize {
    let mut violations = 0;
    let device = Arc::new(MemDevice::new(MID.total_blocks()));
    Journal::format(device.as_ref(), MID).unwrap();
    {
        let (journal, _) = Journal::open(device.clone() as Arc<dyn BlockDevice>).unwrap();
        // A partly filled block, then a group of about three blocks.
        journal.commit(&[set(0, 1), set(1, 1)]).unwrap();
        let before = device.snapshot();
        let group: Vec<Record> = (0..300u32).map(|i| set(1000 + i, 2)).collect();
        journal.commit(&group).unwrap();
        let after = device.snapshot();
        drop(journal);
        let changed: Vec<u64> = after.keys().copied().filter(|lba| before.get(lba) != after.get(lba)).collect();
        assert!(changed.len() >= 3, "the group spans several blocks: {changed:?}");
        for &lba in &changed {
            let torn = MemDevice::from_snapshot(MID.total_blocks(), after.clone());
            match before.get(&lba) {
                Some(old) => torn.write(Lba(lba), old).unwrap(),
                None => torn.write(Lba(lba), &vec![0u8; BLOCK_SIZE]).unwrap(),
            }
            let (_, replay) = Journal::open(Arc::new(torn) as Arc<dyn BlockDevice>).unwrap();
            let got: Vec<&Record> = replay.log.iter().filter(|r| group.contains(r)).collect();
            if got.iter().zip(&group).any(|(a, b)| *a != b) {
                violations += 1;
            }
        }
    }
    violations
}

/// Records that carry their images ask for no flush of the barrier device, and a group with
/// any record that does not asks for one; pieces that fill whole log blocks pack and replay in
/// order across groups and a reopen.
#[test]
fn commits_that_carry_images_skip_the_barrier_and_replay_in_order() {
    let geometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 64 };
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(geometry.total_blocks()));
    Journal::format(device.as_ref(), geometry).unwrap();
    let barrier = Arc::new(FaultyDevice::new(MemDevice::new(8), 3));
    let (mut journal, _) = Journal::open(device.clone()).unwrap();
    journal.set_barrier(barrier.clone());
    let carried = |page: u32, version: u64| -> Vec<Record> {
        let image: Vec<u8> = (0..9000u32).map(|i| (i as u64 * 31 + version) as u8).collect();
        carrying(page, version, &image)
    };
    let mut written = Vec::new();
    let flushes = barrier.stats().flushes;
    for version in 0..6 {
        let records = carried(version as u32 % 4, version);
        journal.commit_with_data(&records).unwrap();
        written.extend(records);
    }
    assert_eq!(barrier.stats().flushes, flushes, "commits that carry their images flushed the barrier device");
    journal.commit(&[set(9, 1)]).unwrap();
    written.push(set(9, 1));
    assert_eq!(barrier.stats().flushes, flushes + 1, "a commit of a plain record flushes the barrier device once");
    drop(journal);
    let (_, replay) = Journal::open(device).unwrap();
    assert_eq!(replay.log, written);
}

/// The records of a commit that carries `image`: its pieces, then the page's entry.
fn carrying(page: u32, version: u64, image: &[u8]) -> Vec<Record> {
    let mut records: Vec<Record> = image
        .chunks(PAGE_DATA_MAX_BYTES)
        .enumerate()
        .map(|(n, piece)| Record::PageData {
            chunk: ChunkId(7),
            page: PageNo(page),
            offset: (n * PAGE_DATA_MAX_BYTES) as u16,
            bytes: piece.to_vec(),
        })
        .collect();
    records.push(set(page, version));
    records
}

/// Commits of one 8 KiB image each, as a mount's WAL commits are, with a checkpointer that looks
/// for a due checkpoint only every few commits (the node's background loop, every 50 ms): how
/// many commits found no room to carry their image and had to flush the data device first. The
/// store commits such a page's record alone (a fraction of a log block).
fn commits_refused_room(lag: u64) -> u64 {
    let geometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 256 };
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(geometry.total_blocks()));
    Journal::format(device.as_ref(), geometry).unwrap();
    let (mut journal, _) = Journal::open(device).unwrap();
    journal.set_barrier(Arc::new(MemDevice::new(8)));
    let image = vec![0x5a; 8192];
    let mut refused = 0;
    for version in 0..2_000u64 {
        let page = version as u32 % 16;
        if journal.has_room_for_data(image.len()) {
            journal.commit_with_data(&carrying(page, version, &image)).unwrap();
        } else {
            refused += 1;
            journal.commit(&[set(page, version)]).unwrap();
        }
        if version % lag == 0 && journal.wants_checkpoint() {
            let position = journal.position();
            journal.checkpoint(&[], position).unwrap();
        }
    }
    refused
}

/// The journal asks for a checkpoint before commits run out of room to carry their images, so
/// that a checkpointer a few commits late still takes it in time: no commit pays a second flush.
#[test]
fn a_lagging_checkpointer_keeps_small_commits_carrying_their_images() {
    for lag in [1, 4] {
        assert_eq!(commits_refused_room(lag), 0, "checkpointer looking every {lag} commits");
    }
}

/// The twin: asked for at the third where commits stop carrying their images (as before), the
/// checkpoint comes only after many commits have flushed the data device first.
#[test]
fn the_lagging_checkpointer_test_fails_when_the_checkpoint_is_asked_for_at_a_third() {
    set_checkpoint_at_a_third(true);
    let refused = commits_refused_room(4);
    set_checkpoint_at_a_third(false);
    assert!(refused > 100, "only {refused} of 2,000 commits were refused room");
}
