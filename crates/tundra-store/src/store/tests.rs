//! The store's tests: pages through writes, trims, reopens and crashes; journal damage seen
//! through the store.
use std::collections::BTreeMap;

use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_env::Rng;

use super::*;
use crate::ErrorKind;
use crate::command::{PagePut, StoreCommand};
use crate::ids::Lsn;
use crate::journal::JournalGeometry;
use crate::journal::Record;

const PAGE: usize = 16384;

/// Volume 0, big enough for every test: chunk ids 0, 1, 2 ... are its chunks.
pub(crate) fn test_volume(page_size: usize) -> Volume {
    Volume {
        id: VolumeId(0),
        name: "test".into(),
        size_bytes: 64 << 30,
        page_size: page_size as u32,
        chunk_bytes: 1 << 30,
        mode: VolumeMode::Normal,
    }
}

/// Opens a store and makes sure volume 0 exists.
fn open_store(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>) -> Store {
    let store = Store::open(data, fast).unwrap();
    if store.volume(VolumeId(0)).is_none() {
        store.create_volume(test_volume(PAGE)).unwrap();
    }
    store
}
const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 64 };

fn raw_image(chunk: ChunkId, page: PageNo, tag: u64) -> PageImage {
    let mut bytes = vec![0u8; PAGE];
    Rng::new(tag).fill(&mut bytes[..64]);
    bytes[..8].copy_from_slice(&tag.to_le_bytes());
    let checksum = page_checksum(chunk, page, &bytes);
    PageImage { encoding: Encoding::Raw, bytes, checksum }
}

fn tag_of(store: &Store, chunk: ChunkId, page: PageNo) -> Option<u64> {
    let (entry, bytes) = store.read_image(chunk, page).unwrap()?;
    assert_eq!(entry.encoding, Encoding::Raw);
    assert_eq!(page_checksum(chunk, page, &bytes), entry.checksum, "page {page:?} fails its checksum");
    Some(u64::from_le_bytes(bytes[..8].try_into().unwrap()))
}

fn new_store(data_blocks: u64) -> (Arc<MemDevice>, Arc<MemDevice>, Store) {
    let data = Arc::new(MemDevice::new(data_blocks));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = open_store(data.clone(), fast.clone());
    (data, fast, store)
}

#[test]
fn pages_round_trip_overwrite_trim_and_reopen() {
    let (data, fast, store) = new_store(4096);
    let chunk = ChunkId(3);
    for round in 0..5u64 {
        for page in 0..40u32 {
            store
                .apply_write(
                    chunk,
                    PageNo(page),
                    &raw_image(chunk, PageNo(page), round * 100 + u64::from(page)),
                    Lsn(round),
                )
                .unwrap();
            store.maybe_checkpoint().unwrap();
        }
    }
    store.trim_page(chunk, PageNo(7)).unwrap();
    assert_eq!(tag_of(&store, chunk, PageNo(7)), None);
    assert_eq!(tag_of(&store, chunk, PageNo(8)), Some(408));
    assert_eq!(store.stats().pages, 39);
    store.release_freed().unwrap();
    // 39 live pages of 4 blocks need 5 extents; overwritten runs came back.
    assert!(store.stats().extents_in_use <= 6, "{:?}", store.stats());
    drop(store);
    let store = open_store(data, fast);
    assert_eq!(tag_of(&store, chunk, PageNo(8)), Some(408));
    assert_eq!(tag_of(&store, chunk, PageNo(7)), None);
    assert_eq!(store.stats().pages, 39);
}

#[test]
fn blocks_written_but_never_journalled_are_trimmed_at_open() {
    let (data, fast, store) = new_store(256);
    let chunk = ChunkId(1);
    store.apply_write(chunk, PageNo(0), &raw_image(chunk, PageNo(0), 1), Lsn(1)).unwrap();
    // The small commit carried the image; the checkpoint writes it to its run.
    store.checkpoint().unwrap();
    drop(store);
    let referenced = data.usage().mapped_bytes;
    // As if a crash struck between a page's data write and its journal record.
    data.write(Lba(200), &vec![7u8; 4 * BLOCK_SIZE]).unwrap();
    assert_eq!(data.usage().mapped_bytes, referenced + 4 * BLOCK_SIZE as u64);
    let store = open_store(data.clone(), fast);
    assert_eq!(data.usage().mapped_bytes, referenced, "only page 0's blocks stay");
    assert_eq!(tag_of(&store, chunk, PageNo(0)), Some(1));
}

