//! Recovery: which superblock copy, which checkpoint, and how far the log goes.
//!
//! Replay reads the log from the chosen checkpoint's position and classifies every block
//! (docs/format.md, "Recovery"): zeros or a verified block of another position or an older
//! epoch end the log, as a crash leaves it; a block whose header verifies but whose body does
//! not, or a block that is neither zeros nor verified, is damage. A single 4 KiB write is atomic,
//! so a checksum failure is never a torn write, and treating it as the end would silently roll
//! back acknowledged writes: recovery refuses instead, naming the block and what follows it,
//! unless the caller accepts the loss ([`super::Journal::open_with`]). This is the rule LevelDB's
//! paranoid mode and ZFS's intent log keep: stop at corruption and say so.
//!
//! A damaged newest checkpoint is recovered from the one before it with a longer replay: the
//! log ring never reuses blocks the older checkpoint still needs (see `Journal::write_batch`).

use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

use super::frame::{
    CheckpointHeader, JournalGeometry, LogBlock, READABLE, Superblock, SuperblockRead, classify_log_block,
};
use super::ids::{CheckpointSlot, Epoch, LogPosition};
use super::{Record, decode_all};
use crate::{Error, Result};

/// Where a journal lives, for messages: its name ("the compressed store's journal in
/// fast.img") and the block of that file where the journal's block 0 is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalPlace {
    pub name: String,
    pub first_lba: Lba,
}

impl Default for JournalPlace {
    fn default() -> JournalPlace {
        JournalPlace { name: "the journal".into(), first_lba: Lba(0) }
    }
}

impl JournalPlace {
    /// The address, on the device the place names, of the journal's block `lba`.
    fn lba(&self, lba: Lba) -> Lba {
        self.first_lba.offset_by(lba.0)
    }
}

/// Damage found in the log, and what recovery would drop by truncating the log there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDamage {
    /// The log position of the damaged block, and its LBA on the device the place names.
    pub position: LogPosition,
    pub lba: Lba,
    /// What is wrong with it.
    pub what: String,
    /// Later blocks of the log (their expected position and a current epoch) after it, and the
    /// records those that verify hold.
    pub later_blocks: u64,
    pub later_records: u64,
}

impl LogDamage {
    /// What truncating the log here drops, in a phrase.
    pub fn dropped(&self) -> String {
        let Self { position, lba, later_blocks, later_records, .. } = self;
        if *later_blocks == 0 {
            format!("the damaged block at position {position} ({lba}), the last the log reached")
        } else {
            format!(
                "the damaged block at position {position} ({lba}) and {later_blocks} later block(s) holding at least {later_records} record(s)"
            )
        }
    }

    /// What happened, what is at stake and what to do, in one message.
    pub fn describe(&self, place: &JournalPlace) -> String {
        let Self { position, lba, what, later_blocks, later_records } = self;
        let found = if *later_blocks > 0 {
            format!(
                "the log block at position {position} ({lba}) is damaged ({what}) and {later_blocks} later \
                 block(s) of the log follow it, holding at least {later_records} record(s): the records from \
                 position {position} on would be lost"
            )
        } else {
            format!(
                "the log block at position {position} ({lba}) is damaged ({what}); no later block of the log \
                 follows it, so whether it held acknowledged records cannot be known"
            )
        };
        format!(
            "{}: {found}. Recovery stops rather than silently roll back acknowledged writes; to accept the loss, \
             run `tundra repair --accept-loss` on the stopped node, which truncates the log at position {position}",
            place.name
        )
    }
}

/// What a read-only look at a journal found; nothing is written.
pub struct Inspection {
    pub(super) superblock: Superblock,
    /// The epoch the next session takes.
    pub(super) next_epoch: Epoch,
    /// The checkpoint slot recovery starts from, and the log position replay starts at.
    pub(super) slot: CheckpointSlot,
    pub(super) start: LogPosition,
    pub checkpoint: Vec<Record>,
    /// The log's records up to its end or up to the damage.
    pub log: Vec<Record>,
    pub(super) end: LogPosition,
    pub damage: Option<LogDamage>,
    /// Damage recovered from (a superblock copy, the newest checkpoint), one line each.
    pub notes: Vec<String>,
}

