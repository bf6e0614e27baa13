//! The page path's tests: round trips through both layers, damage, partial writes, the
//! software policy, batches, the cache, heavy segments and crash points.

use std::sync::Arc;

use tundra_codec::{DecompressCost, LinearCost, SelectorConfig};
use tundra_device::BlockDevice;
use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
use tundra_device::mem::MemDevice;

use super::*;
use crate::journal::{Journal, JournalGeometry};
use crate::store::tests::test_volume;

const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 64 };

/// A page that looks like a heap page of rows: text with varying numbers, some free space.
fn table_page(seed: u64, size: usize) -> Vec<u8> {
    let mut page = vec![0u8; size];
    let mut at = size / 5;
    let mut row = seed * 1000;
    while at + 80 < size {
        let line =
            format!("{row:010}|2013-01-{:02}|UA|N{:05}|EWR|IAH|{:4}|", 1 + row % 28, row * 37 % 99_991, row % 1440);
        page[at..at + line.len()].copy_from_slice(line.as_bytes());
        at += line.len() + 7;
        row += 1;
    }
    page
}

fn pages_on_a_drive(page_size: usize) -> (Arc<MemDevice>, Arc<MemDevice>, Pages) {
    let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
    let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    let drive = CsdDevice::format(media.clone(), &options, CsdConfig::default()).unwrap();
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let pages = pages_over(Arc::new(drive), fast.clone(), page_size);
    (media, fast, pages)
}

fn pages_over(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>, page_size: usize) -> Pages {
    let store = Arc::new(Store::open(data, fast).unwrap());
    store.create_volume(test_volume(page_size)).unwrap();
    path_of(store, page_size, CpuLoad::Fixed(0.0))
}

/// The page path over `store`, with a fixed cost model that keeps Algorithm 1's decisions
/// independent of this machine's timing.
fn path_of(store: Arc<Store>, page_size: usize, cpu: CpuLoad) -> Pages {
    let codec = PageCodec::new(1).unwrap();
    let cost = DecompressCost {
        page_size: PageSize::from_bytes(page_size as u64).unwrap(),
        lz4: LinearCost { fixed_us: 0.5, us_per_byte: 0.5 / 1024.0 },
        zstd: LinearCost { fixed_us: 2.0, us_per_byte: 2.0 / 1024.0 },
    };
    let selector = Selector::new(SelectorConfig::default(), codec, cost).unwrap();
    Pages::new(store, PageSize::from_bytes(page_size as u64).unwrap(), selector, codec, cpu).unwrap()
}

#[test]
fn pages_round_trip_through_both_layers() {
    let (_, _, pages) = pages_on_a_drive(16384);
    let chunk = ChunkId(1);
    for p in 0..200u32 {
        pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 16384), Lsn(1), None).unwrap();
    }
    for p in 0..200u32 {
        assert_eq!(pages.read_page(chunk, PageNo(p)).unwrap().unwrap(), table_page(u64::from(p), 16384));
    }
    assert_eq!(pages.read_page(chunk, PageNo(999)).unwrap(), None);
    let counts = pages.counts();
    assert_eq!(counts.written_lz4 + counts.written_zstd + counts.written_raw, 200);
    assert_eq!(counts.written_raw, 0, "table pages compress");
    let stats = pages.store().stats();
    assert!(stats.stored_bytes < 200 * 16384 / 2, "software compression at least halves: {stats:?}");
    assert!(pages.write_page(chunk, PageNo(0), &[0u8; 100], Lsn(2), None).is_err());
}

#[test]
fn a_corrupted_page_is_an_error_never_wrong_data() {
    let (_, _, pages) = pages_on_a_drive(8192);
    let chunk = ChunkId(2);
    pages.write_page(chunk, PageNo(0), &table_page(1, 8192), Lsn(1), None).unwrap();
    pages.write_page(chunk, PageNo(1), &table_page(2, 8192), Lsn(1), None).unwrap();
    let entry0 = pages.store().entry(chunk, PageNo(0)).unwrap();
    let entry1 = pages.store().entry(chunk, PageNo(1)).unwrap();
    // Page 1's bytes written where page 0 lives: valid compressed data, wrong page.
    let other = pages.store().read_blocks(entry1.run.first_lba(), usize::from(entry1.run.count)).unwrap();
    let mut misplaced = other.clone();
    misplaced.resize(usize::from(entry0.run.count) * 4096, 0);
    pages.store().data_device().write(entry0.run.first_lba(), &misplaced).unwrap();
    let error = pages.read_page(chunk, PageNo(0)).unwrap_err();
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted, "{error}");
    pages.store().data_device().write(entry0.run.first_lba(), &vec![0xAB; misplaced.len()]).unwrap();
    assert_eq!(pages.read_page(chunk, PageNo(0)).unwrap_err().kind(), crate::ErrorKind::Corrupted);
    assert_eq!(pages.read_page(chunk, PageNo(1)).unwrap().unwrap(), table_page(2, 8192));
}

