//! The chunks a simulation places: read from a CSV file's text (`chunk_id,logical_bytes,
//! physical_bytes`, one row per chunk, in arrival order) or drawn from the built-in
//! distribution, whose ratios were measured on slices of the project's real datasets.
//!
//! The built-in table, `chunk_ratios.csv`, is the output of `scripts/chunk-ratios` (quick-scale
//! TPC-H, TPC-DS, nycflights13 and Wikipedia relation files from `scripts/datasets`, cut into
//! 1 MiB slices, each measured by `tundra analyze`): for each slice its logical bytes, its bytes
//! on the drive alone and its bytes after Algorithm 1 and the drive. A simulated database
//! volume takes one dataset, and each of its chunks the ratio of one slice of that dataset
//! (slices weighted by their size); volumes arrive one after the other, their chunks together,
//! as a database is loaded.

use std::collections::BTreeSet;

use tundra_env::Rng;

use crate::error::{Error, Result};
use crate::usage::Space;

/// One chunk of the input: its id and its final size (it grows to it after placement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpec {
    pub id: u64,
    pub size: Space,
}

/// Parses the chunk CSV. A header line naming the columns is allowed; blank lines and lines
/// starting with `#` are skipped. Any other bad line is refused naming its number.
pub fn parse_chunks_csv(text: &str) -> Result<Vec<ChunkSpec>> {
    let mut chunks = Vec::new();
    let mut seen = BTreeSet::new();
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if chunks.is_empty() && seen.is_empty() && line.replace(' ', "") == "chunk_id,logical_bytes,physical_bytes" {
            continue;
        }
        let bad = |why: String| Error::invalid(format!("line {line_no}: {why} (in {line:?})"));
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != 3 {
            return Err(bad(format!(
                "expected 3 fields chunk_id,logical_bytes,physical_bytes, found {}",
                fields.len()
            )));
        }
        let number = |name: &str, field: &str| {
            field.parse::<u64>().map_err(|_| bad(format!("{name} {field:?} is not a non-negative integer")))
        };
        let id = number("chunk_id", fields[0])?;
        let logical = number("logical_bytes", fields[1])?;
        let physical = number("physical_bytes", fields[2])?;
        if logical == 0 || physical == 0 {
            return Err(bad("a chunk needs logical and physical bytes above zero".into()));
        }
        if !seen.insert(id) {
            return Err(bad(format!("chunk_id {id} appears twice")));
        }
        chunks.push(ChunkSpec { id, size: Space::new(logical, physical) });
    }
    if chunks.is_empty() {
        return Err(Error::invalid("the chunk file holds no chunk"));
    }
    Ok(chunks)
}

/// Which layer's ratios the built-in distribution uses: the drive alone (as the paper's
/// cluster C1, PolarCSD 1.0 without software compression) or both layers (C2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layers {
    DriveOnly,
    Dual,
}

impl Layers {
    pub fn parse(name: &str) -> Result<Layers> {
        match name {
            "drive" => Ok(Layers::DriveOnly),
            "dual" => Ok(Layers::Dual),
            other => Err(Error::invalid(format!("unknown ratio layers {other:?} (drive or dual)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Layers::DriveOnly => "drive",
            Layers::Dual => "dual",
        }
    }
}

const TABLE: &str = include_str!("chunk_ratios.csv");

/// A measured slice: its dataset and its logical bytes over its stored bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub dataset: String,
    pub logical_bytes: u64,
    pub ratio: f64,
}

/// The built-in table's slices, with the ratio of the chosen layers.
pub fn builtin_slices(layers: Layers) -> Vec<Slice> {
    TABLE
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 6, "chunk_ratios.csv: {line}");
            let number = |s: &str| s.parse::<u64>().expect("chunk_ratios.csv holds integers");
            let logical_bytes = number(f[3]);
            let stored = match layers {
                Layers::DriveOnly => number(f[4]),
                Layers::Dual => number(f[5]),
            };
            Slice { dataset: f[0].to_string(), logical_bytes, ratio: logical_bytes as f64 / stored as f64 }
        })
        .collect()
}

/// The largest database volume the built-in distribution draws, in chunks: volume sizes are
/// log-uniform between one chunk and this.
pub const MAX_VOLUME_CHUNKS: u64 = 400;

/// `count` chunks of `chunk_logical_bytes` each, in volumes as the module describes, numbered
/// from 0 in arrival order.
pub fn builtin_chunks(count: usize, chunk_logical_bytes: u64, layers: Layers, rng: &mut Rng) -> Vec<ChunkSpec> {
    builtin_chunks_in_eras(count, chunk_logical_bytes, layers, 0, rng)
}

/// [`builtin_chunks`], with the arrivals cut into `eras` equal eras (0: none) whose volumes
/// all take one dataset: the datasets in a random order, that order repeated if there are
/// more eras than datasets. It models a cluster whose tenants come in kinds over time (a
/// cluster first loaded with one kind of database, later with another), a correlation between
/// a chunk's ratio and its arrival that the default input lacks: nodes that join during an era
/// receive mostly that era's chunks.
pub fn builtin_chunks_in_eras(
    count: usize,
    chunk_logical_bytes: u64,
    layers: Layers,
    eras: usize,
    rng: &mut Rng,
) -> Vec<ChunkSpec> {
    assert!(chunk_logical_bytes > 0);
    let slices = builtin_slices(layers);
    let datasets: Vec<String> = slices.iter().map(|s| s.dataset.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    // Shuffled only with eras, so that the default input of a seed stays what it was.
    let mut order: Vec<String> = datasets.clone();
    if eras > 0 {
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    let mut chunks = Vec::with_capacity(count);
    while chunks.len() < count {
        let dataset = match eras {
            0 => rng.pick(&datasets),
            _ => &order[(chunks.len() * eras / count) % order.len()],
        };
        let own: Vec<&Slice> = slices.iter().filter(|s| &s.dataset == dataset).collect();
        let total: u64 = own.iter().map(|s| s.logical_bytes).sum();
        let volume_chunks = (MAX_VOLUME_CHUNKS as f64).powf(uniform(rng)).floor().max(1.0) as u64;
        for _ in 0..volume_chunks {
            if chunks.len() == count {
                break;
            }
            let slice = weighted(&own, total, rng);
            let physical = ((chunk_logical_bytes as f64 / slice.ratio).round() as u64).max(1);
            chunks.push(ChunkSpec { id: chunks.len() as u64, size: Space::new(chunk_logical_bytes, physical) });
        }
    }
    chunks
}

/// A number in [0, 1) from the generator.
fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn weighted<'a>(slices: &[&'a Slice], total: u64, rng: &mut Rng) -> &'a Slice {
    let mut point = rng.below(total);
    for s in slices {
        if point < s.logical_bytes {
            return s;
        }
        point -= s.logical_bytes;
    }
    unreachable!("the point is below the total")
}
