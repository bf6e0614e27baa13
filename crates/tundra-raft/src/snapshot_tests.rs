//! A chunk's snapshot end to end without Raft: captured on one store, pushed in pieces over a
//! link that drops or corrupts pieces, staged, resumed, installed on another store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tundra_device::mem::MemDevice;
use tundra_env::Rng;
use tundra_store::command::{HeavyPage, PagePut, StoreCommand};
use tundra_store::ids::{ChunkId, Lsn, PageNo, VolumeId};
use tundra_store::index::Encoding;
use tundra_store::journal::{Journal, JournalGeometry};
use tundra_store::store::{ChunkImage, PageImage, Store};
use tundra_store::volume::{Volume, VolumeMode};

use crate::network::{Call, Envelope, Link, Reply, Rpc, Transport, push_extents};
use crate::snapshot::{CaptureError, Manifest, PIECE_BYTES, Precopy, SnapshotBug, SnapshotFiles};

const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 512 };
const CHUNK: ChunkId = ChunkId(1 << 32);

fn store() -> Store {
    let data = Arc::new(MemDevice::new(32_768));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = Store::open(data, fast).unwrap();
    let volume = Volume {
        id: VolumeId(1),
        name: "v".into(),
        size_bytes: 256 << 20,
        page_size: 8192,
        chunk_bytes: 128 << 20,
        mode: VolumeMode::Normal,
    };
    store.create_volume(volume).unwrap();
    store
}

/// `pages` compressed-looking pages of 200 to 3,000 bytes, then `segments` heavy segments of
/// 32 pages (the store decodes neither when it stores or moves them).
fn fill(store: &Store, seed: u64, pages: u32, segments: u32) {
    assert_eq!(CHUNK, ChunkId::new(VolumeId(1), 0));
    let mut rng = Rng::new(seed);
    for start in (0..pages).step_by(500) {
        let mut puts = Vec::new();
        for page in start..pages.min(start + 500) {
            let len = 200 + rng.below(2800) as usize;
            let image = PageImage { encoding: Encoding::Zstd, bytes: rng.bytes(len), checksum: page };
            puts.push(PagePut { page: PageNo(page), image, lsn: Lsn(u64::from(page) + 1) });
        }
        store.apply(&StoreCommand::PutPages { chunk: CHUNK, pages: puts }).unwrap();
    }
    for s in 0..segments {
        let len = 4000 + rng.below(40_000) as usize;
        let frame = rng.bytes(len);
        let mut segment = (frame.len() as u32).to_le_bytes().to_vec();
        segment.extend_from_slice(&32u16.to_le_bytes());
        segment.extend_from_slice(&[0; 10]);
        segment.extend_from_slice(&frame);
        let first = pages + 32 * s;
        // The segment's pages written first at the version it names (a segment takes only
        // pages still at it).
        let puts = (0..32)
            .map(|i| {
                let image = PageImage { encoding: Encoding::Zstd, bytes: rng.bytes(300), checksum: i };
                PagePut { page: PageNo(first + i), image, lsn: Lsn(9) }
            })
            .collect();
        store.apply(&StoreCommand::PutPages { chunk: CHUNK, pages: puts }).unwrap();
        let heavy = (0..32).map(|i| HeavyPage { page: PageNo(first + i), checksum: i, lsn: Lsn(9) }).collect();
        store.apply(&StoreCommand::PutHeavy { chunk: CHUNK, pages: heavy, segment }).unwrap();
    }
}

type Content = BTreeMap<u32, (Encoding, u16, u32, u64, Vec<u8>)>;

fn content(store: &Store) -> Content {
    let mut all = BTreeMap::new();
    for (page, _) in store.chunk_entries(CHUNK) {
        let (e, bytes) = store.read_image(CHUNK, page).unwrap().unwrap();
        all.insert(page.0, (e.encoding, e.stored_len, e.checksum, e.lsn.0, bytes));
    }
    all
}