#[test]
fn bad_images_are_refused_and_change_nothing() {
    let (_, _, store) = new_store(512);
    let chunk = ChunkId(1);
    let mut short = raw_image(chunk, PageNo(0), 1);
    short.bytes.truncate(100);
    assert_eq!(store.apply_write(chunk, PageNo(0), &short, Lsn(1)).unwrap_err().kind(), ErrorKind::Invalid);
    let too_long = PageImage { encoding: Encoding::Lz4, bytes: vec![1; PAGE + 1], checksum: 0 };
    assert_eq!(store.apply_write(chunk, PageNo(0), &too_long, Lsn(1)).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(store.stats().pages, 0);
    assert!(Store::open(Arc::new(MemDevice::new(64)), Arc::new(MemDevice::new(64))).is_err(), "no journal");
    let bad = Volume { page_size: 4096, ..test_volume(PAGE) };
    assert_eq!(store.create_volume(bad).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(store.create_volume(test_volume(PAGE)).unwrap_err().kind(), ErrorKind::Invalid, "exists");
    let outside = ChunkId::new(VolumeId(7), 0);
    let image = raw_image(outside, PageNo(0), 1);
    assert_eq!(store.apply_write(outside, PageNo(0), &image, Lsn(1)).unwrap_err().kind(), ErrorKind::Invalid);
}

#[test]
fn a_full_data_device_is_a_clear_error() {
    let (_, _, store) = new_store(64);
    let chunk = ChunkId(1);
    let mut written = 0;
    let error = loop {
        match store.apply_write(chunk, PageNo(written), &raw_image(chunk, PageNo(written), 1), Lsn(1)) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(error.kind(), ErrorKind::Full);
    assert_eq!(written, 16, "64 blocks hold 16 pages of 16 KiB");
}

/// Power fails at a random write of either device: after recovery every page holds its newest
/// acknowledged version, or one the operation cut short by the power failure was writing (a
/// trim there is the tag 0), and every page verifies. An older acknowledged version is a
/// rollback and fails the check.
#[test]
fn crash_points_lose_no_acknowledged_write() {
    let struck = store_crash_rounds(150);
    assert!(struck > 150, "power should often fail inside an operation: {struck}");
}

/// The crash oracle above catches the rollback it guards against: with recovery dropping the
/// newest journal record, the same rounds fail.
#[test]
fn the_store_crash_oracle_fails_when_recovery_drops_the_newest_commit() {
    crate::journal::set_drop_newest_record(true);
    let verdict = std::panic::catch_unwind(|| store_crash_rounds(150));
    crate::journal::set_drop_newest_record(false);
    assert!(verdict.is_err(), "the store's crash oracle missed a dropped acknowledged write");
}

/// The same oracle catches a replay that does not write again the images small commits carried
/// in the log: the data device loses them in the crashes, and their pages fail their checksums.
#[test]
fn the_store_crash_oracle_fails_when_replay_skips_carried_images() {
    rebuild::set_replay_skips_carried_images(true);
    let verdict = std::panic::catch_unwind(|| store_crash_rounds(150));
    rebuild::set_replay_skips_carried_images(false);
    assert!(verdict.is_err(), "the store's crash oracle missed images lost from the data device");
}

/// And a checkpoint that does not flush the data device first: the log behind it, which held
/// the images the device has not made durable, is no longer replayed.
#[test]
fn the_store_crash_oracle_fails_when_a_checkpoint_does_not_flush_carried_images() {
    set_checkpoint_skips_data_flush(true);
    let verdict = std::panic::catch_unwind(|| store_crash_rounds(150));
    set_checkpoint_skips_data_flush(false);
    assert!(verdict.is_err(), "the store's crash oracle missed a checkpoint ahead of the data device");
}

/// And a checkpoint that does not write the images still waiting for their runs: the log that
/// held them is no longer replayed, and their pages read as the blocks were before.
#[test]
fn the_store_crash_oracle_fails_when_a_checkpoint_leaves_images_unwritten() {
    set_checkpoint_skips_unwritten_images(true);
    let verdict = std::panic::catch_unwind(|| store_crash_rounds(150));
    set_checkpoint_skips_unwritten_images(false);
    assert!(verdict.is_err(), "the store's crash oracle missed images a checkpoint never wrote");
}

/// And a release that keeps a freed run's unwritten image: a later batch writes the old image
/// over the run after another page took it.
#[test]
fn the_store_crash_oracle_fails_when_a_freed_runs_image_is_still_written() {
    set_release_keeps_unwritten_images(true);
    let verdict = std::panic::catch_unwind(|| store_crash_rounds(150));
    set_release_keeps_unwritten_images(false);
    assert!(verdict.is_err(), "the store's crash oracle missed a stale image written over a reused run");
}

/// A small commit's image waits in memory, not on the data device: the page reads back from
/// there; rewritten, only its newest image is ever written; the batch's commit writes every
/// waiting image, and a checkpoint those of a batch not yet full.
#[test]
fn carried_images_wait_unwritten_and_go_to_their_runs_in_batches() {
    let chunk = ChunkId(0);
    let data = Arc::new(FaultyDevice::new(MemDevice::new(1024), 1));
    // A log with room for every image the test's commits carry.
    let journal = JournalGeometry { checkpoint_blocks: 64, log_blocks: 1024 };
    let fast = Arc::new(MemDevice::new(journal.total_blocks()));
    Journal::format(fast.as_ref(), journal).unwrap();
    let store = open_store(data.clone(), fast.clone()).with_write_behind(true).with_unwritten_batch(4);
    store.checkpoint().unwrap();
    let writes = || data.stats().block_writes;
    let before = writes();
    store.apply_write(chunk, PageNo(1), &raw_image(chunk, PageNo(1), 1), Lsn(1)).unwrap();
    store.apply_write(chunk, PageNo(2), &raw_image(chunk, PageNo(2), 2), Lsn(2)).unwrap();
    store.apply_write(chunk, PageNo(1), &raw_image(chunk, PageNo(1), 3), Lsn(3)).unwrap();
    store.release_freed().unwrap();
    assert_eq!(writes(), before, "a small commit wrote the data device");
    assert_eq!(store.unwritten_images(), 2, "page 1's first image went with its run");
    assert_eq!((tag_of(&store, chunk, PageNo(1)), tag_of(&store, chunk, PageNo(2))), (Some(3), Some(2)));
    // The fourth waiting image fills the batch: all four go to the device.
    store.apply_write(chunk, PageNo(3), &raw_image(chunk, PageNo(3), 4), Lsn(4)).unwrap();
    store.apply_write(chunk, PageNo(4), &raw_image(chunk, PageNo(4), 5), Lsn(5)).unwrap();
    let blocks = (PAGE / BLOCK_SIZE) as u64;
    assert_eq!(writes(), before + 4 * blocks);
    assert_eq!(store.unwritten_images(), 0);
    store.apply_write(chunk, PageNo(5), &raw_image(chunk, PageNo(5), 6), Lsn(6)).unwrap();
    store.checkpoint().unwrap();
    assert_eq!(writes(), before + 5 * blocks, "the checkpoint wrote the waiting image");
    // Every page reads from its blocks now, here and after a reopen with an empty log.
    drop(store);
    let store = open_store(data.clone(), fast.clone());
    let tags: Vec<Option<u64>> = (1..=5).map(|p| tag_of(&store, chunk, PageNo(p))).collect();
    assert_eq!(tags, [Some(3), Some(2), Some(4), Some(5), Some(6)]);
}

/// A full data device with runs freed but not yet released (they wait for a batch of them)
/// releases them for a write that then fits, instead of refusing it.
#[test]
fn a_full_device_releases_freed_runs_before_it_refuses_a_write() {
    let run_blocks = (PAGE / BLOCK_SIZE) as u64;
    // Two extents: room for 16 pages.
    let (_, _, store) = new_store(2 * u64::from(crate::ids::EXTENT_BLOCKS));
    let runs = 2 * u64::from(crate::ids::EXTENT_BLOCKS) / run_blocks;
    let chunk = ChunkId(0);
    let write =
        |page: u32, tag: u64| store.apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), tag), Lsn(tag));
    for page in 0..runs as u32 - 2 {
        write(page, u64::from(page) + 1).unwrap();
    }
    // Two rewrites take the last free runs and leave two freed ones waiting; the third
    // rewrite fits only once they are released.
    write(0, 100).unwrap();
    write(1, 101).unwrap();
    write(2, 102).unwrap();
    // Two new pages fill the device; a third is refused as full, with nothing left to release.
    write(20, 120).unwrap();
    write(21, 121).unwrap();
    let error = write(22, 122).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Full, "{error}");
    let tags: Vec<Option<u64>> = [0, 1, 2, 3, 20, 21, 22].iter().map(|&p| tag_of(&store, chunk, PageNo(p))).collect();
    assert_eq!(tags, [Some(100), Some(101), Some(102), Some(4), Some(120), Some(121), None]);
    store.check_invariants().unwrap();
}

