//! Attacks as tests: a corruption campaign over a node's data directory.
//!
//! A small node is built over a temporary directory with a compressed volume and a mode none
//! volume holding known, seeded pages (text, numbers, zeros and random bytes), some overwritten,
//! some trimmed, some partly rewritten. The directory is then captured twice: as a kill leaves it
//! (the node dropped without `close`, every write durable because each one returns only once its
//! journal commit is flushed) and as a clean `close` leaves it. For every region of the two image
//! files (the drive's superblocks, map checkpoints, segment headers, record headers and payloads;
//! both journals' superblocks, checkpoints and log blocks; the fast store's data) one seeded bit
//! is flipped in a byte-identical copy of the directory, the node is opened on the copy, every
//! page of every volume is read and the node's check (what `tundra fsck` runs) is run.
//!
//! Three outcomes are allowed: every page reads its last acknowledged content, some page fails
//! to read, or the node refuses to open (or its check reports damage) with a message naming the
//! damage. A page that reads successfully with other content is silent wrong data; so is a
//! volume that disappears. The campaign counts them and fails on any. `TUNDRA_SEED` replays a
//! run; `TUNDRA_CORRUPTION_FLIPS` sets the flips per region (default 3).

mod campaign;

use campaign::{Outcome, Pristine, RegionGroup, Scenario, run_campaign};

/// The drive's regions: superblocks, map checkpoints, segment headers, records.
#[test]
fn drive_corruption_is_detected_or_harmless() {
    run_campaign(RegionGroup::Drive);
}

/// Both journals' regions on the fast device: superblocks, checkpoints, log blocks.
///
/// On the code of this commit a flip in any log block that replay reads (the newest, or one
/// in the middle) silently rolls pages back: recovery takes the first block that does not
/// verify as the end of the log, so every later acknowledged write is lost without an error.
#[test]
fn journal_corruption_is_detected_or_harmless() {
    run_campaign(RegionGroup::Journals);
}

/// The fast store's data blocks (the mode none volume's pages).
#[test]
fn fast_data_corruption_is_detected_or_harmless() {
    run_campaign(RegionGroup::FastData);
}

/// The oracle's own check: a copy with nothing flipped passes, and the same copy judged against
/// a model that expects other content for one page (the model flipped, not the disk) is called
/// silent wrong data. Without this the campaign could pass by never comparing anything.
#[test]
fn the_oracle_calls_wrong_content_silent() {
    let seed = campaign::seed();
    let pristine = Pristine::build(seed);
    let image = &pristine.images[Scenario::Killed as usize];
    let clean = campaign::judge_copy(&pristine, image, None, &pristine.model);
    assert_eq!(clean.outcome, Outcome::NoEffect, "seed {seed}: an untouched copy: {}", clean.detail);

    let mut wrong = pristine.model.clone();
    let (volume, page) = wrong.first_written_page().expect("the workload writes pages");
    wrong.volumes[volume].pages[page].as_mut().expect("written")[100] ^= 0x20;
    let judged = campaign::judge_copy(&pristine, image, None, &wrong);
    assert_eq!(judged.outcome, Outcome::Silent, "seed {seed}: {}", judged.detail);

    // A page the model expects but the node lost (read as zeros) is silent too.
    let mut lost = pristine.model.clone();
    let free = lost.volumes[volume].pages.iter().position(Option::is_none).expect("some page is unwritten");
    lost.volumes[volume].pages[free] = Some(vec![7u8; lost.volumes[volume].page_size]);
    let judged = campaign::judge_copy(&pristine, image, None, &lost);
    assert_eq!(judged.outcome, Outcome::Silent, "seed {seed}: {}", judged.detail);
}