#[test]
fn partial_writes_merge_store_raw_then_recompress() {
    let (_, _, pages) = pages_on_a_drive(16384);
    let chunk = ChunkId(5);
    let original = table_page(9, 16384);
    pages.write_page(chunk, PageNo(0), &original, Lsn(1), None).unwrap();
    pages.write_partial(chunk, PageNo(0), 100, b"patched", Lsn(2)).unwrap();
    pages.write_partial(chunk, PageNo(1), 16380, b"tail", Lsn(2)).unwrap();
    let mut expected = original.clone();
    expected[100..107].copy_from_slice(b"patched");
    assert_eq!(pages.read_page(chunk, PageNo(0)).unwrap().unwrap(), expected);
    let mut fresh = vec![0u8; 16384];
    fresh[16380..].copy_from_slice(b"tail");
    assert_eq!(pages.read_page(chunk, PageNo(1)).unwrap().unwrap(), fresh);
    assert_eq!(pages.store().entry(chunk, PageNo(0)).unwrap().encoding, Encoding::Raw);
    assert_eq!(pages.recompress_partial().unwrap(), 2);
    assert_ne!(pages.store().entry(chunk, PageNo(0)).unwrap().encoding, Encoding::Raw);
    assert_eq!(pages.read_page(chunk, PageNo(0)).unwrap().unwrap(), expected);
    assert_eq!(pages.recompress_partial().unwrap(), 0);
    for (offset, len) in [(16384, 1), (16380, 5), (0, 0)] {
        let err = pages.write_partial(chunk, PageNo(0), offset, &vec![1u8; len], Lsn(3)).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Invalid);
    }
}

/// Every write path follows the software policy: single pages, batches, pages written with
/// a named algorithm, and the background pass over partial writes.
#[test]
fn the_software_policy_decides_every_whole_page() {
    let expected = [
        (SoftwareCompression::Lz4, Some(Encoding::Lz4)),
        (SoftwareCompression::Zstd, Some(Encoding::Zstd)),
        (SoftwareCompression::Off, Some(Encoding::Raw)),
        (SoftwareCompression::Auto, None),
    ];
    for (policy, encoding) in expected {
        let (_, _, pages) = pages_on_a_drive(16384);
        let pages = pages.with_software_compression(policy);
        assert_eq!(pages.software_compression(), policy);
        let chunk = ChunkId(3);
        let contents: Vec<Vec<u8>> = (0..12u64).map(|p| table_page(p + 40, 16384)).collect();
        for p in 0..4u32 {
            pages.write_page(chunk, PageNo(p), &contents[p as usize], Lsn(1), None).unwrap();
        }
        let items: Vec<_> = (4..8u32).map(|p| (PageNo(p), contents[p as usize].as_slice(), Lsn(1), None)).collect();
        pages.write_pages(chunk, &items).unwrap();
        // A writer that names an algorithm (or raw) gets it only under Auto.
        pages.write_page_with(chunk, PageNo(8), &contents[8], Lsn(1), Some(Algorithm::Zstd)).unwrap();
        pages.write_page_with(chunk, PageNo(9), &contents[9], Lsn(1), Some(Algorithm::Lz4)).unwrap();
        pages.write_page_with(chunk, PageNo(10), &contents[10], Lsn(1), None).unwrap();
        // A partial write is stored raw, then the background pass compresses it again.
        pages.write_partial(chunk, PageNo(11), 0, &contents[11][..100], Lsn(1)).unwrap();
        let recompressed = pages.recompress_partial().unwrap();
        let stored: Vec<Encoding> =
            (0..12u32).map(|p| pages.store().entry(chunk, PageNo(p)).unwrap().encoding).collect();
        match encoding {
            Some(encoding) => {
                assert!(stored.iter().all(|&e| e == encoding), "{policy:?}: {stored:?}");
                assert_eq!(recompressed, usize::from(encoding != Encoding::Raw), "{policy:?}");
            }
            None => {
                assert_eq!(&stored[8..11], &[Encoding::Zstd, Encoding::Lz4, Encoding::Raw]);
                assert!(stored[..8].iter().chain(&stored[11..]).all(|&e| e != Encoding::Raw), "{stored:?}");
                assert_eq!(recompressed, 1);
            }
        }
        let heavy = pages.heavy_compress(chunk, PageNo(0), 4);
        assert_eq!(heavy.is_err(), policy == SoftwareCompression::Off, "{policy:?}: {heavy:?}");
        for (p, content) in contents.iter().enumerate().take(11) {
            assert!(pages.read_page(chunk, PageNo(p as u32)).unwrap().unwrap() == *content, "page {p}");
        }
    }
}

#[test]
fn concurrent_partial_writes_to_one_page_lose_nothing() {
    let (_, _, pages) = pages_on_a_drive(8192);
    let chunk = ChunkId(6);
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let pages = &pages;
            scope.spawn(move || {
                for i in 0..16usize {
                    let offset = (t * 16 + i) * 64;
                    pages.write_partial(chunk, PageNo(0), offset, &[t as u8 + 1; 64], Lsn(1)).unwrap();
                }
            });
        }
    });
    let page = pages.read_page(chunk, PageNo(0)).unwrap().unwrap();
    for t in 0..4usize {
        assert!(page[t * 1024..(t + 1) * 1024].iter().all(|&b| b == t as u8 + 1), "thread {t}'s bytes were lost");
    }
}

/// A data device whose trims take a while, so that a trim racing a writer's allocation
/// shows up every time rather than once in a while.
struct SlowTrim(MemDevice);

impl BlockDevice for SlowTrim {
    fn block_count(&self) -> u64 {
        self.0.block_count()
    }
    fn read(&self, lba: tundra_device::Lba, buf: &mut [u8]) -> tundra_device::Result<()> {
        self.0.read(lba, buf)
    }
    fn write(&self, lba: tundra_device::Lba, data: &[u8]) -> tundra_device::Result<()> {
        self.0.write(lba, data)
    }
    fn trim(&self, lba: tundra_device::Lba, blocks: u64) -> tundra_device::Result<()> {
        std::thread::sleep(std::time::Duration::from_micros(300));
        self.0.trim(lba, blocks)
    }
    fn flush(&self) -> tundra_device::Result<()> {
        self.0.flush()
    }
    fn usage(&self) -> tundra_device::Usage {
        self.0.usage()
    }
}

