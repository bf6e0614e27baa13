//! Redo streams on a node built over memory devices: batches appended as a writer sends them
//! (durable when answered, `Gap` and `Fenced` changing nothing), pages read at every LSN and
//! compared with a model that keeps every version, folds into the compressed store under
//! LSN_min held by a reader's lease, a rebuild on the same media that loses no acknowledged
//! batch, and the same through the native protocol.

use std::sync::Arc;

use tundra_device::csd::CsdConfig;
use tundra_env::{Rng, seed_from_env};
use tundra_node::{Environment, FoldBug, Node, RedoRefusal, VolumeRef};
use tundra_redo::codec::encode_record;
use tundra_redo::{AppendOutcome, Payload, RedoRecord};
use tundra_store::ids::Lsn;
use tundra_store::volume::VolumeMode;

mod memory_node;
use memory_node::redo_model::{Model, PAGE};
use memory_node::{Media, config, layout};

const PAGES: u64 = 64;

fn record(rng: &mut Rng, lsn: u64) -> RedoRecord {
    let page = rng.below(PAGES);
    let payload = if rng.chance(0.15) {
        // Text-like pages, so the fold's compression has something to do.
        let mut image = vec![0u8; PAGE];
        for (i, byte) in image.iter_mut().enumerate().skip(PAGE / 4) {
            *byte = b"tundra redo page "[(i + page as usize) % 17];
        }
        Payload::Image(image)
    } else {
        let ranges = (0..1 + rng.below(3))
            .map(|_| {
                let len = 1 + rng.below(200);
                (rng.below(PAGE as u64 - len) as u32, rng.bytes(len as usize))
            })
            .collect();
        Payload::Ranges(ranges)
    };
    RedoRecord { lsn: Lsn(lsn), page, payload }
}

fn encoded(records: &[RedoRecord]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for record in records {
        encode_record(record, &mut bytes);
    }
    bytes
}

fn build(media: &Media, fresh: bool, seed: u64) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let layout = layout();
    let csd = CsdConfig { background: false, ..CsdConfig::default() };
    let devices = if fresh { media.format_with(&layout, csd) } else { media.open() };
    Node::from_devices(&config(dir.path()), layout, devices, &Environment::simulated(seed), false, &mut |_| {}).unwrap()
}

/// `records` random records after LSN `end`, and the end of the batch that holds them.
fn random_batch(rng: &mut Rng, end: u64, records: u64) -> (Vec<RedoRecord>, u64) {
    let mut lsn = end;
    let records = (0..records)
        .map(|_| {
            lsn += 1 + rng.below(50);
            record(rng, lsn)
        })
        .collect();
    (records, lsn + 1 + rng.below(3))
}

/// Appends `count` random batches; returns the stream's end.
fn append_batches(
    node: &Node,
    volume: &VolumeRef,
    rng: &mut Rng,
    model: &mut Model,
    mut end: u64,
    count: usize,
) -> u64 {
    for _ in 0..count {
        let records = rng.below(6);
        let (records, batch_end) = random_batch(rng, end, records);
        let outcome = node.append_redo(volume, 1, end, batch_end, records.len() as u32, &encoded(&records)).unwrap();
        assert_eq!(outcome, AppendOutcome::Ok { durable_lsn: Lsn(batch_end) });
        model.add(records);
        end = batch_end;
    }
    end
}

fn check_reads(node: &Node, volume: &VolumeRef, model: &Model, rng: &mut Rng, from: u64, end: u64, reads: usize) {
    reads_match(node, volume, model, rng, from, end, reads).unwrap_or_else(|why| panic!("{why}"));
}

