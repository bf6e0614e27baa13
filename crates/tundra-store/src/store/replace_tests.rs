//! A chunk replaced whole from another replica's images (a snapshot): plain pages and heavy
//! segments arrive byte-identical, and a crash at any write leaves the chunk as it was or as
//! sent, never a mix.

use std::collections::BTreeMap;

use tundra_device::fault::FaultyDevice;
use tundra_device::mem::MemDevice;
use tundra_env::Rng;

use super::*;
use crate::command::{HeavyPage, PagePut, StoreCommand};
use crate::ids::Lsn;
use crate::journal::JournalGeometry;

const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 256 };
const PAGE: u32 = 8192;

fn volume() -> Volume {
    Volume {
        id: VolumeId(1),
        name: "v".into(),
        size_bytes: 256 << 20,
        page_size: PAGE,
        chunk_bytes: 64 << 20,
        mode: VolumeMode::Normal,
    }
}

fn store_on(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>) -> Store {
    let store = Store::open(data, fast).unwrap();
    if store.volume(VolumeId(1)).is_none() {
        store.create_volume(volume()).unwrap();
    }
    store
}

fn new_store(data_blocks: u64) -> Store {
    let data = Arc::new(MemDevice::new(data_blocks));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    store_on(data, fast)
}

/// A compressed-looking image (the store never decodes one) of 200 to 3,000 bytes.
fn image(rng: &mut Rng, page: u32) -> PagePut {
    let len = 200 + rng.below(2800) as usize;
    let bytes = rng.bytes(len);
    let encoding = if rng.chance(0.5) { Encoding::Lz4 } else { Encoding::Zstd };
    let checksum = rng.below(u64::from(u32::MAX)) as u32;
    PagePut { page: PageNo(page), image: PageImage { encoding, bytes, checksum }, lsn: Lsn(rng.below(1 << 40)) }
}

/// A heavy segment of `pages` consecutive pages from `first`: a header naming its frame and
/// page count, then the frame (random bytes: the store does not decode it on install).
fn heavy(rng: &mut Rng, first: u32, pages: u16) -> StoreCommand {
    let len = 4000 + rng.below(20_000) as usize;
    let frame = rng.bytes(len);
    let mut segment = Vec::new();
    segment.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    segment.extend_from_slice(&pages.to_le_bytes());
    segment.extend_from_slice(&[0, 0]);
    segment.extend_from_slice(&rng.below(u64::MAX).to_le_bytes());
    segment.extend_from_slice(&frame);
    let pages = (0..pages)
        .map(|i| HeavyPage { page: PageNo(first + u32::from(i)), checksum: i.into(), lsn: Lsn(7 + u64::from(i)) })
        .collect();
    StoreCommand::PutHeavy { chunk: ChunkId::new(VolumeId(1), 0), pages, segment }
}

/// Fills chunk 0 of volume 1 with `pages` plain pages and, from page `pages`, `segments` heavy
/// segments of 32 pages, of which a few pages are written again plainly (gaps in segments).
fn fill(store: &Store, rng: &mut Rng, pages: u32, segments: u32) {
    let chunk = ChunkId::new(VolumeId(1), 0);
    for start in (0..pages).step_by(500) {
        let puts = (start..pages.min(start + 500)).map(|p| image(rng, p)).collect();
        store.apply(&StoreCommand::PutPages { chunk, pages: puts }).unwrap();
    }
    for s in 0..segments {
        // The segment's pages are first written at the version it archives (a segment takes
        // only pages still at the checksum and LSN it names).
        let segment = heavy(rng, pages + 32 * s, 32);
        let StoreCommand::PutHeavy { pages: archived, .. } = &segment else { unreachable!("a heavy segment") };
        let puts = archived
            .iter()
            .map(|h| {
                let mut put = image(rng, h.page.0);
                (put.image.checksum, put.lsn) = (h.checksum, h.lsn);
                put
            })
            .collect();
        store.apply(&StoreCommand::PutPages { chunk, pages: puts }).unwrap();
        store.apply(&segment).unwrap();
    }
    if segments > 0 {
        let rewritten = (0..segments).map(|s| image(rng, pages + 32 * s + 3)).collect();
        store.apply(&StoreCommand::PutPages { chunk, pages: rewritten }).unwrap();
    }
}

/// Every page of the chunk: its entry's encoding, stored length, checksum and LSN, and the
/// blocks it reads from (a heavy page's: its segment's).
fn content(store: &Store, chunk: ChunkId) -> BTreeMap<u32, (Encoding, u16, u32, u64, Vec<u8>)> {
    let mut all = BTreeMap::new();
    for (page, _) in store.chunk_entries(chunk) {
        let (e, bytes) = store.read_image(chunk, page).unwrap().unwrap();
        all.insert(page.0, (e.encoding, e.stored_len, e.checksum, e.lsn.0, bytes));
    }
    all
}

/// The chunk's images as a snapshot reads them.
fn images(store: &Store, chunk: ChunkId) -> Vec<ChunkImage> {
    store
        .snapshot_plan(chunk)
        .into_iter()
        .filter_map(|(page, entry, slots)| store.snapshot_image(chunk, page, &entry, slots).unwrap())
        .collect()
}