#[test]
fn freed_blocks_are_trimmed_before_a_writer_can_reuse_them() {
    let journal = JournalGeometry { checkpoint_blocks: 64, log_blocks: 8192 };
    let fast = Arc::new(MemDevice::new(journal.total_blocks()));
    Journal::format(fast.as_ref(), journal).unwrap();
    let pages = pages_over(Arc::new(SlowTrim(MemDevice::new(16384))), fast, 8192);
    let chunk = ChunkId(9);
    let content = |t: u32, p: u32, round: u32| -> Vec<u8> {
        let mut page = table_page(u64::from(t * 1000 + p), 8192);
        page[..4].copy_from_slice(&round.to_le_bytes());
        page
    };
    // Every rewrite frees the page's old run; every 64 frees, the writer that crosses the
    // batch releases them (trims, then makes them allocatable) while the others allocate.
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let pages = &pages;
            scope.spawn(move || {
                for round in 0..60u32 {
                    for p in 0..8u32 {
                        let page = PageNo(t * 8 + p);
                        pages.write_page_with(chunk, page, &content(t, p, round), Lsn(1), None).unwrap();
                    }
                }
            });
        }
    });
    pages.set_cache_pages(0);
    for t in 0..4u32 {
        for p in 0..8u32 {
            let read = pages.read_page(chunk, PageNo(t * 8 + p)).unwrap().unwrap();
            assert!(read == content(t, p, 59), "page {} lost its last write", t * 8 + p);
        }
    }
    let report = pages.check().unwrap();
    assert!(report.damaged.is_empty(), "{:?}", report.damaged);
}

#[test]
fn a_batch_of_pages_is_stored_with_one_commit_or_not_at_all() {
    let (_, _, pages) = pages_on_a_drive(8192);
    let chunk = ChunkId(10);
    pages.write_page(chunk, PageNo(3), &table_page(300, 8192), Lsn(1), None).unwrap();
    let contents: Vec<Vec<u8>> = (0..40u64).map(|p| table_page(p + 1000, 8192)).collect();
    let items: Vec<_> =
        contents.iter().enumerate().map(|(p, c)| (PageNo(p as u32), c.as_slice(), Lsn(2), None)).collect();
    pages.write_pages(chunk, &items).unwrap();
    for (p, content) in contents.iter().enumerate() {
        assert!(pages.read_page(chunk, PageNo(p as u32)).unwrap().unwrap() == *content, "page {p}");
    }
    let counts = pages.counts();
    assert_eq!(counts.written_lz4 + counts.written_zstd + counts.written_raw, 41);
    // A batch with one page outside the volume stores nothing and leaks nothing.
    let before = pages.store().stats();
    let bad =
        [(PageNo(50), contents[0].as_slice(), Lsn(3), None), (PageNo(u32::MAX), contents[1].as_slice(), Lsn(3), None)];
    assert!(pages.write_pages(chunk, &bad).is_err());
    assert_eq!(pages.read_page(chunk, PageNo(50)).unwrap(), None);
    assert_eq!(pages.store().stats().stored_bytes, before.stored_bytes);
    let report = pages.check().unwrap();
    assert!(report.damaged.is_empty(), "{:?}", report.damaged);
}

#[test]
fn the_cache_hits_and_never_serves_an_old_version() {
    let (_, _, pages) = pages_on_a_drive(8192);
    let chunk = ChunkId(7);
    pages.write_page(chunk, PageNo(3), &table_page(1, 8192), Lsn(1), None).unwrap();
    for _ in 0..5 {
        assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(1, 8192));
    }
    let stats = pages.cache_stats();
    assert_eq!((stats.hits, stats.misses), (4, 1));
    pages.write_page(chunk, PageNo(3), &table_page(2, 8192), Lsn(2), None).unwrap();
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(2, 8192));
    pages.set_cache_pages(0);
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(2, 8192));
    assert_eq!(pages.cache_stats().pages, 0);
}

/// A write of a page the cache holds (one read to merge a piece of a write into it) gives the
/// cached copy the new content, whether the page came alone or in a batch; a page the cache does
/// not hold is not cached by being written.
#[test]
fn a_cached_page_written_again_stays_cached_with_its_new_content() {
    let (_, _, pages) = pages_on_a_drive(8192);
    let chunk = ChunkId(7);
    pages.write_page(chunk, PageNo(3), &table_page(1, 8192), Lsn(1), None).unwrap();
    pages.write_page(chunk, PageNo(4), &table_page(2, 8192), Lsn(2), None).unwrap();
    assert_eq!(pages.cache_stats().pages, 0, "a write alone cached a page");
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(1, 8192));
    // Alone, as a page protocol write or the merge of a piece with the cache off does.
    pages.write_partial(chunk, PageNo(3), 100, &[7u8; 500], Lsn(3)).unwrap();
    let mut merged = table_page(1, 8192);
    merged[100..600].fill(7);
    let misses = pages.cache_stats().misses;
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), merged);
    // In a batch, as the write-back cache flushes.
    let items = [(PageNo(3), table_page(5, 8192)), (PageNo(4), table_page(6, 8192))];
    let batch: Vec<_> = items.iter().map(|(p, c)| (*p, c.as_slice(), Lsn(4), None)).collect();
    pages.write_pages(chunk, &batch).unwrap();
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(5, 8192));
    assert_eq!(pages.cache_stats().misses, misses, "a page written while cached was read from the device");
    assert_eq!(pages.cache_stats().pages, 1, "page 4, written but never read, was cached");
    assert_eq!(pages.read_page(chunk, PageNo(4)).unwrap().unwrap(), table_page(6, 8192));
    // What the device holds is what the cache served.
    pages.set_cache_pages(16);
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(5, 8192));
}