/// Write-behind under threads: writers rewrite their own pages and read each back at once,
/// a reader reads every page, and a background thread writes the waiting images and takes
/// checkpoints, all at the same time, with runs freed and reused throughout. Every read is of
/// the page's own image, never older than one read before; after a reopen every page holds
/// its last write. `skip_reads` is the twin: reads ignore the waiting images.
fn write_behind_under_threads(skip_reads: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    const WRITERS: u32 = 3;
    const PAGES_EACH: u32 = 6;
    const WRITES_EACH: u64 = 240;
    let chunk = ChunkId(0);
    // Room for every page, the freed runs a release waits for (state.rs's RELEASE_BATCH) and a
    // little more, so freed runs are reused after every release.
    let data = Arc::new(MemDevice::new((u64::from(WRITERS * PAGES_EACH) + state::RELEASE_BATCH as u64 + 8) * 4));
    let journal = JournalGeometry { checkpoint_blocks: 64, log_blocks: 1024 };
    let fast = Arc::new(MemDevice::new(journal.total_blocks()));
    Journal::format(fast.as_ref(), journal).unwrap();
    let store = open_store(data.clone(), fast.clone()).with_write_behind(true).with_unwritten_batch(16);
    let tag = |page: u32, seq: u64| u64::from(page) * 1_000_000 + seq;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let background = scope.spawn(|| {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                store.write_unwritten().unwrap();
                if rounds % 8 == 7 {
                    store.checkpoint().unwrap();
                }
                rounds += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
        let reader = scope.spawn(|| {
            set_reads_skip_unwritten_images(skip_reads);
            let mut seen = BTreeMap::new();
            let every: Vec<PageNo> = (0..WRITERS * PAGES_EACH).map(PageNo).collect();
            let mut sweeps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Every other sweep reads all the pages together (`read_images`).
                sweeps += 1;
                let together = sweeps.is_multiple_of(2).then(|| store.read_images(chunk, &every).unwrap());
                for page in 0..WRITERS * PAGES_EACH {
                    let got = match &together {
                        None => tag_of(&store, chunk, PageNo(page)),
                        Some(images) => images[page as usize].as_ref().map(|(entry, bytes)| {
                            assert_eq!(
                                page_checksum(chunk, PageNo(page), bytes),
                                entry.checksum,
                                "page {page} read together"
                            );
                            u64::from_le_bytes(bytes[..8].try_into().unwrap())
                        }),
                    };
                    let Some(got) = got else { continue };
                    assert_eq!(got / 1_000_000, u64::from(page), "page {page} read another page's image");
                    let before = seen.insert(page, got).unwrap_or(0);
                    assert!(got >= before, "page {page} went back from {before} to {got}");
                }
            }
        });
        let store = &store;
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                scope.spawn(move || {
                    set_reads_skip_unwritten_images(skip_reads);
                    for seq in 1..=WRITES_EACH {
                        let page = w * PAGES_EACH + (seq % u64::from(PAGES_EACH)) as u32;
                        let want = tag(page, seq);
                        store
                            .apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), want), Lsn(want))
                            .unwrap();
                        assert_eq!(tag_of(store, chunk, PageNo(page)), Some(want), "page {page} just written");
                    }
                })
            })
            .collect();
        let outcome: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Relaxed);
        for joined in outcome.into_iter().chain([reader.join(), background.join()]) {
            if let Err(panic) = joined {
                std::panic::resume_unwind(panic);
            }
        }
    });
    store.check_invariants().unwrap();
    store.checkpoint().unwrap();
    drop(store);
    let store = open_store(data, fast);
    store.check_invariants().unwrap();
    for w in 0..WRITERS {
        for i in 0..PAGES_EACH {
            let page = w * PAGES_EACH + i;
            // The last write of the page: the highest seq with seq % PAGES_EACH == i.
            let last = (1..=WRITES_EACH).rev().find(|seq| seq % u64::from(PAGES_EACH) == u64::from(i)).unwrap();
            assert_eq!(tag_of(&store, chunk, PageNo(page)), Some(tag(page, last)), "page {page} after reopen");
        }
    }
}