/// A link to a receiver's snapshot files that can drop every piece after some number, or
/// corrupt one piece in flight; it counts the extent bytes it carried.
struct TestLink {
    receiver: Arc<SnapshotFiles>,
    pieces: AtomicU64,
    bytes: AtomicU64,
    cut_after: Mutex<Option<u64>>,
    corrupt: Mutex<Option<u64>>,
}

impl TestLink {
    fn new(receiver: Arc<SnapshotFiles>) -> Arc<TestLink> {
        Arc::new(TestLink {
            receiver,
            pieces: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            cut_after: Mutex::new(None),
            corrupt: Mutex::new(None),
        })
    }
}

impl Transport for TestLink {
    fn call(&self, envelope: Envelope) -> Call {
        let Rpc::SnapshotPiece { snapshot_id, total, offset, mut data, crc } = envelope.rpc else {
            return Box::pin(async { Err("not a piece".to_string()) });
        };
        if !data.is_empty() {
            let n = self.pieces.fetch_add(1, Ordering::SeqCst);
            if self.cut_after.lock().is_some_and(|cut| n >= cut) {
                return Box::pin(async { Err("the link dropped".to_string()) });
            }
            self.bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
            if *self.corrupt.lock() == Some(n) {
                data[7] ^= 0x20;
            }
        }
        let held = self.receiver.receive_piece(envelope.group, &snapshot_id, total, offset, &data, crc);
        Box::pin(async move { Ok(Reply::Piece(held)) })
    }
}

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

