//! Replicas and the I/O-free core: the same commands, encoded and decoded as a Raft entry
//! would carry them, applied on two stores whose devices differ give the same logical content
//! with their own block placement; the core alone, driven by random events with no device,
//! keeps its invariants after every step.

use tundra_device::mem::MemDevice;
use tundra_env::{Rng, seed_from_env};

use super::*;
use crate::command::{HeavyPage, PagePut, StoreCommand};
use crate::ids::{BlockRun, Lsn};
use crate::journal::JournalGeometry;

const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 256 };
const PAGE: u32 = 8192;

fn replica(data_blocks: u64) -> (Arc<MemDevice>, Arc<MemDevice>, Store) {
    let data = Arc::new(MemDevice::new(data_blocks));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = Store::open(data.clone(), fast.clone()).unwrap();
    (data, fast, store)
}

fn volume(id: u32) -> Volume {
    Volume {
        id: VolumeId(id),
        name: format!("v{id}"),
        size_bytes: 16 * 1024 * 1024,
        page_size: PAGE,
        chunk_bytes: 4 * 1024 * 1024,
        mode: VolumeMode::Normal,
    }
}

/// An image of `page` as the leader would ship it: raw, or "compressed" bytes of some length
/// (the store never decodes them; it checks only that they fit the page).
fn image(rng: &mut Rng, chunk: ChunkId, page: PageNo) -> PageImage {
    let content = rng.bytes(PAGE as usize);
    let checksum = page_checksum(chunk, page, &content);
    let (encoding, len) = match rng.below(3) {
        0 => return PageImage { encoding: Encoding::Raw, bytes: content, checksum },
        1 => (Encoding::Lz4, 1 + rng.below(u64::from(PAGE)) as usize),
        _ => (Encoding::Zstd, 1 + rng.below(3000) as usize),
    };
    PageImage { encoding, bytes: rng.bytes(len), checksum }
}

/// The checksum and LSN of the pages the generated commands wrote: what a heavy segment
/// names, so that it takes them (a page at another version keeps its entry).
type Written = std::collections::BTreeMap<(ChunkId, PageNo), (u32, Lsn)>;

/// A random command the leader side could have decided, for volumes 1 and 2.
fn command(rng: &mut Rng, lsn: &mut u64, live: &[VolumeId], written: &mut Written) -> StoreCommand {
    let id = *rng.pick(live);
    let chunk = ChunkId::new(id, rng.below(4) as u32);
    let pages_per_chunk = 4 * 1024 * 1024 / u64::from(PAGE);
    let mut pages: Vec<PageNo> = (0..1 + rng.below(6)).map(|_| PageNo(rng.below(pages_per_chunk) as u32)).collect();
    pages.sort_unstable();
    pages.dedup();
    *lsn += 1;
    match rng.below(10) {
        0..=5 => {
            let puts: Vec<PagePut> = pages
                .into_iter()
                .map(|page| PagePut { page, image: image(rng, chunk, page), lsn: Lsn(*lsn) })
                .collect();
            for put in &puts {
                written.insert((chunk, put.page), (put.image.checksum, put.lsn));
            }
            StoreCommand::PutPages { chunk, pages: puts }
        }
        6 => {
            for &page in &pages {
                written.remove(&(chunk, page));
            }
            StoreCommand::TrimPages { chunk, pages }
        }
        7 => {
            // Around a page written before when there is one; pages at another version (or
            // none) are named with a made-up checksum, and keep their entries.
            let known: Vec<PageNo> = written.keys().filter(|(c, _)| *c == chunk).map(|&(_, p)| p).collect();
            let first = match known.is_empty() {
                true => rng.below(pages_per_chunk - 8) as u32,
                false => rng.pick(&known).0.min(pages_per_chunk as u32 - 8),
            };
            let pages = (first..first + 1 + rng.below(8) as u32)
                .map(|p| {
                    let (checksum, lsn) = written
                        .get(&(chunk, PageNo(p)))
                        .copied()
                        .filter(|_| rng.chance(0.9))
                        .unwrap_or((rng.next_u32(), Lsn(*lsn)));
                    HeavyPage { page: PageNo(p), checksum, lsn }
                })
                .collect();
            let len = 17 + rng.below(20_000) as usize;
            StoreCommand::PutHeavy { chunk, pages, segment: rng.bytes(len) }
        }
        _ => StoreCommand::SetWatermarks {
            volume: id,
            marks: Watermarks { durable_lsn: Lsn(*lsn), min_reader_lsn: Lsn(*lsn / 2) },
        },
    }
}

