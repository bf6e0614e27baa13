//! Journal damage end to end: the scenario through the node and the `tundra` binary. A
//! node writes and flushes, restarts, rewrites every seventh page, flushes and is killed; one
//! bit flips in a log block written after the restart. The node refuses to open naming the
//! block, `tundra fsck` reports it and exits 1, `tundra repair` reports what it would drop and
//! changes nothing, `tundra repair --accept-loss` truncates the log there, and every page then
//! reads its latest flushed contents, its older one (only as the repair reported a loss) or an
//! error. A journal record with a valid checksum but an impossible stored length leaves only
//! its page unreadable: fsck reports it and the node serves the others.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{fails, succeeds, tundra};
use tundra_node::{Config, Error, Node, WriteMode};
use tundra_store::volume::VolumeMode;

const PAGES: u64 = 2800;
const PAGE: usize = 8192;

fn config(dir: &Path) -> Config {
    let text = "[drive]\nphysical = \"64MiB\"\nlogical = \"128MiB\"\n[fast]\nvolumes = \"32MiB\"\n";
    let mut config = Config::parse(text).unwrap();
    config.data_dir = dir.join("data");
    config
}

fn content(page: u64, generation: u64) -> Vec<u8> {
    let line = format!("page {page:06} generation {generation:03} of the tundra repair test; ");
    line.as_bytes().iter().copied().cycle().take(PAGE).collect()
}

