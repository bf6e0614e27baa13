//! `tundra cluster rebalance`: repeated CLUSTER_ADMIN `rebalance_step` requests to the node
//! asked (tundra-member's rebalance.rs), each planning from the cluster as it is and making one
//! move, with progress printed as it goes; a JSON summary with `--json`.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::volume::Connect;

/// Moves that fail in one run before it gives up.
const FAILURES_MAX: usize = 16;

pub fn run(policy: &str, dry_run: bool, max_moves: Option<u64>, json_out: bool, connect: &Connect) -> Result<()> {
    if policy != "logical" && policy != "compression-aware" {
        bail!("--policy {policy:?}: write logical or compression-aware");
    }
    let mut client = connect.client()?;
    let started = Instant::now();
    // The run's steps share the claim on moves (one mover at a time across the cluster).
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()) << 32;
    let mut skip: Vec<Value> = Vec::new();
    let mut moves: Vec<Value> = Vec::new();
    let mut failed: Vec<Value> = Vec::new();
    let mut first: Option<Value> = None;
    let mut last: Option<Value> = None;
    loop {
        if !dry_run && max_moves.is_some_and(|max| moves.len() as u64 >= max) {
            break;
        }
        let request = json!({ "rebalance_step": { "policy": policy, "dry_run": dry_run, "skip": skip, "run": run } });
        let answer = client.cluster_admin(&request.to_string())?;
        let step: Value = serde_json::from_str(&answer).context("the node's answer is not JSON")?;
        if first.is_none() {
            if !json_out {
                print_zones("before", &step["before"]);
                print_plan(&step["plan"]);
            }
            first = Some(step.clone());
        }
        if let Some(moved) = step.get("moved").filter(|m| !m.is_null()) {
            // A chunk moved in this run is not sent back to the node it left: with the sizes
            // changing under a writer, two rules could otherwise trade it back and forth.
            skip.push(json!({ "volume_id": moved["volume_id"], "chunk": moved["chunk"], "to": moved["from"] }));
            moves.push(moved.clone());
            if !json_out {
                println!("move {}: {}", moves.len(), describe(moved));
            }
        }
        if let Some(bad) = step.get("failed").and_then(Value::as_array) {
            let (planned, why) = (&bad[0], bad.get(1).and_then(Value::as_str).unwrap_or("?"));
            if !json_out {
                println!("failed and rolled back: {} ({why})", describe(planned));
            }
            skip.push(json!({ "volume_id": planned["volume_id"], "chunk": planned["chunk"], "to": planned["to"] }));
            failed.push(json!({ "move": planned, "error": why }));
        }
        let done = dry_run || step["plan"].as_array().is_none_or(Vec::is_empty) || failed.len() >= FAILURES_MAX;
        last = Some(step);
        if done {
            break;
        }
    }
    let first = first.unwrap_or(Value::Null);
    let last = last.unwrap_or(Value::Null);
    let sum = |key: &str| moves.iter().filter_map(|m| m[key].as_u64()).sum::<u64>();
    let after = if dry_run { first["simulated"]["after"].clone() } else { last["after"].clone() };
    let summary = json!({
        "policy": policy,
        "dry_run": dry_run,
        "moves_made": moves.len(),
        "logical_bytes_moved": sum("logical_bytes"),
        "physical_bytes_moved": sum("physical_bytes"),
        "seconds": started.elapsed().as_secs_f64(),
        "moves": moves,
        "failed": failed,
        "plan": first["plan"],
        "simulated_moves": first["simulated"]["moves"],
        "zones_before": first["before"],
        "zones_after": after,
        "chunk_sizes": first["sizes"],
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    if let Some(note) = first["sizes"]["note"].as_str() {
        println!("note: {note}");
    }
    if dry_run {
        let simulated = first["simulated"]["moves"].as_array().cloned().unwrap_or_default();
        println!("a run would make {} moves:", simulated.len());
        for (i, m) in simulated.iter().enumerate() {
            println!("  {}: {}", i + 1, describe(m));
        }
        print_zones("after (predicted)", &after);
    } else {
        println!(
            "{} moves, {} logical / {} physical bytes moved in {:.1} s",
            summary["moves_made"], summary["logical_bytes_moved"], summary["physical_bytes_moved"], summary["seconds"]
        );
        print_zones("after", &after);
    }
    if !failed.is_empty() && !dry_run && failed.len() >= FAILURES_MAX {
        bail!("{} moves failed; the rest of the plan was not carried out", failed.len());
    }
    Ok(())
}

fn describe(m: &Value) -> String {
    format!(
        "chunk {} of {} from node {} to node {} ({}, {} logical / {} physical bytes)",
        m["chunk"],
        m["volume"].as_str().unwrap_or("?"),
        m["from"],
        m["to"],
        m["reason"].as_str().unwrap_or("?"),
        m["logical_bytes"],
        m["physical_bytes"],
    )
}

fn print_plan(plan: &Value) {
    let plan = plan.as_array().cloned().unwrap_or_default();
    println!("plan: {} moves", plan.len());
    for m in &plan {
        println!("  {}", describe(m));
    }
}

fn print_zones(when: &str, zones: &Value) {
    println!(
        "zones {when}: band [{:.2}, {:.2}] around {:.2}, {:.0}% of nodes in it",
        zones["ratio_low"].as_f64().unwrap_or(0.0),
        zones["ratio_high"].as_f64().unwrap_or(0.0),
        zones["ratio_average"].as_f64().unwrap_or(0.0),
        100.0 * zones["nodes_in_band_fraction"].as_f64().unwrap_or(0.0),
    );
    for n in zones["nodes"].as_array().into_iter().flatten() {
        println!(
            "  node {}\tzone {}\tratio {}\tlogical {}\tphysical {}",
            n["id"],
            n["zone"].as_str().unwrap_or("-"),
            n["ratio"].as_f64().map_or("-".to_string(), |r| format!("{r:.2}")),
            n["logical_bytes"],
            n["physical_bytes"],
        );
    }
}
