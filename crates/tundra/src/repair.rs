//! `tundra repair`: what to do when a store's journal is damaged in a way recovery cannot undo
//! without loss. Without `--accept-loss` it only reports what it would drop and changes nothing;
//! with it, the damaged log is truncated at the damage (the valid prefix is replayed, a fresh
//! checkpoint and a new epoch written), then every page is checked and the pages that now fail
//! their checksum are listed: a page whose newer record was dropped reads its previous contents,
//! or, if its old blocks were reused since, a checksum error, never another page's bytes (every
//! page's checksum is bound to its address).

use anyhow::{Context, Result, bail};
use clap::Args;
use tundra_node::Node;
use tundra_node::repair::inspect_journals;

use crate::serve::NodeArgs;

#[derive(Args)]
pub struct RepairArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Truncate a damaged journal log at the damage, dropping the records from there on.
    #[arg(long)]
    accept_loss: bool,
}

fn say(line: &str) {
    eprintln!("tundra: {line}");
}

pub fn repair(args: RepairArgs) -> Result<()> {
    let config = args.node.config()?;
    let dir = &config.data_dir;
    if !dir.join("layout.toml").exists() {
        bail!("{} holds no Tundra node (no layout.toml)", dir.display());
    }
    if !args.accept_loss {
        return report_only(dir);
    }
    let node = Node::open_with(&config, &mut |line| say(line), true)
        .with_context(|| format!("repairing {} (is the node still running?)", dir.display()))?;
    for (device, recovery) in node.recovery() {
        match recovery.lost {
            Some(lost) => println!("{device:?} store: truncated the journal's log, dropping {}", lost.dropped()),
            None => println!("{device:?} store: journal intact, nothing dropped"),
        }
    }
    let reports = node.check()?;
    let failing: Vec<&String> = reports.iter().flat_map(|(_, r)| &r.damaged).collect();
    for line in &failing {
        println!("  {line}");
    }
    node.close().context("checkpointing the repaired node")?;
    if failing.is_empty() {
        println!("repaired: every page verifies");
    } else {
        println!(
            "repaired: the node starts again; the {} problem(s) above stay (pages read as errors until rewritten \
             or trimmed)",
            failing.len()
        );
    }
    Ok(())
}

/// Reports what a repair would drop, changing nothing; fails if anything would be dropped.
fn report_only(dir: &std::path::Path) -> Result<()> {
    let reports = inspect_journals(dir)
        .with_context(|| format!("reading the journals in {} (is the node still running?)", dir.display()))?;
    let mut damaged = 0;
    for report in &reports {
        for note in &report.notes {
            println!("{note} (the next start recovers this without loss)");
        }
        match &report.damage {
            Some(damage) => {
                damaged += 1;
                println!("{}: {}; a repair would drop {}", report.place.name, damage.what, damage.dropped());
            }
            None => println!("{}: intact", report.place.name),
        }
    }
    if damaged > 0 {
        bail!("{damaged} journal(s) damaged and nothing changed; `tundra repair --accept-loss` drops what is listed");
    }
    println!("nothing to repair");
    Ok(())
}