/// What a replica holds of its volumes, placement aside: every page's encoding, stored bytes,
/// checksum and LSN, the volumes and their watermarks.
fn logical_content(store: &Store) -> Vec<String> {
    let mut out: Vec<String> = store.volumes().iter().map(|v| format!("{v:?} {:?}", store.watermarks(v.id))).collect();
    for (chunk, page, entry) in store.entries() {
        let (_, bytes) = store.read_image(chunk, page).unwrap().unwrap();
        // A heavy page's image is its whole segment, padded to blocks; its stored length is its
        // place in the segment.
        out.push(format!(
            "{chunk:?} {page:?} {:?} {} {:08x} {:?} {:08x}",
            entry.encoding,
            entry.stored_len,
            entry.checksum,
            entry.lsn,
            crc32c::crc32c(&bytes)
        ));
    }
    out
}

fn placement(store: &Store) -> Vec<BlockRun> {
    store.entries().into_iter().map(|(_, _, e)| e.run).collect()
}

#[test]
fn two_replicas_applying_the_same_commands_hold_the_same_pages() {
    let seed = seed_from_env(14);
    let mut rng = Rng::new(seed);
    // The replicas differ: another device size, and replica b has pages of a volume of its own
    // (as a node hosting other chunks would), so its blocks go elsewhere.
    let (_, _, a) = replica(4096);
    let (_, _, b) = replica(6144);
    let local = Volume { id: VolumeId(0), name: "local".into(), ..volume(0) };
    b.create_volume(local).unwrap();
    for p in 0..40 {
        let chunk = ChunkId::new(VolumeId(0), 0);
        b.apply_write(chunk, PageNo(p), &image(&mut rng, chunk, PageNo(p)), Lsn(1)).unwrap();
    }
    let mut lsn = 0;
    let mut written = Written::new();
    let mut commands = vec![StoreCommand::CreateVolume(volume(1)), StoreCommand::CreateVolume(volume(2))];
    for _ in 0..300 {
        commands.push(command(&mut rng, &mut lsn, &[VolumeId(1), VolumeId(2)], &mut written));
    }
    commands.push(StoreCommand::ResizeVolume { volume: VolumeId(1), size_bytes: 32 * 1024 * 1024 });
    commands.push(StoreCommand::DeleteVolume(VolumeId(2)));
    for _ in 0..100 {
        commands.push(command(&mut rng, &mut lsn, &[VolumeId(1)], &mut written));
    }
    let mut applied = 0;
    for (step, command) in commands.iter().enumerate() {
        // What a Raft entry carries: the command's bytes.
        let shipped = StoreCommand::decode(&command.encode()).unwrap();
        assert_eq!(&shipped, command);
        let on_a = a.apply(command);
        let on_b = b.apply(&shipped);
        assert_eq!(on_a.is_ok(), on_b.is_ok(), "step {step}: {command:?}: {on_a:?} against {on_b:?}");
        applied += usize::from(on_a.is_ok());
        a.check_invariants().unwrap();
        b.check_invariants().unwrap();
    }
    b.delete_volume(VolumeId(0)).unwrap();
    let content = logical_content(&a);
    assert!(content.len() > 100, "the commands left pages behind: {}", content.len());
    assert_eq!(content, logical_content(&b), "seed {seed}");
    assert_ne!(placement(&a), placement(&b), "the replicas placed blocks alike: the test shows nothing");
    assert!(applied * 10 > commands.len() * 9, "only {applied} of {} commands applied", commands.len());
    // The comparison sees one command applied on one replica only.
    let chunk = ChunkId::new(VolumeId(1), 0);
    let extra = StoreCommand::PutPages {
        chunk,
        pages: vec![PagePut { page: PageNo(3), image: image(&mut rng, chunk, PageNo(3)), lsn: Lsn(lsn + 1) }],
    };
    a.apply(&extra).unwrap();
    assert_ne!(logical_content(&a), logical_content(&b), "a command missing on one replica went unseen");
}