#[test]
fn check_is_clean_then_finds_damage() {
    let (_, _, pages) = pages_on_a_drive(8192);
    let chunk = ChunkId(8);
    for p in 0..20u32 {
        pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 8192), Lsn(1), None).unwrap();
        pages.write_page(chunk, PageNo(p), &table_page(u64::from(p) + 100, 8192), Lsn(2), None).unwrap();
    }
    let clean = pages.check().unwrap();
    assert_eq!(clean.pages, 20);
    assert!(clean.damaged.is_empty(), "{clean:?}");
    assert!(clean.device_mapped_bytes <= clean.referenced_bytes);
    let entry = pages.store().entry(chunk, PageNo(4)).unwrap();
    pages.store().data_device().write(entry.run.first_lba(), &vec![0x5A; 4096]).unwrap();
    let damaged = pages.check().unwrap();
    assert_eq!(damaged.damaged.len(), 1, "{damaged:?}");
    assert!(damaged.damaged[0].contains("page 4"));
}

#[test]
fn heavy_compression_shrinks_archived_pages_and_reads_them_back() {
    let (_, _, pages) = pages_on_a_drive(16384);
    let chunk = ChunkId(9);
    for p in 0..64u32 {
        pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 16384), Lsn(100 + u64::from(p)), None).unwrap();
    }
    pages.trim_page(chunk, PageNo(10)).unwrap();
    let before = pages.store().stats().stored_bytes;
    let report = pages.heavy_compress(chunk, PageNo(0), 64).unwrap();
    // Archiving changes no page: each keeps the LSN of its last change.
    for p in (0..64u32).filter(|&p| p != 10) {
        let entry = pages.store().entry(chunk, PageNo(p)).unwrap();
        assert_eq!((entry.encoding, entry.lsn), (Encoding::Heavy, Lsn(100 + u64::from(p))), "page {p}");
    }
    assert_eq!(report.pages, 63);
    assert!(report.segments >= 2, "512 KiB groups: {report:?}");
    pages.store().release_freed().unwrap();
    let after = pages.store().stats().stored_bytes;
    assert!(after * 2 < before, "heavy segments at least halve the blocks: {before} -> {after}");
    for p in 0..64u32 {
        let got = pages.read_page(chunk, PageNo(p)).unwrap();
        if p == 10 {
            assert_eq!(got, None);
        } else {
            assert_eq!(got.unwrap(), table_page(u64::from(p), 16384), "page {p}");
        }
    }
    // Rewriting one page of a segment moves it out; the segment lives on for the others.
    pages.write_page(chunk, PageNo(3), &table_page(333, 16384), Lsn(2), None).unwrap();
    pages.trim_page(chunk, PageNo(4)).unwrap();
    assert_eq!(pages.read_page(chunk, PageNo(4)).unwrap(), None);
    pages.store().release_freed().unwrap();
    assert_eq!(pages.read_page(chunk, PageNo(3)).unwrap().unwrap(), table_page(333, 16384));
    assert_eq!(pages.read_page(chunk, PageNo(5)).unwrap().unwrap(), table_page(5, 16384));
    let check = pages.check().unwrap();
    assert!(check.damaged.is_empty(), "{check:?}");
}

#[test]
fn heavy_segments_survive_reopen_and_their_blocks_are_freed_when_empty() {
    let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
    let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    let drive: Arc<dyn BlockDevice> = Arc::new(CsdDevice::format(media, &options, CsdConfig::default()).unwrap());
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let chunk = ChunkId(2);
    {
        let pages = pages_over(drive.clone(), fast.clone(), 8192);
        for p in 0..16u32 {
            pages.write_page(chunk, PageNo(p), &table_page(u64::from(p), 8192), Lsn(1), None).unwrap();
        }
        pages.heavy_compress(chunk, PageNo(0), 16).unwrap();
    }
    let store = Arc::new(Store::open(drive.clone(), fast.clone()).unwrap());
    let extents = store.stats().extents_in_use;
    assert_eq!(extents, 1, "one segment in one extent");
    let pages = path_of(store.clone(), 8192, CpuLoad::Fixed(0.0));
    for p in 0..16u32 {
        assert_eq!(pages.read_page(chunk, PageNo(p)).unwrap().unwrap(), table_page(u64::from(p), 8192));
    }
    for p in 0..16u32 {
        store.trim_page(chunk, PageNo(p)).unwrap();
    }
    store.release_freed().unwrap();
    assert_eq!(store.stats().extents_in_use, 0, "the segment's blocks are freed with its last page");
}

/// Random page operations in every mode against a model: whole-page writes chosen by
/// Algorithm 1 (idle or busy host) or forced to lz4, zstd or raw (pages the user marks
/// uncompressed), batched writes, partial writes (the none mode), trims, heavy compression
/// of a range, re-compression of partially written pages and reopening the store, on a
/// mode normal volume of two chunks and a mode none volume. After every step the page read
/// back equals the model; at the end every page does and the store checks clean (what
/// `tundra fsck` runs: every checksum, no leaked block).
mod model {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::ids::VolumeId;
    use crate::volume::{Volume, VolumeMode};

    const PAGE: usize = 8192;

