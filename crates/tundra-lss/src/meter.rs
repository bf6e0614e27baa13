//! The figures of Table 1 (seed 001 §3.2.3) and how they are measured, the same way for the
//! model and for the store on the drive.
//!
//! Write amplification is every byte the log writes to the drive over the bytes of user
//! elements: user elements, elements the collector moves, and the sectors virtual data trim
//! rewrites (4 KiB each; a whole-sector trim writes nothing). Physical space amplification is the
//! physical space the log occupies over the physical space its live elements need, sampled at a
//! fixed interval of user writes (its time average) and also just before each collected segment
//! is trimmed, when the moved copies and the originals both exist (its peak).

use crate::core::CoreCounters;

/// Samples of the space the log occupies, over a measured window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Meter {
    samples: u64,
    physical_sum: f64,
    logical_sum: f64,
    physical_peak: f64,
    logical_peak: f64,
    gc_samples: u64,
}

impl Meter {
    /// One regular sample: the physical bytes the log occupies, its logical footprint, and the
    /// bytes of its live elements.
    pub fn sample(&mut self, physical_bytes: u64, footprint_bytes: u64, live_bytes: u64) {
        if live_bytes == 0 {
            return;
        }
        let physical = physical_bytes as f64 / live_bytes as f64;
        let logical = footprint_bytes as f64 / live_bytes as f64;
        self.samples += 1;
        self.physical_sum += physical;
        self.logical_sum += logical;
        self.note_peak(physical, logical);
    }

    /// A sample taken at the moment of a collection's peak: it counts toward the peak only, so
    /// that the average stays a time average over user writes.
    pub fn sample_gc_peak(&mut self, physical_bytes: u64, footprint_bytes: u64, live_bytes: u64) {
        if live_bytes == 0 {
            return;
        }
        self.gc_samples += 1;
        self.note_peak(physical_bytes as f64 / live_bytes as f64, footprint_bytes as f64 / live_bytes as f64);
    }

    fn note_peak(&mut self, physical: f64, logical: f64) {
        self.physical_peak = self.physical_peak.max(physical);
        self.logical_peak = self.logical_peak.max(logical);
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn physical_average(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.physical_sum / self.samples as f64 }
    }

    pub fn logical_average(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.logical_sum / self.samples as f64 }
    }
}

/// What a measured window gives: Table 1's write and physical space amplification, split.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub user_bytes: u64,
    pub gc_bytes: u64,
    pub trim_bytes: u64,
    /// (user + GC + trim) / user.
    pub write_amplification: f64,
    pub gc_write_amplification: f64,
    pub trim_write_amplification: f64,
    pub physical_amplification_average: f64,
    pub physical_amplification_peak: f64,
    /// The logical footprint over the live data (γ), averaged and at its peak.
    pub logical_amplification_average: f64,
    pub logical_amplification_peak: f64,
    pub zeroed_sectors: u64,
    pub trimmed_sectors: u64,
    pub segments_collected: u64,
    pub samples: u64,
    pub gc_samples: u64,
}

impl Figures {
    /// The figures of a window: the core's counters at its start and end, and its meter.
    pub fn from_window(start: &CoreCounters, end: &CoreCounters, slot_bytes: u32, meter: &Meter) -> Figures {
        let slot = u64::from(slot_bytes);
        let user_bytes = (end.user_slots - start.user_slots) * slot;
        let gc_bytes = (end.gc_slots - start.gc_slots) * slot;
        let trim_bytes = (end.zeroed_sectors - start.zeroed_sectors) * u64::from(crate::geometry::SECTOR_BYTES);
        let per_user = |bytes: u64| if user_bytes == 0 { 0.0 } else { bytes as f64 / user_bytes as f64 };
        Figures {
            user_bytes,
            gc_bytes,
            trim_bytes,
            write_amplification: per_user(user_bytes + gc_bytes + trim_bytes),
            gc_write_amplification: per_user(gc_bytes),
            trim_write_amplification: per_user(trim_bytes),
            physical_amplification_average: meter.physical_average(),
            physical_amplification_peak: meter.physical_peak,
            logical_amplification_average: meter.logical_average(),
            logical_amplification_peak: meter.logical_peak,
            zeroed_sectors: end.zeroed_sectors - start.zeroed_sectors,
            trimmed_sectors: end.trimmed_sectors - start.trimmed_sectors,
            segments_collected: end.segments_collected - start.segments_collected,
            samples: meter.samples,
            gc_samples: meter.gc_samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_is_over_regular_samples_and_the_peak_over_all() {
        let mut meter = Meter::default();
        meter.sample(120, 120, 100);
        meter.sample(110, 130, 100);
        meter.sample_gc_peak(150, 150, 100);
        assert!((meter.physical_average() - 1.15).abs() < 1e-12);
        assert!((meter.logical_average() - 1.25).abs() < 1e-12);
        let start = CoreCounters::default();
        let end = CoreCounters { user_slots: 10, gc_slots: 5, zeroed_sectors: 1, ..CoreCounters::default() };
        let figures = Figures::from_window(&start, &end, 2048, &meter);
        assert_eq!(figures.physical_amplification_peak, 1.5);
        assert_eq!(figures.user_bytes, 20480);
        assert!((figures.write_amplification - (20480.0 + 10240.0 + 4096.0) / 20480.0).abs() < 1e-12);
        assert!((figures.trim_write_amplification - 0.2).abs() < 1e-12);
    }
}
