//! The slot overflow rule on a node (seed 000 §3.3.3: "a slot that would overflow makes the
//! page materialize, or writes an extra image above LSN_min for lagging readers"): a small
//! redo cache, few pages, and a reader holding LSN_min at the stream's start so that nothing
//! folds. Every page's slot fills again and again; each time the page gets an extra image in an
//! image cell and its slot is emptied, so the stream's memory stays within its bound while
//! every version the reader may ask for stays readable, at two device reads at most, and
//! equal to the model's. Once the reader lets go, folds empty every slot and cell.
//!
//! The twin injects a bug (the extra image built at the page's newest record but kept as the
//! page at its oldest) and the model check must catch it. A last test shows the hard bound:
//! records that cannot leave memory (pages past the slot region) make the writer wait and
//! then hear `Busy`, with nothing appended.

use tundra_device::csd::CsdConfig;
use tundra_env::{Rng, seed_from_env};
use tundra_node::{Environment, Error, Node, RedoWatermarks, VolumeRef};
use tundra_redo::codec::encode_record;
use tundra_redo::testing::{Bug, inject};
use tundra_redo::versions::{apply, record_cost_bytes};
use tundra_redo::{AppendOutcome, Payload, RedoRecord};
use tundra_store::ids::Lsn;
use tundra_store::volume::VolumeMode;

mod memory_node;
use memory_node::redo_model::{Model, PAGE};
use memory_node::{Media, config, layout};

/// Few pages, so that each takes many records and its slot fills many times.
const PAGES: u64 = 6;
const CACHE: u64 = 16 * 1024;

fn build(media: &Media, seed: u64) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let devices = media.format_with(&layout(), CsdConfig { background: false, ..CsdConfig::default() });
    let mut config = config(dir.path());
    config.redo.cache = "16KiB".into();
    config.redo.log_slots = true;
    Node::from_devices(&config, layout(), devices, &Environment::simulated(seed), false, &mut |_| {}).unwrap()
}

fn status(node: &Node, volume: &VolumeRef) -> RedoWatermarks {
    node.redo_status(volume).unwrap()
}

/// Appends `batches` batches of small records on pages `first..first + pages` (and now and
/// then a whole page), each checked against the hard bound on the stream's memory.
fn append(
    node: &Node,
    volume: &VolumeRef,
    rng: &mut Rng,
    model: &mut Model,
    mut end: u64,
    batches: usize,
    pages: std::ops::Range<u64>,
) -> u64 {
    for _ in 0..batches {
        let mut lsn = end;
        let records: Vec<RedoRecord> = (0..1 + rng.below(4))
            .map(|_| {
                lsn += 1 + rng.below(3);
                let page = pages.start + rng.below(pages.end - pages.start);
                let payload = if rng.chance(0.02) {
                    Payload::Image((0..PAGE).map(|i| (i as u64 + lsn) as u8).collect())
                } else {
                    let len = 8 + rng.below(60);
                    Payload::Ranges(vec![(rng.below(PAGE as u64 - len) as u32, rng.bytes(len as usize))])
                };
                RedoRecord { lsn: Lsn(lsn), page, payload }
            })
            .collect();
        let mut bytes = Vec::new();
        for r in &records {
            encode_record(r, &mut bytes);
        }
        let batch_cost: u64 = records.iter().map(record_cost_bytes).sum();
        let outcome = node.append_redo(volume, 1, end, lsn, records.len() as u32, &bytes).unwrap();
        assert_eq!(outcome, AppendOutcome::Ok { durable_lsn: Lsn(lsn) });
        let held = status(node, volume);
        assert!(
            held.unfolded_bytes <= 4 * CACHE + batch_cost,
            "the stream's memory passed its hard bound (4 x {CACHE} + the batch's {batch_cost}): {held:?}"
        );
        model.add(records);
        end = lsn;
    }
    end
}

/// Reads every page at every LSN where it changed and just below, and at `from` and `end`,
/// each checked against the model (built up record by record); returns how many reads differed
/// or failed, and the most device reads one rebuilt page took.
fn check_every_version(node: &Node, volume: &VolumeRef, model: &Model, from: u64, end: u64) -> (u64, u64) {
    let mut out = vec![0u8; PAGE];
    let (mut wrong, mut most) = (0, 0);
    for page in 0..PAGES {
        let records = model.records.get(&page).map(Vec::as_slice).unwrap_or_default();
        let mut lsns: Vec<u64> = records.iter().flat_map(|r| [r.lsn.0 - 1, r.lsn.0]).collect();
        lsns.extend([from, end]);
        lsns.retain(|&l| l >= from && l <= end);
        lsns.sort_unstable();
        lsns.dedup();
        let (mut expected, mut applied) = (vec![0u8; PAGE], 0);
        for lsn in lsns {
            while applied < records.len() && records[applied].lsn.0 <= lsn {
                apply(&mut expected, &records[applied].payload).unwrap();
                applied += 1;
            }
            let before = status(node, volume);
            match node.read_page_at(volume, page, lsn, 0, &mut out) {
                Ok(served) if out == expected && served.page_lsn == model.page_lsn(page, Lsn(lsn)) => {}
                _ => wrong += 1,
            }
            let after = status(node, volume);
            if after.rebuilt_pages > before.rebuilt_pages {
                most = most.max(after.rebuild_device_reads - before.rebuild_device_reads);
            }
        }
    }
    (wrong, most)
}

