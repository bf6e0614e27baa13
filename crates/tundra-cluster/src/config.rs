//! The manager's configuration: how many replicas, the fullness limit, the logical margin, the
//! scheduling policy and its band, and the throttle on migrations. It is part of the replicated
//! state (a `Configure` command changes it), so every member decides with the same numbers.

use crate::error::{Error, Result};

/// Which moves the manager plans besides repairs, drains and joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// Seed 000 §4.2.1, the original strategy: chunks move off a node whose logical usage is
    /// more than the margin above the average, to the nodes with the lowest logical usage,
    /// whatever their compression ratios.
    Logical,
    /// Seed 000 §4.2.2: the logical rule, plus moves that keep every node's compression ratio
    /// inside the band [c_l, c_h] (zones A to D).
    CompressionAware,
}

impl Policy {
    pub fn parse(name: &str) -> Result<Policy> {
        match name {
            "logical" => Ok(Policy::Logical),
            "compression-aware" => Ok(Policy::CompressionAware),
            other => Err(Error::invalid(format!("unknown policy {other:?} (logical or compression-aware)"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Logical => "logical",
            Policy::CompressionAware => "compression-aware",
        }
    }
}

/// The band [c_l, c_h] of compression ratios a node should stay in (seed 000 §4.2.2).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Band {
    /// Around the cluster's average ratio c_avg: [c_avg (1 - below), c_avg (1 + above)]. The
    /// paper's two clusters used ±10% (2.2 to 2.7 around about 2.45; 3.15 to 3.85 around 3.5).
    Relative { below: f64, above: f64 },
    /// Fixed ratios, as an operator who ran the offline simulation would set them.
    Absolute { low: f64, high: f64 },
}

impl Band {
    /// The band's bounds for a cluster whose average ratio is `average`.
    pub fn bounds(self, average: f64) -> (f64, f64) {
        match self {
            Band::Relative { below, above } => (average * (1.0 - below), average * (1.0 + above)),
            Band::Absolute { low, high } => (low, high),
        }
    }
}

/// How much migration may be under way at once. Each move costs a copy of the chunk over the
/// network and a membership change, so plans are cut to these bounds; moves already in flight
/// count against them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Throttle {
    /// Moves in flight in the whole cluster.
    pub max_moves: usize,
    /// Moves in flight that one node sends or receives.
    pub max_moves_per_node: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManagerConfig {
    /// Replicas of every chunk, each on a different node.
    pub replicas: usize,
    /// A node whose logical or physical usage would pass this fraction of its capacity takes
    /// no new replica (seed 000 §4.2.1: 75%).
    pub fullness_limit: f64,
    /// The logical rule's margin: a node more than this fraction above the average logical
    /// usage sheds chunks; one more than this fraction below it (a new node) receives them.
    pub logical_margin: f64,
    pub policy: Policy,
    pub band: Band,
    pub throttle: Throttle,
    /// How many of a source's chunks (in the policy's order of preference) a plan tries before
    /// giving up on that source; it bounds a plan's work on large nodes.
    pub candidates_per_source: usize,
}

impl ManagerConfig {
    pub const PAPER_FULLNESS_LIMIT: f64 = 0.75;
    pub const PAPER_LOGICAL_MARGIN: f64 = 0.10;
    /// More replicas than any deployment uses, and a bound a decoded configuration keeps.
    pub const MAX_REPLICAS: usize = 16;

    /// The paper's numbers with the given policy: three replicas, 75%, 10%, a ±10% band.
    pub fn paper(policy: Policy) -> ManagerConfig {
        ManagerConfig {
            replicas: 3,
            fullness_limit: Self::PAPER_FULLNESS_LIMIT,
            logical_margin: Self::PAPER_LOGICAL_MARGIN,
            policy,
            band: Band::Relative { below: 0.10, above: 0.10 },
            throttle: Throttle { max_moves: 64, max_moves_per_node: 2 },
            candidates_per_source: 16,
        }
    }

    /// Refuses a configuration the decisions cannot work with.
    pub fn validate(&self) -> Result<()> {
        if self.replicas == 0 || self.replicas > Self::MAX_REPLICAS {
            return Err(Error::invalid(format!("replicas must be 1 to {}, not {}", Self::MAX_REPLICAS, self.replicas)));
        }
        if !(self.fullness_limit > 0.0 && self.fullness_limit <= 1.0) {
            return Err(Error::invalid(format!("fullness limit {} is not in (0, 1]", self.fullness_limit)));
        }
        if !(self.logical_margin >= 0.0 && self.logical_margin < 1.0) {
            return Err(Error::invalid(format!("logical margin {} is not in [0, 1)", self.logical_margin)));
        }
        match self.band {
            Band::Relative { below, above } => {
                if !((0.0..1.0).contains(&below) && above >= 0.0 && above.is_finite()) {
                    return Err(Error::invalid(format!(
                        "relative band -{below}/+{above}: below must be in [0, 1), above at least 0"
                    )));
                }
            }
            Band::Absolute { low, high } => {
                if !(low > 0.0 && high >= low && high.is_finite()) {
                    return Err(Error::invalid(format!("band [{low}, {high}] needs 0 < c_l <= c_h")));
                }
            }
        }
        if self.throttle.max_moves == 0 || self.throttle.max_moves_per_node == 0 {
            return Err(Error::invalid("the throttle must allow at least one move"));
        }
        if self.candidates_per_source == 0 {
            return Err(Error::invalid("candidates per source must be at least 1"));
        }
        Ok(())
    }
}
