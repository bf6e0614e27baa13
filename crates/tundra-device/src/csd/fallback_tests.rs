//! The drive survives one bad block in its superblocks or map checkpoints: a damaged newest
//! checkpoint (or superblock) falls back to the one before it, with the longer replay, and
//! every block reads its latest flushed contents, blocks trimmed in between included. Damage
//! that leaves nothing to recover from is refused with a message naming it.

use std::sync::Arc;

use tundra_env::Rng;

use super::layout::Superblock;
use super::state::{HeadKind, SegmentState};
use super::*;

use crate::Lba;
use crate::conformance::block_content;
use crate::mem::MemDevice;

const SEGMENT: u64 = 64 * 1024;
const BLOCKS: u64 = 256;

fn options() -> FormatOptions {
    FormatOptions { segment_bytes: SEGMENT, ..FormatOptions::new(BLOCKS * 4096, 2 << 20) }
}

fn quiet() -> CsdConfig {
    CsdConfig { background: false, ..CsdConfig::default() }
}

/// Incompressible content, so every write takes a whole record and segments fill fast.
fn noise(rng: &mut Rng) -> Vec<u8> {
    (0..4096).map(|_| rng.below(256) as u8).collect()
}

/// A drive with two checkpoints, the newest after a trim of block 5, then garbage collected:
/// the segment that held the trim record is collected and written over, while the one holding
/// block 5's old data is not. Returns the media and what every block must read.
fn two_checkpoints_around_a_trim() -> (Arc<MemDevice>, Vec<Vec<u8>>) {
    let options = options();
    let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
    // No checkpoint but the test's own: the newest must be the one after the trim.
    let config = CsdConfig { checkpoint_interval_segments: 100_000, ..quiet() };
    let drive = CsdDevice::format(media.clone(), &options, config).unwrap();
    let mut rng = Rng::new(5);
    let mut model = vec![vec![0u8; 4096]; BLOCKS as usize];
    let mut write = |drive: &CsdDevice, model: &mut Vec<Vec<u8>>, lba: usize| {
        model[lba] = noise(&mut rng);
        drive.write(Lba(lba as u64), &model[lba]).unwrap();
    };
    // Block 5 among blocks that stay live: its segment is never worth collecting.
    model[5] = block_content(5, 1);
    drive.write(Lba(5), &model[5]).unwrap();
    for lba in 30..44 {
        write(&drive, &mut model, lba);
    }
    drive.checkpoint().unwrap();
    for lba in 100..110 {
        write(&drive, &mut model, lba);
    }
    drive.trim(Lba(5), 1).unwrap();
    model[5] = vec![0u8; 4096];
    let (trim_segment, trim_open_seq) = {
        let state = drive.shared.state.lock();
        let head = state.heads[HeadKind::User as usize].as_ref().expect("a user head");
        (head.segment, head.open_seq)
    };
    // Churn: the trim record's segment fills with records that die.
    for _round in 0..20 {
        for lba in 100..110 {
            write(&drive, &mut model, lba);
        }
    }
    drive.flush().unwrap();
    drive.checkpoint().unwrap();
    let dead = {
        let state = drive.shared.state.lock();
        state.segments.iter().filter(|s| s.state == SegmentState::Sealed && s.live_bytes < 2 * 4112).count()
    };
    assert!(drive.collect_garbage(dead).unwrap() > 0, "garbage collection collected nothing");
    // Written over: the trim record survives only where garbage collection moved it.
    let mut bounded = 0;
    while drive.shared.state.lock().segments[trim_segment as usize].open_seq == trim_open_seq {
        for lba in 100..110 {
            write(&drive, &mut model, lba);
        }
        bounded += 1;
        assert!(bounded < 200, "the trim record's segment was never reused");
    }
    drive.flush().unwrap();
    // Power lost without another checkpoint.
    drop(drive);
    (media, model)
}

