//! The store's write and read paths, timed in one process: whole 8 KiB pages written one at a
//! time, written in batches of 32 (a write-back flush), and read back with the page cache off,
//! through the page path (Algorithm 1 with a fixed cost model and an idle CPU, so every run
//! makes the same choices), the store and the emulated drive over memory. It uses only the
//! store API that has been stable across revisions, so `scripts/compare-store-paths` can build
//! it against an older revision and give a same-machine ratio.

use std::sync::Arc;
use std::time::Instant;

use tundra_codec::{DecompressCost, LinearCost, PageCodec, PageSize, Selector, SelectorConfig};
use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
use tundra_device::mem::MemDevice;
use tundra_store::ids::{ChunkId, Lsn, PageNo, VolumeId};
use tundra_store::journal::{Journal, JournalGeometry};
use tundra_store::pages::{CpuLoad, Pages};
use tundra_store::store::Store;
use tundra_store::volume::{Volume, VolumeMode};

const PAGE: usize = 8192;

/// A page that looks like a heap page of rows: text with varying numbers and some free space.
fn table_page(seed: u64) -> Vec<u8> {
    let mut page = vec![0u8; PAGE];
    let mut at = PAGE / 5;
    let mut row = seed * 1000;
    while at + 80 < PAGE {
        let line =
            format!("{row:010}|2013-01-{:02}|UA|N{:05}|EWR|IAH|{:4}|", 1 + row % 28, row * 37 % 99_991, row % 1440);
        page[at..at + line.len()].copy_from_slice(line.as_bytes());
        at += line.len() + 7;
        row += 1;
    }
    page
}

fn main() {
    let pages: u32 = std::env::args().nth(1).map_or(8192, |s| s.parse().expect("a page count"));
    let options = FormatOptions { segment_bytes: 1 << 20, ..FormatOptions::new(1 << 30, 512 << 20) };
    let media = Arc::new(MemDevice::new(options.geometry().unwrap().total_bytes() / 4096));
    let drive = Arc::new(CsdDevice::format(media, &options, CsdConfig::default()).unwrap());
    let geometry = JournalGeometry { checkpoint_blocks: 2048, log_blocks: 8192 };
    let fast = Arc::new(MemDevice::new(geometry.total_blocks()));
    Journal::format(fast.as_ref(), geometry).unwrap();
    let store = Arc::new(Store::open(drive, fast).unwrap());
    let volume = Volume {
        id: VolumeId(0),
        name: "bench".into(),
        size_bytes: 1 << 30,
        page_size: PAGE as u32,
        chunk_bytes: 1 << 30,
        mode: VolumeMode::Normal,
    };
    store.create_volume(volume).unwrap();
    let codec = PageCodec::new(1).unwrap();
    let cost = DecompressCost {
        page_size: PageSize::Kib8,
        lz4: LinearCost { fixed_us: 0.5, us_per_byte: 0.5 / 1024.0 },
        zstd: LinearCost { fixed_us: 2.0, us_per_byte: 2.0 / 1024.0 },
    };
    let selector = Selector::new(SelectorConfig::default(), codec, cost).unwrap();
    let path = Pages::new(store.clone(), PageSize::Kib8, selector, codec, CpuLoad::Fixed(0.0)).unwrap();
    path.set_cache_pages(0);
    let chunk = ChunkId(0);
    let contents: Vec<Vec<u8>> = (0..pages).map(|p| table_page(u64::from(p))).collect();

    let started = Instant::now();
    for p in 0..pages {
        path.write_page(chunk, PageNo(p), &contents[p as usize], Lsn(1), None).unwrap();
    }
    let single = started.elapsed().as_secs_f64();

    let started = Instant::now();
    for group in (0..pages).collect::<Vec<_>>().chunks(32) {
        let batch: Vec<(PageNo, &[u8], Lsn, Option<f64>)> =
            group.iter().map(|&p| (PageNo(p), contents[p as usize].as_slice(), Lsn(2), None)).collect();
        path.write_pages(chunk, &batch).unwrap();
    }
    let batched = started.elapsed().as_secs_f64();

    let started = Instant::now();
    for p in 0..pages {
        let page = path.read_page(chunk, PageNo(p)).unwrap().unwrap();
        assert_eq!(page, contents[p as usize]);
    }
    let read = started.elapsed().as_secs_f64();
    let mb = f64::from(pages) * PAGE as f64 / 1e6;
    println!("{{\"pages\": {pages}, \"write_mb_s\": {:.1}, \"batch_write_mb_s\": {:.1}, \"read_mb_s\": {:.1}}}",
        mb / single, mb / batched, mb / read);
}