    #[derive(Clone, Debug)]
    enum Op {
        /// Algorithm 1 (busy: the CPU rule picks lz4 without comparing).
        Write {
            target: u8,
            page: u8,
            content: u8,
            seed: u16,
            busy: bool,
        },
        /// Forced: 0 lz4, 1 zstd, 2 raw.
        WriteWith {
            target: u8,
            page: u8,
            content: u8,
            seed: u16,
            algorithm: u8,
        },
        Batch {
            target: u8,
            first: u8,
            count: u8,
            content: u8,
            seed: u16,
        },
        Partial {
            target: u8,
            page: u8,
            offset: u16,
            len: u16,
            seed: u16,
        },
        Trim {
            target: u8,
            page: u8,
        },
        Heavy {
            first: u8,
            count: u8,
        },
        Recompress,
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        let t = 0u8..3;
        let p = 0u8..12;
        prop_oneof![
            4 => (t.clone(), p.clone(), 0u8..4, any::<u16>(), any::<bool>())
                .prop_map(|(target, page, content, seed, busy)| Op::Write { target, page, content, seed, busy }),
            2 => (t.clone(), p.clone(), 0u8..4, any::<u16>(), 0u8..3).prop_map(
                |(target, page, content, seed, algorithm)| Op::WriteWith { target, page, content, seed, algorithm }
            ),
            1 => (t.clone(), p.clone(), 1u8..6, 0u8..4, any::<u16>())
                .prop_map(|(target, first, count, content, seed)| Op::Batch { target, first, count, content, seed }),
            2 => (t.clone(), p.clone(), 0u16..8192, 1u16..600, any::<u16>())
                .prop_map(|(target, page, offset, len, seed)| Op::Partial { target, page, offset, len, seed }),
            1 => (t, p).prop_map(|(target, page)| Op::Trim { target, page }),
            1 => (0u8..12, 1u8..12).prop_map(|(first, count)| Op::Heavy { first, count }),
            1 => Just(Op::Recompress),
            1 => Just(Op::Reopen),
        ]
    }

    /// Target 0 and 1: chunks 0 and 1 of the mode normal volume 0; 2: the mode none volume 1.
    fn chunk_of(target: u8) -> ChunkId {
        match target {
            0 => ChunkId::new(VolumeId(0), 0),
            1 => ChunkId::new(VolumeId(0), 1),
            _ => ChunkId::new(VolumeId(1), 0),
        }
    }

    /// Table rows, zeros, incompressible bytes, or half rows and half noise.
    fn content(kind: u8, seed: u16) -> Vec<u8> {
        let noise = |n: usize| tundra_env::Rng::new(u64::from(seed)).bytes(n);
        match kind {
            0 => table_page(u64::from(seed), PAGE),
            1 => vec![0u8; PAGE],
            2 => noise(PAGE),
            _ => {
                let mut page = table_page(u64::from(seed), PAGE);
                page[..PAGE / 2].copy_from_slice(&noise(PAGE / 2));
                page
            }
        }
    }

    struct Rig {
        media: Arc<MemDevice>,
        fast: Arc<MemDevice>,
    }

    impl Rig {
        fn open(&self, busy: bool) -> Pages {
            let quiet = CsdConfig { background: false, ..CsdConfig::default() };
            let drive: Arc<dyn BlockDevice> = Arc::new(CsdDevice::open(self.media.clone(), quiet).unwrap());
            let store = Arc::new(Store::open(drive, self.fast.clone()).unwrap());
            if store.volume(VolumeId(0)).is_none() {
                store.create_volume(test_volume(PAGE)).unwrap();
                let none = Volume { id: VolumeId(1), name: "wal".into(), mode: VolumeMode::None, ..test_volume(PAGE) };
                store.create_volume(none).unwrap();
            }
            path_of(store, PAGE, CpuLoad::Fixed(if busy { 0.9 } else { 0.0 }))
        }
    }

    fn expect(model: &BTreeMap<(u8, u8), Vec<u8>>, pages: &Pages, target: u8, page: u8, after: &Op) {
        let got = pages.read_page(chunk_of(target), PageNo(u32::from(page))).unwrap();
        assert!(got.as_ref() == model.get(&(target, page)), "target {target} page {page} differs after {after:?}");
    }