#[test]
fn watermarks_only_advance_and_survive_checkpoints_and_reopen() {
    let (data, fast, store) = replica(2048);
    store.create_volume(volume(1)).unwrap();
    let set = |durable, reader| StoreCommand::SetWatermarks {
        volume: VolumeId(1),
        marks: Watermarks { durable_lsn: Lsn(durable), min_reader_lsn: Lsn(reader) },
    };
    store.apply(&set(10, 4)).unwrap();
    store.apply(&set(8, 6)).unwrap();
    assert_eq!(store.watermarks(VolumeId(1)), Some(Watermarks { durable_lsn: Lsn(10), min_reader_lsn: Lsn(6) }));
    assert!(store.apply(&StoreCommand::SetWatermarks { volume: VolumeId(5), marks: Watermarks::default() }).is_err());
    drop(store);
    // From the log...
    let store = Store::open(data.clone(), fast.clone()).unwrap();
    assert_eq!(store.watermarks(VolumeId(1)).unwrap().durable_lsn, Lsn(10));
    store.apply(&set(12, 7)).unwrap();
    store.checkpoint().unwrap();
    drop(store);
    // ...and from a checkpoint; a deleted volume's marks are gone with it.
    let store = Store::open(data, fast).unwrap();
    assert_eq!(store.watermarks(VolumeId(1)), Some(Watermarks { durable_lsn: Lsn(12), min_reader_lsn: Lsn(7) }));
    store.delete_volume(VolumeId(1)).unwrap();
    assert_eq!(store.watermarks(VolumeId(1)), None);
}

/// The core alone: random allocations, installs, removals, volume deletions and releases, with
/// no device, and the invariant check after every event. Replayed twice, the same events give
/// the same placement.
#[test]
fn the_core_keeps_its_invariants_under_random_events_with_no_io() {
    let seed = seed_from_env(3);
    let run = |seed: u64| -> Vec<(ChunkId, PageNo, PageEntry)> {
        let mut rng = Rng::new(seed);
        let mut core = StoreCore::new(64);
        core.set_volume(volume(1));
        let mut in_flight: Vec<(ChunkId, Vec<(PageNo, BlockRun)>)> = Vec::new();
        let mut checks = 0;
        for step in 0..3_000 {
            let chunk = ChunkId::new(VolumeId(1), rng.below(3) as u32);
            match rng.below(10) {
                0..=3 => {
                    let counts: Vec<u8> = (0..1 + rng.below(4)).map(|_| 1 + rng.below(2) as u8).collect();
                    if let Ok(runs) = core.allocate(chunk, &counts) {
                        let pages = runs.into_iter().map(|run| (PageNo(rng.below(64) as u32), run)).collect();
                        in_flight.push((chunk, pages));
                    }
                }
                4..=6 if !in_flight.is_empty() => {
                    let (chunk, pages) = in_flight.swap_remove(rng.below(in_flight.len() as u64) as usize);
                    // A page named twice in one group keeps its first run; the others were
                    // never journalled and go back at once.
                    let mut named = std::collections::BTreeSet::new();
                    let (mut entries, mut spare) = (Vec::new(), Vec::new());
                    for (page, run) in pages {
                        if !named.insert(page) {
                            spare.push(run);
                            continue;
                        }
                        let entry = PageEntry {
                            encoding: Encoding::Lz4,
                            run,
                            stored_len: u16::from(run.count) * 4096 - 1,
                            checksum: 0,
                            lsn: Lsn(step),
                        };
                        entries.push((page, Some(entry)));
                    }
                    core.unallocate(chunk, &spare);
                    core.install(chunk, &entries);
                }
                7 => {
                    let page = PageNo(rng.below(64) as u32);
                    if core.is_mapped(chunk, page) {
                        core.install(chunk, &[(page, None)]);
                    }
                }
                8 if in_flight.is_empty() => {
                    let freed = core.take_pending();
                    core.release(&freed);
                }
                _ => {
                    let (chunk, runs): (ChunkId, Vec<BlockRun>) = match in_flight.pop() {
                        Some((chunk, pages)) => (chunk, pages.into_iter().map(|(_, run)| run).collect()),
                        None => continue,
                    };
                    core.unallocate(chunk, &runs);
                }
            }
            if in_flight.is_empty() {
                assert_eq!(core.invariant_problem(), None, "seed {seed}, step {step}");
                checks += 1;
            }
        }
        assert!(checks > 300, "only {checks} quiescent steps were checked");
        core.entries()
    };
    let first = run(seed);
    assert!(!first.is_empty());
    assert_eq!(first, run(seed), "the same events gave another placement");
}