/// The run both tests share, with `bug` injected while the writer appends; returns the reads
/// that differed from the model while the reader held every version, and the stream's status
/// then.
fn run(seed: u64, bug: Option<Bug>) -> (u64, RedoWatermarks) {
    let mut rng = Rng::new(seed);
    let media = Media::new(&layout());
    let mut model = Model::default();
    let node = build(&media, seed);
    let volume = node.volume_create("kv", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    assert_eq!(node.append_redo(&volume, 1, 0, 1, 0, &[]).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(1) });
    let lease = node.register_reader(&volume, 7, 1).unwrap_or_else(|e| panic!("{e:?}"));
    let end = {
        let _bug = bug.map(inject);
        append(&node, &volume, &mut rng, &mut model, 1, 1500, 0..PAGES)
    };
    let held = status(&node, &volume);
    assert_eq!(held.lsn_min, 1, "the reader holds every version: {held:?}");
    let (wrong, most) = check_every_version(&node, &volume, &model, 1, end);
    if bug.is_some() {
        return (wrong, held);
    }
    assert!((1..=2).contains(&most), "a rebuilt page took {most} device reads (the run must rebuild from the device)");
    // The reader lets go: everything folds, and slots and cells cost the drive nothing.
    node.release_reader(&volume, lease.lease_id).unwrap();
    while node.fold_redo(1000).unwrap() > 0 {}
    let idle = status(&node, &volume);
    assert_eq!((idle.spilled_records, idle.unfolded_bytes, idle.image_cells_in_use), (0, 0, 0), "{idle:?}");
    assert_eq!(idle.slot_mapped_bytes, 0, "folded pages' slots and cells are emptied: {idle:?}");
    assert_eq!(check_every_version(&node, &volume, &model, end, end).0, 0);
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {:?}", report.damaged);
    }
    (wrong, held)
}

#[test]
fn overflowing_slots_get_extra_images_and_memory_stays_bounded_under_a_lagging_reader() {
    let (wrong, held) = run(seed_from_env(31), None);
    assert_eq!(wrong, 0, "reads differed from the model");
    assert!(held.slot_overflows > 0, "the run must overflow slots: {held:?}");
    assert!(held.extra_images > 0 && held.image_cells_in_use > 0, "overflows make extra images: {held:?}");
    assert!(held.spilled_records > 1000, "records left memory though nothing could fold: {held:?}");
}

#[test]
fn the_model_check_catches_an_extra_image_at_the_wrong_lsn() {
    let (wrong, held) = run(seed_from_env(31), Some(Bug::ExtraImageAtWrongLsn));
    assert!(held.extra_images > 0, "{held:?}");
    assert!(wrong > 0, "an image holding changes newer than its LSN must show in reads between the two");
}

#[test]
fn records_that_cannot_leave_memory_make_the_writer_wait_then_hear_busy() {
    let seed = seed_from_env(32);
    let mut rng = Rng::new(seed);
    let media = Media::new(&layout());
    let mut model = Model::default();
    let node = build(&media, seed);
    // Pages past the stream's slot region (its slots, then its image cells) have no slot.
    let (_, region) = layout().slot_region(0);
    let pages = region + 8;
    let volume = node.volume_create("big", pages * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    assert_eq!(node.append_redo(&volume, 1, 0, 1, 0, &[]).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(1) });
    let lease = node.register_reader(&volume, 7, 1).unwrap_or_else(|e| panic!("{e:?}"));
    let mut end = 1;
    let refused = loop {
        let record = RedoRecord {
            lsn: Lsn(end + 1),
            page: region + rng.below(8),
            payload: Payload::Ranges(vec![(0, vec![7; 200])]),
        };
        let mut bytes = Vec::new();
        encode_record(&record, &mut bytes);
        match node.append_redo(&volume, 1, end, end + 1, 1, &bytes) {
            Ok(outcome) => {
                assert_eq!(outcome, AppendOutcome::Ok { durable_lsn: Lsn(end + 1) });
                model.add([record]);
                end += 1;
                assert!(status(&node, &volume).unfolded_bytes <= 4 * CACHE + 1024);
            }
            Err(error) => break error,
        }
        assert!(end < 10_000, "the writer was never held back");
    };
    assert!(matches!(refused, Error::Busy(_)), "{refused:?}");
    assert!(refused.to_string().contains("send it again later"), "{refused}");
    assert_eq!(status(&node, &volume).durable_lsn, end, "a refused batch changes nothing");
    // The reader moves on: the pages fold and the writer goes on.
    node.release_reader(&volume, lease.lease_id).unwrap();
    let record = RedoRecord { lsn: Lsn(end + 1), page: region, payload: Payload::Ranges(vec![(0, vec![9; 10])]) };
    let mut bytes = Vec::new();
    encode_record(&record, &mut bytes);
    assert!(node.append_redo(&volume, 1, end, end + 1, 1, &bytes).is_ok());
}