fn push(link: &Arc<TestLink>, sender: &SnapshotFiles, id: &str) -> Result<u64, String> {
    let link_ref = Link { transport: link.as_ref(), from: 1, to: 2, group: CHUNK };
    run(push_extents(&link_ref, sender, id))
}

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("tundra-snapshot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ID: &str = "n1-t1.1-i100";

/// The check of a capture whose images are all good (these stores' images are random bytes,
/// not pages a codec decodes).
fn sound(_: &ChunkImage) -> tundra_store::Result<()> {
    Ok(())
}

/// Pages that fail the capture's check are all listed, the capture gives no extents, and a
/// capture told to take them as stored gives the whole chunk.
#[test]
fn a_capture_lists_every_bad_page_and_keeps_no_extents() {
    let dir = TempDir::new("bad-pages");
    let source = store();
    fill(&source, 14, 300, 2);
    let files = SnapshotFiles::in_dir(dir.0.join("sender")).unwrap();
    // Three pages and the second heavy segment (named by its first page, 332).
    let bad_pages = [7u32, 150, 299, 332];
    let check = |image: &ChunkImage| {
        let page = match image {
            ChunkImage::Page(put) => put.page.0,
            ChunkImage::Heavy { pages, .. } => pages[0].page.0,
        };
        if bad_pages.contains(&page) {
            Err(tundra_store::Error::corrupted(format!("page {page} fails its checksum")))
        } else {
            Ok(())
        }
    };
    match files.capture(&source, (CHUNK, ID), b"mark".to_vec(), &check, None) {
        Err(CaptureError::BadPages(bad)) => {
            let pages: Vec<u32> = bad.iter().map(|b| b.page.0).collect();
            assert_eq!(pages, bad_pages, "every bad page, in page order");
            assert!(bad.iter().all(|b| b.readable && b.why.contains("checksum")), "{bad:?}");
        }
        other => panic!("a capture with bad pages answered {:?}", other.map(|m| m.images.len())),
    }
    assert_eq!(files.extents_len(CHUNK, ID).unwrap(), 0, "a failed capture left extents to send");
    let left = std::fs::read_dir(dir.0.join("sender")).unwrap().count();
    assert_eq!(left, 0, "a failed capture left a file behind");
    let manifest = files.capture(&source, (CHUNK, ID), b"mark".to_vec(), &sound, None).unwrap();
    assert_eq!(manifest.images.len(), 300 + 2, "every page and both segments");
}

/// A source chunk captured on disk; answers the source, its files and the manifest's bytes.
fn captured(dir: &TempDir, pages: u32, segments: u32) -> (Store, SnapshotFiles, Vec<u8>) {
    let source = store();
    fill(&source, 14, pages, segments);
    let files = SnapshotFiles::in_dir(dir.0.join("sender")).unwrap();
    let manifest = files.capture(&source, (CHUNK, ID), b"mark".to_vec(), &sound, None).unwrap();
    (source, files, manifest.encode())
}

#[test]
fn a_chunk_of_heavy_segments_and_thousands_of_pages_moves_byte_identical() {
    let dir = TempDir::new("whole");
    let (source, sender, manifest) = captured(&dir, 4000, 8);
    let total = sender.extents_len(CHUNK, ID).unwrap();
    assert!(total > 3 * PIECE_BYTES as u64, "several pieces: {total} bytes");
    let receiver = Arc::new(SnapshotFiles::in_dir(dir.0.join("receiver")).unwrap());
    let link = TestLink::new(receiver.clone());
    assert_eq!(push(&link, &sender, ID).unwrap(), total);
    let target = store();
    fill(&target, 99, 5000, 0);
    receiver.install(&target, CHUNK, ID, &manifest).unwrap();
    assert!(content(&target) == content(&source), "the chunk moved is not byte-identical");
    assert_eq!(target.chunk_mark(CHUNK).as_deref(), Some(&b"mark"[..]));
    target.check_invariants().unwrap();
    // Only the stored images travel: the extents are the chunk's stored bytes, heavy segments
    // once each, never recompressed.
    let stored: u64 = Manifest::decode(&manifest).unwrap().images.iter().map(|line| u64::from(line.len)).sum();
    assert_eq!(stored, total);
}

/// Cuts the link after two pieces, restarts the receiver's files (a new process) and pushes
/// again: the second push sends only what had not arrived. Answers the extent bytes the link
/// carried in all, and the extents' size.
fn cut_and_resume(bug: SnapshotBug) -> (u64, u64) {
    let dir = TempDir::new(&format!("resume-{bug:?}"));
    let (source, sender, manifest) = captured(&dir, 4000, 4);
    sender.set_bug(bug);
    let total = sender.extents_len(CHUNK, ID).unwrap();
    let receiver = Arc::new(SnapshotFiles::in_dir(dir.0.join("receiver")).unwrap());
    let link = TestLink::new(receiver);
    *link.cut_after.lock() = Some(2);
    assert!(push(&link, &sender, ID).is_err(), "the cut link fails the first push");
    let receiver = Arc::new(SnapshotFiles::in_dir(dir.0.join("receiver")).unwrap());
    let target = store();
    assert!(receiver.install(&target, CHUNK, ID, &manifest).is_err(), "installed before every piece arrived");
    let resumed = TestLink::new(receiver.clone());
    push(&resumed, &sender, ID).unwrap();
    receiver.install(&target, CHUNK, ID, &manifest).unwrap();
    assert!(content(&target) == content(&source));
    (link.bytes.load(Ordering::SeqCst) + resumed.bytes.load(Ordering::SeqCst), total)
}

#[test]
fn a_transfer_cut_half_way_resumes_without_sending_again() {
    let (carried, total) = cut_and_resume(SnapshotBug::None);
    assert_eq!(carried, total, "bytes that had arrived were sent again");
}

/// The resumption oracle catches a sender that starts over from the first byte.
#[test]
fn the_resume_oracle_fails_on_a_sender_that_starts_over() {
    let (carried, total) = cut_and_resume(SnapshotBug::ResumeFromZero);
    assert!(carried > total, "a transfer that started over carried only {carried} of {total} bytes");
}

/// Corrupts the second piece in flight: it must be refused and sent again, and the chunk
/// installed byte-identical. Panics if it is not.
fn corrupt_piece(bug: SnapshotBug) {
    let dir = TempDir::new(&format!("corrupt-{bug:?}"));
    let (source, sender, manifest) = captured(&dir, 3000, 2);
    let total = sender.extents_len(CHUNK, ID).unwrap();
    let receiver = Arc::new(SnapshotFiles::in_dir(dir.0.join("receiver")).unwrap());
    receiver.set_bug(bug);
    let link = TestLink::new(receiver.clone());
    *link.corrupt.lock() = Some(1);
    push(&link, &sender, ID).unwrap();
    let carried = link.bytes.load(Ordering::SeqCst);
    let target = store();
    let before = content(&target);
    let installed = receiver.install(&target, CHUNK, ID, &manifest);
    if installed.is_err() {
        assert!(content(&target) == before, "a refused install changed the chunk");
    }
    installed.unwrap();
    assert!(content(&target) == content(&source));
    assert_eq!(carried, total + PIECE_BYTES as u64, "exactly the corrupted piece is sent again");
}

#[test]
fn a_corrupted_piece_is_refused_and_sent_again() {
    corrupt_piece(SnapshotBug::None);
}

/// The oracle catches a receiver that stages pieces without checking them.
#[test]
fn the_piece_oracle_fails_when_the_receiver_skips_the_checksum() {
    let verdict = std::panic::catch_unwind(|| corrupt_piece(SnapshotBug::SkipPieceChecksum));
    assert!(verdict.is_err(), "a corrupted piece was staged and went unnoticed");
}

#[test]
fn a_piece_of_another_snapshot_discards_the_stage() {
    let dir = TempDir::new("other");
    let (_, sender, _) = captured(&dir, 2000, 0);
    let receiver = Arc::new(SnapshotFiles::in_dir(dir.0.join("receiver")).unwrap());
    let link = TestLink::new(receiver.clone());
    *link.cut_after.lock() = Some(1);
    assert!(push(&link, &sender, ID).is_err());
    let held = receiver.receive_piece(CHUNK, "n1-t2.1-i200", 10, 0, &[], 0).unwrap();
    assert_eq!(held, 0, "a new snapshot id starts an empty stage");
    assert_eq!(std::fs::read_dir(dir.0.join("receiver")).unwrap().count(), 0, "the old stage is removed");
}

#[test]
fn a_damaged_manifest_is_refused() {
    let dir = TempDir::new("manifest");
    let (_, _, manifest) = captured(&dir, 300, 1);
    assert!(Manifest::decode(&manifest).is_ok());
    let mut rng = Rng::new(1);
    for _ in 0..200 {
        let mut bad = manifest.clone();
        let at = rng.below(bad.len() as u64) as usize;
        bad[at] ^= 1 << rng.below(8);
        assert!(Manifest::decode(&bad).is_err(), "a flipped bit at {at} went unnoticed");
        assert!(Manifest::decode(&manifest[..at]).is_err(), "a manifest cut at {at} decoded");
    }
}

/// Moves a chunk of about `TUNDRA_SNAPSHOT_MIB` MiB of stored images (default 4: the tiny
/// version in the default tests) through capture, pieces and install, and prints what it sent
/// against the chunk's stored size and how long each step took (bench/results/
/// 2026-11-28-snapshot).
#[test]
fn measure_a_chunk_move() {
    let mib: u32 = std::env::var("TUNDRA_SNAPSHOT_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let pages = mib * 1024 * 1024 / 1700;
    let segments = mib;
    let dir = TempDir::new("measure");
    let source = store();
    fill(&source, 7, pages, segments);
    let stored_blocks = source.stats().stored_bytes;
    let start = std::time::Instant::now();
    let sender = SnapshotFiles::in_dir(dir.0.join("sender")).unwrap();
    let manifest = sender.capture(&source, (CHUNK, ID), b"mark".to_vec(), &sound, None).unwrap().encode();
    let captured = start.elapsed();
    let receiver = Arc::new(SnapshotFiles::in_dir(dir.0.join("receiver")).unwrap());
    let link = TestLink::new(receiver.clone());
    let start = std::time::Instant::now();
    let sent = push(&link, &sender, ID).unwrap();
    let pushed = start.elapsed();
    let target = store();
    let start = std::time::Instant::now();
    receiver.install(&target, CHUNK, ID, &manifest).unwrap();
    let installed = start.elapsed();
    assert!(content(&target) == content(&source));
    let images: u64 = Manifest::decode(&manifest).unwrap().images.iter().map(|l| u64::from(l.len)).sum();
    let carried = link.bytes.load(Ordering::SeqCst);
    let total = captured + pushed + installed;
    println!(
        "pages={} heavy_segments={segments} stored_image_bytes={images} stored_block_bytes={stored_blocks} \
         extent_bytes_sent={sent} link_bytes={carried} manifest_bytes={} sent_per_stored_image={:.4} \
         sent_per_stored_blocks={:.4} capture_ms={:.1} push_ms={:.1} install_ms={:.1} total_ms={:.1} mib_per_s={:.1}",
        pages + 32 * segments,
        manifest.len(),
        (sent + manifest.len() as u64) as f64 / images as f64,
        (sent + manifest.len() as u64) as f64 / stored_blocks as f64,
        captured.as_secs_f64() * 1e3,
        pushed.as_secs_f64() * 1e3,
        installed.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
        images as f64 / (1 << 20) as f64 / total.as_secs_f64(),
    );
    assert_eq!(sent, images, "the extents are the stored images, nothing more");
}

/// A capture given images read ahead ([`Precopy`]) after pages changed since: the pages written
/// since are read again, and the capture is byte for byte what one without images read ahead
/// gives. `any_entry` is the twin: an image serves its page whatever its entry.
fn captured_ahead(any_entry: bool) -> Ahead {
    let dir = TempDir::new(if any_entry { "ahead-twin" } else { "ahead" });
    let source = store();
    fill(&source, 15, 300, 2);
    let ahead = Precopy::default();
    ahead.set_any_entry(any_entry);
    ahead.fill(&source, CHUNK, &sound);
    assert!(ahead.is_done() && ahead.len() == 302, "read ahead {} images", ahead.len());
    // Pages 10 to 19 written again and page 40 trimmed after they were read ahead.
    let puts = (10..20u32)
        .map(|page| {
            let image = PageImage { encoding: Encoding::Zstd, bytes: vec![page as u8; 900], checksum: page + 7 };
            PagePut { page: PageNo(page), image, lsn: Lsn(1_000 + u64::from(page)) }
        })
        .collect();
    source.apply(&StoreCommand::PutPages { chunk: CHUNK, pages: puts }).unwrap();
    source.apply(&StoreCommand::TrimPages { chunk: CHUNK, pages: vec![PageNo(40)] }).unwrap();
    let files = SnapshotFiles::in_dir(dir.0.join("sender")).unwrap();
    // A capture drops the group's other extents: each is read before the next.
    let bytes = |id: &str| {
        let len = files.extents_len(CHUNK, id).unwrap();
        files.extents_piece(CHUNK, id, 0, len as usize).unwrap()
    };
    let with = files.capture(&source, (CHUNK, "with"), b"mark".to_vec(), &sound, Some(&ahead)).unwrap();
    let with_bytes = bytes("with");
    let without = files.capture(&source, (CHUNK, "without"), b"mark".to_vec(), &sound, None).unwrap();
    Ahead { manifests: (with, without), extents: (with_bytes, bytes("without")), unused: ahead.len() - ahead.served() }
}

/// Two captures of the same chunk, with images read ahead and without, and how many images
/// read ahead the first left unused.
struct Ahead {
    manifests: (Manifest, Manifest),
    extents: (Vec<u8>, Vec<u8>),
    unused: usize,
}

#[test]
fn a_capture_reads_again_only_what_changed_since_it_was_read_ahead() {
    let ahead = captured_ahead(false);
    assert_eq!(ahead.manifests.0, ahead.manifests.1, "the manifests differ");
    assert!(ahead.extents.0 == ahead.extents.1, "the extents differ");
    // The ten pages written since and the trimmed one were left; every other image served.
    assert_eq!(ahead.unused, 11, "images read ahead left unused");
    // The twin: stale images serve pages written since, and the capture is not the chunk's.
    let twin = captured_ahead(true);
    assert_ne!(twin.manifests.0, twin.manifests.1, "a capture from stale images went unnoticed");
}
