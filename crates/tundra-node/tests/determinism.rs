//! One seed, one run: a node built on memory devices with `Environment::simulated(seed)` and
//! the drive's background thread off, driven by a workload drawn from the same seed (page
//! writes through Algorithm 1 and forced algorithms, unaligned byte writes through the
//! write-back cache, zeroes, trims, heavy compression, background passes, flushes, a volume
//! deleted), leaves byte-identical drive media and fast device every time, and makes the same
//! Algorithm 1 choices. A replay of a failing seed is exact: `TUNDRA_SEED=N`.

use std::collections::HashMap;

use tundra_device::csd::CsdConfig;
use tundra_env::{Rng, seed_from_env};
use tundra_node::{Environment, Node, VolumeRef, WriteMode};
use tundra_store::volume::VolumeMode;

mod memory_node;
use memory_node::{MIB, Media, config, layout};

/// What a run leaves: both devices' blocks, and how many pages each volume holds in each
/// encoding (Algorithm 1's choices among them).
#[derive(Debug, PartialEq)]
struct Outcome {
    drive: HashMap<u64, Box<[u8]>>,
    fast: HashMap<u64, Box<[u8]>>,
    encodings: Vec<(String, u64, u64, u64, u64)>,
}

/// A page of rows: text with numbers from the generator, some free space; every fifth page is
/// noise that does not compress.
fn page(rng: &mut Rng, size: usize) -> Vec<u8> {
    if rng.below(5) == 0 {
        return rng.bytes(size);
    }
    let mut page = vec![0u8; size];
    let mut at = size / (2 + rng.below(6) as usize);
    while at + 80 < size {
        let row = rng.below(1_000_000);
        let line = format!("{row:08}|2013-01-{:02}|UA|N{:05}|EWR|IAH|{:4}|", 1 + row % 28, row % 99_991, row % 1440);
        page[at..at + line.len()].copy_from_slice(line.as_bytes());
        at += line.len() + rng.below(12) as usize;
    }
    page
}

fn run(environment: &Environment, seed: u64) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout();
    let media = Media::new(&layout);
    let csd = CsdConfig { background: false, ..CsdConfig::default() };
    let node = Node::from_devices(
        &config(dir.path()),
        layout.clone(),
        media.format_with(&layout, csd),
        environment,
        false,
        &mut |_| {},
    )
    .unwrap();
    let mut rng = Rng::new(seed);
    let volumes: Vec<VolumeRef> = vec![
        node.volume_create("db", 8 * MIB, 8192, VolumeMode::Normal).unwrap(),
        node.volume_create("big", 8 * MIB, 16384, VolumeMode::Normal).unwrap(),
        node.volume_create("wal", 2 * MIB, 8192, VolumeMode::None).unwrap(),
        node.volume_create("scratch", 2 * MIB, 8192, VolumeMode::Normal).unwrap(),
    ];
    for _ in 0..600 {
        let volume = rng.pick(&volumes).clone();
        let page_size = volume.page_size();
        let pages = volume.volume.size_bytes / page_size as u64;
        let index = rng.below(pages);
        match rng.below(20) {
            0..=7 => {
                let mode = match rng.below(6) {
                    0 => WriteMode::Lz4,
                    1 => WriteMode::Zstd,
                    2 => WriteMode::None,
                    _ => WriteMode::Auto { update_fraction: if rng.chance(0.5) { None } else { Some(0.5) } },
                };
                let content = page(&mut rng, page_size);
                node.write_page(&volume, index, mode, &content).unwrap();
            }
            8..=12 => {
                let len = 1 + rng.below(3 * page_size as u64);
                let offset = rng.below(volume.volume.size_bytes - len);
                let mut bytes = page(&mut rng, 3 * page_size);
                bytes.truncate(len as usize);
                node.write_bytes(&volume, offset, &bytes).unwrap();
            }
            13 => {
                let len = 1 + rng.below(2 * page_size as u64);
                node.zero_bytes(&volume, rng.below(volume.volume.size_bytes - len), len).unwrap();
            }
            14 => node.trim_pages(&volume, index, 1 + rng.below(4).min(pages - index - 1)).unwrap(),
            15 if volume.volume.mode == VolumeMode::Normal => {
                let count = 1 + rng.below(32).min(pages - index - 1);
                node.flush(Some(&volume)).unwrap();
                node.heavy_compress(&volume, index, count).unwrap();
            }
            16 => node.background().unwrap(),
            _ => node.flush(None).unwrap(),
        }
    }
    node.volume_delete("scratch").unwrap();
    node.flush(None).unwrap();
    node.background().unwrap();
    let stats = node.stats();
    let encodings = stats
        .volumes
        .iter()
        .map(|v| (v.name.clone(), v.space.raw_pages, v.space.lz4_pages, v.space.zstd_pages, v.space.heavy_pages))
        .collect();
    node.close().unwrap();
    drop(node);
    Outcome { drive: media.drive.snapshot(), fast: media.fast.snapshot(), encodings }
}

#[test]
fn the_same_seed_gives_the_same_bytes_on_both_devices_and_the_same_choices() {
    let seed = seed_from_env(2026);
    let first = run(&Environment::simulated(seed), seed);
    let (lz4, zstd): (u64, u64) = first.encodings.iter().fold((0, 0), |(l, z), v| (l + v.2, z + v.3));
    assert!(lz4 > 0 && zstd > 0, "Algorithm 1 and the forced modes stored both algorithms: {:?}", first.encodings);
    assert!(first.encodings.iter().any(|v| v.4 > 0), "heavy segments were written: {:?}", first.encodings);
    let second = run(&Environment::simulated(seed), seed);
    assert_eq!(first.encodings, second.encodings, "seed {seed}: other choices");
    assert!(
        first.drive == second.drive,
        "seed {seed}: the drive's media differ ({} and {} blocks)",
        first.drive.len(),
        second.drive.len()
    );
    assert!(first.fast == second.fast, "seed {seed}: the fast devices differ");
}

/// The comparison can fail: another workload seed, or only the environment's random stream
/// changed (the heavy segments' nonces reach the media), gives other bytes.
#[test]
fn another_seed_or_another_random_stream_gives_other_bytes() {
    let seed = seed_from_env(2026);
    let first = run(&Environment::simulated(seed), seed);
    let other_workload = run(&Environment::simulated(seed), seed + 1);
    assert!(first.drive != other_workload.drive);
    let other_stream = run(&Environment::simulated(seed + 1), seed);
    assert_eq!(first.encodings, other_stream.encodings, "the same workload makes the same choices");
    assert!(first.drive != other_stream.drive, "nonces from another stream left the drive's bytes unchanged");
}
