//! The simulator on the manager's code: a small cluster, and the paper's scale (1,000 nodes,
//! 48,000 chunks); the same seed gives the same report.

use tundra_cluster::sim::{self, Layers, SimConfig, SimReport, builtin_chunks};
use tundra_cluster::{ManagerConfig, Policy, Space};
use tundra_env::Rng;

const GIB: u64 = 1 << 30;

fn config(policy: Policy, nodes: usize, chunks: &[sim::ChunkSpec]) -> SimConfig {
    let logical: u64 = chunks.iter().map(|c| c.size.logical_bytes).sum();
    let physical: u64 = chunks.iter().map(|c| c.size.physical_bytes).sum();
    let node_physical = (3 * physical) as f64 / nodes as f64 / 0.70;
    let node_logical = node_physical * logical as f64 / physical as f64;
    SimConfig {
        manager: ManagerConfig::paper(policy),
        nodes,
        initial_nodes: nodes * 7 / 10,
        join_waves: 2,
        node_capacity: Space::new(node_logical as u64, node_physical as u64),
        steps: 200,
        arrival_steps: 150,
        growth_steps: 20,
    }
}

fn run(policy: Policy, nodes: usize, chunk_count: usize, seed: u64) -> SimReport {
    let chunks = builtin_chunks(chunk_count, 10 * GIB, Layers::Dual, &mut Rng::new(seed));
    sim::run(&config(policy, nodes, &chunks), &chunks).expect("simulation runs")
}

fn show(name: &str, r: &SimReport) {
    let s = &r.summary;
    eprintln!(
        "{name}: in band {:.3}, stranded logical {:.4} physical {:.4}, zones {:?}, moves {} {:?}, refused {}, final plan {}, ratio {:.2}..{:.2} sd {:.3}",
        s.nodes_in_band_fraction,
        s.stranded_logical_fraction,
        s.stranded_physical_fraction,
        s.zone_counts,
        r.moves,
        r.moves_by_reason,
        r.refused_chunks,
        r.final_plan_moves,
        s.ratio_min,
        s.ratio_max,
        s.ratio_stddev
    );
}

#[test]
fn small_cluster_both_policies() {
    let logical = run(Policy::Logical, 60, 2_880, 7);
    let aware = run(Policy::CompressionAware, 60, 2_880, 7);
    show("logical", &logical);
    show("compression-aware", &aware);
    for r in [&logical, &aware] {
        assert_eq!(r.placed_chunks, 2_880, "a cluster sized for its chunks takes them all");
        assert_eq!(r.final_plan_moves, 0, "scheduling settles");
        assert_eq!(r.summary.active_nodes, 60);
    }
    assert_eq!(logical.moves_by_reason.get("zone-a"), None, "the logical policy makes no zone move");
    assert!(aware.summary.nodes_in_band_fraction >= logical.summary.nodes_in_band_fraction);
    assert!(aware.summary.nodes_in_band_fraction >= 0.9);
}

/// A tight band is where the policies part: compression-aware scheduling keeps the nodes in it
/// and strands less, at the price of more moves (seed 000 §4.2.3's trade-off).
#[test]
fn a_tight_band_separates_the_policies() {
    let chunks = builtin_chunks(2_880, 10 * GIB, Layers::Dual, &mut Rng::new(3));
    let tight = |policy| {
        let mut c = config(policy, 60, &chunks);
        c.manager.band = tundra_cluster::Band::Relative { below: 0.03, above: 0.03 };
        sim::run(&c, &chunks).unwrap()
    };
    let (logical, aware) = (tight(Policy::Logical), tight(Policy::CompressionAware));
    show("logical ±3%", &logical);
    show("compression-aware ±3%", &aware);
    let stranded = |r: &SimReport| r.summary.stranded_logical_fraction + r.summary.stranded_physical_fraction;
    assert!(aware.summary.nodes_in_band_fraction > logical.summary.nodes_in_band_fraction);
    assert!(stranded(&aware) < stranded(&logical));
    assert!(aware.moves > logical.moves);
}

/// Arrivals in eras, each of one dataset: the nodes that join during an era fill with its
/// chunks and stop at the logical margin outside the band, where sending chunks would take them
/// under the margin; taking chunks from the other side of the average brings them in.
/// At ±5% and seed 1 (of seeds 1 to 6 at 100 and 200 nodes, the one where nodes stop short of
/// the band without taking).
fn eras(seed: u64) -> (SimReport, SimReport) {
    let chunks = sim::builtin_chunks_in_eras(4_800, 10 * GIB, Layers::Dual, 4, &mut Rng::new(seed));
    let run = |policy| {
        let mut c = config(policy, 100, &chunks);
        c.manager.band = tundra_cluster::Band::Relative { below: 0.05, above: 0.05 };
        sim::run(&c, &chunks).unwrap()
    };
    (run(Policy::Logical), run(Policy::CompressionAware))
}

