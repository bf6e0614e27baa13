//! The simulator on the manager's code: a small cluster in the default tests, the paper's scale
//! behind `TUNDRA_SIM_FULL=1`; the same seed gives the same report.

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
}