    fn encoding_of(pages: &Pages, target: u8, page: u8) -> Encoding {
        pages.store().entry(chunk_of(target), PageNo(u32::from(page))).expect("a written page").encoding
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn pages_match_a_model_in_every_mode(ops in proptest::collection::vec(op(), 1..60)) {
            let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
            let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
            let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
            let quiet = CsdConfig { background: false, ..CsdConfig::default() };
            CsdDevice::format(media.clone(), &options, quiet).unwrap();
            Journal::format(fast.as_ref(), JOURNAL).unwrap();
            let rig = Rig { media, fast };
            let mut busy = false;
            let mut pages = rig.open(busy);
            let mut model: BTreeMap<(u8, u8), Vec<u8>> = BTreeMap::new();
            let mut version = 0u64;
            for op in &ops {
                version += 1;
                match *op {
                    Op::Write { target, page, content: kind, seed, busy: now_busy } => {
                        if now_busy != busy {
                            busy = now_busy;
                            drop(pages);
                            pages = rig.open(busy);
                        }
                        let data = content(kind, seed);
                        pages.write_page(chunk_of(target), PageNo(u32::from(page)), &data, Lsn(version), None).unwrap();
                        model.insert((target, page), data);
                        let encoding = encoding_of(&pages, target, page);
                        if target == 2 || kind == 2 {
                            prop_assert_eq!(encoding, Encoding::Raw, "mode none and noise are stored raw");
                        }
                        if busy && target != 2 {
                            prop_assert!(encoding != Encoding::Zstd, "a busy host gets lz4 (or raw), never zstd");
                        }
                        expect(&model, &pages, target, page, op);
                    }
                    Op::WriteWith { target, page, content: kind, seed, algorithm } => {
                        let data = content(kind, seed);
                        let algorithm = [Some(Algorithm::Lz4), Some(Algorithm::Zstd), None][usize::from(algorithm)];
                        pages.write_page_with(chunk_of(target), PageNo(u32::from(page)), &data, Lsn(version), algorithm).unwrap();
                        model.insert((target, page), data);
                        let encoding = encoding_of(&pages, target, page);
                        if target == 2 || algorithm.is_none() {
                            prop_assert_eq!(encoding, Encoding::Raw);
                        } else if encoding != Encoding::Raw {
                            let wanted = if algorithm == Some(Algorithm::Lz4) { Encoding::Lz4 } else { Encoding::Zstd };
                            prop_assert_eq!(encoding, wanted);
                        }
                        expect(&model, &pages, target, page, op);
                    }
                    Op::Batch { target, first, count, content: kind, seed } => {
                        let datas: Vec<Vec<u8>> =
                            (0..count).map(|i| content(kind, seed.wrapping_add(u16::from(i)))).collect();
                        let items: Vec<_> = datas
                            .iter()
                            .enumerate()
                            .map(|(i, d)| (PageNo(u32::from(first) + i as u32), d.as_slice(), Lsn(version), None))
                            .collect();
                        pages.write_pages(chunk_of(target), &items).unwrap();
                        for (i, d) in datas.into_iter().enumerate() {
                            model.insert((target, first + i as u8), d);
                        }
                        for i in 0..count {
                            expect(&model, &pages, target, first + i, op);
                        }
                    }
                    Op::Partial { target, page, offset, len, seed } => {
                        let offset = usize::from(offset);
                        let len = usize::from(len).min(PAGE - offset);
                        let bytes: Vec<u8> = content(2, seed)[..len].to_vec();
                        pages.write_partial(chunk_of(target), PageNo(u32::from(page)), offset, &bytes, Lsn(version)).unwrap();
                        let entry = model.entry((target, page)).or_insert_with(|| vec![0u8; PAGE]);
                        entry[offset..offset + len].copy_from_slice(&bytes);
                        prop_assert_eq!(encoding_of(&pages, target, page), Encoding::Raw, "a partial write stores the page raw");
                        expect(&model, &pages, target, page, op);
                    }
                    Op::Trim { target, page } => {
                        pages.trim_page(chunk_of(target), PageNo(u32::from(page))).unwrap();
                        model.remove(&(target, page));
                        expect(&model, &pages, target, page, op);
                    }
                    Op::Heavy { first, count } => {
                        pages.heavy_compress(chunk_of(0), PageNo(u32::from(first)), u32::from(count)).unwrap();
                        for page in first..first.saturating_add(count).min(12) {
                            expect(&model, &pages, 0, page, op);
                        }
                        // The mode none volume refuses, and changes nothing.
                        prop_assert!(pages.heavy_compress(chunk_of(2), PageNo(0), 4).is_err());
                    }
                    Op::Recompress => {
                        pages.recompress_partial().unwrap();
                    }
                    Op::Reopen => {
                        drop(pages);
                        pages = rig.open(busy);
                    }
                }
                // The allocator equals the one derived from the index after every step.
                if let Err(problem) = pages.store().check_invariants() {
                    prop_assert!(false, "after {:?}: {}", op, problem);
                }
            }
            pages.set_cache_pages(0);
            for target in 0..3u8 {
                for page in 0..12u8 {
                    expect(&model, &pages, target, page, &Op::Reopen);
                }
            }
            let report = pages.check().unwrap();
            prop_assert!(report.damaged.is_empty(), "{:?}", report.damaged);
            drop(pages);
            let pages = rig.open(false);
            for ((target, page), data) in &model {
                let got = pages.read_page(chunk_of(*target), PageNo(u32::from(*page))).unwrap();
                prop_assert!(got.as_ref() == Some(data), "target {} page {} lost at reopen", target, page);
            }
            prop_assert!(pages.check().unwrap().damaged.is_empty());
        }
    }
}

/// Power fails at a random write of the drive's media or of the journal, in the middle of
/// page writes, partial writes, trims and heavy compression, on the emulated drive: after
/// recovery of both layers every page verifies and holds its newest acknowledged content, or
/// the content the operation cut short by the power failure was writing. An older
/// acknowledged content is a rollback and fails the check.
#[test]
fn crash_points_through_both_layers_lose_no_acknowledged_page() {
    let struck = two_layer_crash_rounds(40);
    assert!(struck > 30, "power should often fail inside an operation: {struck}");
}

/// The two-layer crash oracle catches the rollback it guards against: with recovery
/// dropping the newest journal record, the same rounds fail.
#[test]
fn the_two_layer_crash_oracle_fails_when_recovery_drops_the_newest_commit() {
    crate::journal::set_drop_newest_record(true);
    let verdict = std::panic::catch_unwind(|| two_layer_crash_rounds(40));
    crate::journal::set_drop_newest_record(false);
    assert!(verdict.is_err(), "the two-layer crash oracle missed a dropped acknowledged write");
}

