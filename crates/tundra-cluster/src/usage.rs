//! Space on the two axes of seed 000 §4.2: logical bytes (what databases wrote) and physical
//! bytes (what the compressing drive stores), as capacities, usages and the ratios and
//! fractions the decisions compare.

use std::fmt;

/// A storage node, by the same number the Raft groups use for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// Bytes on both axes: a node's capacity, its usage, or a chunk's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Space {
    pub logical_bytes: u64,
    pub physical_bytes: u64,
}

impl Space {
    pub const ZERO: Space = Space { logical_bytes: 0, physical_bytes: 0 };

    pub fn new(logical_bytes: u64, physical_bytes: u64) -> Space {
        Space { logical_bytes, physical_bytes }
    }

    /// The compression ratio, logical over physical; `None` with nothing stored.
    pub fn ratio(self) -> Option<f64> {
        (self.physical_bytes > 0).then(|| self.logical_bytes as f64 / self.physical_bytes as f64)
    }

    pub fn plus(self, other: Space) -> Space {
        Space {
            logical_bytes: self.logical_bytes + other.logical_bytes,
            physical_bytes: self.physical_bytes + other.physical_bytes,
        }
    }

    /// `self - other`, which the caller knows cannot go below zero (a chunk leaving a node that
    /// counts it).
    pub fn minus(self, other: Space) -> Space {
        assert!(self.logical_bytes >= other.logical_bytes, "logical usage below zero");
        assert!(self.physical_bytes >= other.physical_bytes, "physical usage below zero");
        Space {
            logical_bytes: self.logical_bytes - other.logical_bytes,
            physical_bytes: self.physical_bytes - other.physical_bytes,
        }
    }

    /// `self - other`, each axis floored at zero (a heartbeat's usage against what the manager
    /// attributes to chunks).
    pub fn saturating_minus(self, other: Space) -> Space {
        Space {
            logical_bytes: self.logical_bytes.saturating_sub(other.logical_bytes),
            physical_bytes: self.physical_bytes.saturating_sub(other.physical_bytes),
        }
    }

    /// Usage as fractions of a capacity, (logical, physical); a zero capacity counts as full.
    pub fn fractions_of(self, capacity: Space) -> (f64, f64) {
        let fraction = |used: u64, cap: u64| if cap == 0 { f64::INFINITY } else { used as f64 / cap as f64 };
        (fraction(self.logical_bytes, capacity.logical_bytes), fraction(self.physical_bytes, capacity.physical_bytes))
    }
}

/// Where a node's compression ratio lies against the band [c_l, c_h] and the average c_avg
/// (seed 000 §4.2.2, Figure 9b). Zone A is high physical and low logical usage (a ratio below
/// c_l), zone D the opposite (above c_h); B and C are inside the band, below and above the
/// average.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Zone {
    A,
    B,
    C,
    D,
}

impl Zone {
    pub fn of(ratio: f64, low: f64, average: f64, high: f64) -> Zone {
        if ratio < low {
            Zone::A
        } else if ratio > high {
            Zone::D
        } else if ratio < average {
            Zone::B
        } else {
            Zone::C
        }
    }

    pub fn in_band(self) -> bool {
        matches!(self, Zone::B | Zone::C)
    }

    pub fn name(self) -> &'static str {
        match self {
            Zone::A => "A",
            Zone::B => "B",
            Zone::C => "C",
            Zone::D => "D",
        }
    }
}