#[test]
fn chunk_marks_travel_with_their_commands_and_replace_chunk_is_whole() {
    let mut rng = Rng::new(seed_from_env(15));
    let data = Arc::new(MemDevice::new(4096));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = Store::open(data.clone(), fast.clone()).unwrap();
    store.create_volume(volume(1)).unwrap();
    let chunk = ChunkId::new(VolumeId(1), 0);
    let puts: Vec<PagePut> =
        (0..4).map(|p| PagePut { page: PageNo(p), image: image(&mut rng, chunk, PageNo(p)), lsn: Lsn(1) }).collect();
    store.apply_marked(&StoreCommand::PutPages { chunk, pages: puts.clone() }, b"one").unwrap();
    store.apply_marked(&StoreCommand::TrimPages { chunk, pages: vec![PageNo(9)] }, b"two").unwrap();
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"two"[..]));
    // A mark too long, or on a command of no chunk, is refused and changes nothing.
    assert!(store.apply_marked(&StoreCommand::TrimPages { chunk, pages: vec![PageNo(1)] }, &[0; 81]).is_err());
    assert!(store.apply_marked(&StoreCommand::DeleteVolume(VolumeId(1)), b"x").is_err());
    assert_eq!(store.chunk_entries(chunk).len(), 4);
    // A replaced chunk holds exactly what was sent, and the mark with it, across a reopen.
    let sent = vec![puts[1].clone(), PagePut { page: PageNo(7), ..puts[2].clone() }];
    store.replace_chunk(chunk, &sent, b"three").unwrap();
    drop(store);
    let store = Store::open(data, fast).unwrap();
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"three"[..]));
    let pages: Vec<PageNo> = store.chunk_entries(chunk).into_iter().map(|(p, _)| p).collect();
    assert_eq!(pages, vec![PageNo(1), PageNo(7)]);
    store.check_invariants().unwrap();
}

/// Deferred applies (a replica's, whose Raft log is their write-ahead log) are installed at
/// once but durable only with the next commit or `sync`: a reopen before that finds the chunk
/// at its last durable mark, never a mix; a checkpoint and a release of freed runs make them
/// durable first.
#[test]
fn deferred_applies_are_durable_only_after_a_sync() {
    use crate::store::Durability::Deferred;
    let mut rng = Rng::new(seed_from_env(16));
    let data = Arc::new(MemDevice::new(4096));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = Store::open(data.clone(), fast.clone()).unwrap();
    store.create_volume(volume(1)).unwrap();
    let chunk = ChunkId::new(VolumeId(1), 0);
    let put =
        |rng: &mut Rng, page: u32| PagePut { page: PageNo(page), image: image(rng, chunk, PageNo(page)), lsn: Lsn(1) };
    store.apply_marked(&StoreCommand::PutPages { chunk, pages: vec![put(&mut rng, 0)] }, b"one").unwrap();
    store.apply_marked_as(&StoreCommand::PutPages { chunk, pages: vec![put(&mut rng, 1)] }, b"two", Deferred).unwrap();
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"two"[..]));
    assert_eq!(store.chunk_entries(chunk).len(), 2);
    drop(store);
    // Lost, whole: the mark and the page of the deferred apply.
    let store = Store::open(data.clone(), fast.clone()).unwrap();
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"one"[..]));
    assert_eq!(store.chunk_entries(chunk).len(), 1);
    store.check_invariants().unwrap();
    store.apply_marked_as(&StoreCommand::PutPages { chunk, pages: vec![put(&mut rng, 1)] }, b"two", Deferred).unwrap();
    store.set_chunk_mark_as(chunk, b"three", Deferred).unwrap();
    store.sync().unwrap();
    drop(store);
    let store = Store::open(data.clone(), fast.clone()).unwrap();
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"three"[..]));
    assert_eq!(store.chunk_entries(chunk).len(), 2);
    // Overwrites free runs: their release syncs first; so does a checkpoint.
    for round in 0..80u32 {
        let mark = format!("w{round}");
        store
            .apply_marked_as(
                &StoreCommand::PutPages { chunk, pages: vec![put(&mut rng, 0)] },
                mark.as_bytes(),
                Deferred,
            )
            .unwrap();
    }
    store.checkpoint().unwrap();
    drop(store);
    let store = Store::open(data, fast).unwrap();
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"w79"[..]));
    store.check_invariants().unwrap();
}