#[test]
fn write_behind_holds_under_threads() {
    write_behind_under_threads(false);
}

/// Its twin: reads that ignore the waiting images see blocks not yet written, and fail.
#[test]
fn write_behind_under_threads_fails_when_reads_ignore_waiting_images() {
    let verdict = std::panic::catch_unwind(|| write_behind_under_threads(true));
    assert!(verdict.is_err(), "the concurrent test missed reads that ignore waiting images");
}

/// A small commit carries its page's image in the log and flushes the data device not at all:
/// after a crash that loses every data write since the device's last flush, replay writes the
/// images again and the pages read as written. With replay skipping them (the twin) the same
/// pages fail their checksums.
#[test]
fn a_small_commit_carries_its_image_and_replay_writes_it_again() {
    let chunk = ChunkId(0);
    for skip in [false, true] {
        let data = Arc::new(FaultyDevice::new(MemDevice::new(1024), 1));
        let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let store = open_store(data.clone(), fast.clone());
        store.apply_write(chunk, PageNo(1), &raw_image(chunk, PageNo(1), 7), Lsn(7)).unwrap();
        store.checkpoint().unwrap();
        // The data device as of its last flush.
        let flushed = data.inner().snapshot();
        let flushes = data.stats().flushes;
        store.apply_write(chunk, PageNo(1), &raw_image(chunk, PageNo(1), 8), Lsn(8)).unwrap();
        store.apply_write(chunk, PageNo(2), &raw_image(chunk, PageNo(2), 9), Lsn(9)).unwrap();
        assert_eq!(data.stats().flushes, flushes, "a small commit flushed the data device");
        drop(store);
        let lost = Arc::new(MemDevice::from_snapshot(1024, flushed));
        rebuild::set_replay_skips_carried_images(skip);
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let store = open_store(lost.clone(), fast.clone());
            (tag_of(&store, chunk, PageNo(1)), tag_of(&store, chunk, PageNo(2)))
        }));
        rebuild::set_replay_skips_carried_images(false);
        match (skip, read) {
            (false, Ok(tags)) => assert_eq!(tags, (Some(8), Some(9))),
            (false, Err(_)) => panic!("a page whose image the log carried was lost"),
            (true, read) => assert!(read.is_err(), "the twin read the lost images back: {read:?}"),
        }
    }
}

/// A commit of more than [`CARRIED_IMAGES_MAX_BYTES`] of images flushes the data device before
/// its records, as every commit did before images were carried, and carries nothing.
#[test]
fn a_large_commit_flushes_the_data_device_and_carries_no_image() {
    let chunk = ChunkId(0);
    let data = Arc::new(FaultyDevice::new(MemDevice::new(1024), 1));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = open_store(data.clone(), fast.clone());
    let flushes = data.stats().flushes;
    let pages: Vec<PagePut> =
        (0..2).map(|p| PagePut { page: PageNo(p), image: raw_image(chunk, PageNo(p), 5), lsn: Lsn(5) }).collect();
    const { assert!(2 * PAGE > apply::CARRIED_IMAGES_MAX_BYTES) };
    store.apply(&StoreCommand::PutPages { chunk, pages }).unwrap();
    assert_eq!(data.stats().flushes, flushes + 1, "one data flush before the commit's records");
    drop(store);
    let (_, replay) = Journal::open(fast.clone()).unwrap();
    assert!(!replay.log.iter().any(|r| matches!(r, Record::PageData { .. })), "a large commit carried images");
}

