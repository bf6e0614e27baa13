//! What `tundra-bench redo` reports: each method's latencies per run, their medians over the
//! runs with the spread, the ratio of each to the baseline measured in the same rounds, the
//! Markdown table and the JSON document (its keys are a contract: docs/bench-cli.md), and the
//! description of the storage the files lived on.

use std::path::Path;

use serde::Serialize;

use crate::measure::Latencies;

/// One method's commits in one run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RunStats {
    pub latency_us_p50: f64,
    pub latency_us_p95: f64,
    pub latency_us_p99: f64,
    pub latency_us_mean: f64,
}

impl RunStats {
    pub fn of(latencies: &mut Latencies) -> RunStats {
        RunStats {
            latency_us_p50: latencies.percentile_us(50.0),
            latency_us_p95: latencies.percentile_us(95.0),
            latency_us_p99: latencies.percentile_us(99.0),
            latency_us_mean: latencies.mean_us(),
        }
    }
}

/// One method at one batch size over every run.
#[derive(Clone, Debug, Serialize)]
pub struct MethodReport {
    /// `fdatasync`, `redo_log`, `redo_log_zstd` or `node_protocol`.
    pub method: &'static str,
    /// Medians over the runs of each run's percentile or mean.
    pub latency_us_p50: f64,
    pub latency_us_p95: f64,
    pub latency_us_p99: f64,
    pub latency_us_mean: f64,
    /// The spread of the runs' medians.
    pub latency_us_p50_min: f64,
    pub latency_us_p50_max: f64,
    /// Median over the runs of this method's median over the baseline's in the same run, with
    /// the spread; and the same for the 99th percentile and the mean.
    pub ratio_p50: f64,
    pub ratio_p50_min: f64,
    pub ratio_p50_max: f64,
    pub ratio_p99: f64,
    pub ratio_mean: f64,
    /// Bytes handed to the write per commit: the encoded batch, or for `redo_log_zstd` the
    /// encoded batch that carries the compressed bytes.
    pub payload_bytes_per_commit: f64,
    /// Bytes that reach the device per commit: the 4 KiB pages the plain write dirties, or the
    /// log blocks the redo log writes (the partly filled last block rewritten included); null
    /// for `node_protocol`, whose devices are the node's.
    pub device_bytes_per_commit: Option<f64>,
    pub runs: Vec<RunStats>,
}

/// Every method at one batch size.
#[derive(Clone, Debug, Serialize)]
pub struct SizeReport {
    pub batch_bytes: usize,
    pub records_per_batch: f64,
    /// Encoded batch bytes over zstd level 1's output, over every commit of every run.
    pub zstd_ratio: f64,
    /// Median over the runs of the median time to encode and compress one batch, the part of
    /// `redo_log_zstd`'s latency that compression takes.
    pub compress_us_p50: f64,
    pub methods: Vec<MethodReport>,
}

/// The whole measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub configuration: String,
    pub machine: String,
    /// /proc/loadavg's 1, 5 and 15 minute averages when the measurement began and ended.
    pub load_average_before: String,
    pub load_average_after: String,
    pub storage: Storage,
    /// Whether the redo logs' files bypass the page cache, as the node's fast device does.
    pub direct_io: bool,
    pub commits: usize,
    pub warmup_commits: usize,
    pub runs: usize,
    pub page_size: u32,
    pub ring_bytes: u64,
    pub sizes: Vec<SizeReport>,
}

/// Where the measurement's files lived.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Storage {
    pub dir: String,
    pub filesystem: String,
    pub mount_point: String,
    /// The mounted device, as /proc/self/mountinfo names it.
    pub device: String,
    /// From the device's queue in /sys/class/block: `write back` or `write through`, and
    /// whether it rotates; empty when unknown.
    pub write_cache: String,
    pub rotational: Option<bool>,
}

impl Storage {
    /// Finds the mount holding `dir` (the longest mount point above it) and its device's queue.
    pub fn of(dir: &Path) -> Storage {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let mut storage = Storage { dir: dir.display().to_string(), ..Storage::default() };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut best = 0;
        for line in mountinfo.lines() {
            let Some((before, after)) = line.split_once(" - ") else { continue };
            let Some(point) = before.split(' ').nth(4) else { continue };
            let point = point.replace("\\040", " ");
            let mut after = after.split(' ');
            let (Some(fs), Some(source)) = (after.next(), after.next()) else { continue };
            if dir.starts_with(&point) && point.len() >= best {
                best = point.len();
                storage.mount_point = point;
                storage.filesystem = fs.to_string();
                storage.device = source.to_string();
            }
        }
        if let Some(name) = storage.device.strip_prefix("/dev/") {
            let block = Path::new("/sys/class/block").join(name);
            // A partition's queue is its disk's, one directory up.
            let queue = [block.join("queue"), block.join("../queue")].into_iter().find(|q| q.exists());
            if let Some(queue) = queue {
                let read = |file: &str| std::fs::read_to_string(queue.join(file)).ok().map(|s| s.trim().to_string());
                storage.write_cache = read("write_cache").unwrap_or_default();
                storage.rotational = read("rotational").map(|r| r == "1");
            }
        }
        storage
    }

    pub fn describe(&self) -> String {
        let rotation = match self.rotational {
            Some(true) => ", rotational",
            Some(false) => ", non-rotational",
            None => "",
        };
        let cache = if self.write_cache.is_empty() { String::new() } else { format!(", {} cache", self.write_cache) };
        format!(
            "{} on {} ({} mounted at {}{rotation}{cache})",
            self.dir, self.device, self.filesystem, self.mount_point
        )
    }
}