/// Runs `rounds` rounds of operations through both layers with power failing at random
/// writes; panics on the first page that breaks the oracle. Returns how many failed.
fn two_layer_crash_rounds(rounds: u64) -> u64 {
    use std::collections::BTreeMap;

    use tundra_device::fault::FaultyDevice;
    use tundra_env::Rng;

    let options = FormatOptions { segment_bytes: 64 * 1024, ..FormatOptions::new(16 << 20, 4 << 20) };
    let quiet = CsdConfig { background: false, ..CsdConfig::default() };
    let mut rng = Rng::new(99);
    let mut struck = 0;
    for round in 0..rounds {
        let media =
            Arc::new(FaultyDevice::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096), round));
        let fast = Arc::new(FaultyDevice::new(MemDevice::new(JOURNAL.total_blocks()), round + 500));
        CsdDevice::format(media.clone(), &options, quiet).unwrap();
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let chunk = ChunkId(1);
        // Per page: the content a reader may see (None: absent).
        let mut acknowledged: BTreeMap<u32, Option<Vec<u8>>> = BTreeMap::new();
        // What the operation a power failure cut short was writing, per page.
        let mut in_flight: BTreeMap<u32, Vec<Option<Vec<u8>>>> = BTreeMap::new();
        for crash in 0..3u64 {
            let drive: Arc<dyn BlockDevice> = Arc::new(CsdDevice::open(media.clone(), quiet).unwrap());
            let store = Arc::new(Store::open(drive, fast.clone()).unwrap());
            if store.volume(crate::ids::VolumeId(0)).is_none() {
                store.create_volume(test_volume(8192)).unwrap();
            }
            store.check_invariants().unwrap_or_else(|p| panic!("round {round} crash {crash}: at recovery: {p}"));
            let pages = path_of(store, 8192, CpuLoad::Fixed(0.0));
            // What `tundra fsck` runs: every page verified, no block leaked.
            let report = pages.check().unwrap_or_else(|e| panic!("round {round} crash {crash}: check: {e}"));
            assert!(report.damaged.is_empty(), "round {round} crash {crash}: {:?}", report.damaged);
            for page in 0..8u32 {
                let got =
                    pages.read_page(chunk, PageNo(page)).unwrap_or_else(|e| panic!("round {round}: page {page}: {e}"));
                let expected = acknowledged.get(&page).cloned().flatten();
                let possible = in_flight.get(&page).is_some_and(|v| v.contains(&got));
                assert!(got == expected || possible, "round {round} crash {crash}: page {page} lost its content");
                acknowledged.insert(page, got);
            }
            in_flight.clear();
            if rng.chance(0.50) {
                media.crash_after(rng.below(40))
            } else {
                fast.crash_after(rng.below(20))
            }
            for step in 0..25u64 {
                let page = rng.below(8) as u32;
                in_flight.clear();
                let result = match rng.below(10) {
                    0 => {
                        in_flight.entry(page).or_default().push(None);
                        pages.trim_page(chunk, PageNo(page)).map(|()| vec![(page, None)])
                    }
                    1 => {
                        // Heavy compression changes no content: nothing new to allow.
                        pages.heavy_compress(chunk, PageNo(0), 8).map(|_| Vec::new())
                    }
                    2 => {
                        let mut merged = acknowledged.get(&page).cloned().flatten().unwrap_or_else(|| vec![0; 8192]);
                        merged[100..108].copy_from_slice(&(round * 1000 + crash * 100 + step).to_le_bytes());
                        in_flight.entry(page).or_default().push(Some(merged.clone()));
                        let patch = merged[100..108].to_vec();
                        pages
                            .write_partial(chunk, PageNo(page), 100, &patch, Lsn(1))
                            .map(|()| vec![(page, Some(merged))])
                    }
                    _ => {
                        let content = table_page(round * 1000 + crash * 100 + step, 8192);
                        in_flight.entry(page).or_default().push(Some(content.clone()));
                        pages
                            .write_page(chunk, PageNo(page), &content, Lsn(1), None)
                            .map(|_| vec![(page, Some(content))])
                    }
                };
                match result {
                    Ok(changes) => {
                        for (page, content) in changes {
                            acknowledged.insert(page, content);
                        }
                        let invariants = pages.store().check_invariants();
                        invariants.unwrap_or_else(|p| panic!("round {round} crash {crash} step {step}: {p}"));
                    }
                    Err(_) => {
                        struck += 1;
                        break;
                    }
                }
            }
            drop(pages);
            media.crash();
            fast.crash();
            media.recover().unwrap();
            fast.recover().unwrap();
        }
    }
    struck
}

/// A CPU gauge a test turns from busy to idle.
struct Switch(std::sync::atomic::AtomicBool);

impl tundra_env::CpuGauge for Switch {
    fn busy_fraction(&self) -> std::result::Result<f64, String> {
        Ok(if self.0.load(Ordering::Relaxed) { 0.9 } else { 0.05 })
    }
}

/// An 8 KiB page that lz4 cannot bring under 4 KiB and zstd can: rows of text with a run of
/// random bytes, the run as long as that takes (found, not guessed).
fn page_zstd_saves_a_block() -> Vec<u8> {
    let codec = PageCodec::new(1).unwrap();
    let mut rng = tundra_env::Rng::new(5);
    for random in (0..8192).step_by(64) {
        let mut page = table_page(7, 8192);
        page[..random].copy_from_slice(&rng.bytes(random));
        let lz4 = codec.encode(Algorithm::Lz4, &page).unwrap();
        let zstd = codec.encode(Algorithm::Zstd, &page).unwrap();
        if lz4.bytes_4k() == 8192 && zstd.bytes_4k() == 4096 {
            return page;
        }
    }
    panic!("no page found where only zstd saves a block");
}