/// The newest superblock and the byte offset of the checkpoint it names.
fn newest(media: &MemDevice) -> (Superblock, u64) {
    let mut block = vec![0u8; 4096];
    let mut best: Option<Superblock> = None;
    for slot in 0..2 {
        media.read(Lba(slot), &mut block).unwrap();
        if let Ok(Some(superblock)) = Superblock::decode(&block)
            && best.as_ref().is_none_or(|b| superblock.generation > b.generation)
        {
            best = Some(superblock);
        }
    }
    let superblock = best.expect("a valid superblock");
    let offset = superblock.geometry.checkpoint_offset(superblock.checkpoint_slot);
    (superblock, offset)
}

fn flip(media: &MemDevice, byte_offset: u64) {
    let mut block = vec![0u8; 4096];
    let lba = Lba(byte_offset / 4096);
    media.read(lba, &mut block).unwrap();
    block[(byte_offset % 4096) as usize] ^= 0x10;
    media.write(lba, &block).unwrap();
}

/// Opens the drive and compares every block with the model; the drive's recovery notes.
fn reads_the_model(media: Arc<MemDevice>, model: &[Vec<u8>]) -> std::result::Result<Vec<String>, String> {
    let drive = CsdDevice::open(media, quiet()).map_err(|e| format!("refused: {e}"))?;
    let mut block = vec![0u8; 4096];
    for (lba, want) in model.iter().enumerate() {
        drive.read(Lba(lba as u64), &mut block).map_err(|e| format!("block {lba}: {e}"))?;
        if &block != want {
            return Err(format!("block {lba} reads other data than it was last given"));
        }
    }
    drive.check_invariants();
    Ok(drive.recovery_notes().to_vec())
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
    for (what, at) in [("header", 100u64), ("map", 4096 + 7 * 31)] {
        let (media, model) = two_checkpoints_around_a_trim();
        let (_, offset) = newest(&media);
        flip(&media, offset + at);
        let notes = reads_the_model(media, &model).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(notes.iter().any(|n| n.contains("recovered from the checkpoint of generation")), "{what}: {notes:?}");
    }
}

#[test]
fn a_damaged_newest_superblock_falls_back_to_the_other() {
    let (media, model) = two_checkpoints_around_a_trim();
    let (superblock, _) = newest(&media);
    flip(&media, (superblock.generation % 2) * 4096 + 50);
    let notes = reads_the_model(media, &model).unwrap();
    assert!(notes.iter().any(|n| n.contains("superblock slot") && n.contains("damaged")), "{notes:?}");
}

/// The trim between the two checkpoints stays a trim after a fallback although garbage
/// collection moved its segment: the record is kept until both checkpoints reflect it.
#[test]
fn the_fallback_oracle_fails_when_gc_drops_trims_the_older_checkpoint_needs() {
    gc::set_drop_trims_at_newest(true);
    let (media, model) = two_checkpoints_around_a_trim();
    gc::set_drop_trims_at_newest(false);
    let (_, offset) = newest(&media);
    flip(&media, offset + 100);
    let verdict = reads_the_model(media, &model);
    assert!(verdict.is_err(), "with trim records dropped early the trimmed block came back unnoticed");
}

#[test]
fn both_superblocks_damaged_is_said_as_damage_not_as_no_drive() {
    let (media, _) = two_checkpoints_around_a_trim();
    flip(&media, 50);
    flip(&media, 4096 + 50);
    let error = CsdDevice::open(media, quiet()).err().expect("nothing to open from");
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted);
    assert!(error.message().contains("both superblocks of the drive are unusable"), "{error}");
    assert!(!error.message().contains("not a formatted"), "{error}");
    let zeros = Arc::new(MemDevice::new(4096));
    let error = CsdDevice::open(zeros, quiet()).err().unwrap();
    assert!(error.message().contains("not a formatted Tundra drive"), "{error}");
}

#[test]
fn both_checkpoints_damaged_is_refused_naming_both() {
    let (media, _) = two_checkpoints_around_a_trim();
    let (superblock, offset) = newest(&media);
    flip(&media, offset + 100);
    let older = superblock.geometry.checkpoint_offset(1 - superblock.checkpoint_slot);
    flip(&media, older + 100);
    let error = CsdDevice::open(media, quiet()).err().expect("no checkpoint to start from");
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted);
    let message = error.message();
    assert!(message.contains("no checkpoint of the drive verifies"), "{message}");
    assert!(message.matches("is damaged").count() == 2, "{message}");
}