/// Runs `rounds` rounds of page writes, groups and trims with power failing at random writes;
/// panics on the first page that breaks the oracle. Returns how many operations failed.
fn store_crash_rounds(rounds: u64) -> u64 {
    let mut rng = Rng::new(7);
    let mut struck = 0;
    for round in 0..rounds {
        // Both trim policies; under Deferred freed runs are reused untrimmed.
        let policy = if round % 2 == 0 { TrimPolicy::EveryRun } else { TrimPolicy::Deferred };
        let data = Arc::new(FaultyDevice::new(MemDevice::new(1024), round));
        let fast = Arc::new(FaultyDevice::new(MemDevice::new(JOURNAL.total_blocks()), round + 1000));
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let chunk = ChunkId(round % 3);
        let mut acknowledged: BTreeMap<u32, u64> = BTreeMap::new();
        // What the operation a power failure cut short was writing, per page.
        let mut in_flight: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for crash in 0..3u64 {
            // Carried images go to their runs in batches of a few, or wait for a checkpoint.
            let batch = [1, 2, 3, 5, 8, UNWRITTEN_BATCH][(round % 6) as usize];
            let store = open_store(data.clone(), fast.clone())
                .with_trim_policy(policy)
                .with_write_behind(round % 7 != 6)
                .with_unwritten_batch(batch);
            store.check_invariants().unwrap_or_else(|p| panic!("round {round} crash {crash}: at recovery: {p}"));
            for page in 0..12u32 {
                let got = tag_of(&store, chunk, PageNo(page));
                let possible = |t: u64| in_flight.get(&page).is_some_and(|v| v.contains(&t));
                let allowed = got == acknowledged.get(&page).copied() || possible(got.unwrap_or(0));
                assert!(allowed, "round {round} crash {crash}: page {page} holds {got:?}");
                match got {
                    Some(tag) => acknowledged.insert(page, tag),
                    None => acknowledged.remove(&page),
                };
            }
            in_flight.clear();
            if rng.chance(0.50) {
                data.crash_after(rng.below(30))
            } else {
                fast.crash_after(rng.below(30))
            }
            for step in 0..30u64 {
                let page = rng.below(12) as u32;
                let tag = round * 10_000 + crash * 100 + step;
                in_flight.clear();
                let result = if rng.chance(0.15) {
                    in_flight.entry(page).or_default().push(0);
                    store.trim_page(chunk, PageNo(page)).map(|()| vec![(page, None)])
                } else if rng.chance(0.30) {
                    // A group of distinct pages with one commit, written in few I/Os.
                    let mut group: Vec<u32> = (0..1 + rng.below(4)).map(|i| (page + i as u32 * 5) % 12).collect();
                    group.dedup();
                    let images: Vec<PagePut> = group
                        .iter()
                        .enumerate()
                        .map(|(i, &p)| {
                            let tag = tag + i as u64 * 1_000_000;
                            in_flight.entry(p).or_default().push(tag);
                            PagePut { page: PageNo(p), image: raw_image(chunk, PageNo(p), tag), lsn: Lsn(tag) }
                        })
                        .collect();
                    let done: Vec<(u32, Option<u64>)> =
                        images.iter().map(|put| (put.page.0, Some(put.lsn.0))).collect();
                    store.apply(&StoreCommand::PutPages { chunk, pages: images }).map(|()| done)
                } else {
                    in_flight.entry(page).or_default().push(tag);
                    store
                        .apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), tag), Lsn(tag))
                        .map(|()| vec![(page, Some(tag))])
                };
                // Now and then a checkpoint whether or not the journal wants one (a node's
                // close, a snapshot), right behind commits that carried their images.
                let forced = rng.chance(0.10);
                let result =
                    result.and_then(|r| if forced { store.checkpoint() } else { store.maybe_checkpoint() }.map(|()| r));
                let result =
                    if rng.chance(0.20) { result.and_then(|r| store.release_freed().map(|()| r)) } else { result };
                match result {
                    Ok(done) => {
                        for (page, tag) in done {
                            match tag {
                                Some(tag) => acknowledged.insert(page, tag),
                                None => acknowledged.remove(&page),
                            };
                        }
                        store.check_invariants().unwrap_or_else(|p| panic!("round {round} step {step}: {p}"));
                        // Every page reads as acknowledged while the store runs too, whether
                        // its image is on the device or waits for its run.
                        for page in 0..12u32 {
                            let got = tag_of(&store, chunk, PageNo(page));
                            let want = acknowledged.get(&page).copied();
                            assert_eq!(got, want, "round {round} step {step}: page {page} reads wrong");
                        }
                    }
                    Err(_) => {
                        struck += 1;
                        break;
                    }
                }
            }
            drop(store);
            data.crash();
            fast.crash();
            data.recover().unwrap();
            fast.recover().unwrap();
        }
    }
    struck
}

#[test]
fn grouped_pages_take_consecutive_blocks_and_deferred_trims_wait() {
    let (data, _fast, store) = new_store(4096);
    let store = store.with_trim_policy(TrimPolicy::Deferred);
    let chunk = ChunkId(0);
    // Every block of every image holds data (the memory device does not map zero blocks).
    let image = |page: PageNo, tag: u64| {
        let mut image = raw_image(chunk, page, tag);
        Rng::new(tag).fill(&mut image.bytes[64..]);
        image.checksum = page_checksum(chunk, page, &image.bytes);
        image
    };
    let images = |pages: std::ops::Range<u32>, tag: u64| -> StoreCommand {
        let pages =
            pages.map(|p| PagePut { page: PageNo(p), image: image(PageNo(p), tag + u64::from(p)), lsn: Lsn(tag) });
        StoreCommand::PutPages { chunk, pages: pages.collect() }
    };
    store.apply(&images(0..8, 100)).unwrap();
    let lbas: Vec<u64> = (0..8).map(|p| store.entry(chunk, PageNo(p)).unwrap().run.first_lba().0).collect();
    for pair in lbas.windows(2) {
        assert_eq!(pair[1], pair[0] + 4, "16 KiB raw pages written together lie back to back: {lbas:?}");
    }
    let page_bytes = PAGE as u64;
    assert_eq!(data.usage().mapped_bytes, 8 * page_bytes);
    // The runs a rewrite lets go of stay mapped...
    store.apply(&images(0..4, 200)).unwrap();
    store.release_freed().unwrap();
    assert_eq!(data.usage().mapped_bytes, 12 * page_bytes);
    // ...and the next rewrite reuses them (first fit). The second extent, empty again, goes
    // back to the device allocator untrimmed.
    store.apply(&images(0..4, 300)).unwrap();
    assert_eq!(store.entry(chunk, PageNo(0)).unwrap().run.first_lba().0, lbas[0]);
    store.release_freed().unwrap();
    assert_eq!(store.stats().extents_in_use, 1);
    assert_eq!(data.usage().mapped_bytes, 12 * page_bytes);
    for p in 0..8 {
        assert_eq!(tag_of(&store, chunk, PageNo(p)), Some(if p < 4 { 300 } else { 100 } + u64::from(p)));
    }
    // Trimmed pages free their blocks without trimming them; a check's trim of unused
    // blocks, or deleting the volume, does.
    store.trim_page(chunk, PageNo(7)).unwrap();
    store.release_freed().unwrap();
    assert_eq!(data.usage().mapped_bytes, 12 * page_bytes);
    store.trim_unused().unwrap();
    assert_eq!(data.usage().mapped_bytes, 7 * page_bytes);
    store.delete_volume(VolumeId(0)).unwrap();
    assert_eq!(data.usage().mapped_bytes, 0);
    assert_eq!(store.stats().extents_in_use, 0);
}