/// Pages written while the host is busy get lz4 without a comparison, which saves no block on
/// these pages, so they are stored raw and remembered; the pass does nothing while the host
/// stays busy, then, once idle, compares and stores them with zstd in half the blocks, a
/// bounded number per call. A page written again in between leaves the set; what it reads is
/// unchanged throughout.
#[test]
fn pages_written_on_a_busy_host_are_chosen_again_when_it_is_idle() {
    let options = FormatOptions { segment_bytes: 256 * 1024, ..FormatOptions::new(64 << 20, 16 << 20) };
    let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
    let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
    let drive = CsdDevice::format(media, &options, CsdConfig::default()).unwrap();
    Journal::format(fast.as_ref(), JOURNAL).unwrap();
    let store = Arc::new(Store::open(Arc::new(drive), fast).unwrap());
    store.create_volume(test_volume(8192)).unwrap();
    let busy = Arc::new(Switch(std::sync::atomic::AtomicBool::new(true)));
    let pages = path_of(store, 8192, CpuLoad::Gauge(busy.clone()));
    let chunk = ChunkId(1);
    let content = page_zstd_saves_a_block();
    for p in 0..40u32 {
        let encoding = pages.write_page(chunk, PageNo(p), &content, Lsn(1), None).unwrap();
        assert_eq!(encoding, Encoding::Raw, "lz4 on a busy host saves no block");
    }
    // A batch write (a write-back flush) and a rewrite that keeps the assumed lz4 are noted too.
    let batch: Vec<(PageNo, &[u8], Lsn, Option<f64>)> =
        (40..50u32).map(|p| (PageNo(p), content.as_slice(), Lsn(1), Some(0.0))).collect();
    pages.write_pages(chunk, &batch).unwrap();
    assert_eq!(pages.rechoose_stats().pending_pages, 50);
    assert_eq!(pages.rechoose(100, 0.2).unwrap().busy_passes, 1, "nothing while the host is busy");
    assert_eq!(pages.rechoose_stats().pending_pages, 50);
    // Page 0 written again with a named algorithm: it leaves the set.
    pages.write_page_with(chunk, PageNo(0), &content, Lsn(2), Some(Algorithm::Lz4)).unwrap();
    busy.0.store(false, Ordering::Relaxed);
    let first = pages.rechoose(20, 0.2).unwrap();
    assert_eq!((first.examined_pages, first.rewritten_pages, first.pending_pages), (20, 20, 29), "{first:?}");
    let all = pages.rechoose(100, 0.2).unwrap();
    assert_eq!((all.examined_pages, all.rewritten_pages, all.pending_pages), (49, 49, 0), "{all:?}");
    assert_eq!((all.bytes_before, all.bytes_after), (49 * 8192, 49 * 4096));
    for p in 0..50u32 {
        assert_eq!(pages.read_page(chunk, PageNo(p)).unwrap().unwrap(), content, "page {p}");
        let expected = if p == 0 { Encoding::Raw } else { Encoding::Zstd };
        assert_eq!(pages.store().entry(chunk, PageNo(p)).unwrap().encoding, expected, "page {p}");
    }
    // Written on an idle host, pages are compared at once and not remembered.
    pages.write_page(chunk, PageNo(60), &content, Lsn(3), None).unwrap();
    assert_eq!(pages.rechoose_stats().pending_pages, 0);
    assert_eq!(pages.rechoose(100, 0.2).unwrap().examined_pages, 49);
}

/// Two replicas of one chunk holding the same command; a page made bad on one is rewritten
/// from the other's copy with the same encoding, length, checksum and LSN, durably (it reads
/// back after a reopen), and a copy of another version, a bad copy, or a page that changed
/// meanwhile is never installed.
#[test]
fn a_bad_page_is_repaired_from_another_replicas_copy() {
    let replica = || {
        let data = Arc::new(MemDevice::new(4096));
        let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        (data.clone(), fast.clone(), pages_over(data, fast, 8192))
    };
    let ((data, fast, a), (_, _, b)) = (replica(), replica());
    let chunk = ChunkId(2);
    let content = table_page(7, 8192);
    let command = a.encode_pages(chunk, &[(PageNo(3), content.as_slice(), Lsn(5), None)]).unwrap();
    a.apply_command(&command, |c| a.store().apply(c)).unwrap();
    b.apply_command(&command, |c| b.store().apply(c)).unwrap();
    let bad = a.store().entry(chunk, PageNo(3)).unwrap();
    // The image the commit carried goes to its run, and is damaged there.
    a.store().write_unwritten().unwrap();
    let len = usize::from(bad.run.count) * 4096;
    a.store().data_device().write(bad.run.first_lba(), &vec![0x5A; len]).unwrap();
    a.forget_all();
    assert_eq!(a.verify_stored(chunk, PageNo(3)).unwrap_err().kind(), crate::ErrorKind::Corrupted);
    assert_eq!(a.good_image(chunk, PageNo(3)).unwrap_err().kind(), crate::ErrorKind::Corrupted);
    let copy = b.good_image(chunk, PageNo(3)).unwrap().unwrap();

    // A copy of another version, and a copy whose bytes are bad, are refused.
    let mut newer = copy.clone();
    newer.lsn = Lsn(6);
    assert_eq!(a.store().repair_page(chunk, bad, &newer).unwrap_err().kind(), crate::ErrorKind::Invalid);
    let mut damaged = copy.clone();
    damaged.image.bytes[10] ^= 0x40;
    assert!(a.verify_image(chunk, &damaged).is_err());
    assert!(a.verify_image(chunk, &copy).is_ok());

    assert_eq!(a.store().repair_page(chunk, bad, &copy).unwrap(), crate::store::RepairOutcome::Repaired);
    let repaired = a.store().entry(chunk, PageNo(3)).unwrap();
    let theirs = b.store().entry(chunk, PageNo(3)).unwrap();
    assert_eq!(
        (repaired.encoding, repaired.stored_len, repaired.checksum, repaired.lsn),
        (theirs.encoding, theirs.stored_len, theirs.checksum, theirs.lsn)
    );
    assert_eq!(a.read_page(chunk, PageNo(3)).unwrap().unwrap(), content);
    a.store().check_invariants().unwrap();
    drop(a);
    let reopened = path_of(Arc::new(Store::open(data, fast).unwrap()), 8192, CpuLoad::Fixed(0.0));
    assert_eq!(reopened.read_page(chunk, PageNo(3)).unwrap().unwrap(), content);

    // The page was written again after it was found bad: the old copy is not installed.
    let bad = reopened.store().entry(chunk, PageNo(3)).unwrap();
    reopened.store().data_device().write(bad.run.first_lba(), &vec![0x5A; len]).unwrap();
    let newer_content = table_page(8, 8192);
    reopened.write_page(chunk, PageNo(3), &newer_content, Lsn(9), None).unwrap();
    assert_eq!(reopened.store().repair_page(chunk, bad, &copy).unwrap(), crate::store::RepairOutcome::Superseded);
    assert_eq!(reopened.read_page(chunk, PageNo(3)).unwrap().unwrap(), newer_content);
    reopened.store().check_invariants().unwrap();
}
