//! How an opened drive behaves: the garbage collection policy, where compression happens, and
//! whether a background thread does the drive's own work. None of it is on the media, so the
//! same drive may be opened with different settings.

/// How garbage collection picks the segment to empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GcPolicy {
    /// The segment with the fewest live bytes.
    #[default]
    Greedy,
    /// The best (1 - u) * age / (1 + u), which leaves recently written segments time to die.
    CostBenefit,
}

/// Where the drive spends the host CPU that a real drive's engine would spend for free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompressionMode {
    /// Compress in the writing thread before the write returns.
    #[default]
    Inline,
    /// Store blocks raw at once and compress them in a background pass: writes return sooner
    /// on a busy host, and physical usage drops once the pass catches up.
    Deferred,
    /// Never compress: every block written is stored as is, all-zero blocks included, as a
    /// drive without compression stores them, so physical usage equals the blocks written.
    /// Records written compressed earlier stay readable and stay compressed (garbage
    /// collection moves them as they are); the "software only" configuration of seed 000
    /// §5.3 (Figure 13).
    Off,
}

/// How an opened drive behaves; none of it is part of the on-media format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsdConfig {
    pub gc_policy: GcPolicy,
    pub compression: CompressionMode,
    /// Run garbage collection, deferred compression and checkpoints on a background thread.
    /// Without it, writers do that work themselves when they must.
    pub background: bool,
    /// Write a map checkpoint after this many segments were sealed; 0 picks a default that keeps
    /// checkpoint traffic near a tenth of the data written.
    pub checkpoint_interval_segments: u32,
}

impl Default for CsdConfig {
    fn default() -> CsdConfig {
        CsdConfig {
            gc_policy: GcPolicy::Greedy,
            compression: CompressionMode::Inline,
            background: true,
            checkpoint_interval_segments: 0,
        }
    }
}
