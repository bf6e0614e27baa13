//! What the cluster looks like on the two axes: each active node's zone, how many are inside
//! the band, and the space stranded (seed 000 §4.2.1, Figure 9a). `tundra sim schedule` reports
//! it, and `tundra cluster status` is meant to.
//!
//! Stranded space is a projection from the nodes' current ratios: a node filled at its ratio
//! stops at the fullness limit of whichever axis its data pushes, so a node whose ratio is below
//! what its capacities allow strands logical space (`limit * logical capacity - ratio *
//! limit * physical capacity`) and one above it strands physical space. A node with nothing
//! stored counts at the cluster's average ratio. The usable capacity is the logical bytes the
//! nodes could hold at those ratios.

use crate::plan::Thresholds;
use crate::state::ClusterState;
use crate::usage::{Space, Zone};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSummary {
    pub active_nodes: usize,
    /// Active nodes storing something (the ones with a ratio and a zone).
    pub nodes_with_data: usize,
    /// Nodes with data per zone A, B, C, D.
    pub zone_counts: [usize; 4],
    /// In zone B or C, over the nodes with data.
    pub nodes_in_band_fraction: f64,
    pub capacity: Space,
    pub used: Space,
    pub thresholds: Option<Thresholds>,
    pub stranded: Space,
    /// Stranded bytes over the active nodes' capacity on that axis.
    pub stranded_logical_fraction: f64,
    pub stranded_physical_fraction: f64,
    /// Nodes that strand logical space (too little compression for their capacities) and
    /// physical space (too much), over the active nodes.
    pub nodes_stranding_logical_fraction: f64,
    pub nodes_stranding_physical_fraction: f64,
    /// Logical bytes the active nodes could hold, each filled at its ratio to the fullness
    /// limit, counting every replica.
    pub usable_capacity_bytes: u64,
    /// The spread of node ratios: lowest, highest, and the population standard deviation.
    pub ratio_min: f64,
    pub ratio_max: f64,
    pub ratio_stddev: f64,
}

impl ClusterState {
    pub fn summary(&self) -> ClusterSummary {
        let thresholds = self.thresholds();
        let limit = self.config.fullness_limit;
        let mut s = ClusterSummary { thresholds: Some(thresholds), ratio_min: f64::INFINITY, ..Default::default() };
        let mut stranding_logical = 0usize;
        let mut stranding_physical = 0usize;
        let mut ratios = Vec::new();
        let mut usable = 0.0f64;
        let mut stranded_logical = 0.0f64;
        let mut stranded_physical = 0.0f64;
        for node in self.nodes.values().filter(|n| n.takes_part()) {
            s.active_nodes += 1;
            let used = node.projected();
            s.capacity = s.capacity.plus(node.capacity);
            s.used = s.used.plus(used);
            let ratio = match used.ratio() {
                Some(r) => {
                    s.nodes_with_data += 1;
                    let zone = Zone::of(r, thresholds.ratio_low, thresholds.ratio_average, thresholds.ratio_high);
                    s.zone_counts[zone as usize] += 1;
                    ratios.push(r);
                    r
                }
                None => thresholds.ratio_average,
            };
            let logical_limit = limit * node.capacity.logical_bytes as f64;
            let physical_limit = limit * node.capacity.physical_bytes as f64;
            let wasted_logical = (logical_limit - ratio * physical_limit).max(0.0);
            let wasted_physical = (physical_limit - logical_limit / ratio).max(0.0);
            stranding_logical += usize::from(wasted_logical > 0.0);
            stranding_physical += usize::from(wasted_physical > 0.0);
            stranded_logical += wasted_logical;
            stranded_physical += wasted_physical;
            usable += logical_limit.min(ratio * physical_limit);
        }
        s.stranded = Space::new(stranded_logical as u64, stranded_physical as u64);
        s.usable_capacity_bytes = usable as u64;
        let share = |part: f64, whole: f64| if whole > 0.0 { part / whole } else { 0.0 };
        s.stranded_logical_fraction = share(stranded_logical, s.capacity.logical_bytes as f64);
        s.stranded_physical_fraction = share(stranded_physical, s.capacity.physical_bytes as f64);
        s.nodes_stranding_logical_fraction = share(stranding_logical as f64, s.active_nodes as f64);
        s.nodes_stranding_physical_fraction = share(stranding_physical as f64, s.active_nodes as f64);
        let in_band = s.zone_counts[Zone::B as usize] + s.zone_counts[Zone::C as usize];
        s.nodes_in_band_fraction = share(in_band as f64, s.nodes_with_data as f64);
        if ratios.is_empty() {
            s.ratio_min = 0.0;
        } else {
            let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
            let variance = ratios.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / ratios.len() as f64;
            s.ratio_min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            s.ratio_max = ratios.iter().copied().fold(0.0, f64::max);
            s.ratio_stddev = variance.sqrt();
        }
        s
    }
}