/// [`check_reads`], answering the first difference.
fn reads_match(
    node: &Node,
    volume: &VolumeRef,
    model: &Model,
    rng: &mut Rng,
    from: u64,
    end: u64,
    reads: usize,
) -> Result<(), String> {
    let mut out = vec![0u8; PAGE];
    for _ in 0..reads {
        let page = rng.below(PAGES);
        let lsn = from + rng.below(end - from + 1);
        let lsn = lsn.max(1);
        let served =
            node.read_page_at(volume, page, lsn, 0, &mut out).map_err(|e| format!("page {page} at {lsn}: {e:?}"))?;
        if served.served_lsn != Lsn(lsn) {
            return Err(format!("page {page} at {lsn} served at {:?}", served.served_lsn));
        }
        if served.page_lsn != model.page_lsn(page, Lsn(lsn)) {
            return Err(format!(
                "page {page} at {lsn}: page LSN {:?}, the model's {:?}",
                served.page_lsn,
                model.page_lsn(page, Lsn(lsn))
            ));
        }
        if out != model.page_at(page, Lsn(lsn)) {
            return Err(format!("page {page} at LSN {lsn} differs from the model"));
        }
    }
    Ok(())
}

#[test]
fn pages_read_at_every_lsn_match_the_model_through_folds_and_a_rebuild() {
    let seed = seed_from_env(13);
    let mut rng = Rng::new(seed);
    let layout = layout();
    let media = Media::new(&layout);
    let mut model = Model::default();
    let node = build(&media, true, seed);
    let volume = node.volume_create("kv", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    // A heartbeat makes the stream; a reader registered at its end holds LSN_min at 1: nothing
    // is folded yet. With no reader, LSN_min follows the durable LSN.
    assert_eq!(node.append_redo(&volume, 1, 0, 1, 0, &[]).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(1) });
    let lease = node.register_reader(&volume, 7, 1).unwrap_or_else(|e| panic!("{e:?}"));
    let end = 1;
    let end = append_batches(&node, &volume, &mut rng, &mut model, end, 150);
    check_reads(&node, &volume, &model, &mut rng, 1, end, 300);
    assert_eq!(node.fold_redo(1000).unwrap(), 0, "a reader at LSN 1 holds every version");
    // The reader moves to the middle: pages fold up to it, and reads below it of pages
    // changed since are refused, never answered with a newer version.
    let middle = end / 2;
    node.renew_reader(&volume, lease.lease_id, middle).unwrap_or_else(|e| panic!("{e:?}"));
    let folded = node.fold_redo(1000).unwrap();
    assert!(folded > 0, "pages fold up to the reader");
    assert!(node.redo_status(&volume).unwrap().lsn_min == middle);
    check_reads(&node, &volume, &model, &mut rng, middle, end, 300);
    let mut out = vec![0u8; PAGE];
    let mut too_old = 0;
    for page in 0..PAGES {
        match node.read_page_at(&volume, page, 1, 0, &mut out) {
            Ok(served) => assert!(out == model.page_at(page, served.served_lsn), "page {page}"),
            Err(RedoRefusal::TooOld { lsn_min, .. }) => {
                assert_eq!(lsn_min, Lsn(middle));
                too_old += 1;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(too_old > 0, "pages changed since LSN 1 were folded");
    // Released: everything folds, and the log is truncated behind the images.
    node.release_reader(&volume, lease.lease_id).unwrap();
    node.fold_redo(1000).unwrap();
    check_reads(&node, &volume, &model, &mut rng, end, end, 100);
    let end = append_batches(&node, &volume, &mut rng, &mut model, end, 50);
    drop((volume, node));

    // A rebuild on the same media: every acknowledged batch is back (folded or in the log).
    let node = build(&media, false, seed);
    let volume = node.volume_by_name("kv").unwrap();
    let status = node.redo_status(&volume).unwrap();
    assert_eq!(status.durable_lsn, end);
    check_reads(&node, &volume, &model, &mut rng, status.lsn_min.max(1), end, 300);
    // The writer resumes after the durable end; a gap and an older epoch change nothing.
    let gap = node.append_redo(&volume, 1, end + 5, end + 9, 0, &[]).unwrap();
    assert_eq!(gap, AppendOutcome::Gap { expected_prev_lsn: Lsn(end) });
    let taken = node.append_redo(&volume, 2, end, end + 1, 0, &[]).unwrap();
    assert_eq!(taken, AppendOutcome::Ok { durable_lsn: Lsn(end + 1) });
    let fenced = node.append_redo(&volume, 1, end + 1, end + 2, 0, &[]).unwrap();
    assert_eq!(fenced, AppendOutcome::Fenced { epoch: tundra_redo::WriterEpoch(2) });
    // A record outside the volume, a cut encoding: refused, nothing changes.
    let outside = RedoRecord { lsn: Lsn(end + 3), page: PAGES, payload: Payload::Image(vec![1; PAGE]) };
    match node.append_redo(&volume, 2, end + 1, end + 3, 1, &encoded(&[outside])) {
        Err(tundra_node::Error::Invalid(message)) => {
            assert!(message.contains("outside") || message.contains("pages"), "{message}")
        }
        other => panic!("a record outside the volume: {other:?}"),
    }
    let mut cut = encoded(&[record(&mut rng, end + 3)]);
    cut.pop();
    match node.append_redo(&volume, 2, end + 1, end + 3, 1, &cut) {
        Err(tundra_node::Error::Invalid(_)) => {}
        other => panic!("a cut encoding: {other:?}"),
    }
    // Records out of LSN order, and more records than the bytes hold: the same.
    let (a, b) = (record(&mut rng, end + 3), record(&mut rng, end + 2));
    match node.append_redo(&volume, 2, end + 1, end + 3, 2, &encoded(&[a.clone(), b])) {
        Err(tundra_node::Error::Invalid(_)) => {}
        other => panic!("records out of order: {other:?}"),
    }
    match node.append_redo(&volume, 2, end + 1, end + 3, 2, &encoded(&[a])) {
        Err(tundra_node::Error::Invalid(_)) => {}
        other => panic!("a count above the records sent: {other:?}"),
    }
    assert_eq!(node.redo_status(&volume).unwrap().durable_lsn, end + 1);
    // Reads at LSN 0, or below not_modified_since, are bad requests.
    for (request_lsn, not_modified_since) in [(0, 0), (end, end + 1)] {
        match node.read_page_at(&volume, 0, request_lsn, not_modified_since, &mut out) {
            Err(RedoRefusal::Error(tundra_node::Error::Invalid(_))) => {}
            other => panic!("a read at {request_lsn} not modified since {not_modified_since}: {other:?}"),
        }
    }
    // Pages of a volume that takes redo are made from its redo, never written otherwise.
    let page = vec![7u8; PAGE];
    assert!(node.write_page(&volume, 0, tundra_node::WriteMode::Lz4, &page).is_err());
    assert!(node.write_bytes(&volume, 100, &page[..10]).is_err());
    assert!(node.zero_bytes(&volume, 0, 4096).is_err());
    assert!(node.trim_pages(&volume, 0, 1).is_err());
    let stats = node.stats();
    let redo = stats.volumes.iter().find(|v| v.name == "kv").and_then(|v| v.redo).expect("the stream's stats");
    assert_eq!(redo.durable_lsn, end + 1);
    let metrics = tundra_node::metrics::render(&node);
    let durable = format!("tundra_redo_durable_lsn{{volume=\"kv\"}} {}", end + 1);
    assert!(metrics.contains(&durable), "no {durable:?} in the metrics:\n{metrics}");
    // Reads ahead of the stream wait, then answer NotYet.
    match node.read_page_at(&volume, 0, end + 100, end + 100, &mut out) {
        Err(RedoRefusal::NotYet { complete_lsn }) => assert_eq!(complete_lsn, Lsn(end + 1)),
        other => panic!("{other:?}"),
    }
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {:?}", report.damaged);
    }
    // Deleting the volume frees its stream for another volume.
    node.volume_delete("kv").unwrap();
    let again = node.volume_create("kv2", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    assert_eq!(node.append_redo(&again, 1, 0, 1, 0, &[]).unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(1) });
}

#[test]
fn the_native_protocol_carries_appends_reads_and_leases() {
    let seed = seed_from_env(31);
    let mut rng = Rng::new(seed);
    let layout = layout();
    let media = Media::new(&layout);
    let node = Arc::new(build(&media, true, seed));
    let volume = node.volume_create("kv", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    let server = tundra_node::native::start("127.0.0.1:0", node.clone()).unwrap();
    let mut client = tundra_client::Client::connect(server.local_addr()).unwrap();
    let mut model = Model::default();
    let heartbeat = tundra_proto::RedoAppend {
        volume: volume.volume.id.0,
        writer_epoch: 1,
        prev_lsn: 0,
        end_lsn: 1,
        record_count: 0,
        records: &[],
    };
    assert_eq!(client.append_redo(&heartbeat).unwrap(), tundra_proto::AppendOutcome::Ok { durable_lsn: 1 });
    let lease = client.register_reader(volume.volume.id.0, 1, 1).unwrap();
    let mut end = 1;
    for _ in 0..40 {
        let mut lsn = end;
        let records: Vec<RedoRecord> = (0..1 + rng.below(4))
            .map(|_| {
                lsn += 1 + rng.below(20);
                record(&mut rng, lsn)
            })
            .collect();
        let bytes = encoded(&records);
        let append = tundra_proto::RedoAppend {
            volume: volume.volume.id.0,
            writer_epoch: 1,
            prev_lsn: end,
            end_lsn: lsn,
            record_count: records.len() as u32,
            records: &bytes,
        };
        assert_eq!(client.append_redo(&append).unwrap(), tundra_proto::AppendOutcome::Ok { durable_lsn: lsn });
        model.add(records);
        end = lsn;
    }
    for _ in 0..100 {
        let page = rng.below(PAGES);
        let lsn = 1 + rng.below(end);
        let at = tundra_proto::ReadAt { request_lsn: lsn, not_modified_since: 0, lease: Some(lease.lease_id) };
        let served = client.get_page_at_lsn(volume.volume.id.0, page, at).unwrap();
        assert_eq!(served.served_lsn, lsn);
        assert!(served.data == model.page_at(page, Lsn(lsn)), "page {page} at {lsn}");
    }
    // The vectored form (prefetch): several pages, repeats among them, at one LSN each time.
    for _ in 0..30 {
        let pages: Vec<u64> = (0..1 + rng.below(8)).map(|_| rng.below(PAGES)).collect();
        let lsn = 1 + rng.below(end);
        let at = tundra_proto::ReadAt { request_lsn: lsn, not_modified_since: 0, lease: Some(lease.lease_id) };
        let served = client.get_pages_at_lsn(volume.volume.id.0, &pages, at).unwrap();
        assert_eq!((served.served_lsn, served.len(), served.page_size as usize), (lsn, pages.len(), PAGE));
        for (i, &page) in pages.iter().enumerate() {
            assert!(served.data[i * PAGE..(i + 1) * PAGE] == model.page_at(page, Lsn(lsn)), "page {page} at {lsn}");
            assert_eq!(served.page_lsns[i], model.page_lsn(page, Lsn(lsn)).0, "page {page} at {lsn}");
        }
    }
    // A vectored read naming a page outside the volume, or at LSN 0, is refused whole.
    let at = tundra_proto::ReadAt { request_lsn: end, not_modified_since: 0, lease: None };
    for (pages, request_lsn) in [(vec![0, PAGES], end), (vec![0, 1], 0)] {
        match client.get_pages_at_lsn(volume.volume.id.0, &pages, tundra_proto::ReadAt { request_lsn, ..at }) {
            Err(tundra_client::Error::Status { status: tundra_proto::Status::Invalid, .. }) => {}
            other => panic!("pages {pages:?} at {request_lsn}: {other:?}"),
        }
    }
    let status = client.redo_status(volume.volume.id.0).unwrap();
    assert_eq!((status.durable_lsn, status.lsn_min), (end, 1));
    // Behind the stream: NOT_YET carries the complete LSN.
    let at = tundra_proto::ReadAt { request_lsn: end + 10, not_modified_since: end + 10, lease: None };
    match client.get_page_at_lsn(volume.volume.id.0, 0, at) {
        Err(tundra_client::Error::NotYet { complete_lsn, .. }) => assert_eq!(complete_lsn, end),
        other => panic!("{other:?}"),
    }
    server.shutdown();
}

/// One batch as a writer sent it: epoch, prev, end, record count and records.
type SentBatch = (u64, u64, u64, u32, Vec<u8>);

/// Appends `count` random batches through the deferred path (a replicated stream's applies);
/// returns the stream's end and the batches as sent.
fn append_deferred(
    node: &Node,
    volume: &VolumeRef,
    rng: &mut Rng,
    model: &mut Model,
    mut end: u64,
    count: usize,
    sent: &mut Vec<SentBatch>,
) -> u64 {
    for _ in 0..count {
        let records = 1 + rng.below(5);
        let (records, batch_end) = random_batch(rng, end, records);
        let bytes = encoded(&records);
        let count = records.len() as u32;
        let outcome = node.append_redo_deferred(volume, 1, end, batch_end, count, &bytes).unwrap();
        assert_eq!(outcome, AppendOutcome::Ok { durable_lsn: Lsn(batch_end) });
        model.add(records);
        sent.push((1, end, batch_end, count, bytes));
        end = batch_end;
    }
    end
}

/// The deferred appends of a replicated stream (its redo group's log is the write-ahead log
/// of its applies): answered before the log syncs, served at once, made durable by a fold
/// (which syncs before it writes a page) and by `redo_sync`; a crash (the node dropped
/// without a sync, its media reopened) loses exactly the unsynced tail, and the group's
/// re-application of every batch past its mark (here, all of them) answers `Gap` for those
/// the log kept and takes the lost ones again, after which every page at every LSN matches
/// the model. Before the re-application the loss is visible (the check's twin): the stream
/// ends at the last sync and reads past it answer `NotYet`.
#[test]
fn deferred_appends_lost_in_a_crash_are_taken_again_and_pages_match() {
    let seed = seed_from_env(47);
    let mut rng = Rng::new(seed);
    let layout = layout();
    let media = Media::new(&layout);
    let mut model = Model::default();
    let node = build(&media, true, seed);
    let volume = node.volume_create("kv", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    let mut sent = Vec::new();
    let end = append_deferred(&node, &volume, &mut rng, &mut model, 0, 60, &mut sent);
    // No reader holds old versions: reads from LSN_min (which follows the stream) on.
    let lsn_min = node.redo_status(&volume).unwrap().lsn_min.max(1);
    check_reads(&node, &volume, &model, &mut rng, lsn_min, end, 200);
    // No reader: LSN_min follows the stream, and everything folds, synced first.
    assert!(node.fold_redo(1000).unwrap() > 0, "nothing folded");
    let folded_end = end;
    assert!(node.redo_status(&volume).unwrap().durable_lsn >= folded_end);
    let end = append_deferred(&node, &volume, &mut rng, &mut model, end, 40, &mut sent);
    node.redo_sync(volume.volume.id).unwrap();
    let synced_end = end;
    let end = append_deferred(&node, &volume, &mut rng, &mut model, end, 30, &mut sent);
    assert_eq!(node.redo_status(&volume).unwrap().durable_lsn, end, "a deferred append is served at once");
    let lsn_min = node.redo_status(&volume).unwrap().lsn_min.max(folded_end);
    check_reads(&node, &volume, &model, &mut rng, lsn_min, end, 200);
    drop((volume, node));

    // The crash: the batches after the sync were never written.
    let node = build(&media, false, seed);
    let volume = node.volume_by_name("kv").unwrap();
    let status = node.redo_status(&volume).unwrap();
    assert_eq!(status.durable_lsn, synced_end, "the log kept other than what was synced");
    let mut out = vec![0u8; PAGE];
    match node.read_page_at(&volume, 0, end, end, &mut out) {
        Err(RedoRefusal::NotYet { complete_lsn }) => assert_eq!(complete_lsn, Lsn(synced_end)),
        other => panic!("a read past the lost tail: {other:?}"),
    }
    // A reader from the stream's LSN_min holds the versions the re-application brings back.
    let lsn_min = status.lsn_min.max(1);
    node.register_reader(&volume, 9, lsn_min).unwrap_or_else(|e| panic!("{e:?}"));
    // The group applies every committed batch again, in order.
    let (mut already, mut again) = (0, 0);
    for (epoch, prev, batch_end, count, bytes) in &sent {
        match node.append_redo_deferred(&volume, *epoch, *prev, *batch_end, *count, bytes).unwrap() {
            AppendOutcome::Gap { expected_prev_lsn } => {
                assert!(expected_prev_lsn >= Lsn(*batch_end), "a hole at ({prev}, {batch_end}]");
                already += 1;
            }
            AppendOutcome::Ok { durable_lsn } => {
                assert_eq!(durable_lsn, Lsn(*batch_end));
                assert!(*prev >= synced_end, "a batch the log kept was taken again");
                again += 1;
            }
            other => panic!("re-applying ({prev}, {batch_end}]: {other:?}"),
        }
    }
    assert_eq!((already, again), (100, 30));
    assert_eq!(node.redo_status(&volume).unwrap().durable_lsn, end);
    assert!(lsn_min <= synced_end, "LSN_min {lsn_min} past the lost tail's start {synced_end}");
    check_reads(&node, &volume, &model, &mut rng, lsn_min, end, 300);
    // Synced, folded and rebuilt once more: nothing is lost now.
    node.redo_sync(volume.volume.id).unwrap();
    node.fold_redo(1000).unwrap();
    drop((volume, node));
    let node = build(&media, false, seed);
    let volume = node.volume_by_name("kv").unwrap();
    assert_eq!(node.redo_status(&volume).unwrap().durable_lsn, end);
    check_reads(&node, &volume, &model, &mut rng, end, end, 200);
    for (device, report) in node.check().unwrap() {
        assert!(report.damaged.is_empty(), "{device:?}: {:?}", report.damaged);
    }
}

/// A fold of deferred appends interrupted by a crash right after its page writes (before the
/// log's truncation), with `bug`; then the redo group's re-application of every batch, and
/// every page read at every LSN the stream serves. `Err` is the first difference.
fn fold_cut_by_a_crash(bug: FoldBug) -> Result<(), String> {
    let seed = seed_from_env(53);
    let mut rng = Rng::new(seed);
    let layout = layout();
    let media = Media::new(&layout);
    let mut model = Model::default();
    let node = build(&media, true, seed);
    let volume = node.volume_create("kv", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    let mut sent = Vec::new();
    let end = append_deferred(&node, &volume, &mut rng, &mut model, 0, 60, &mut sent);
    let folded = node.fold_pages_then_stop(1000, bug).unwrap();
    assert!(folded > 0, "nothing folded");
    drop((volume, node));

    let node = build(&media, false, seed);
    let volume = node.volume_by_name("kv").unwrap();
    let after_crash = node.redo_status(&volume).unwrap();
    println!(
        "{bug:?}: {folded} pages folded; after the crash the stream ends at {} of {end}, LSN_min {}",
        after_crash.durable_lsn, after_crash.lsn_min
    );
    // A reader at the stream's LSN_min, as a read-only node's lease would hold it, keeps the
    // versions the re-application brings back readable.
    let lsn_min = after_crash.lsn_min.max(1);
    node.register_reader(&volume, 9, lsn_min).map_err(|e| format!("a reader at {lsn_min}: {e:?}"))?;
    for (epoch, prev, batch_end, count, bytes) in &sent {
        match node.append_redo_deferred(&volume, *epoch, *prev, *batch_end, *count, bytes) {
            Ok(AppendOutcome::Gap { .. } | AppendOutcome::Ok { .. }) => {}
            other => return Err(format!("re-applying ({prev}, {batch_end}]: {other:?}")),
        }
    }
    let status = node.redo_status(&volume).unwrap();
    if status.durable_lsn != end {
        return Err(format!("the stream ends at {} after the re-application, not {end}", status.durable_lsn));
    }
    reads_match(&node, &volume, &model, &mut rng, lsn_min, end, 400)?;
    for (device, report) in node.check().unwrap() {
        if !report.damaged.is_empty() {
            return Err(format!("{device:?}: {:?}", report.damaged));
        }
    }
    Ok(())
}

/// A fold syncs the log before it writes a page of a replicated stream's deferred appends: a
/// crash right after the page writes loses none of the records the pages hold, and the
/// group's re-application finds them all (`Gap`), every page at every LSN as the model says.
#[test]
fn a_fold_cut_by_a_crash_after_its_page_writes_loses_nothing() {
    fold_cut_by_a_crash(FoldBug::None).unwrap_or_else(|why| panic!("{why}"));
}

/// The twin: a fold that writes a page before the log holding its records is synced leaves,
/// after the same crash, pages newer than the stream that describes them, and the check
/// above sees it.
#[test]
fn a_fold_that_writes_pages_before_syncing_the_log_is_caught() {
    let caught = fold_cut_by_a_crash(FoldBug::PageBeforeSync);
    assert!(caught.is_err(), "pages written before their records were durable went unnoticed");
    println!("caught: {}", caught.unwrap_err());
}

/// A volume that takes redo grows: the stream, sized at its start, takes records of the pages
/// the resize added, reads serve them at every LSN, a fold stores them, and a rebuild on the
/// same media keeps all of it. (Before the stream's page versions followed the volume, the
/// first batch naming a new page was made durable by the log and then refused.)
#[test]
fn a_volume_that_takes_redo_grows_and_its_new_pages_take_redo() {
    let seed = seed_from_env(59);
    let mut rng = Rng::new(seed);
    let layout = layout();
    let media = Media::new(&layout);
    let mut model = Model::default();
    let node = build(&media, true, seed);
    let volume = node.volume_create("kv", PAGES * PAGE as u64, PAGE as u32, VolumeMode::Normal).unwrap();
    let end = append_batches(&node, &volume, &mut rng, &mut model, 0, 40);
    let grown = node.volume_resize("kv", 2 * PAGES * PAGE as u64).unwrap();
    let mut end = end;
    for page in [PAGES, PAGES + 7, 2 * PAGES - 1, 3] {
        let ranges = vec![(rng.below(PAGE as u64 - 64) as u32, rng.bytes(64))];
        let record = RedoRecord { lsn: Lsn(end + 1), page, payload: Payload::Ranges(ranges) };
        let outcome = node.append_redo(&grown, 1, end, end + 2, 1, &encoded(std::slice::from_ref(&record)));
        assert_eq!(outcome.unwrap(), AppendOutcome::Ok { durable_lsn: Lsn(end + 2) }, "page {page}");
        model.add([record]);
        end += 2;
    }
    let mut out = vec![0u8; PAGE];
    for page in [PAGES, PAGES + 7, 2 * PAGES - 1, PAGES + 1] {
        node.read_page_at(&grown, page, end, 0, &mut out).unwrap_or_else(|e| panic!("page {page}: {e:?}"));
        assert!(out == model.page_at(page, Lsn(end)), "page {page} differs from the model");
    }
    assert!(node.fold_redo(1000).unwrap() > 0, "nothing folded");
    drop((volume, grown, node));
    let node = build(&media, false, seed);
    let volume = node.volume_by_name("kv").unwrap();
    assert_eq!(volume.volume.page_count(), 2 * PAGES);
    assert_eq!(node.redo_status(&volume).unwrap().durable_lsn, end);
    for page in [PAGES, PAGES + 7, 2 * PAGES - 1, 3, 0] {
        node.read_page_at(&volume, page, end, 0, &mut out).unwrap_or_else(|e| panic!("page {page}: {e:?}"));
        assert!(out == model.page_at(page, Lsn(end)), "page {page} differs from the model after the rebuild");
    }
}