#[test]
fn volumes_are_created_resized_deleted_and_survive_reopen() {
    let (data, fast, store) = new_store(4096);
    let wal = Volume {
        id: VolumeId(2),
        name: "wal".into(),
        size_bytes: 1 << 20,
        page_size: 16384,
        chunk_bytes: 1 << 20,
        mode: VolumeMode::None,
    };
    store.create_volume(wal.clone()).unwrap();
    let wal_chunk = ChunkId::new(VolumeId(2), 0);
    store.apply_write(wal_chunk, PageNo(5), &raw_image(wal_chunk, PageNo(5), 55), Lsn(1)).unwrap();
    let compressed = PageImage { encoding: Encoding::Lz4, bytes: vec![1; 100], checksum: 0 };
    assert_eq!(store.apply_write(wal_chunk, PageNo(6), &compressed, Lsn(1)).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(
        store.apply_write(wal_chunk, PageNo(64), &raw_image(wal_chunk, PageNo(64), 1), Lsn(1)).unwrap_err().kind(),
        ErrorKind::Invalid,
        "past the end"
    );
    store.resize_volume(VolumeId(2), 2 << 20).unwrap();
    let second = ChunkId::new(VolumeId(2), 1);
    store.apply_write(second, PageNo(0), &raw_image(second, PageNo(0), 66), Lsn(1)).unwrap();
    assert_eq!(store.resize_volume(VolumeId(2), 1 << 20).unwrap_err().kind(), ErrorKind::Invalid);
    let data_chunk = ChunkId(0);
    store.apply_write(data_chunk, PageNo(1), &raw_image(data_chunk, PageNo(1), 11), Lsn(1)).unwrap();
    drop(store);
    let store = open_store(data.clone(), fast.clone());
    assert_eq!(store.volume(VolumeId(2)).unwrap().size_bytes, 2 << 20);
    assert_eq!(tag_of(&store, second, PageNo(0)), Some(66));
    assert_eq!(tag_of(&store, wal_chunk, PageNo(5)), Some(55));
    let extents_before = store.stats().extents_in_use;
    store.delete_volume(VolumeId(2)).unwrap();
    assert!(store.stats().extents_in_use < extents_before, "the volume's extents came back");
    assert_eq!(store.stats().pages, 1);
    assert!(store.read_image(wal_chunk, PageNo(5)).unwrap().is_none());
    drop(store);
    let store = open_store(data, fast);
    assert!(store.volume(VolumeId(2)).is_none());
    assert_eq!(tag_of(&store, data_chunk, PageNo(1)), Some(11));
    assert_eq!(store.volumes().len(), 1);
}

/// (LBA, position) of the journal's log blocks of the newest epoch, read from their headers.
fn newest_log_blocks(fast: &MemDevice) -> Vec<(u64, u64)> {
    let first = 2 + 2 * JOURNAL.checkpoint_blocks;
    let mut found = Vec::new();
    let mut block = vec![0u8; BLOCK_SIZE];
    for lba in first..first + JOURNAL.log_blocks {
        fast.read(Lba(lba), &mut block).unwrap();
        if u32::from_le_bytes(block[..4].try_into().unwrap()) == 0x544a_4c42 {
            let field = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().unwrap());
            found.push((field(16), lba, field(8)));
        }
    }
    let newest = found.iter().map(|f| f.0).max().unwrap();
    found.into_iter().filter(|f| f.0 == newest).map(|f| (f.1, f.2)).collect()
}

