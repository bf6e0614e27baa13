//! `tundra cluster status`: a cluster's nodes and chunk groups as the node asked sees them
//! (its stats' `cluster` object, which it gathers from every peer). `tundra cluster add-node`:
//! a node added to the running cluster (tundra-member's `join`). `tundra cluster drain` and
//! `tundra cluster move`: chunk replicas (and with `--redo`, replicas of a volume's redo stream)
//! moved by the node asked (tundra-member's `migrate`),
//! one CLUSTER_ADMIN request per move so that progress shows.

use anyhow::{Context, Result, bail};
use clap::Subcommand;

use crate::volume::Connect;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// The nodes (up or not) and every chunk's replicas, leader, term, commit and applied
    /// indexes, and how far the slowest replica lags.
    Status {
        /// Print one JSON object (docs/cli.md lists its keys).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Moves every chunk replica off node NODE, one at a time, as the cluster manager plans
    /// them, showing the chunks left; refuses when the other nodes cannot take them.
    Drain {
        node: u64,
        #[command(flatten)]
        connect: Connect,
    },
    /// Moves chunks as the cluster manager's plans say (seed 000 §4.2: the logical rule, and the
    /// compression-aware zones and band), one at a time, planning again after each move, until
    /// the plan is empty or --max-moves were made. A move that fails is rolled back and not
    /// planned again in this run.
    Rebalance {
        /// logical or compression-aware.
        #[arg(long, default_value = "compression-aware")]
        policy: String,
        /// Print the plan and the moves a run would make from this state, and move nothing.
        #[arg(long)]
        dry_run: bool,
        /// Stop after this many moves.
        #[arg(long)]
        max_moves: Option<u64>,
        /// Print one JSON object (docs/cli.md lists its keys).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Adds a node to the running cluster: PEER is `ID@HOST:PORT`, the node's id and the address
    /// it listens on for peers. Start it first, on an empty data directory, with every node in
    /// its `peers`; every running node links it and keeps it, without a restart.
    AddNode {
        peer: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Moves chunk CHUNK of volume VOLUME from node FROM to node TO; with --redo instead of
    /// --chunk, the volume's redo replica (its redo stream's group) on FROM.
    Move {
        #[arg(long)]
        volume: String,
        #[arg(long, required_unless_present = "redo", conflicts_with = "redo")]
        chunk: Option<u32>,
        /// Move the replica of the volume's redo stream instead of a chunk's.
        #[arg(long)]
        redo: bool,
        #[arg(long)]
        from: u64,
        #[arg(long)]
        to: u64,
        #[command(flatten)]
        connect: Connect,
    },
}

pub fn run(command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Status { json, connect } => status(json, &connect),
        ClusterCommand::Drain { node, connect } => drain(node, &connect),
        ClusterCommand::Rebalance { policy, dry_run, max_moves, json, connect } => {
            crate::rebalance::run(&policy, dry_run, max_moves, json, &connect)
        }
        ClusterCommand::AddNode { peer, connect } => {
            let request = serde_json::json!({ "add_node": { "peer": peer } });
            let answer = connect.client()?.cluster_admin(&request.to_string())?;
            let report: serde_json::Value = serde_json::from_str(&answer).context("the node's answer is not JSON")?;
            let linked = report["linked"].as_array().map_or(0, Vec::len);
            if report["added"] == true {
                println!("node {} at {} joined: {linked} nodes linked it", report["node"], report["addr"]);
            } else {
                println!("node {} at {} was a member already; {linked} nodes link it", report["node"], report["addr"]);
            }
            Ok(())
        }
        ClusterCommand::Move { volume, chunk: Some(chunk), redo: false, from, to, connect } => {
            let request = serde_json::json!({ "move": { "volume": volume, "chunk": chunk, "from": from, "to": to } });
            connect.client()?.cluster_admin(&request.to_string())?;
            println!("moved chunk {chunk} of {volume:?} from node {from} to node {to}");
            Ok(())
        }
        ClusterCommand::Move { volume, from, to, connect, .. } => {
            let request = serde_json::json!({ "move_redo": { "volume": volume, "from": from, "to": to } });
            connect.client()?.cluster_admin(&request.to_string())?;
            println!("moved the redo stream of {volume:?} from node {from} to node {to}");
            Ok(())
        }
    }
}

fn drain(node: u64, connect: &Connect) -> Result<()> {
    let mut client = connect.client()?;
    let request = serde_json::json!({ "drain_step": { "node": node } }).to_string();
    loop {
        let answer = client.cluster_admin(&request)?;
        let progress: serde_json::Value = serde_json::from_str(&answer).context("the node's answer is not JSON")?;
        let left = progress["chunks_left"].as_u64().context("the answer has no chunks_left")?;
        if let Some(moved) = progress["moved"].as_array() {
            println!(
                "moved chunk {} of {} to node {}; node {node} holds {left} chunks",
                moved.get(1).unwrap_or(&serde_json::Value::Null),
                moved.first().unwrap_or(&serde_json::Value::Null),
                moved.get(2).unwrap_or(&serde_json::Value::Null),
            );
        }
        let redo_left = progress["redo_left"].as_u64().unwrap_or(0);
        if let Some(moved) = progress["redo_moved"].as_array() {
            let volume = moved.first().unwrap_or(&serde_json::Value::Null);
            match moved.get(1).and_then(serde_json::Value::as_u64) {
                Some(0) | None => {
                    println!("node {node} left the redo group of {volume}; it holds {redo_left} redo replicas")
                }
                Some(to) => println!(
                    "moved the redo stream of {volume} to node {to}; node {node} holds {redo_left} redo replicas"
                ),
            }
        }
        if left == 0 && redo_left == 0 {
            println!("node {node} holds no chunk and no redo replica");
            return Ok(());
        }
    }
}

fn status(json: bool, connect: &Connect) -> Result<()> {
    let text = connect.client()?.stats(None)?;
    let stats: serde_json::Value = serde_json::from_str(&text).context("the node's stats are not JSON")?;
    let Some(status) = stats.get("cluster") else {
        bail!("the node is not part of a cluster (its config has no [cluster] section)");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(status)?);
        return Ok(());
    }
    let text = |v: &serde_json::Value| if v.is_null() { "-".to_string() } else { v.to_string() };
    println!("as node {} sees it:", status["node"]);
    for node in status["nodes"].as_array().into_iter().flatten() {
        let up = if node["up"].as_bool() == Some(true) { "up" } else { "down" };
        let usage = &node["usage"];
        let held: Vec<String> = node["chunks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{}/{}", c["volume_id"], c["chunk"]))
            .collect();
        println!(
            "node {}\t{}\t{up}\tlogical {} of {}\tphysical {} of {}\tratio {}\tchunks [{}]",
            node["id"],
            node["addr"].as_str().unwrap_or("?"),
            text(&usage["logical_used_bytes"]),
            text(&usage["logical_capacity_bytes"]),
            text(&usage["physical_used_bytes"]),
            text(&usage["physical_capacity_bytes"]),
            node["ratio"].as_f64().map_or("-".to_string(), |r| format!("{r:.2}")),
            held.join(" "),
        );
    }
    for chunk in status["chunks"].as_array().into_iter().flatten() {
        println!(
            "volume {} chunk {}\treplicas {}\tleader {}\tterm {}\tcommit {}\tapplied {}\tlag {}",
            chunk["volume"].as_str().unwrap_or("?"),
            chunk["chunk"],
            chunk["replicas"],
            text(&chunk["leader"]),
            chunk["term"],
            text(&chunk["commit_index"]),
            text(&chunk["applied_index"]),
            text(&chunk["lag"]),
        );
    }
    for group in status["redo"].as_array().into_iter().flatten() {
        println!(
            "volume {} redo	replicas {}	leader {}	term {}	commit {}	applied {}	lag {}",
            group["volume"].as_str().unwrap_or("?"),
            group["replicas"],
            text(&group["leader"]),
            group["term"],
            text(&group["commit_index"]),
            text(&group["applied_index"]),
            text(&group["lag"]),
        );
    }
    let manager = &status["manager"];
    match manager["error"].as_str() {
        Some(error) => println!("manager	members {}	{error}", manager["members"]),
        None => println!(
            "manager	members {}	leader {}	term {}	applied {}	nodes {}	chunks {}	moves in flight {}",
            manager["members"],
            text(&manager["leader"]),
            manager["term"],
            text(&manager["applied_index"]),
            manager["nodes"].as_array().map_or(0, Vec::len),
            manager["chunks"],
            manager["moves_in_flight"].as_array().map_or(0, Vec::len),
        ),
    }
    let replaced = &manager["last_replacement"];
    if !replaced.is_null() {
        println!(
            "manager member replaced	node {} by node {}	silent {:.1} s	replace after {:.1} s",
            replaced["replaced"],
            replaced["by"],
            replaced["silent_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
            manager["replace_after_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
        );
    }
    let repair = &manager["repair"];
    let repairing = repair["repairing"].as_array().map_or(0, Vec::len);
    if repairing > 0 || !repair["last_repair"].is_null() {
        println!(
            "manager repair	repairing {}	moves {}	last {}",
            repair["repairing"],
            repair["moves_total"],
            repair["last_repair"]["moved"].as_str().unwrap_or("none"),
        );
    }
    for why in repair["blocked"].as_array().into_iter().flatten() {
        println!("manager repair blocked	{}", why.as_str().unwrap_or_default());
    }
    for why in status["refused_volumes"].as_array().into_iter().flatten() {
        println!("refused volume	{}", why.as_str().unwrap_or_default());
    }
    let background = &manager["background_rebalance"];
    if let Some(every) = background["every_ms"].as_u64() {
        let last = &background["last_round"];
        let last = if last.is_null() {
            "no round yet".to_string()
        } else {
            format!(
                "last round: {} moves, {} failures{}",
                last["moves"],
                last["failures"],
                last["skipped"].as_str().map_or(String::new(), |why| format!(", skipped ({why})"))
            )
        };
        println!(
            "background rebalance	every {:.1} s	{}	rounds {}	moves {}	{last}",
            every as f64 / 1000.0,
            background["policy"].as_str().unwrap_or("?"),
            background["rounds"],
            background["moves_total"],
        );
    }
    Ok(())
}
