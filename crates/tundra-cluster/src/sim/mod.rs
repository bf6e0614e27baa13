//! The scheduling simulator: a cluster of nodes, chunks that arrive, grow and move, all in
//! memory, driven through the manager's own commands and plans, so what it reports is what the
//! manager's code decides (seed 000 §4.2.3: the band is chosen by offline simulation).
//!
//! One step of simulated time: new nodes join (the cluster starts with part of its nodes and
//! the rest join in waves while data arrives, as servers are added to a filling cluster); every
//! chunk still growing reports its new size and every node its usage; the chunks arriving in the
//! step are placed; the manager's plan is carried out (each move begun and finished within the
//! step, the plan itself bounded by the throttle). Chunk `i` of `n` arrives at step
//! `i * arrival_steps / n` and grows linearly to its final size over `growth_steps`; its ratio
//! never changes. After the arrivals the simulation runs on until `steps`, so scheduling can
//! settle. The simulator keeps its own ledger of what each node holds and checks the manager's
//! accounting against it after every step.

mod input;

use std::collections::BTreeMap;

pub use input::{
    ChunkSpec, Layers, MAX_VOLUME_CHUNKS, Slice, builtin_chunks, builtin_chunks_in_eras, builtin_slices,
    parse_chunks_csv,
};
use tundra_store::ids::ChunkId;

use crate::config::ManagerConfig;
use crate::error::{Error, Result};
use crate::state::{ClusterState, Command};
use crate::summary::ClusterSummary;
use crate::usage::{NodeId, Space, Zone};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    pub manager: ManagerConfig,
    /// Nodes at the end; `initial_nodes` of them from the start, the others in `join_waves`
    /// equal waves spread over the arrival period.
    pub nodes: usize,
    pub initial_nodes: usize,
    pub join_waves: usize,
    pub node_capacity: Space,
    pub steps: usize,
    pub arrival_steps: usize,
    pub growth_steps: usize,
}

impl SimConfig {
    pub fn validate(&self) -> Result<()> {
        self.manager.validate()?;
        if self.nodes < self.manager.replicas {
            return Err(Error::invalid(format!(
                "{} nodes cannot hold {} replicas of a chunk",
                self.nodes, self.manager.replicas
            )));
        }
        if self.initial_nodes < self.manager.replicas || self.initial_nodes > self.nodes {
            return Err(Error::invalid(format!(
                "the initial nodes ({}) must be between the replicas ({}) and the nodes ({})",
                self.initial_nodes, self.manager.replicas, self.nodes
            )));
        }
        if self.node_capacity.logical_bytes == 0 || self.node_capacity.physical_bytes == 0 {
            return Err(Error::invalid("node capacities must be above zero"));
        }
        if self.arrival_steps == 0 || self.arrival_steps > self.steps || self.growth_steps == 0 {
            return Err(Error::invalid("need 0 < arrival steps <= steps and at least one growth step"));
        }
        Ok(())
    }

    /// The step at which join wave `wave` (0-based) comes.
    fn join_step(&self, wave: usize) -> usize {
        self.arrival_steps * (wave + 1) / (self.join_waves + 1)
    }
}

/// The cluster after one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub step: usize,
    pub active_nodes: usize,
    pub placed_chunks: usize,
    pub refused_chunks: usize,
    pub nodes_in_band_fraction: f64,
    pub stranded_logical_fraction: f64,
    pub stranded_physical_fraction: f64,
    pub usable_capacity_bytes: u64,
    pub used: Space,
    pub moves: usize,
    pub migrated: Space,
}

/// A node on the logical/physical plane at the end (Figure 9): usage over capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodePoint {
    pub node: NodeId,
    pub logical_fraction: f64,
    pub physical_fraction: f64,
    pub zone: Option<Zone>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    pub samples: Vec<Sample>,
    pub summary: ClusterSummary,
    pub points: Vec<NodePoint>,
    pub placed_chunks: usize,
    pub refused_chunks: usize,
    /// The step of the first chunk the manager refused because the cluster was full.
    pub first_refused_step: Option<usize>,
    /// The first refusal's message.
    pub first_refusal: Option<String>,
    pub moves: usize,
    pub moves_by_reason: BTreeMap<&'static str, usize>,
    /// Sizes of every replica moved, summed.
    pub migrated: Space,
    /// Moves the manager would still plan at the end (0: converged).
    pub final_plan_moves: usize,
}