/// The scenario at the store: pages written, a restart, every seventh page rewritten,
/// a stop without a checkpoint (as kill -9 leaves it), then one bit flipped in a log block the
/// second session wrote. The store refuses naming the block; accepting the loss opens it, and
/// every page reads its latest contents, an older one (only as the repair reported a loss) or
/// an error: never wrong bytes.
#[test]
fn a_damaged_log_block_is_refused_and_accepting_the_loss_gives_no_wrong_data() {
    let (data, fast, store) = new_store(4096);
    let chunk = ChunkId(2);
    for page in 0..60u32 {
        store.apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), u64::from(page)), Lsn(1)).unwrap();
    }
    drop(store);
    let store = open_store(data.clone(), fast.clone());
    let mut latest: BTreeMap<u32, u64> = (0..60u32).map(|p| (p, u64::from(p))).collect();
    for page in (0..60u32).step_by(7) {
        let tag = 1000 + u64::from(page);
        store.apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), tag), Lsn(2)).unwrap();
        latest.insert(page, tag);
    }
    drop(store);
    let (lba, position) = newest_log_blocks(&fast)[0];
    let mut block = vec![0u8; BLOCK_SIZE];
    fast.read(Lba(lba), &mut block).unwrap();
    block[200] ^= 4;
    fast.write(Lba(lba), &block).unwrap();

    let error = Store::open(data.clone(), fast.clone()).err().expect("a damaged log is refused");
    assert_eq!(error.kind(), ErrorKind::Corrupted);
    assert!(error.message().contains(&format!("position {position} (LBA {lba})")), "{error}");
    let options = OpenOptions { accept_loss: true, ..OpenOptions::default() };
    let store = Store::open_with(data.clone(), fast.clone(), &options).unwrap();
    let lost = store.recovery().lost.clone().expect("the repair reports what it dropped");
    assert_eq!(lost.position, crate::journal::LogPosition(position));
    for (&page, &tag) in &latest {
        match store.read_image(chunk, PageNo(page)) {
            Ok(Some((entry, bytes))) if page_checksum(chunk, PageNo(page), &bytes) == entry.checksum => {
                let got = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                assert!(got == tag || got == u64::from(page), "page {page}: {got}, never written");
            }
            Ok(other) => panic!("page {page}: {other:?} is not an error"),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupted),
        }
    }
    drop(store);
    let store = Store::open(data, fast).expect("the repaired journal opens without damage");
    assert!(store.recovery().notes.is_empty() && store.recovery().lost.is_none());
}

/// A journal record whose checksum verifies but whose stored length its block run cannot hold:
/// the store opens, that page reads as a corruption error (never a slice panic, never zeros),
/// the others serve, checkpoints keep the damage, and a rewrite heals it.
#[test]
fn a_record_with_an_impossible_stored_length_leaves_only_its_page_unreadable() {
    let (data, fast, store) = new_store(1024);
    let chunk = ChunkId(1);
    for page in 0..4u32 {
        store.apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), u64::from(page)), Lsn(1)).unwrap();
    }
    let bad = PageEntry { stored_len: 60_000, ..store.entry(chunk, PageNo(1)).unwrap() };
    store.journal.commit(&[Record::PageSet { chunk, page: PageNo(1), entry: bad }]).unwrap();
    drop(store);
    for _reopen in 0..2 {
        let store = open_store(data.clone(), fast.clone());
        let error = store.read_image(chunk, PageNo(1)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupted);
        assert!(error.message().contains("journal record is damaged"), "{error}");
        assert_eq!(tag_of(&store, chunk, PageNo(2)), Some(2));
        assert_eq!(store.damaged_pages().len(), 1);
    }
    let store = open_store(data.clone(), fast.clone());
    store.apply_write(chunk, PageNo(1), &raw_image(chunk, PageNo(1), 11), Lsn(2)).unwrap();
    assert_eq!(tag_of(&store, chunk, PageNo(1)), Some(11));
    drop(store);
    let store = open_store(data, fast);
    assert!(store.damaged_pages().is_empty());
    assert_eq!(tag_of(&store, chunk, PageNo(1)), Some(11));
}

/// The store's corruption test catches the bug it guards against: with recovery treating a
/// checksum failure as the end of the log, the damaged store opens and rolls pages back.
#[test]
fn the_store_oracle_fails_when_damage_ends_the_log() {
    let (data, fast, store) = new_store(1024);
    let chunk = ChunkId(0);
    store.apply_write(chunk, PageNo(0), &raw_image(chunk, PageNo(0), 1), Lsn(1)).unwrap();
    drop(store);
    let store = open_store(data.clone(), fast.clone());
    store.apply_write(chunk, PageNo(0), &raw_image(chunk, PageNo(0), 2), Lsn(2)).unwrap();
    drop(store);
    let (lba, _) = newest_log_blocks(&fast)[0];
    let mut block = vec![0u8; BLOCK_SIZE];
    fast.read(Lba(lba), &mut block).unwrap();
    block[300] ^= 1;
    fast.write(Lba(lba), &block).unwrap();
    crate::journal::set_damage_ends_log(true);
    let opened = Store::open(data, fast);
    crate::journal::set_damage_ends_log(false);
    let store = opened.expect("with the bug injected the damage goes unnoticed");
    assert_eq!(tag_of(&store, chunk, PageNo(0)), Some(1), "and the acknowledged write is rolled back");
}

/// The invariant check catches the bugs it guards against: a block marked in use that no page
/// holds (a leak), a page's block marked free (a double allocation waiting to happen), and an
/// extent owned by no chunk that a chunk uses.
#[test]
fn the_invariant_check_catches_a_leak_a_lost_block_and_a_stray_extent() {
    let (_data, _fast, store) = new_store(1024);
    let chunk = ChunkId(0);
    for page in 0..6 {
        store.apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), 1), Lsn(1)).unwrap();
    }
    store.trim_page(chunk, PageNo(2)).unwrap();
    store.release_freed().unwrap();
    store.check_invariants().expect("a consistent store");
    let run = store.entry(chunk, PageNo(4)).unwrap().run;

    store.state.lock().chunks.get_mut(&chunk).unwrap().blocks.free(run);
    let problem = store.check_invariants().expect_err("a page's blocks marked free");
    assert!(problem.contains("blocks in use"), "{problem}");
    store.state.lock().chunks.get_mut(&chunk).unwrap().blocks.mark_used(run);
    store.check_invariants().expect("repaired");

    let leaked = store.state.lock().chunks.get_mut(&chunk).unwrap().blocks.allocate(1).unwrap();
    let problem = store.check_invariants().expect_err("a leaked block");
    assert!(problem.contains("blocks in use"), "{problem}");
    store.state.lock().chunks.get_mut(&chunk).unwrap().blocks.free(leaked);

    let extent = run.extent;
    store.state.lock().extents.release(extent, chunk);
    let problem = store.check_invariants().expect_err("an extent released while in use");
    assert!(problem.contains("owned by"), "{problem}");
}