#[test]
fn a_chunk_of_heavy_segments_and_thousands_of_pages_is_replaced_byte_identical() {
    let chunk = ChunkId::new(VolumeId(1), 0);
    let mut rng = Rng::new(14);
    let source = new_store(16_384);
    fill(&source, &mut rng, 3000, 6);
    let sent = images(&source, chunk);
    assert_eq!(sent.iter().filter(|i| matches!(i, ChunkImage::Heavy { .. })).count(), 6);
    let target = new_store(16_384);
    // Pages the target holds and the snapshot does not name are removed.
    fill(&target, &mut Rng::new(99), 3500, 0);
    target.replace_chunk_images(chunk, &mut sent.into_iter().map(Ok), b"mark").unwrap();
    let expected = content(&source, chunk);
    assert_eq!(expected.len(), 3000 + 6 * 32);
    assert!(content(&target, chunk) == expected, "the target's chunk differs from the source's");
    assert_eq!(target.chunk_mark(chunk).as_deref(), Some(&b"mark"[..]));
    target.check_invariants().unwrap();
}

#[test]
fn a_bad_image_or_a_page_named_twice_changes_nothing() {
    let chunk = ChunkId::new(VolumeId(1), 0);
    let mut rng = Rng::new(3);
    let target = new_store(4096);
    fill(&target, &mut rng, 200, 1);
    let before = content(&target, chunk);
    let free = target.stats();
    let twice = vec![ChunkImage::Page(image(&mut rng, 5)), ChunkImage::Page(image(&mut rng, 5))];
    assert!(target.replace_chunk_images(chunk, &mut twice.into_iter().map(Ok), b"m").is_err());
    let mut torn = vec![ChunkImage::Page(image(&mut rng, 5))];
    torn.push(ChunkImage::Heavy {
        segment: vec![0xff; 100],
        pages: vec![HeavySlot { page: PageNo(9), position: 0, checksum: 0, lsn: Lsn(1) }],
    });
    assert!(target.replace_chunk_images(chunk, &mut torn.into_iter().map(Ok), b"m").is_err());
    let failing = vec![Ok(ChunkImage::Page(image(&mut rng, 5))), Err(Error::invalid("the link dropped"))];
    assert!(target.replace_chunk_images(chunk, &mut failing.into_iter(), b"m").is_err());
    assert!(content(&target, chunk) == before);
    assert_eq!(target.stats(), free, "runs written for a refused snapshot are given back");
    target.check_invariants().unwrap();
}

/// Replaces a chunk of 300 old pages with 500 new ones (a commit of several journal blocks)
/// with power failing after each number of block writes of the journal device, and every
/// seventh of the data device; after recovery the chunk must be wholly old or wholly new.
/// Returns how many crash points left it new.
fn replace_crash_rounds() -> usize {
    let chunk = ChunkId::new(VolumeId(1), 0);
    let sent = {
        let source = new_store(8192);
        fill(&source, &mut Rng::new(5), 500, 2);
        (images(&source, chunk), content(&source, chunk))
    };
    let mut points = Vec::new();
    for k in 0..60 {
        points.push((true, k));
    }
    for k in (0..700).step_by(7) {
        points.push((false, k));
    }
    let mut new = 0;
    for (round, (journal, after)) in points.into_iter().enumerate() {
        let data = Arc::new(FaultyDevice::new(MemDevice::new(8192), round as u64));
        let fast = Arc::new(FaultyDevice::new(MemDevice::new(JOURNAL.total_blocks()), round as u64 + 7000));
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let store = store_on(data.clone(), fast.clone());
        fill(&store, &mut Rng::new(6), 300, 1);
        let old = content(&store, chunk);
        if journal {
            fast.crash_after(after)
        } else {
            data.crash_after(after)
        }
        let _ = store.replace_chunk_images(chunk, &mut sent.0.clone().into_iter().map(Ok), b"new");
        drop(store);
        data.recover().unwrap();
        fast.recover().unwrap();
        let store = store_on(data, fast);
        store.check_invariants().unwrap_or_else(|p| panic!("crash point {round}: {p}"));
        let now = content(&store, chunk);
        if now == sent.1 {
            assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"new"[..]), "crash point {round}");
            new += 1;
        } else {
            let differ = now.iter().filter(|(p, v)| old.get(p) != Some(v)).count();
            assert!(
                now == old,
                "crash point {round}: the chunk is neither as it was nor as sent ({} pages, {} old, {} new, {differ} differ from old)",
                now.len(),
                old.len(),
                sent.1.len()
            );
        }
    }
    new
}

#[test]
fn a_crash_during_a_replace_leaves_the_chunk_old_or_new() {
    let new = replace_crash_rounds();
    assert!(new > 10, "the replacement should often be whole before the crash: {new}");
}

/// The oracle above catches the mix it guards against: without the unit marker, a journal
/// commit torn at a block boundary installs part of the snapshot.
#[test]
fn the_replace_crash_oracle_fails_without_the_unit_marker() {
    replace::set_replace_without_unit(true);
    let verdict = std::panic::catch_unwind(replace_crash_rounds);
    replace::set_replace_without_unit(false);
    assert!(verdict.is_err(), "the crash oracle missed a partly installed snapshot");
}
