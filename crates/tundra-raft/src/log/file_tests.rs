//! Crash and damage tests of the file log, with the twins that inject the bugs they guard
//! against: a crash at every point keeps every synced batch and reads back only a prefix of
//! what was appended; a flipped bit is refused, or (in the newest batch only) read as a torn
//! write, never read as other records.

use std::sync::Arc;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
use tundra_env::Rng;
use tundra_store::ids::ChunkId;

use super::*;
use crate::log::NodeLog;
use crate::types::Proposal;

fn random_batch(rng: &mut Rng, index: &mut u64) -> Vec<LogRecord> {
    let group = ChunkId(rng.below(3));
    (0..1 + rng.below(3))
        .map(|_| match rng.below(5) {
            0 => LogRecord::Vote { group, vote: Vote::new(rng.below(5), rng.below(3)) },
            1 => LogRecord::Reset { group },
            _ => {
                *index += 1;
                let command: Vec<u8> = (0..40 + rng.below(160)).map(|_| rng.below(256) as u8).collect();
                let log_id = LogId::new(CommittedLeaderId::new(1, 1), *index);
                LogRecord::Entries {
                    group,
                    entries: vec![Entry { log_id, payload: EntryPayload::Normal(Proposal { command, request: 0 }) }],
                }
            }
        })
        .collect()
}

/// Runs appends, flushes and compactions on a log in memory, crashes it at a random point and
/// reopens it. Returns whether the oracle held: every record synced before the crash is read
/// back, and what is read back is a prefix of what was appended.
fn crash_round(seed: u64, bug: FileLogBug) -> bool {
    let mut rng = Rng::new(seed);
    let file = Arc::new(MemLogFile::default());
    let log = FileLog::open(file.clone(), 4096, bug).expect("a new log");
    let mut appended: Vec<LogRecord> = Vec::new();
    let mut synced = 0;
    let mut index = 0;
    for _ in 0..rng.below(40) {
        match rng.below(10) {
            0..=5 => {
                let batch = random_batch(&mut rng, &mut index);
                log.append(&batch).expect("append");
                appended.extend(batch);
            }
            6..=8 => {
                log.flush().expect("flush");
                synced = appended.len();
            }
            _ => {
                if log.wants_compaction() {
                    log.compact(&appended).expect("compact");
                    synced = appended.len();
                }
            }
        }
    }
    file.crash(&mut rng);
    let reopened = FileLog::open(file.clone(), 4096, bug).expect("a crashed log opens");
    let replayed = reopened.replay().expect("replay");
    replayed.len() >= synced && appended.starts_with(&replayed)
}

#[test]
fn a_crash_at_any_point_keeps_every_synced_batch() {
    for seed in 0..400 {
        assert!(crash_round(seed, FileLogBug::None), "seed {seed}: the oracle failed");
    }
}

#[test]
fn a_flush_that_never_syncs_is_caught() {
    let caught = (0..400).filter(|&seed| !crash_round(seed, FileLogBug::SyncIgnored)).count();
    assert!(caught > 0, "a log that never syncs lost nothing in 400 crashes: the oracle is blind");
}

/// A log of a few synced batches, its records and where its last frame starts.
fn synced_log(seed: u64, bug: FileLogBug) -> (Arc<MemLogFile>, Vec<LogRecord>, usize) {
    let mut rng = Rng::new(seed);
    let file = Arc::new(MemLogFile::default());
    let log = FileLog::open(file.clone(), u64::MAX, bug).expect("a new log");
    let mut appended = Vec::new();
    let mut index = 0;
    let mut last_frame = 0;
    for _ in 0..6 {
        last_frame = file.durable_len();
        let batch = random_batch(&mut rng, &mut index);
        log.append(&batch).expect("append");
        log.flush().expect("flush");
        appended.extend(batch);
    }
    (file, appended, last_frame)
}

/// Flips one bit of a synced log and reopens it. Returns whether the oracle held: damage
/// before the newest batch is refused, and whatever is read is a prefix of what was written.
fn flip_round(seed: u64, bug: FileLogBug) -> bool {
    let (file, appended, last_frame) = synced_log(seed, bug);
    let mut rng = Rng::new(seed ^ 0xf11b);
    let bit = rng.below(file.durable_len() as u64 * 8);
    file.flip_bit(bit);
    match FileLog::open(file.clone(), u64::MAX, bug) {
        Err(_) => true,
        Ok(log) => {
            let replayed = log.replay().expect("replay");
            appended.starts_with(&replayed) && (bit / 8) as usize >= last_frame
        }
    }
}

#[test]
fn a_flipped_bit_is_refused_or_reads_as_a_torn_newest_batch() {
    for seed in 0..300 {
        assert!(flip_round(seed, FileLogBug::None), "seed {seed}: a flipped bit was read as records");
    }
}

#[test]
fn a_replay_without_body_checksums_is_caught() {
    let caught = (0..300).filter(|&seed| !flip_round(seed, FileLogBug::BodyUnchecked)).count();
    assert!(caught > 0, "flipped bits never read as other records without checksums: the oracle is blind");
}