/// Reads a journal without changing it: the superblock, a checkpoint that verifies (falling
/// back to the previous one), and the log up to its end or its first damaged block.
pub fn inspect(device: &dyn BlockDevice, place: &JournalPlace) -> Result<Inspection> {
    let mut notes = Vec::new();
    let (superblock, copy_lost) = read_superblock(device, place, &mut notes)?;
    let geometry = superblock.geometry;
    if device.block_count() < geometry.total_blocks() {
        return Err(Error::corrupted(format!(
            "{}: the device has {} blocks but its journal needs {}",
            place.name,
            device.block_count(),
            geometry.total_blocks()
        )));
    }
    let (slot, checkpoint) = choose_checkpoint(device, place, &superblock, &mut notes)?;
    let start = superblock.positions[slot.index()];
    let log = read_log(device, geometry, place, start)?;
    // A lost copy may have been newer by one generation, whose session took the epoch after the
    // newest seen: skipping that one too keeps every epoch used by one session only.
    let newest_epoch = superblock.epoch.max(log.max_epoch);
    let next_epoch = if copy_lost { newest_epoch.next().next() } else { newest_epoch.next() };
    Ok(Inspection {
        superblock,
        next_epoch,
        slot,
        start,
        checkpoint,
        log: log.records,
        end: log.end,
        damage: log.damage,
        notes,
    })
}

/// The newest superblock copy that verifies, and whether the other copy is unreadable.
fn read_superblock(
    device: &dyn BlockDevice,
    place: &JournalPlace,
    notes: &mut Vec<String>,
) -> Result<(Superblock, bool)> {
    let mut blocks = vec![0u8; 2 * BLOCK_SIZE];
    device.read(Lba(0), &mut blocks)?;
    let copies = [&blocks[..BLOCK_SIZE], &blocks[BLOCK_SIZE..]];
    let reads = copies.map(Superblock::decode);
    for read in &reads {
        if let SuperblockRead::Version(version) = read {
            return Err(Error::invalid(format!(
                "{}: journal format version {version}; this build reads {READABLE}. Open it with the build that \
                 wrote it, or set up a new data directory",
                place.name
            )));
        }
    }
    let valid: Vec<Superblock> =
        reads.iter().filter_map(|r| if let SuperblockRead::Valid(s) = r { Some(*s) } else { None }).collect();
    let Some(newest) = valid.iter().max_by_key(|s| s.generation).copied() else {
        return Err(Error::invalid(format!(
            "{}: no valid journal superblock at {} or {}: the device holds no Tundra journal, or both copies are \
             damaged",
            place.name,
            place.lba(Lba(0)),
            place.lba(Lba(1)).0
        )));
    };
    if valid.len() == 2 {
        return Ok((newest, false));
    }
    for (i, copy) in copies.iter().enumerate() {
        if matches!(reads[i], SuperblockRead::Invalid) && copy.iter().any(|&b| b != 0) {
            notes.push(format!(
                "{}: the journal superblock copy at {} is damaged; recovered from the copy at {} (generation {})",
                place.name,
                place.lba(Lba(i as u64)),
                place.lba(Lba(1 - i as u64)),
                newest.generation
            ));
        }
    }
    Ok((newest, true))
}

