//! The measures a move must improve, and the test that makes plans converge.
//!
//! Each rule of the policies has a measure of how far the cluster is from what the rule wants,
//! in bytes, summed over the active nodes: `over` (logical bytes above the average by more
//! than the margin), `under` (logical bytes short of the average by more than the margin: a
//! new node) and, under the compression-aware policy, `outside` (how far each node's ratio is
//! outside the band [c_l, c_h], as the logical bytes it would take to bring it back). A move
//! changes two nodes only, and is taken only if it lowers its own rule's measure by at least a
//! byte and raises none of the others. The measures depend only on the state, and the
//! thresholds only on totals that moves do not change, so every move lowers a vector of
//! measures that can never rise again: no placement repeats, plans cannot oscillate, and the
//! planning ends with an empty plan.

use crate::config::{ManagerConfig, Policy};
use crate::usage::{Space, Zone};

/// The thresholds a plan compares against, from the active nodes' usage. Moves keep the totals,
/// so they stay fixed while moves are planned and carried out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Average logical usage w_avg (total used over total capacity) and the logical rule's
    /// bounds w_avg (1 ± margin).
    pub logical_average: f64,
    pub logical_low: f64,
    pub logical_high: f64,
    /// The average compression ratio c_avg and the band [c_l, c_h].
    pub ratio_average: f64,
    pub ratio_low: f64,
    pub ratio_high: f64,
    pub policy: Policy,
}

impl Thresholds {
    /// From the total usage and capacity of the active nodes.
    pub fn new(config: &ManagerConfig, used: Space, capacity: Space) -> Thresholds {
        let logical_average =
            if capacity.logical_bytes == 0 { 0.0 } else { used.logical_bytes as f64 / capacity.logical_bytes as f64 };
        let ratio_average = used.ratio().unwrap_or(1.0);
        let (ratio_low, ratio_high) = config.band.bounds(ratio_average);
        Thresholds {
            logical_average,
            logical_low: logical_average * (1.0 - config.logical_margin),
            logical_high: logical_average * (1.0 + config.logical_margin),
            ratio_average,
            ratio_low,
            ratio_high,
            policy: config.policy,
        }
    }

    /// The zone of a node's usage; `None` for a node with nothing stored.
    pub fn zone(&self, used: Space) -> Option<Zone> {
        used.ratio().map(|r| Zone::of(r, self.ratio_low, self.ratio_average, self.ratio_high))
    }

    /// One node's measures.
    pub fn measures(&self, used: Space, capacity: Space) -> Measures {
        let logical = used.logical_bytes as f64;
        let cap = capacity.logical_bytes as f64;
        let over = (logical - self.logical_high * cap).max(0.0);
        let under = (self.logical_low * cap - logical).max(0.0);
        // A node still filling up (under the logical rule) has no ratio to balance yet: its
        // first chunks decide it, and the rule that fills it picks them near the average.
        let outside = if self.policy == Policy::Logical || under > 0.0 || used.physical_bytes == 0 {
            0.0
        } else {
            let physical = used.physical_bytes as f64;
            (self.ratio_low * physical - logical).max(0.0) + (logical - self.ratio_high * physical).max(0.0)
        };
        Measures { over, under, outside }
    }
}

/// How far one node (or a sum of nodes) is from what each rule wants, in logical bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measures {
    pub over: f64,
    pub under: f64,
    pub outside: f64,
}

/// Which measure a move is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    Over,
    Under,
    Outside,
}

impl Measures {
    pub fn plus(self, other: Measures) -> Measures {
        Measures {
            over: self.over + other.over,
            under: self.under + other.under,
            outside: self.outside + other.outside,
        }
    }

    fn get(self, measure: Measure) -> f64 {
        match measure {
            Measure::Over => self.over,
            Measure::Under => self.under,
            Measure::Outside => self.outside,
        }
    }

    /// Whether going from `self` to `after` lowers `purpose` by at least a byte and raises no
    /// measure at all.
    pub fn improved_by(self, after: Measures, purpose: Measure) -> bool {
        after.over <= self.over
            && after.under <= self.under
            && after.outside <= self.outside
            && after.get(purpose) <= self.get(purpose) - 1.0
    }
}