/// Writes every page, closes; reopens, rewrites every seventh page, flushes and stops without
/// closing (as kill -9 leaves the directory). Returns the latest contents' generations.
fn write_restart_rewrite_kill(config: &Config) -> Vec<u64> {
    let node = Node::open(config, &mut |_| {}).unwrap();
    let volume = node.volume_create("pg", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    for page in 0..PAGES {
        node.write_page(&volume, page, WriteMode::Lz4, &content(page, 0)).unwrap();
    }
    node.flush(None).unwrap();
    node.close().unwrap();
    // The volume's page path holds the devices too.
    drop((volume, node));
    let node = Node::open(config, &mut |_| {}).unwrap();
    let volume = node.volume_by_name("pg").unwrap();
    let mut latest = vec![0; PAGES as usize];
    for page in (0..PAGES).step_by(7) {
        node.write_page(&volume, page, WriteMode::Lz4, &content(page, 1)).unwrap();
        latest[page as usize] = 1;
    }
    node.flush(None).unwrap();
    drop((volume, node));
    latest
}

/// The compressed store's journal's log blocks of the newest epoch in fast.img: (LBA, block).
fn newest_log_blocks(data_dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let layout = std::fs::read_to_string(data_dir.join("layout.toml")).unwrap();
    let field = |key: &str| -> u64 {
        let line = layout.lines().find(|l| l.starts_with(&format!("{key} = "))).unwrap();
        line.split(" = ").nth(1).unwrap().trim().parse().unwrap()
    };
    let first = 2 + 2 * field("data_journal_checkpoint_blocks");
    let count = field("data_journal_log_blocks");
    let file = std::fs::File::open(data_dir.join("fast.img")).unwrap();
    let mut ring = vec![0u8; count as usize * 4096];
    file.read_exact_at(&mut ring, first * 4096).unwrap();
    let mut found: Vec<(u64, u64, u64, Vec<u8>)> = Vec::new();
    for (i, block) in ring.chunks(4096).enumerate() {
        if &block[..4] == b"BLJT" {
            let epoch = u64::from_le_bytes(block[16..24].try_into().unwrap());
            let position = u64::from_le_bytes(block[8..16].try_into().unwrap());
            found.push((epoch, position, first + i as u64, block.to_vec()));
        }
    }
    let newest = found.iter().map(|f| f.0).max().expect("log blocks");
    found.retain(|f| f.0 == newest);
    found.sort_by_key(|f| f.1);
    found.into_iter().map(|f| (f.2, f.3)).collect()
}

fn write_block(data_dir: &Path, lba: u64, block: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(data_dir.join("fast.img")).unwrap();
    file.write_all_at(block, lba * 4096).unwrap();
    file.sync_all().unwrap();
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_flipped_bit_in_the_log_is_refused_reported_and_repaired_without_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let latest = write_restart_rewrite_kill(&config);
    let data_dir = config.data_dir.clone();
    let blocks = newest_log_blocks(&data_dir);
    assert!(blocks.len() >= 3, "the rewrites span several log blocks: {}", blocks.len());
    let (lba, mut block) = blocks[blocks.len() / 2].clone();
    block[1000] ^= 0x08;
    write_block(&data_dir, lba, &block);

    let refused = Node::open(&config, &mut |_| {}).err().expect("the node refuses to open");
    let Error::Corrupted(message) = refused else { panic!("{refused}") };
    assert!(message.contains("the compressed store's journal in fast.img"), "{message}");
    assert!(message.contains(&format!("(LBA {lba})")), "{message}");

    let dir_arg = data_dir.to_str().unwrap();
    fails(&["repair", "--data-dir", dir.path().to_str().unwrap()], "holds no Tundra node");
    let fsck = tundra(&["fsck", "--data-dir", dir_arg]);
    assert_eq!(fsck.status.code(), Some(1), "{}", text(&fsck.stderr));
    assert!(text(&fsck.stdout).contains(&format!("(LBA {lba})")), "{}", text(&fsck.stdout));
    let json = tundra(&["fsck", "--data-dir", dir_arg, "--json"]);
    assert_eq!(json.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("fsck --json is JSON");
    assert_eq!((json["clean"].as_bool(), json["opened"].as_bool()), (Some(false), Some(false)), "{json}");
    assert!(json["problem"].as_str().unwrap().contains(&format!("(LBA {lba})")), "{json}");
    let dry = tundra(&["repair", "--data-dir", dir_arg]);
    assert!(!dry.status.success());
    assert!(text(&dry.stdout).contains("a repair would drop the damaged block at position"), "{}", text(&dry.stdout));
    assert!(Node::open(&config, &mut |_| {}).is_err(), "a repair without --accept-loss changes nothing");

    let repaired = succeeds(&["repair", "--data-dir", dir_arg, "--accept-loss"]);
    let report = text(&repaired.stdout);
    assert!(report.contains("Drive store: truncated the journal's log, dropping the damaged block"), "{report}");
    let lost = report.contains("dropping");

    let node = Node::open(&config, &mut |_| {}).expect("the repaired node opens");
    let volume = node.volume_by_name("pg").unwrap();
    let (mut current, mut older, mut errors) = (0, 0, 0);
    for page in 0..PAGES {
        let mut out = vec![0u8; PAGE];
        match node.read_page(&volume, page, &mut out) {
            Ok(()) if out == content(page, latest[page as usize]) => current += 1,
            Ok(()) if lost && latest[page as usize] == 1 && out == content(page, 0) => older += 1,
            Ok(()) => panic!("page {page} reads contents never written there"),
            Err(Error::Corrupted(_)) => errors += 1,
            Err(e) => panic!("page {page}: {e}"),
        }
    }
    assert!(older > 0, "the dropped block held rewrites: {current} current, {older} older, {errors} errors");
    assert_eq!(current + older + errors, PAGES);
}

/// Rewrites the first page record of a log block with an impossible stored length and seals the
/// block again with valid checksums, as a writer's bug would: the page it names. Pieces of page
/// images a small commit carried (tag 9, 17 bytes and their length) may come before it.
fn corrupt_first_record(block: &mut [u8]) -> u64 {
    let mut at = 40;
    while block[at] == 9 {
        at += 17 + usize::from(u16::from_le_bytes(block[at + 15..at + 17].try_into().unwrap()));
    }
    assert_eq!(block[at], 1, "a page record at byte {at}");
    let page = u32::from_le_bytes(block[at + 9..at + 13].try_into().unwrap());
    block[at + 20..at + 22].copy_from_slice(&60_000u16.to_le_bytes());
    let body = crc32c::crc32c(&block[40..]);
    block[28..32].copy_from_slice(&body.to_le_bytes());
    let header = crc32c::crc32c(&block[..36]);
    block[36..40].copy_from_slice(&header.to_le_bytes());
    u64::from(page)
}

#[test]
fn a_record_with_an_impossible_stored_length_is_reported_and_the_node_serves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let latest = write_restart_rewrite_kill(&config);
    let data_dir = config.data_dir.clone();
    let (lba, mut block) = newest_log_blocks(&data_dir)[0].clone();
    let bad = corrupt_first_record(&mut block);
    write_block(&data_dir, lba, &block);

    let fsck = tundra(&["fsck", "--data-dir", data_dir.to_str().unwrap()]);
    assert_eq!(fsck.status.code(), Some(1), "{}", text(&fsck.stderr));
    assert!(text(&fsck.stdout).contains("journal record is damaged"), "{}", text(&fsck.stdout));

    let node = Node::open(&config, &mut |_| {}).expect("the node starts");
    let volume = node.volume_by_name("pg").unwrap();
    for page in 0..PAGES {
        let mut out = vec![0u8; PAGE];
        let read = node.read_page(&volume, page, &mut out);
        if page == bad {
            assert!(matches!(read, Err(Error::Corrupted(_))), "page {page}: {read:?}");
        } else {
            read.unwrap();
            assert_eq!(out, content(page, latest[page as usize]), "page {page}");
        }
    }
}

/// The compressed store's journal's superblock with the higher generation in fast.img:
/// (current checkpoint slot, checkpoint_blocks).
fn current_checkpoint_slot(data_dir: &Path) -> (u64, u64) {
    let file = std::fs::File::open(data_dir.join("fast.img")).unwrap();
    let mut blocks = vec![0u8; 2 * 4096];
    file.read_exact_at(&mut blocks, 0).unwrap();
    let field = |block: &[u8], at: usize| u64::from_le_bytes(block[at..at + 8].try_into().unwrap());
    let newest = blocks.chunks(4096).filter(|b| &b[..8] == b"TNDRJRNL").max_by_key(|b| field(b, 32)).unwrap();
    (field(newest, 48), field(newest, 16))
}

#[test]
fn a_damaged_newest_checkpoint_is_recovered_from_the_previous_one_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let latest = write_restart_rewrite_kill(&config);
    let data_dir = config.data_dir.clone();
    let (slot, checkpoint_blocks) = current_checkpoint_slot(&data_dir);
    let lba = 2 + slot * checkpoint_blocks;
    let file = std::fs::File::open(data_dir.join("fast.img")).unwrap();
    let mut header = vec![0u8; 4096];
    file.read_exact_at(&mut header, lba * 4096).unwrap();
    header[17] ^= 0x40;
    write_block(&data_dir, lba, &header);

    let fsck = tundra(&["fsck", "--data-dir", data_dir.to_str().unwrap(), "--json"]);
    assert!(fsck.status.success(), "{}", text(&fsck.stderr));
    let report: serde_json::Value = serde_json::from_slice(&fsck.stdout).unwrap();
    let recovered = report["recovered"][0].as_str().unwrap_or_default();
    let said =
        format!("the compressed store's journal in fast.img: journal checkpoint slot {slot} (LBA {lba}) is damaged");
    assert!(recovered.starts_with(&said), "{report}");
    assert!(recovered.contains("recovered from the previous checkpoint in slot"), "{report}");
    assert_eq!(report["clean"], true);

    let node = Node::open(&config, &mut |_| {}).unwrap();
    let volume = node.volume_by_name("pg").unwrap();
    for page in 0..PAGES {
        let mut out = vec![0u8; PAGE];
        node.read_page(&volume, page, &mut out).unwrap();
        assert_eq!(out, content(page, latest[page as usize]), "page {page}");
    }
}
