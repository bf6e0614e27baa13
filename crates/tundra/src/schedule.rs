//! `tundra sim schedule`: the cluster manager's placement and scheduling code (tundra-cluster)
//! over a simulated cluster with no I/O (seed 000 §4.2, Figures 9 to 11). Chunks come from a
//! CSV file or the built-in distribution of ratios measured on the project's datasets; both
//! policies run on the same input and seed unless one is named, and the report sets them side
//! by side with the paper's figures.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use tundra_cluster::sim::{self, ChunkSpec, Layers, SimConfig, SimReport};
use tundra_cluster::{Band, ManagerConfig, Policy, Space, Zone};
use tundra_device::size::{format_size, parse_size};
use tundra_env::Rng;

#[derive(Args)]
pub struct ScheduleArgs {
    /// Chunks from a CSV file (`chunk_id,logical_bytes,physical_bytes`, one row per chunk, in
    /// arrival order); without it, --chunk-count chunks from the built-in distribution.
    #[arg(long, value_name = "FILE")]
    chunks: Option<std::path::PathBuf>,
    /// Chunks drawn from the built-in distribution.
    #[arg(long, default_value_t = 48_000)]
    chunk_count: usize,
    /// Each built-in chunk's logical size.
    #[arg(long, default_value = "10GiB", value_name = "SIZE")]
    chunk_size: String,
    /// The built-in ratios: `dual` (Algorithm 1 then the drive, as the paper's cluster C2) or
    /// `drive` (the drive alone, as C1).
    #[arg(long, default_value = "dual")]
    ratios: String,
    /// The built-in arrivals in N equal eras, each era's volumes all of one dataset (0: every
    /// volume's dataset drawn at random).
    #[arg(long, default_value_t = 0, value_name = "N", conflicts_with = "chunks")]
    eras: usize,
    /// Nodes at the end of the run (70% from the start, the rest joining in two waves).
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// Each node's logical capacity; by default its physical capacity times the input's
    /// average ratio.
    #[arg(long, value_name = "BYTES")]
    node_logical: Option<String>,
    /// Each node's physical capacity; by default what leaves the cluster --fill full once every
    /// chunk is placed.
    #[arg(long, value_name = "BYTES")]
    node_physical: Option<String>,
    /// The fill the default capacities aim at.
    #[arg(long, default_value_t = 0.70)]
    fill: f64,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// `logical` or `compression-aware`; without it both run on the same input.
    #[arg(long)]
    policy: Option<String>,
    /// The band around the average ratio, in percent either side ([c_avg (1 - p), c_avg (1 + p)]).
    #[arg(long, default_value_t = 10.0, value_name = "PERCENT")]
    band: f64,
    /// A fixed band instead: c_l and c_h.
    #[arg(long, requires = "band_high")]
    band_low: Option<f64>,
    #[arg(long, requires = "band_low")]
    band_high: Option<f64>,
    /// The logical rule's margin, in percent above (and below) the average.
    #[arg(long, default_value_t = 10.0, value_name = "PERCENT")]
    margin: f64,
    /// Moves the throttle lets start in one step (and two per node).
    #[arg(long, default_value_t = 64)]
    moves_per_step: usize,
    /// Steps of simulated time; chunks arrive over the first three quarters.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Steps a chunk takes to fill.
    #[arg(long, default_value_t = 20)]
    growth_steps: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Include every node's final position (the Figure 9 plane) in the JSON.
    #[arg(long)]
    points: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Seed 000 §4.2: Figure 9a (a full cluster under the logical policy) and §4.2.3 (nodes in the
/// band after compression-aware scheduling in clusters C1 and C2).
const PAPER: &str = "Figure 9a, logical policy: 12.1% of nodes below the average ratio wasting 1.72% of the \
logical space, 78.6% above it wasting 9.17% of the physical space; §4.2.3, compression-aware: over 90% of nodes \
of C1 within 2.2-2.7, 87.7% of C2 within 3.15-3.85";

/// The figures of a run that a single-policy report also gives at its top level.
const TOP_LEVEL_KEYS: [&str; 7] = [
    "policy",
    "nodes_in_band_fraction",
    "stranded_logical_fraction",
    "stranded_physical_fraction",
    "usable_capacity_bytes",
    "migrated_bytes",
    "migrations",
];

pub fn run(args: ScheduleArgs) -> Result<()> {
    let (chunks, source) = input(&args)?;
    let policies = match &args.policy {
        Some(name) => vec![Policy::parse(name).map_err(|e| anyhow::anyhow!("--policy: {}", e.message()))?],
        None => vec![Policy::Logical, Policy::CompressionAware],
    };
    let total = chunks.iter().fold(Space::ZERO, |sum, c| sum.plus(c.size));
    let capacity = capacity(&args, total)?;
    let mut runs = Vec::new();
    for policy in policies {
        let config = config(&args, policy, capacity)?;
        let began = Instant::now();
        let report = sim::run(&config, &chunks).map_err(|e| anyhow::anyhow!("{}", e))?;
        runs.push(run_json(&args, &config, &report, began.elapsed().as_secs_f64()));
    }
    let comparison = compare(&runs);
    let mut report = json!({
        "seed": args.seed,
        "input": {
            "source": source,
            "chunks": chunks.len(),
            "logical_bytes": total.logical_bytes,
            "physical_bytes": total.physical_bytes,
            "ratio": total.ratio(),
        },
        "cluster": {
            "nodes": args.nodes,
            "initial_nodes": initial_nodes(args.nodes, args.replicas),
            "node_logical_bytes": capacity.logical_bytes,
            "node_physical_bytes": capacity.physical_bytes,
            "replicas": args.replicas,
            "fullness_limit": ManagerConfig::PAPER_FULLNESS_LIMIT,
            "logical_margin": args.margin / 100.0,
            "moves_per_step": args.moves_per_step,
            "steps": args.steps,
            "growth_steps": args.growth_steps,
        },
        "runs": runs,
        "comparison": comparison,
        "paper": PAPER,
    });
    // With one policy the run's figures are also the report's own keys, as the contract
    // names them; with both they stay per run, beside the comparison.
    if let [only] = runs.as_slice()
        && let Some(top) = report.as_object_mut()
    {
        for key in TOP_LEVEL_KEYS {
            top.insert(key.to_string(), only[key].clone());
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn input(args: &ScheduleArgs) -> Result<(Vec<ChunkSpec>, String)> {
    if let Some(path) = &args.chunks {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let chunks =
            sim::parse_chunks_csv(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?;
        return Ok((chunks, path.display().to_string()));
    }
    let layers = Layers::parse(&args.ratios).map_err(|e| anyhow::anyhow!("--ratios: {}", e.message()))?;
    let size = parse_size(&args.chunk_size).map_err(|e| anyhow::anyhow!("--chunk-size: {}", e.message()))?;
    if size == 0 || args.chunk_count == 0 {
        bail!("--chunk-size and --chunk-count must be above zero");
    }
    let chunks = sim::builtin_chunks_in_eras(args.chunk_count, size, layers, args.eras, &mut Rng::new(args.seed));
    let eras = match args.eras {
        0 => String::new(),
        n => format!(", {n} eras of one dataset each"),
    };
    Ok((chunks, format!("built-in ({} ratios, {} chunks{eras})", layers.name(), format_size(size))))
}

fn capacity(args: &ScheduleArgs, total: Space) -> Result<Space> {
    if !(args.fill > 0.0 && args.fill <= 1.0) {
        bail!("--fill must be in (0, 1]");
    }
    if args.nodes == 0 {
        bail!("--nodes must be above zero");
    }
    let size = |flag: &str, text: &Option<String>| -> Result<Option<u64>> {
        text.as_ref().map(|t| parse_size(t).map_err(|e| anyhow::anyhow!("{flag} {t:?}: {}", e.message()))).transpose()
    };
    let replicated_physical = total.physical_bytes as f64 * args.replicas as f64;
    let physical = match size("--node-physical", &args.node_physical)? {
        Some(bytes) => bytes,
        None => (replicated_physical / args.nodes as f64 / args.fill).ceil() as u64,
    };
    let logical = match size("--node-logical", &args.node_logical)? {
        Some(bytes) => bytes,
        None => (physical as f64 * total.ratio().unwrap_or(1.0)).ceil() as u64,
    };
    if logical == 0 || physical == 0 {
        bail!("node capacities must be above zero");
    }
    Ok(Space::new(logical, physical))
}

fn initial_nodes(nodes: usize, replicas: usize) -> usize {
    (nodes * 7 / 10).max(replicas).min(nodes)
}

fn config(args: &ScheduleArgs, policy: Policy, capacity: Space) -> Result<SimConfig> {
    let mut manager = ManagerConfig::paper(policy);
    manager.replicas = args.replicas;
    manager.logical_margin = args.margin / 100.0;
    manager.throttle.max_moves = args.moves_per_step;
    manager.band = match (args.band_low, args.band_high) {
        (Some(low), Some(high)) => Band::Absolute { low, high },
        _ => Band::Relative { below: args.band / 100.0, above: args.band / 100.0 },
    };
    let config = SimConfig {
        manager,
        nodes: args.nodes,
        initial_nodes: initial_nodes(args.nodes, args.replicas),
        join_waves: 2,
        node_capacity: capacity,
        steps: args.steps,
        arrival_steps: (args.steps * 3 / 4).max(1),
        growth_steps: args.growth_steps,
    };
    config.validate().map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    Ok(config)
}

fn run_json(args: &ScheduleArgs, config: &SimConfig, r: &SimReport, seconds: f64) -> Value {
    let s = &r.summary;
    let t = s.thresholds.expect("a summary has thresholds");
    let zones: Value = [Zone::A, Zone::B, Zone::C, Zone::D]
        .iter()
        .map(|z| (z.name().to_string(), json!(s.zone_counts[*z as usize])))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let timeline: Vec<Value> = r
        .samples
        .iter()
        .map(|x| {
            json!({
                "step": x.step,
                "active_nodes": x.active_nodes,
                "placed_chunks": x.placed_chunks,
                "nodes_in_band_fraction": x.nodes_in_band_fraction,
                "stranded_logical_fraction": x.stranded_logical_fraction,
                "stranded_physical_fraction": x.stranded_physical_fraction,
                "usable_capacity_bytes": x.usable_capacity_bytes,
                "used_logical_bytes": x.used.logical_bytes,
                "migrations": x.moves,
                "migrated_bytes": x.migrated.logical_bytes,
            })
        })
        .collect();
    let points: Option<Vec<Value>> = args.points.then(|| {
        r.points
            .iter()
            .map(|p| json!([p.node.0, p.logical_fraction, p.physical_fraction, p.zone.map(Zone::name)]))
            .collect()
    });
    json!({
        "policy": config.manager.policy.name(),
        "nodes_in_band_fraction": s.nodes_in_band_fraction,
        "stranded_logical_fraction": s.stranded_logical_fraction,
        "stranded_physical_fraction": s.stranded_physical_fraction,
        "stranded_logical_bytes": s.stranded.logical_bytes,
        "stranded_physical_bytes": s.stranded.physical_bytes,
        "nodes_stranding_logical_fraction": s.nodes_stranding_logical_fraction,
        "nodes_stranding_physical_fraction": s.nodes_stranding_physical_fraction,
        "usable_capacity_bytes": s.usable_capacity_bytes,
        "migrated_bytes": r.migrated.logical_bytes,
        "migrated_physical_bytes": r.migrated.physical_bytes,
        "migrations": r.moves,
        "migrations_by_reason": r.moves_by_reason,
        "final_plan_moves": r.final_plan_moves,
        "placed_chunks": r.placed_chunks,
        "refused_chunks": r.refused_chunks,
        "first_refused_step": r.first_refused_step,
        "first_refusal": r.first_refusal,
        "ratio_average": t.ratio_average,
        "band_low": t.ratio_low,
        "band_high": t.ratio_high,
        "ratio_min": s.ratio_min,
        "ratio_max": s.ratio_max,
        "ratio_stddev": s.ratio_stddev,
        "zones": zones,
        "logical_used_fraction": s.used.fractions_of(s.capacity).0,
        "physical_used_fraction": s.used.fractions_of(s.capacity).1,
        "seconds": seconds,
        "timeline": timeline,
        "points": points,
    })
}

/// The compression-aware run against the logical one, when both ran.
fn compare(runs: &[Value]) -> Value {
    let find = |name: &str| runs.iter().find(|r| r["policy"] == name);
    let (Some(logical), Some(aware)) = (find("logical"), find("compression-aware")) else {
        return Value::Null;
    };
    let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    let stranded = |v: &Value| f(v, "stranded_logical_fraction") + f(v, "stranded_physical_fraction");
    json!({
        "stranded_reduction_factor": stranded(logical) / stranded(aware),
        "usable_capacity_gain_fraction": f(aware, "usable_capacity_bytes") / f(logical, "usable_capacity_bytes") - 1.0,
        "extra_migrated_bytes": f(aware, "migrated_bytes") - f(logical, "migrated_bytes"),
    })
}

fn print_table(report: &Value) {
    let input = &report["input"];
    let cluster = &report["cluster"];
    println!(
        "tundra sim schedule: {} chunks from {}, average ratio {:.2}; {} nodes of {} logical / {} physical, {} replicas, seed {}",
        input["chunks"],
        input["source"].as_str().unwrap_or("?"),
        input["ratio"].as_f64().unwrap_or(f64::NAN),
        cluster["nodes"],
        format_size(cluster["node_logical_bytes"].as_u64().unwrap_or(0)),
        format_size(cluster["node_physical_bytes"].as_u64().unwrap_or(0)),
        cluster["replicas"],
        report["seed"]
    );
    println!(
        "{:<18} {:>13} {:>8} {:>9} {:>9} {:>11} {:>10} {:>12} {:>7} {:>8}",
        "policy", "band", "in band", "strand L", "strand P", "usable", "moves", "migrated", "refused", "seconds"
    );
    let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    for run in report["runs"].as_array().into_iter().flatten() {
        println!(
            "{:<18} {:>6.2}-{:<6.2} {:>7.1}% {:>8.2}% {:>8.2}% {:>11} {:>10} {:>12} {:>7} {:>8.2}",
            run["policy"].as_str().unwrap_or("?"),
            f(run, "band_low"),
            f(run, "band_high"),
            100.0 * f(run, "nodes_in_band_fraction"),
            100.0 * f(run, "stranded_logical_fraction"),
            100.0 * f(run, "stranded_physical_fraction"),
            format_size(run["usable_capacity_bytes"].as_u64().unwrap_or(0)),
            run["migrations"],
            format_size(run["migrated_bytes"].as_u64().unwrap_or(0)),
            run["refused_chunks"],
            f(run, "seconds"),
        );
    }
    if let Some(c) = report["comparison"].as_object() {
        println!(
            "compression-aware strands {:.1}x less space, holds {:+.2}% more, and migrates {} more",
            c["stranded_reduction_factor"].as_f64().unwrap_or(f64::NAN),
            100.0 * c["usable_capacity_gain_fraction"].as_f64().unwrap_or(f64::NAN),
            format_size(c["extra_migrated_bytes"].as_f64().unwrap_or(0.0).max(0.0) as u64)
        );
    }
    println!("paper: {}", report["paper"].as_str().unwrap_or(""));
}
