//! Small measuring tools shared by the benchmarks: latency percentiles, CPU time and a line that
//! names the machine.

use std::time::Duration;

/// Latencies of one kind of operation.
#[derive(Default)]
pub struct Latencies {
    samples_ns: Vec<u64>,
}

impl Latencies {
    pub fn record(&mut self, elapsed: Duration) {
        self.samples_ns.push(elapsed.as_nanos() as u64);
    }

    /// The `p`-th percentile in microseconds (nearest rank).
    pub fn percentile_us(&mut self, p: f64) -> f64 {
        if self.samples_ns.is_empty() {
            return 0.0;
        }
        self.samples_ns.sort_unstable();
        let rank = ((p / 100.0) * self.samples_ns.len() as f64).ceil() as usize;
        self.samples_ns[rank.clamp(1, self.samples_ns.len()) - 1] as f64 / 1000.0
    }

    /// The mean in microseconds.
    pub fn mean_us(&self) -> f64 {
        if self.samples_ns.is_empty() {
            return 0.0;
        }
        self.samples_ns.iter().map(|&ns| ns as f64).sum::<f64>() / self.samples_ns.len() as f64 / 1000.0
    }

    pub fn len(&self) -> usize {
        self.samples_ns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples_ns.is_empty()
    }
}

/// CPU time used by this process so far (user + system), from getrusage.
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass, which is plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// Core count, CPU model and Linux version, for the reports.
pub fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} x {cpu}, Linux {}", kernel.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut l = Latencies::default();
        for us in 1..=100 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.percentile_us(50.0), 50.0);
        assert_eq!(l.percentile_us(99.0), 99.0);
        assert_eq!(l.percentile_us(100.0), 100.0);
        assert_eq!(l.mean_us(), 50.5);
    }

    #[test]
    fn cpu_time_advances() {
        let before = process_cpu_time();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_time() > before);
    }
}