const ERAS_SEED: u64 = 1;

#[test]
fn nodes_filled_in_one_era_are_brought_into_the_band() {
    let (logical, aware) = eras(ERAS_SEED);
    show("logical, eras", &logical);
    show("compression-aware, eras", &aware);
    assert!(logical.summary.nodes_in_band_fraction < 0.9, "the eras push nodes out of the band");
    assert!(aware.summary.nodes_in_band_fraction >= 0.9);
    assert_eq!(aware.final_plan_moves, 0);
}

#[test]
fn twin_without_taking_nodes_filled_in_one_era_stay_outside_the_band() {
    tundra_cluster::plan::set_zone_takes_for_test(false);
    let (_, aware) = eras(ERAS_SEED);
    tundra_cluster::plan::set_zone_takes_for_test(true);
    show("compression-aware without taking, eras", &aware);
    assert!(aware.summary.nodes_in_band_fraction < 0.9, "the twin must miss the band");
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let a = run(Policy::CompressionAware, 30, 1_000, 11);
    let b = run(Policy::CompressionAware, 30, 1_000, 11);
    assert_eq!(a, b);
    let c = run(Policy::CompressionAware, 30, 1_000, 12);
    assert_ne!(a.summary, c.summary, "another seed draws other chunks");
}

#[test]
fn a_cluster_too_small_refuses_chunks_and_says_so() {
    let chunks = builtin_chunks(600, 10 * GIB, Layers::Dual, &mut Rng::new(5));
    let mut c = config(Policy::Logical, 12, &chunks);
    c.node_capacity = Space::new(c.node_capacity.logical_bytes / 2, c.node_capacity.physical_bytes / 2);
    let r = sim::run(&c, &chunks).unwrap();
    assert!(r.refused_chunks > 0 && r.placed_chunks + r.refused_chunks == 600);
    assert!(r.first_refusal.as_deref().unwrap().contains("cluster full"), "{:?}", r.first_refusal);
}

#[test]
fn bad_csv_rows_are_refused_naming_the_line() {
    let good = "chunk_id,logical_bytes,physical_bytes\n1,100,40\n2,100,50\n";
    assert_eq!(sim::parse_chunks_csv(good).unwrap().len(), 2);
    for (text, line, words) in [
        ("chunk_id,logical_bytes,physical_bytes\n1,100\n", 2, "expected 3 fields"),
        ("1,100,40\n2,abc,40\n", 2, "logical_bytes \"abc\""),
        ("1,100,40\n\n# note\n1,100,40\n", 4, "appears twice"),
        ("1,0,40\n", 1, "above zero"),
        ("1,100,-4\n", 1, "physical_bytes"),
    ] {
        let e = sim::parse_chunks_csv(text).unwrap_err();
        assert!(e.message().starts_with(&format!("line {line}:")) && e.message().contains(words), "{e}");
    }
    assert!(sim::parse_chunks_csv("chunk_id,logical_bytes,physical_bytes\n").is_err());
}

/// The paper's scale: 1,000 nodes and 48,000 chunks, both policies on the same seed, side by
/// side on two threads (tens of seconds with the optimised build of this crate the workspace
/// profile gives it; `tundra sim schedule` runs the same).
#[test]
fn full_scale_both_policies() {
    let (logical, aware) = std::thread::scope(|s| {
        let logical = s.spawn(|| run(Policy::Logical, 1_000, 48_000, 1));
        let aware = run(Policy::CompressionAware, 1_000, 48_000, 1);
        (logical.join().expect("the logical run"), aware)
    });
    show("logical", &logical);
    show("compression-aware", &aware);
    assert_eq!(logical.placed_chunks, 48_000);
    assert_eq!(aware.placed_chunks, 48_000);
    assert!(aware.summary.nodes_in_band_fraction >= 0.9);
    assert_eq!(aware.final_plan_moves, 0);
    // At the paper's band the two policies strand about the same on this input (docs/measurements.md);
    // the compression-aware one must never strand more.
    assert!(aware.summary.stranded_physical_fraction <= logical.summary.stranded_physical_fraction);
    assert!(aware.summary.stranded_logical_fraction <= logical.summary.stranded_logical_fraction);
}