/// A heavy segment takes only the pages still at the version it names: a page written again
/// or trimmed after the segment was made keeps what it has, and a segment no page takes writes
/// nothing but still moves the chunk's mark.
#[test]
fn a_heavy_segment_takes_only_the_pages_still_at_the_version_it_names() {
    let mut rng = Rng::new(5);
    let (_, _, store) = replica(4096);
    store.create_volume(volume(1)).unwrap();
    let chunk = ChunkId::new(VolumeId(1), 0);
    let puts: Vec<PagePut> =
        (0..4).map(|p| PagePut { page: PageNo(p), image: image(&mut rng, chunk, PageNo(p)), lsn: Lsn(1) }).collect();
    store.apply(&StoreCommand::PutPages { chunk, pages: puts.clone() }).unwrap();
    let heavy: Vec<HeavyPage> =
        puts.iter().map(|p| HeavyPage { page: p.page, checksum: p.image.checksum, lsn: p.lsn }).collect();
    // After the segment was made: page 1 written again, page 2 trimmed.
    let newer = PagePut { page: PageNo(1), image: image(&mut rng, chunk, PageNo(1)), lsn: Lsn(2) };
    store.apply(&StoreCommand::PutPages { chunk, pages: vec![newer.clone()] }).unwrap();
    store.apply(&StoreCommand::TrimPages { chunk, pages: vec![PageNo(2)] }).unwrap();
    let segment = rng.bytes(6000);
    store.apply(&StoreCommand::PutHeavy { chunk, pages: heavy.clone(), segment: segment.clone() }).unwrap();
    let entry = |p: u32| store.entry(chunk, PageNo(p));
    for p in [0, 3] {
        let e = entry(p).expect("an archived page");
        assert_eq!((e.encoding, e.stored_len, e.checksum), (Encoding::Heavy, p as u16, heavy[p as usize].checksum));
    }
    let kept = entry(1).expect("page 1");
    assert_eq!((kept.encoding, kept.checksum, kept.lsn), (newer.image.encoding, newer.image.checksum, Lsn(2)));
    assert_eq!(entry(2), None, "a trimmed page stays trimmed");

    // Every page named at another version now: nothing is written, the mark still moves.
    let used = store.stats().stored_bytes;
    let stale: Vec<HeavyPage> = (1..3).map(|p| HeavyPage { page: PageNo(p), checksum: 1, lsn: Lsn(1) }).collect();
    store.apply_marked(&StoreCommand::PutHeavy { chunk, pages: stale, segment }, b"m9").unwrap();
    assert_eq!(store.stats().stored_bytes, used, "a segment no page takes took blocks");
    assert_eq!(store.chunk_mark(chunk).as_deref(), Some(&b"m9"[..]));
    assert_eq!(entry(1), Some(kept));
    assert!(store.check_invariants().is_ok());
}
