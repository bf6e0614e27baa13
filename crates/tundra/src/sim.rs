//! `tundra sim ...`: simulations of the policies Tundra's structures run, on the same decision
//! code the product runs. `tundra sim trim` is seed 001 §3.2's virtual data trim: the model of
//! tundra-lss's log under current practice and trim-assisted mode, set beside Table 1, and
//! optionally the store itself on an emulated drive at the same scale (docs/lss.md).
//! `tundra sim schedule` is the cluster manager's scheduling (schedule.rs).

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tundra_device::size::{format_size, parse_size};
use tundra_lss::drive_run::{DriveRun, run_on_drive};
use tundra_lss::model::run_model;
use tundra_lss::{Figures, Mode, Policy, RunConfig, Scale};

#[derive(Subcommand)]
pub enum SimCommand {
    /// Virtual data trim (seed 001 §3.2, Table 1): write and physical space amplification of a
    /// log-structured store under current practice and trim-assisted mode.
    Trim(TrimArgs),
    /// The cluster manager's placement and scheduling (seed 000 §4.2, Figures 9 to 11) over a
    /// simulated cluster: the logical policy against compression-aware scheduling.
    Schedule(crate::schedule::ScheduleArgs),
}

#[derive(Args)]
pub struct TrimArgs {
    /// One policy, `current` or `trim`; without it (and without --gamma-th) the four columns of
    /// Table 1 run: current practice at 1.2, 1.3, 1.4 and trim-assisted at 1.2.
    #[arg(long)]
    mode: Option<String>,
    /// γ_th of the one policy run (default 1.2).
    #[arg(long)]
    gamma_th: Option<f64>,
    /// Trim-assisted mode's cap on the logical footprint, as a multiple of the live data.
    #[arg(long, default_value_t = Policy::DEFAULT_LOGICAL_CAP)]
    cap: f64,
    /// paper (64 MiB segments, 8 GiB live), drive (1 MiB segments, 64 MiB live) or tiny.
    #[arg(long, default_value = "paper")]
    scale: String,
    /// Overrides the scale's live data size.
    #[arg(long, value_name = "SIZE")]
    live: Option<String>,
    /// Overrides the scale's segment size.
    #[arg(long, value_name = "SIZE")]
    segment_size: Option<String>,
    /// Overrides the element (slot) size: a power of two from 512 to 4096.
    #[arg(long, value_name = "SIZE")]
    element_size: Option<String>,
    /// Random overwrites before the measured window, in passes over the data.
    #[arg(long)]
    warmup_passes: Option<f64>,
    /// Random overwrites measured, in passes over the data.
    #[arg(long)]
    measured_passes: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also run the store on an emulated drive (in memory) with the same workload, and compare.
    #[arg(long)]
    drive: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Table 1 of seed 001: (mode, γ_th, write amplification, physical space amplification).
const TABLE_1: [(Mode, f64, f64, f64); 4] = [
    (Mode::CurrentPractice, 1.2, 3.20, 1.20),
    (Mode::CurrentPractice, 1.3, 2.34, 1.31),
    (Mode::CurrentPractice, 1.4, 1.93, 1.41),
    (Mode::TrimAssisted, 1.2, 2.16, 1.19),
];

/// The largest live data the store on the in-memory drive is run with.
const DRIVE_LIVE_LIMIT_BYTES: u64 = 1 << 30;

pub fn run(command: SimCommand) -> Result<()> {
    match command {
        SimCommand::Trim(args) => trim(args),
        SimCommand::Schedule(args) => crate::schedule::run(args),
    }
}

fn trim(args: TrimArgs) -> Result<()> {
    let policies = policies(&args)?;
    let configs: Vec<RunConfig> = policies.iter().map(|&p| config(&args, p)).collect::<Result<_>>()?;
    let first = configs[0];
    if args.drive && first.live_bytes > DRIVE_LIVE_LIMIT_BYTES {
        bail!(
            "--drive runs the store on a drive held in memory: at most {} of live data (use --scale drive)",
            format_size(DRIVE_LIVE_LIMIT_BYTES)
        );
    }
    let mut runs = Vec::new();
    for config in &configs {
        let began = std::time::Instant::now();
        let model = run_model(config).with_context(|| format!("the model of {}", describe(&config.policy)))?;
        let model_seconds = began.elapsed().as_secs_f64();
        let drive = if args.drive {
            Some(
                run_on_drive(config)
                    .with_context(|| format!("the store on the drive, {}", describe(&config.policy)))?,
            )
        } else {
            None
        };
        let segments = config.geometry()?.segment_count;
        runs.push(run_json(config, segments, &model, model_seconds, drive.as_ref()));
    }
    let report = json!({
        "scale": args.scale,
        "seed": args.seed,
        "element_bytes": first.element_bytes,
        "segment_bytes": first.segment_bytes,
        "live_bytes": first.live_bytes,
        "elements": first.elements(),
        "warmup_passes": first.warmup_passes,
        "measured_passes": first.measured_passes,
        "sample_every": first.sample_every,
        "runs": runs,
        "targets": targets(&runs),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn policies(args: &TrimArgs) -> Result<Vec<Policy>> {
    if args.mode.is_none() && args.gamma_th.is_none() {
        return Ok(TABLE_1
            .iter()
            .map(|&(mode, gamma, _, _)| match mode {
                Mode::CurrentPractice => Policy::current_practice(gamma),
                Mode::TrimAssisted => Policy::trim_assisted(gamma, args.cap),
            })
            .collect());
    }
    let mode = Mode::parse(args.mode.as_deref().unwrap_or("current"))
        .map_err(|e| anyhow::anyhow!("--mode: {}", e.message()))?;
    let gamma = args.gamma_th.unwrap_or(1.2);
    Ok(vec![match mode {
        Mode::CurrentPractice => Policy::current_practice(gamma),
        Mode::TrimAssisted => Policy::trim_assisted(gamma, args.cap),
    }])
}

fn config(args: &TrimArgs, policy: Policy) -> Result<RunConfig> {
    let scale = Scale::parse(&args.scale).map_err(|e| anyhow::anyhow!("--scale: {}", e.message()))?;
    let mut config = scale.run(policy, args.seed);
    if let Some(live) = &args.live {
        config.live_bytes = parse_size(live).map_err(|e| anyhow::anyhow!("--live {live:?}: {}", e.message()))?;
    }
    if let Some(size) = &args.segment_size {
        config.segment_bytes =
            parse_size(size).map_err(|e| anyhow::anyhow!("--segment-size {size:?}: {}", e.message()))?;
    }
    if let Some(size) = &args.element_size {
        let bytes = parse_size(size).map_err(|e| anyhow::anyhow!("--element-size {size:?}: {}", e.message()))?;
        config.element_bytes = u32::try_from(bytes).context("--element-size is too large")?;
    }
    if let Some(passes) = args.warmup_passes {
        config.warmup_passes = passes;
    }
    if let Some(passes) = args.measured_passes {
        config.measured_passes = passes;
    }
    if !(config.warmup_passes >= 0.0 && config.measured_passes > 0.0) {
        bail!("--warmup-passes must not be negative and --measured-passes must be above 0");
    }
    config.geometry().map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    Ok(config)
}

fn describe(policy: &Policy) -> String {
    match policy.mode {
        Mode::CurrentPractice => format!("current practice at gamma_th {}", policy.gamma_th),
        Mode::TrimAssisted => {
            format!("trim-assisted at gamma_th {} with a cap of {}", policy.gamma_th, policy.logical_cap)
        }
    }
}

fn figures_json(f: &Figures) -> Value {
    json!({
        "user_bytes": f.user_bytes,
        "gc_bytes": f.gc_bytes,
        "trim_bytes": f.trim_bytes,
        "write_amplification": f.write_amplification,
        "gc_write_amplification": f.gc_write_amplification,
        "trim_write_amplification": f.trim_write_amplification,
        "physical_amplification_average": f.physical_amplification_average,
        "physical_amplification_peak": f.physical_amplification_peak,
        "logical_amplification_average": f.logical_amplification_average,
        "logical_amplification_peak": f.logical_amplification_peak,
        "zeroed_sectors": f.zeroed_sectors,
        "trimmed_sectors": f.trimmed_sectors,
        "segments_collected": f.segments_collected,
    })
}

fn run_json(config: &RunConfig, segments: u32, model: &Figures, seconds: f64, drive: Option<&DriveRun>) -> Value {
    let policy = config.policy;
    let paper = TABLE_1
        .iter()
        .find(|(mode, gamma, _, _)| *mode == policy.mode && *gamma == policy.gamma_th)
        .map(|&(_, _, wa, psa)| json!({ "write_amplification": wa, "physical_amplification": psa }));
    let drive = drive.map(|d| {
        let mut value = figures_json(&d.figures);
        let extra = json!({
            "drive_write_amplification": d.drive_write_amplification,
            "drive_compression_ratio": d.drive_compression_ratio,
            "verified_elements": d.verified_elements,
            "seconds": d.seconds,
            "write_amplification_vs_model": d.drive_write_amplification / model.write_amplification,
            "physical_average_vs_model": d.figures.physical_amplification_average / model.physical_amplification_average,
            "physical_peak_vs_model": d.figures.physical_amplification_peak / model.physical_amplification_peak,
        });
        merge(&mut value, extra);
        value
    });
    json!({
        "mode": policy.mode.name(),
        "gamma_th": policy.gamma_th,
        "logical_cap": (policy.mode == Mode::TrimAssisted).then_some(policy.logical_cap),
        "segments": segments,
        "model": figures_json(model),
        "model_seconds": seconds,
        "paper": paper,
        "drive": drive,
    })
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// The targets, checked on the runs that have the columns they compare.
fn targets(runs: &[Value]) -> Value {
    let find = |mode: &str, gamma: f64| {
        runs.iter().find(|r| r["mode"] == mode && r["gamma_th"].as_f64() == Some(gamma)).map(|r| &r["model"])
    };
    let number = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    let mut current_wa = Vec::new();
    let mut current_space = Vec::new();
    for &(mode, gamma, wa, _) in &TABLE_1 {
        if mode != Mode::CurrentPractice {
            continue;
        }
        if let Some(model) = find("current", gamma) {
            current_wa.push((number(model, "write_amplification") / wa - 1.0).abs() <= 0.05);
            let within = |key| (number(model, key) - gamma).abs() <= 0.02;
            current_space.push(within("physical_amplification_average") && within("physical_amplification_peak"));
        }
    }
    let all = |v: &[bool]| (!v.is_empty()).then(|| v.iter().all(|&ok| ok));
    let trim = find("trim", 1.2);
    let trim_space = trim.zip(find("current", 1.2)).map(|(t, c)| {
        number(t, "physical_amplification_average") <= number(c, "physical_amplification_average")
            && number(t, "physical_amplification_peak") <= number(c, "physical_amplification_peak")
    });
    let trim_writes = trim
        .zip(find("current", 1.3))
        .map(|(t, c)| number(t, "write_amplification") < number(c, "write_amplification"));
    let drives: Vec<bool> = runs
        .iter()
        .filter(|r| !r["drive"].is_null())
        .map(|r| {
            ["write_amplification_vs_model", "physical_average_vs_model", "physical_peak_vs_model"]
                .iter()
                .all(|key| (number(&r["drive"], key) - 1.0).abs() <= 0.05)
        })
        .collect();
    json!({
        "current_write_amplification_within_5pct_of_table_1": all(&current_wa),
        "current_physical_within_2_points_of_gamma_th": all(&current_space),
        "trim_physical_not_above_current_at_1_2": trim_space,
        "trim_write_amplification_below_current_at_1_3": trim_writes,
        "drive_within_5pct_of_model": all(&drives),
    })
}

fn print_table(report: &Value) {
    println!(
        "tundra sim trim: {} scale, {}-byte elements, {} segments, {} live ({} elements), seed {}",
        report["scale"].as_str().unwrap_or("?"),
        report["element_bytes"],
        format_size(report["segment_bytes"].as_u64().unwrap_or(0)),
        format_size(report["live_bytes"].as_u64().unwrap_or(0)),
        report["elements"],
        report["seed"]
    );
    println!(
        "{:<8} {:>5} {:>5} | {:>6} {:>6} {:>6} {:>8} {:>8} {:>6} | {:>9} {:>9} | {:>8} {:>8} {:>8}",
        "mode",
        "γ_th",
        "cap",
        "WA",
        "GC",
        "trim",
        "PSA avg",
        "PSA peak",
        "γ avg",
        "paper WA",
        "paper PSA",
        "drive WA",
        "drv avg",
        "drv peak"
    );
    let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    for run in report["runs"].as_array().into_iter().flatten() {
        let m = &run["model"];
        let cap = run["logical_cap"].as_f64().map_or("-".to_string(), |c| format!("{c:.1}"));
        let paper = if run["paper"].is_null() {
            format!("{:>9} {:>9}", "-", "-")
        } else {
            format!(
                "{:>9.2} {:>8.0}%",
                f(&run["paper"], "write_amplification"),
                100.0 * f(&run["paper"], "physical_amplification")
            )
        };
        let drive = if run["drive"].is_null() {
            format!("{:>8} {:>8} {:>8}", "-", "-", "-")
        } else {
            let d = &run["drive"];
            format!(
                "{:>8.3} {:>7.1}% {:>7.1}%",
                f(d, "drive_write_amplification"),
                100.0 * f(d, "physical_amplification_average"),
                100.0 * f(d, "physical_amplification_peak")
            )
        };
        println!(
            "{:<8} {:>5.2} {:>5} | {:>6.3} {:>6.3} {:>6.3} {:>7.1}% {:>7.1}% {:>6.3} | {paper} | {drive}",
            run["mode"].as_str().unwrap_or("?"),
            f(run, "gamma_th"),
            cap,
            f(m, "write_amplification"),
            f(m, "gc_write_amplification"),
            f(m, "trim_write_amplification"),
            100.0 * f(m, "physical_amplification_average"),
            100.0 * f(m, "physical_amplification_peak"),
            f(m, "logical_amplification_average"),
        );
    }
    for (target, verdict) in report["targets"].as_object().into_iter().flatten() {
        if !verdict.is_null() {
            println!("{target}: {}", if verdict.as_bool() == Some(true) { "met" } else { "NOT met" });
        }
    }
}