/// A method's numbers in one run at one size, before they are summed up over the runs.
#[derive(Clone, Copy, Debug)]
pub struct MethodRun {
    pub stats: RunStats,
    pub payload_bytes: u64,
    /// None where the device is not the benchmark's to count (the node's).
    pub device_bytes: Option<u64>,
    pub commits: usize,
}

/// Sums up one method over the runs against the baseline's runs (the first method's).
pub fn method_report(method: &'static str, runs: &[MethodRun], baseline: &[MethodRun]) -> MethodReport {
    assert!(!runs.is_empty() && runs.len() == baseline.len(), "every run measured every method");
    let stat = |f: fn(&RunStats) -> f64| median(runs.iter().map(|r| f(&r.stats)).collect());
    let ratios = |f: fn(&RunStats) -> f64| -> Vec<f64> {
        runs.iter().zip(baseline).map(|(r, b)| f(&r.stats) / f(&b.stats).max(1e-9)).collect()
    };
    let p50 = |s: &RunStats| s.latency_us_p50;
    let p50s: Vec<f64> = runs.iter().map(|r| r.stats.latency_us_p50).collect();
    let p50_ratios = ratios(p50);
    let commits: usize = runs.iter().map(|r| r.commits).sum();
    let per_commit = |bytes: u64| bytes as f64 / commits.max(1) as f64;
    MethodReport {
        method,
        latency_us_p50: stat(p50),
        latency_us_p95: stat(|s| s.latency_us_p95),
        latency_us_p99: stat(|s| s.latency_us_p99),
        latency_us_mean: stat(|s| s.latency_us_mean),
        latency_us_p50_min: p50s.iter().copied().fold(f64::INFINITY, f64::min),
        latency_us_p50_max: p50s.iter().copied().fold(0.0, f64::max),
        ratio_p50: median(p50_ratios.clone()),
        ratio_p50_min: p50_ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratio_p50_max: p50_ratios.iter().copied().fold(0.0, f64::max),
        ratio_p99: median(ratios(|s| s.latency_us_p99)),
        ratio_mean: median(ratios(|s| s.latency_us_mean)),
        payload_bytes_per_commit: per_commit(runs.iter().map(|r| r.payload_bytes).sum()),
        device_bytes_per_commit: runs.iter().map(|r| r.device_bytes).sum::<Option<u64>>().map(per_commit),
        runs: runs.iter().map(|r| r.stats).collect(),
    }
}

/// The median of a non-empty list; the mean of the middle two for an even count.
pub fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "the median of nothing");
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// The Markdown report for people; its layout may change, the JSON's may not.
pub fn print(report: &Report) {
    println!("# tundra-bench redo\n");
    println!("configuration: `{}`\n", report.configuration);
    println!(
        "machine: {}; load average {} before, {} after\n",
        report.machine, report.load_average_before, report.load_average_after
    );
    println!(
        "storage: {}; the redo logs' files {} O_DIRECT\n",
        report.storage.describe(),
        if report.direct_io { "use" } else { "cannot use" }
    );
    println!(
        "{} commits per method and size in each of {} runs (after {} untimed), queue depth 1, methods interleaved \
         commit by commit; {}-byte pages, a {} ring. Latencies are medians over the runs; ranges are the runs' \
         lowest and highest median; ratios are to the fdatasync baseline's median in the same run.\n",
        report.commits,
        report.runs,
        report.warmup_commits,
        report.page_size,
        tundra_device::size::format_size(report.ring_bytes)
    );
    println!(
        "| batch | records | method | p50 µs (runs' range) | p95 µs | p99 µs | mean µs | p50 ratio (range) | p99 ratio | bytes to the device per commit |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for size in &report.sizes {
        for m in &size.methods {
            println!(
                "| {} | {:.1} | {} | {:.1} ({:.1}–{:.1}) | {:.1} | {:.1} | {:.1} | {:.3} ({:.3}–{:.3}) | {:.3} | {} |",
                tundra_device::size::format_size(size.batch_bytes as u64),
                size.records_per_batch,
                m.method,
                m.latency_us_p50,
                m.latency_us_p50_min,
                m.latency_us_p50_max,
                m.latency_us_p95,
                m.latency_us_p99,
                m.latency_us_mean,
                m.ratio_p50,
                m.ratio_p50_min,
                m.ratio_p50_max,
                m.ratio_p99,
                m.device_bytes_per_commit.map_or("–".to_string(), |b| format!("{b:.0}")),
            );
        }
    }
    println!("\n| batch | zstd level 1 ratio | encode and compress p50 µs |");
    println!("|---:|---:|---:|");
    for size in &report.sizes {
        println!(
            "| {} | {:.2} | {:.1} |",
            tundra_device::size::format_size(size.batch_bytes as u64),
            size.zstd_ratio,
            size.compress_us_p50
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn ratios_are_taken_run_by_run() {
        let run = |p50: f64| MethodRun {
            stats: RunStats { latency_us_p50: p50, latency_us_p95: p50, latency_us_p99: p50, latency_us_mean: p50 },
            payload_bytes: 100,
            device_bytes: Some(4096),
            commits: 1,
        };
        let baseline = [run(100.0), run(200.0), run(100.0)];
        let method = [run(110.0), run(200.0), run(150.0)];
        let report = method_report("redo_log", &method, &baseline);
        assert_eq!(report.latency_us_p50, 150.0);
        assert_eq!((report.ratio_p50, report.ratio_p50_min, report.ratio_p50_max), (1.1, 1.0, 1.5));
        assert_eq!(report.device_bytes_per_commit, Some(4096.0));
    }
}
