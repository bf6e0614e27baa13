//! `tundra cluster status`: a cluster's nodes and chunk groups as the node asked sees them
//! (its stats' `cluster` object, which it gathers from every peer).

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
}

pub fn run(command: ClusterCommand) -> Result<()> {
    let ClusterCommand::Status { json, connect } = command;
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
    Ok(())
}