#[test]
fn compaction_keeps_the_live_records_only() {
    let file = Arc::new(MemLogFile::default());
    let log = FileLog::open(file.clone(), 1024, FileLogBug::None).expect("a new log");
    let mut rng = Rng::new(5);
    let mut index = 0;
    while !log.wants_compaction() {
        log.append(&random_batch(&mut rng, &mut index)).expect("append");
    }
    let live = random_batch(&mut rng, &mut index);
    log.compact(&live).expect("compact");
    let later = random_batch(&mut rng, &mut index);
    log.append(&later).expect("append");
    log.flush().expect("flush");
    let reopened = FileLog::open(file, 1024, FileLogBug::None).expect("reopen");
    let mut expected = live;
    expected.extend(later);
    assert_eq!(reopened.replay().expect("replay"), expected);
}

#[test]
fn the_file_on_disk_survives_a_reopen() {
    let dir = std::env::temp_dir().join(format!("tundra-raft-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("raft.log");
    let mut rng = Rng::new(9);
    let mut index = 0;
    let mut appended = Vec::new();
    {
        let log = FileLog::open(OsLogFile::new(&path), 512, FileLogBug::None).expect("a new log");
        for _ in 0..20 {
            let batch = random_batch(&mut rng, &mut index);
            log.append(&batch).expect("append");
            log.flush().expect("flush");
            appended.extend(batch);
            if log.wants_compaction() {
                log.compact(&appended).expect("compact");
            }
        }
    }
    let log = FileLog::open(OsLogFile::new(&path), 512, FileLogBug::None).expect("reopen");
    assert_eq!(log.replay().expect("replay"), appended);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// An [`OsLogFile`] grows ahead of its frames by zeros, which a reopen reads as a torn tail
/// and cuts; a frame torn inside those zeros (its body partly written) is cut with them, and
/// every frame before it is read back.
#[test]
fn the_file_on_disk_grows_ahead_and_a_frame_torn_in_its_zeros_is_cut() {
    use std::os::unix::fs::FileExt;
    let dir = std::env::temp_dir().join(format!("tundra-raft-log-ahead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("raft.log");
    let on_disk = || std::fs::metadata(&path).expect("the log's file").len();
    let mut rng = Rng::new(11);
    let mut index = 0;
    let mut appended = Vec::new();
    {
        let log = FileLog::open(OsLogFile::new(&path), 1 << 30, FileLogBug::None).expect("a new log");
        for _ in 0..30 {
            let batch = random_batch(&mut rng, &mut index);
            log.append(&batch).expect("append");
            log.flush().expect("flush");
            appended.extend(batch);
        }
        assert_eq!(on_disk(), PREALLOCATE_BYTES, "grown by one step of zeros");
        assert!(log.size_bytes() < PREALLOCATE_BYTES);
        assert_eq!(log.file().allocated_bytes().expect("allocated"), PREALLOCATE_BYTES);
    }
    let (kept, torn_at) = {
        let log = FileLog::open(OsLogFile::new(&path), 1 << 30, FileLogBug::None).expect("reopen");
        assert_eq!(log.replay().expect("replay"), appended);
        assert_eq!(on_disk(), log.size_bytes(), "the zeros ahead are cut at the open");
        let torn_at = log.size_bytes();
        let batch = random_batch(&mut rng, &mut index);
        log.append(&batch).expect("append");
        log.flush().expect("flush");
        assert_eq!(on_disk(), torn_at.next_multiple_of(PREALLOCATE_BYTES));
        (appended.clone(), torn_at)
    };
    // The last frame's body torn: its header and some bytes written, then zeros.
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    file.write_all_at(&[0u8; 64], torn_at + FRAME_HEADER_BYTES as u64 + 8).expect("tear");
    drop(file);
    let log = FileLog::open(OsLogFile::new(&path), 1 << 30, FileLogBug::None).expect("reopen after the tear");
    assert_eq!(log.replay().expect("replay"), kept, "every frame before the torn one, and nothing else");
    assert_eq!(on_disk(), torn_at);
    // It goes on from there.
    let batch = random_batch(&mut rng, &mut index);
    log.append(&batch).expect("append");
    log.flush().expect("flush");
    drop(log);
    let log = FileLog::open(OsLogFile::new(&path), 1 << 30, FileLogBug::None).expect("reopen");
    let mut expected = kept;
    expected.extend(batch);
    assert_eq!(log.replay().expect("replay"), expected);
    drop(log);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A file of format version 1 (written before the `Reset` record existed) opens with every
/// record, is rewritten under the current header at once, and reopens the same; a header of
/// an unknown version is refused by name, and the file is left as it was.
#[test]
fn a_version_1_file_is_read_and_rewritten_and_an_unknown_version_refused() {
    let mut rng = Rng::new(7);
    let mut index = 0;
    let batches: Vec<Vec<LogRecord>> = (0..6)
        .map(|_| {
            random_batch(&mut rng, &mut index).into_iter().filter(|r| !matches!(r, LogRecord::Reset { .. })).collect()
        })
        .collect();
    let mut old = header_of_version(1);
    for (seq, batch) in batches.iter().enumerate() {
        old.extend_from_slice(&encode_frame(seq as u64, batch));
    }
    let file = Arc::new(MemLogFile::default());
    file.replace(&old).expect("write");
    let log = FileLog::open(file.clone(), 1 << 20, FileLogBug::None).expect("a version 1 log opens");
    let expected: Vec<LogRecord> = batches.concat();
    assert_eq!(log.replay().expect("replay"), expected);
    let now = file.read_all().expect("read");
    assert_eq!(now[..FILE_HEADER_BYTES], file_header()[..], "rewritten under the current header");
    assert_eq!(now[FILE_HEADER_BYTES..], old[FILE_HEADER_BYTES..], "the frames as they were");
    log.append(&[LogRecord::Reset { group: ChunkId(1) }]).expect("append");
    log.flush().expect("flush");
    let reopened = FileLog::open(file.clone(), 1 << 20, FileLogBug::None).expect("reopens");
    assert_eq!(reopened.replay().expect("replay").last(), Some(&LogRecord::Reset { group: ChunkId(1) }));

    let mut future = header_of_version(FILE_FORMAT + 1);
    future.extend_from_slice(&old[FILE_HEADER_BYTES..]);
    let file = Arc::new(MemLogFile::default());
    file.replace(&future).expect("write");
    let refused = FileLog::open(file.clone(), 1 << 20, FileLogBug::None).err().expect("refused");
    assert!(refused.contains(&format!("format version {}", FILE_FORMAT + 1)), "{refused}");
    assert_eq!(file.read_all().expect("read"), future, "a refused file is left as it was");
}

/// A group's reset, through the node's log: its entries, purge point and committed position
/// are gone at once, stay gone when the node reopens the file, and stay gone after a
/// compaction; its vote stays throughout, and another group's records are untouched.
#[test]
fn a_reset_forgets_a_group_but_its_vote_across_a_reopen_and_a_compaction() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    runtime.block_on(async {
        let file = Arc::new(MemLogFile::default());
        let (gone, kept) = (ChunkId(1), ChunkId(2));
        let log_id = LogId::new(CommittedLeaderId::new(3, 1), 7);
        let entry = |index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), index),
            payload: EntryPayload::Normal(Proposal { command: vec![index as u8; 16], request: 0 }),
        };
        let vote = Vote::new(3, 1);
        let media = FileLog::open(file.clone(), 1 << 20, FileLogBug::None).expect("a new log");
        media
            .append(&[
                LogRecord::Vote { group: gone, vote },
                LogRecord::Entries { group: gone, entries: (5..=9).map(entry).collect() },
                LogRecord::Purge { group: gone, upto: log_id },
                LogRecord::Committed { group: gone, committed: Some(log_id) },
                LogRecord::Entries { group: kept, entries: (0..=2).map(entry).collect() },
            ])
            .expect("append");
        media.flush().expect("flush");
        drop(media);
        let state = |log: &NodeLog, group| {
            log.with_group(group, |g| (g.vote, g.entries.len(), g.purged, g.committed, g.durable))
        };
        let forgotten = |vote| (Some(vote), 0, None, None, None);

        let media = Arc::new(FileLog::open(file.clone(), 1 << 20, FileLogBug::None).expect("reopen"));
        let log = NodeLog::open(media.clone(), std::time::Duration::ZERO).expect("open");
        assert_eq!(state(&log, gone), (Some(vote), 2, Some(log_id), Some(log_id), Some(9)));
        log.reset(gone).await.expect("reset");
        assert_eq!(state(&log, gone), forgotten(vote));
        assert_eq!(state(&log, kept).1, 3, "another group's entries are untouched");
        log.stop();
        drop(log);

        let media = Arc::new(FileLog::open(file.clone(), 1 << 20, FileLogBug::None).expect("reopen"));
        let log = NodeLog::open(media.clone(), std::time::Duration::ZERO).expect("open");
        assert_eq!(state(&log, gone), forgotten(vote), "after a reopen");
        assert_eq!(log.reset_held(gone), Some(9), "after a reopen");
        media.compact(&log.live_records()).expect("compact");
        log.stop();
        drop(log);

        let media = Arc::new(FileLog::open(file.clone(), 1 << 20, FileLogBug::None).expect("reopen"));
        let log = NodeLog::open(media, std::time::Duration::ZERO).expect("open");
        assert_eq!(state(&log, gone), forgotten(vote), "after a compaction");
        assert!(log.was_reset(gone) && !log.was_reset(kept), "the reset is remembered (the vote guard needs it)");
        assert_eq!(
            (log.reset_held(gone), log.reset_held(kept)),
            (Some(9), None),
            "so is the highest index held before it (elections wait for it)"
        );
        assert_eq!(state(&log, kept).1, 3);
        log.stop();
    });
}
