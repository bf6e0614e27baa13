//! The workload of seed 001 §3.2.3 and the sizes it runs at. The paper states its element size
//! (2 KB) and segment size (64 MB) but not the data set's or the access pattern; we fill a set of
//! elements once and then overwrite them uniformly at random, the usual worst case of a greedy
//! collector and the one whose write amplification Table 1's figures match.

use tundra_env::Rng;

use crate::core::RESERVE_SEGMENTS;
use crate::error::{Error, Result};
use crate::geometry::{LogGeometry, SECTOR_BYTES};
use crate::policy::Policy;

/// One run of the workload under one policy: sizes, lengths, sampling and seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunConfig {
    pub policy: Policy,
    /// Each element fills one slot of this size, header included.
    pub element_bytes: u32,
    pub segment_bytes: u64,
    /// The live data: elements × element size.
    pub live_bytes: u64,
    /// Random overwrites after the fill and before the measured window, in passes over the data.
    pub warmup_passes: f64,
    /// Random overwrites measured, in passes over the data.
    pub measured_passes: f64,
    /// User writes between two samples of the space used.
    pub sample_every: u64,
    pub seed: u64,
}

/// The sizes a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Table 1's: 2 KB elements, 64 MB segments, and 8 GiB of live data (which the paper leaves
    /// unstated).
    Paper,
    /// Small enough for the store on the emulated drive: 2 KiB elements, 1 MiB segments,
    /// 64 MiB of live data.
    Drive,
    /// For tests: 2 KiB elements, 64 KiB segments, 2 MiB of live data.
    Tiny,
}

impl Scale {
    pub fn parse(text: &str) -> Result<Scale> {
        match text {
            "paper" => Ok(Scale::Paper),
            "drive" => Ok(Scale::Drive),
            "tiny" => Ok(Scale::Tiny),
            other => Err(Error::invalid(format!("scale {other:?}: expected paper, drive or tiny"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::Paper => "paper",
            Scale::Drive => "drive",
            Scale::Tiny => "tiny",
        }
    }

    /// A run at this scale: two passes of warm-up and three measured.
    pub fn run(self, policy: Policy, seed: u64) -> RunConfig {
        let (segment_bytes, live_bytes, sample_every) = match self {
            Scale::Paper => (64 << 20, 8 << 30, 4096),
            Scale::Drive => (1 << 20, 64 << 20, 64),
            Scale::Tiny => (64 << 10, 2 << 20, 16),
        };
        RunConfig {
            policy,
            element_bytes: 2048,
            segment_bytes,
            live_bytes,
            warmup_passes: 2.0,
            measured_passes: 3.0,
            sample_every,
            seed,
        }
    }
}

impl RunConfig {
    pub fn elements(&self) -> u64 {
        self.live_bytes / u64::from(self.element_bytes)
    }

    /// The log for this run: room for the policy's footprint limit over the live data, the
    /// collector's reserve, and a few segments of slack so that only the policy starts the
    /// collector, never a shortage of free segments.
    pub fn geometry(&self) -> Result<LogGeometry> {
        self.policy.validate()?;
        if !self.segment_bytes.is_multiple_of(u64::from(SECTOR_BYTES)) {
            return Err(Error::invalid(format!("segment size {}: not a multiple of 4 KiB", self.segment_bytes)));
        }
        if self.elements() == 0 {
            return Err(Error::invalid("the live data must hold at least one element"));
        }
        let sectors = u32::try_from(self.segment_bytes / u64::from(SECTOR_BYTES))
            .map_err(|_| Error::invalid("segments too large"))?;
        let slots_per_segment = (u64::from(SECTOR_BYTES / self.element_bytes.max(1))) * u64::from(sectors);
        if slots_per_segment == 0 {
            return Err(Error::invalid(format!("element size {}: larger than a sector", self.element_bytes)));
        }
        let footprint = (self.elements() as f64 * self.policy.footprint_limit()).ceil() as u64;
        let segments = footprint.div_ceil(slots_per_segment) + u64::from(RESERVE_SEGMENTS) + 4;
        let segments = u32::try_from(segments).map_err(|_| Error::invalid("too many segments"))?;
        LogGeometry::new(self.element_bytes, sectors, segments)
    }

    pub fn warmup_writes(&self) -> u64 {
        self.elements() + (self.warmup_passes * self.elements() as f64) as u64
    }

    pub fn measured_writes(&self) -> u64 {
        (self.measured_passes * self.elements() as f64) as u64
    }
}

/// The keys written, in order: each of `elements` once, then uniformly at random.
pub struct UpdateWorkload {
    elements: u64,
    written: u64,
    rng: Rng,
}

impl UpdateWorkload {
    pub fn new(elements: u64, seed: u64) -> UpdateWorkload {
        assert!(elements > 0);
        UpdateWorkload { elements, written: 0, rng: Rng::new(seed) }
    }

    pub fn next_key(&mut self) -> u64 {
        let key = if self.written < self.elements { self.written } else { self.rng.below(self.elements) };
        self.written += 1;
        key
    }
}
