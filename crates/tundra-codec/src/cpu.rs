//! The host's CPU utilisation, which Algorithm 1 checks before spending CPU on a choice (seed 000
//! §3.3.2, line 2: above 20% busy, pages get lz4 without comparing).
//!
//! It is the whole machine's busy fraction, not this process's: the selection competes with
//! everything on the host. Linux counts CPU time in `/proc/stat`; the fraction is the busy share
//! of the ticks between two samples. Parsing is separate from reading, so it is tested on text.
//!
//! [`CpuSampler`] is the real [`CpuGauge`] of tundra-env's seam; simulation and tests give the
//! store a `FixedCpu` instead.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use tundra_env::CpuGauge;

use crate::{Error, Result};

/// The machine's cumulative CPU time, in clock ticks summed over all CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// user + nice + system + irq + softirq + steal.
    pub busy_ticks: u64,
    /// busy + idle + iowait. guest and guest_nice are left out: the kernel already counts them
    /// in user and nice.
    pub total_ticks: u64,
}

impl CpuTimes {
    /// Parses the aggregate `cpu` line of /proc/stat's text.
    pub fn parse(proc_stat: &str) -> Result<CpuTimes> {
        let line = proc_stat
            .lines()
            .find(|line| line.split_whitespace().next() == Some("cpu"))
            .ok_or_else(|| unexpected("no aggregate \"cpu\" line"))?;
        let mut fields = [0u64; 8];
        let mut count = 0;
        for (slot, text) in fields.iter_mut().zip(line.split_whitespace().skip(1)) {
            *slot = text.parse().map_err(|_| unexpected(&format!("{text:?} is not a tick count")))?;
            count += 1;
        }
        // user, nice, system, idle are in every kernel since 2.6; the others may be missing.
        if count < 4 {
            return Err(unexpected(&format!("the cpu line has {count} fields, fewer than 4")));
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = fields;
        let busy_ticks = [user, nice, system, irq, softirq, steal].iter().fold(0u64, |a, &b| a.saturating_add(b));
        Ok(CpuTimes { busy_ticks, total_ticks: busy_ticks.saturating_add(idle).saturating_add(iowait) })
    }

    /// The busy fraction of the ticks between `earlier` and `self`, in [0, 1], or None when no
    /// tick has passed. Counters that went backwards (iowait may, on some kernels) count as zero.
    pub fn busy_fraction_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total_ticks.saturating_sub(earlier.total_ticks);
        if total == 0 {
            return None;
        }
        let busy = self.busy_ticks.saturating_sub(earlier.busy_ticks);
        Some((busy as f64 / total as f64).clamp(0.0, 1.0))
    }
}

fn unexpected(what: &str) -> Error {
    Error::new(crate::ErrorKind::Io, format!("unexpected /proc/stat: {what}"))
}

/// Samples the machine's CPU utilisation between calls. It is shared (`&self`): the previous
/// sample sits behind a lock, so one sampler can serve every writer as an `Arc<dyn CpuGauge>`.
#[derive(Debug)]
pub struct CpuSampler {
    path: PathBuf,
    last: Mutex<Sample>,
}

#[derive(Debug)]
struct Sample {
    times: CpuTimes,
    fraction: f64,
}

impl CpuSampler {
    /// A sampler of /proc/stat, starting its first interval now.
    pub fn new() -> Result<CpuSampler> {
        CpuSampler::with_path("/proc/stat")
    }

    /// A sampler of a file in /proc/stat's format (tests point it at their own file).
    pub fn with_path(path: impl AsRef<Path>) -> Result<CpuSampler> {
        let path = path.as_ref().to_path_buf();
        let times = read_times(&path)?;
        Ok(CpuSampler { path, last: Mutex::new(Sample { times, fraction: 0.0 }) })
    }

    /// The busy fraction since the previous sample (or since the sampler was made). Called again
    /// before a clock tick has passed, it repeats the previous answer.
    pub fn sample(&self) -> Result<f64> {
        let now = read_times(&self.path)?;
        let mut last = self.last();
        if let Some(fraction) = now.busy_fraction_since(&last.times) {
            *last = Sample { times: now, fraction };
        }
        Ok(last.fraction)
    }

    /// The previous sample. A panic elsewhere while it was held cannot leave it half written
    /// (it is replaced whole), so a poisoned lock is taken as it is.
    fn last(&self) -> MutexGuard<'_, Sample> {
        self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl CpuGauge for CpuSampler {
    fn busy_fraction(&self) -> std::result::Result<f64, String> {
        self.sample().map_err(|error| error.to_string())
    }
}

fn read_times(path: &Path) -> Result<CpuTimes> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    CpuTimes::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    const STAT: &str = "cpu  100 20 30 800 50 5 5 10 7 0\ncpu0 50 10 15 400 25 2 3 5 3 0\nintr 12345\n";

    #[test]
    fn parses_the_aggregate_line() {
        let times = CpuTimes::parse(STAT).unwrap();
        assert_eq!(times, CpuTimes { busy_ticks: 170, total_ticks: 1020 });
        // A kernel with only the four oldest fields.
        assert_eq!(CpuTimes::parse("cpu 1 2 3 4\n").unwrap(), CpuTimes { busy_ticks: 6, total_ticks: 10 });
    }

    #[test]
    fn busy_fraction_between_samples() {
        let before = CpuTimes::parse(STAT).unwrap();
        let after = CpuTimes::parse("cpu  130 20 40 860 50 5 5 10 7 0\n").unwrap();
        assert_eq!(after.busy_fraction_since(&before), Some(0.4));
        assert_eq!(before.busy_fraction_since(&before), None);
        // iowait going backwards does not make the fraction exceed 1.
        let odd = CpuTimes { busy_ticks: 300, total_ticks: 1030 };
        assert_eq!(odd.busy_fraction_since(&before), Some(1.0));
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in ["", "intr 1 2 3\n", "cpu 1 2 x 4\n", "cpu 1 2\n", "cpu0 1 2 3 4\n"] {
            assert_eq!(CpuTimes::parse(bad).unwrap_err().kind(), ErrorKind::Io, "{bad:?}");
        }
    }

    #[test]
    fn sampler_reads_a_file() {
        let dir = std::env::temp_dir().join(format!("tundra-codec-cpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stat");
        std::fs::write(&path, STAT).unwrap();
        let sampler = CpuSampler::with_path(&path).unwrap();
        assert_eq!(sampler.sample().unwrap(), 0.0, "no tick has passed");
        std::fs::write(&path, "cpu  130 20 40 860 50 5 5 10 7 0\n").unwrap();
        assert_eq!(sampler.sample().unwrap(), 0.4);
        assert_eq!(sampler.sample().unwrap(), 0.4, "repeats until a tick passes");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(sampler.sample().unwrap_err().kind(), ErrorKind::Io);
        if Path::new("/proc/stat").exists() {
            let gauge: std::sync::Arc<dyn CpuGauge> = std::sync::Arc::new(CpuSampler::new().unwrap());
            let fraction = gauge.busy_fraction().unwrap();
            assert!((0.0..=1.0).contains(&fraction));
        }
    }
}