/// Runs the simulation over `chunks`, in arrival order.
pub fn run(config: &SimConfig, chunks: &[ChunkSpec]) -> Result<SimReport> {
    config.validate()?;
    if chunks.is_empty() {
        return Err(Error::invalid("no chunk to simulate"));
    }
    let mut sim = Simulation::new(config)?;
    for step in 0..config.steps {
        sim.step(step, chunks)?;
    }
    Ok(sim.finish())
}

struct Simulation<'a> {
    config: &'a SimConfig,
    state: ClusterState,
    /// What each node holds, as the simulator moved it: the manager's accounting must agree.
    ledger: BTreeMap<NodeId, Space>,
    /// Each placed chunk's data as the simulator wrote it (nothing until its first growth; only
    /// the manager's placement counts a new chunk at its expected size).
    actual: BTreeMap<ChunkId, Space>,
    /// Chunks placed and still growing: (index in the input, step placed).
    growing: Vec<(usize, usize)>,
    next_chunk: usize,
    joined: usize,
    report: SimReport,
}

impl<'a> Simulation<'a> {
    fn new(config: &'a SimConfig) -> Result<Simulation<'a>> {
        let mut sim = Simulation {
            config,
            state: ClusterState::new(config.manager)?,
            ledger: BTreeMap::new(),
            actual: BTreeMap::new(),
            growing: Vec::new(),
            next_chunk: 0,
            joined: 0,
            report: SimReport {
                samples: Vec::new(),
                summary: ClusterSummary::default(),
                points: Vec::new(),
                placed_chunks: 0,
                refused_chunks: 0,
                first_refused_step: None,
                first_refusal: None,
                moves: 0,
                moves_by_reason: BTreeMap::new(),
                migrated: Space::ZERO,
                final_plan_moves: 0,
            },
        };
        sim.join(config.initial_nodes)?;
        Ok(sim)
    }

    fn join(&mut self, count: usize) -> Result<()> {
        for _ in 0..count {
            self.joined += 1;
            let node = NodeId(self.joined as u64);
            self.state.apply(&Command::AddNode { node, capacity: self.config.node_capacity })?;
            self.ledger.insert(node, Space::ZERO);
        }
        Ok(())
    }

    fn step(&mut self, step: usize, chunks: &[ChunkSpec]) -> Result<()> {
        let config = self.config;
        let late = config.nodes - config.initial_nodes;
        for wave in 0..config.join_waves {
            if config.join_step(wave) == step {
                let count = late * (wave + 1) / config.join_waves - late * wave / config.join_waves;
                self.join(count)?;
            }
        }
        self.grow(step, chunks)?;
        for (&node, &used) in &self.ledger {
            self.state.apply(&Command::Heartbeat { node, capacity: config.node_capacity, used })?;
        }
        let arrived = if step + 1 >= config.arrival_steps {
            chunks.len()
        } else {
            chunks.len() * (step + 1) / config.arrival_steps
        };
        while self.next_chunk < arrived {
            self.place(step, chunks[self.next_chunk])?;
            self.next_chunk += 1;
        }
        self.migrate()?;
        self.check();
        let summary = self.state.summary();
        self.report.samples.push(Sample {
            step,
            active_nodes: summary.active_nodes,
            placed_chunks: self.report.placed_chunks,
            refused_chunks: self.report.refused_chunks,
            nodes_in_band_fraction: summary.nodes_in_band_fraction,
            stranded_logical_fraction: summary.stranded_logical_fraction,
            stranded_physical_fraction: summary.stranded_physical_fraction,
            usable_capacity_bytes: summary.usable_capacity_bytes,
            used: summary.used,
            moves: self.report.moves,
            migrated: self.report.migrated,
        });
        Ok(())
    }

    /// Every growing chunk reaches its size for this step; the nodes holding it grow with it.
    fn grow(&mut self, step: usize, chunks: &[ChunkSpec]) -> Result<()> {
        let growth = self.config.growth_steps as u64;
        let mut still = Vec::with_capacity(self.growing.len());
        for &(index, placed) in &self.growing {
            let spec = chunks[index];
            let age = (step - placed) as u64;
            let part = |total: u64| total * age.min(growth) / growth;
            let size = Space::new(part(spec.size.logical_bytes), part(spec.size.physical_bytes));
            let chunk = ChunkId(spec.id);
            let old = self.actual.insert(chunk, size).expect("a placed chunk has an actual size");
            self.state.apply(&Command::ChunkStats { chunk, size })?;
            for node in &self.state.chunk(chunk).expect("placed").replicas {
                let held = self.ledger.get_mut(node).expect("a member");
                *held = held.minus(old).plus(size);
            }
            if age < growth {
                still.push((index, placed));
            }
        }
        self.growing = still;
        Ok(())
    }

    fn place(&mut self, step: usize, spec: ChunkSpec) -> Result<()> {
        let command = Command::PlaceChunk { chunk: ChunkId(spec.id), expected_logical_bytes: spec.size.logical_bytes };
        match self.state.apply(&command) {
            Ok(_) => {
                self.report.placed_chunks += 1;
                self.actual.insert(ChunkId(spec.id), Space::ZERO);
                self.growing.push((self.next_chunk, step));
                Ok(())
            }
            Err(e) if e.kind() == crate::ErrorKind::Full => {
                self.report.refused_chunks += 1;
                if self.report.first_refused_step.is_none() {
                    self.report.first_refused_step = Some(step);
                    self.report.first_refusal = Some(e.to_string());
                }
                Ok(())
            }
            Err(e) => Err(Error::invalid(format!("chunk {}: {}", spec.id, e.message()))),
        }
    }

    /// The manager's plan, carried out: every move begun, then finished (the simulator's
    /// migrations take less than a step).
    fn migrate(&mut self) -> Result<()> {
        let plan = self.state.plan();
        for m in &plan.moves {
            self.state.apply(&Command::BeginMove(*m))?;
        }
        for m in &plan.moves {
            self.state.apply(&Command::FinishMove { chunk: m.chunk })?;
            let size = self.actual[&m.chunk];
            let from = self.ledger.get_mut(&m.from).expect("a member");
            *from = from.minus(size);
            let to = self.ledger.get_mut(&m.to).expect("a member");
            *to = to.plus(size);
            self.report.moves += 1;
            *self.report.moves_by_reason.entry(m.reason.name()).or_insert(0) += 1;
            self.report.migrated = self.report.migrated.plus(size);
        }
        Ok(())
    }

    /// The manager's accounting against the ledger: what the chunks on every node reported
    /// adds up to what the simulator put there.
    fn check(&self) {
        self.state.check_invariants();
        for (node, held) in &self.ledger {
            let state = self.state.node(*node).expect("a member");
            let reported = state.chunks.iter().fold(Space::ZERO, |sum, c| {
                sum.plus(self.state.chunk(*c).expect("placed").reported.unwrap_or(Space::ZERO))
            });
            assert_eq!(reported, *held, "{node}: manager and ledger disagree");
        }
    }

    fn finish(mut self) -> SimReport {
        self.report.summary = self.state.summary();
        let thresholds = self.state.thresholds();
        self.report.points = self
            .state
            .nodes()
            .iter()
            .map(|(&node, n)| {
                let (logical_fraction, physical_fraction) = n.projected().fractions_of(n.capacity);
                NodePoint { node, logical_fraction, physical_fraction, zone: thresholds.zone(n.projected()) }
            })
            .collect();
        self.report.final_plan_moves = self.state.plan().moves.len();
        self.report
    }
}