/// The newest checkpoint if it verifies, otherwise the one before it; with its slot.
fn choose_checkpoint(
    device: &dyn BlockDevice,
    place: &JournalPlace,
    superblock: &Superblock,
    notes: &mut Vec<String>,
) -> Result<(CheckpointSlot, Vec<Record>)> {
    let geometry = superblock.geometry;
    let current = superblock.current;
    let newest = match read_checkpoint(device, geometry, current, superblock.positions[current.index()])? {
        Ok(records) => return Ok((current, records)),
        Err(reason) => reason,
    };
    let previous = current.other();
    let position = superblock.positions[previous.index()];
    let lba = |slot| place.lba(geometry.checkpoint_lba(slot));
    match read_checkpoint(device, geometry, previous, position)? {
        Ok(records) => {
            notes.push(format!(
                "{}: journal checkpoint slot {current} ({}) is damaged ({newest}); recovered from the previous \
                 checkpoint in slot {previous} at log position {position}",
                place.name,
                lba(current)
            ));
            Ok((previous, records))
        }
        Err(older) => Err(Error::corrupted(format!(
            "{}: both journal checkpoints are damaged: slot {current} ({}): {newest}; slot {previous} ({}): \
             {older}. The index cannot be rebuilt from this journal; restore the node's data from a backup",
            place.name,
            lba(current),
            lba(previous)
        ))),
    }
}

/// The records of checkpoint `slot`, which must reflect the log up to `position`; the outer
/// error is the device's, the inner one says why the slot does not verify.
fn read_checkpoint(
    device: &dyn BlockDevice,
    geometry: JournalGeometry,
    slot: CheckpointSlot,
    position: LogPosition,
) -> Result<std::result::Result<Vec<Record>, String>> {
    let mut block = vec![0u8; BLOCK_SIZE];
    device.read(geometry.checkpoint_lba(slot), &mut block)?;
    let header = match CheckpointHeader::decode(&block) {
        Ok(header) => header,
        Err(reason) => return Ok(Err(reason)),
    };
    if header.position != position {
        return Ok(Err(format!(
            "it holds the checkpoint of log position {} where the superblock names {position}",
            header.position
        )));
    }
    let blocks = header.record_bytes.div_ceil(BLOCK_SIZE_BYTES);
    if blocks >= geometry.checkpoint_blocks {
        return Ok(Err(format!(
            "its header claims {} bytes of records, more than the slot holds",
            header.record_bytes
        )));
    }
    let mut bytes = vec![0u8; (blocks * BLOCK_SIZE_BYTES) as usize];
    if blocks > 0 {
        device.read(geometry.checkpoint_lba(slot).offset_by(1), &mut bytes)?;
    }
    bytes.truncate(header.record_bytes as usize);
    if crc32c::crc32c(&bytes) != header.crc {
        return Ok(Err("its records fail their checksum".into()));
    }
    Ok(match decode_all(&bytes) {
        Ok(records) if records.len() as u64 == header.record_count => Ok(records),
        Ok(records) => {
            Err(format!("it holds {} records where its header counts {}", records.len(), header.record_count))
        }
        Err(error) => Err(format!("its records do not decode ({})", error.message())),
    })
}

struct LogRead {
    records: Vec<Record>,
    end: LogPosition,
    /// The newest epoch of any block of this log read, the damaged one and those after it
    /// included; the default (older than any written) when none was read.
    max_epoch: Epoch,
    damage: Option<LogDamage>,
}