/// Volume ids are never reused: not after a delete, a checkpoint that no longer names the
/// volume, or a reopen; the log alone raises the floor too.
#[test]
fn volume_ids_are_never_reused_across_deletes_checkpoints_and_reopens() {
    let (data, fast, store) = new_store(4096);
    let volume = |id: u32, name: &str| Volume { id: VolumeId(id), name: name.into(), ..test_volume(PAGE) };
    assert_eq!(store.next_volume_id(), VolumeId(1), "test volume 0 exists");
    store.create_volume(volume(5, "victim")).unwrap();
    store.delete_volume(VolumeId(5)).unwrap();
    assert_eq!(store.next_volume_id(), VolumeId(6));
    let reused = store.create_volume(volume(5, "secret")).unwrap_err();
    assert!(reused.message().contains("never reused"), "{reused}");
    // The checkpoint no longer names volume 5: only the floor remembers it.
    store.checkpoint().unwrap();
    drop(store);
    let store = open_store(data.clone(), fast.clone());
    assert_eq!(store.next_volume_id(), VolumeId(6), "the floor survives a checkpoint and reopen");
    assert!(store.create_volume(volume(5, "secret")).is_err());
    store.create_volume(volume(6, "secret")).unwrap();
    // The log alone (no checkpoint since) raises the floor too.
    store.create_volume(volume(9, "third")).unwrap();
    store.delete_volume(VolumeId(9)).unwrap();
    drop(store);
    let store = open_store(data, fast);
    assert_eq!(store.next_volume_id(), VolumeId(10));
}

/// Pages read together: each gets its own image, in the order asked, whatever the order and
/// the gaps; images whose runs follow one another take one device read; a page never written
/// reads as none; an image still waiting for its run is read from memory.
#[test]
fn pages_read_together_get_their_own_images_in_few_device_reads() {
    let chunk = ChunkId(0);
    let data = Arc::new(FaultyDevice::new(MemDevice::new(1024), 1));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    // Written to their runs at once, so that the device holds every image.
    let store = open_store(data.clone(), fast.clone()).with_write_behind(false);
    // Pages 0 to 7 in one command: consecutive runs. Page 20 alone, later.
    let pages: Vec<PagePut> = (0..8)
        .map(|p| PagePut { page: PageNo(p), image: raw_image(chunk, PageNo(p), 100 + u64::from(p)), lsn: Lsn(1) })
        .collect();
    store.apply(&StoreCommand::PutPages { chunk, pages }).unwrap();
    store.apply_write(chunk, PageNo(20), &raw_image(chunk, PageNo(20), 120), Lsn(2)).unwrap();
    let runs: Vec<u64> = (0..8).map(|p| store.entry(chunk, PageNo(p)).unwrap().run.first_lba().0).collect();
    assert!(runs.windows(2).all(|w| w[1] == w[0] + 4), "pages written together take consecutive runs: {runs:?}");
    let tags = |store: &Store, asked: &[u32]| -> Vec<Option<u64>> {
        let wanted: Vec<PageNo> = asked.iter().map(|&p| PageNo(p)).collect();
        store
            .read_images(chunk, &wanted)
            .unwrap()
            .into_iter()
            .zip(&wanted)
            .map(|(image, &page)| {
                image.map(|(entry, bytes)| {
                    assert_eq!(page_checksum(chunk, page, &bytes), entry.checksum, "page {page:?} fails its checksum");
                    u64::from_le_bytes(bytes[..8].try_into().unwrap())
                })
            })
            .collect()
    };
    let before = data.stats().reads;
    assert_eq!(tags(&store, &[0, 1, 2, 3, 4, 5, 6, 7]), (100..108).map(Some).collect::<Vec<_>>());
    assert_eq!(data.stats().reads - before, 1, "eight consecutive runs in one device read");
    let before = data.stats().reads;
    assert_eq!(tags(&store, &[7, 3, 20, 9, 2, 6]), vec![Some(107), Some(103), Some(120), None, Some(102), Some(106)]);
    // Runs 2 and 3 touch, 6 and 7 touch, and page 20's run follows page 7's when the
    // allocator gave it the next blocks: two reads, or three.
    let page_20 = store.entry(chunk, PageNo(20)).unwrap().run.first_lba().0;
    let expected = if page_20 == runs[7] + 4 { 2 } else { 3 };
    assert_eq!(data.stats().reads - before, expected);
    // A page rewritten with write-behind: its image waits in memory, and the batch reads it.
    let store = store.with_write_behind(true);
    store.apply_write(chunk, PageNo(4), &raw_image(chunk, PageNo(4), 204), Lsn(3)).unwrap();
    assert!(store.unwritten_images() > 0, "the rewrite's image waits for its run");
    assert_eq!(tags(&store, &[3, 4, 5]), vec![Some(103), Some(204), Some(105)]);
    store.write_unwritten().unwrap();
    assert_eq!(tags(&store, &[5, 4, 3]), vec![Some(105), Some(204), Some(103)]);
}