/// Reads the log from `start` over at most one lap of the ring, to its end or its first
/// damaged block.
fn read_log(
    device: &dyn BlockDevice,
    geometry: JournalGeometry,
    place: &JournalPlace,
    start: LogPosition,
) -> Result<LogRead> {
    let window_end = start.after(geometry.log_blocks);
    let mut read = LogRead { records: Vec::new(), end: start, max_epoch: Epoch::default(), damage: None };
    let mut block = vec![0u8; BLOCK_SIZE];
    // The first block may be of any epoch; each later one of its predecessor's or newer.
    let mut min_epoch = Epoch::default();
    while read.end < window_end {
        let position = read.end;
        device.read(geometry.log_lba(position), &mut block)?;
        let what = match classify_log_block(&block, position, min_epoch) {
            LogBlock::End => break,
            LogBlock::Valid { epoch, records } => match decode_all(records) {
                Ok(records) => {
                    read.records.extend(records);
                    min_epoch = epoch;
                    read.max_epoch = read.max_epoch.max(epoch);
                    read.end = read.end.next();
                    continue;
                }
                Err(error) => format!("its records do not decode: {}", error.message()),
            },
            LogBlock::BodyDamaged { .. } => "its header verifies but its body fails its checksum".to_string(),
            LogBlock::HeaderDamaged => "it is neither zeros nor a block whose header verifies".to_string(),
        };
        if damage_ends_log() {
            break;
        }
        let (later_blocks, later_records, later_epoch) =
            look_ahead(device, geometry, position.next(), window_end, min_epoch)?;
        read.max_epoch = read.max_epoch.max(later_epoch);
        let lba = place.lba(geometry.log_lba(position));
        read.damage = Some(LogDamage { position, lba, what, later_blocks, later_records });
        break;
    }
    if drop_newest_record() {
        read.records.pop();
    }
    Ok(read)
}

/// Counts the blocks in `from..to` that are blocks of this log (their expected position, an
/// epoch no older than `min_epoch`), the records of those that verify, and their newest epoch.
fn look_ahead(
    device: &dyn BlockDevice,
    geometry: JournalGeometry,
    from: LogPosition,
    to: LogPosition,
    min_epoch: Epoch,
) -> Result<(u64, u64, Epoch)> {
    let (mut blocks, mut records, mut max_epoch) = (0, 0, Epoch::default());
    let mut block = vec![0u8; BLOCK_SIZE];
    for position in (0..to.blocks_since(from)).map(|i| from.after(i)) {
        device.read(geometry.log_lba(position), &mut block)?;
        match classify_log_block(&block, position, min_epoch) {
            LogBlock::Valid { epoch, records: bytes } => {
                blocks += 1;
                records += decode_all(bytes).map_or(0, |r| r.len() as u64);
                max_epoch = max_epoch.max(epoch);
            }
            LogBlock::BodyDamaged { epoch } => {
                blocks += 1;
                max_epoch = max_epoch.max(epoch);
            }
            LogBlock::End | LogBlock::HeaderDamaged => {}
        }
    }
    Ok((blocks, records, max_epoch))
}

/// Trims the log blocks of positions `from..to` (at most one lap): they read as zeros, so the
/// log ends at `from` and no block dropped there can reappear.
pub(super) fn truncate(
    device: &dyn BlockDevice,
    geometry: JournalGeometry,
    from: LogPosition,
    to: LogPosition,
) -> Result<()> {
    let mut position = from;
    while position < to {
        let room = geometry.log_blocks - position.ring_block(geometry.log_blocks);
        let count = room.min(to.blocks_since(position));
        device.trim(geometry.log_lba(position), count)?;
        position = position.after(count);
    }
    device.flush()?;
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// The bug the corruption tests guard against, for showing that they catch it.
    static DAMAGE_ENDS_LOG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test-only: makes recovery on this thread treat damage as the end of the log, as the
/// journal's first format did.
#[cfg(test)]
pub(crate) fn set_damage_ends_log(on: bool) {
    DAMAGE_ENDS_LOG.with(|flag| flag.set(on));
}

fn damage_ends_log() -> bool {
    #[cfg(test)]
    return DAMAGE_ENDS_LOG.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}

#[cfg(test)]
thread_local! {
    /// A rollback bug for the crash tests to catch: recovery loses the newest record it replays.
    static DROP_NEWEST_RECORD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test-only: makes recovery on this thread drop the newest record of the log, the loss of the
/// newest acknowledged commit that every crash oracle must notice.
#[cfg(test)]
pub(crate) fn set_drop_newest_record(on: bool) {
    DROP_NEWEST_RECORD.with(|flag| flag.set(on));
}

fn drop_newest_record() -> bool {
    #[cfg(test)]
    return DROP_NEWEST_RECORD.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}
