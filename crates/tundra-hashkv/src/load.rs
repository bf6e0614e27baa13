//! The load generator that measures this store and its peer alike (seed 001 §3.3.3, Table 2):
//! 16-byte keys, 400-byte values half random and half zeros (so they compress to about half),
//! uniform keys, a 7:3 mix of GET and PUT from a number of client threads, a warm-up, then a
//! measured window. It reports operations per second, CPU time per operation (the whole
//! process's user and system time over the window, background threads included), and the
//! median and 99th percentile latency of GETs and PUTs.
//!
//! Anything with a GET and a PUT is a [`KvTarget`]; the `tundra` binary's `bench hashkv` runs
//! it against [`HashKv`](crate::HashKv) and RocksDB.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tundra_env::Rng;

/// Key bytes, as the paper's workload.
pub const KEY_BYTES: usize = 16;
/// Value bytes, as the paper's workload.
pub const VALUE_BYTES: usize = 400;

/// A key-value store under measurement. Errors are strings: the generator only reports them.
pub trait KvTarget: Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String>;
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String>;

    /// CPU time spent so far inside an emulated drive: its calls (or the threads serving them)
    /// and its background thread, work a real compressing drive does in its own hardware; 0
    /// for a store on ordinary files.
    fn drive_cpu_ns(&self) -> u64 {
        0
    }

    /// The part of [`KvTarget::drive_cpu_ns`] the drive's own counters attribute to deflate,
    /// inflate and its background thread: the compression PolarCSD does in hardware.
    fn drive_codec_cpu_ns(&self) -> u64 {
        0
    }
}

impl KvTarget for crate::HashKv {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        crate::HashKv::get(self, key).map_err(|e| e.to_string())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        crate::HashKv::put(self, key, value).map_err(|e| e.to_string())
    }

    fn drive_cpu_ns(&self) -> u64 {
        crate::HashKv::drive_cpu_ns(self) + self.drive().stats().cpu.background_thread_ns
    }

    fn drive_codec_cpu_ns(&self) -> u64 {
        self.drive().stats().cpu.total_ns()
    }
}

/// The key of index `index`: its big-endian bytes, then a mix of them, so keys are distinct and
/// spread over both halves.
pub fn key_for(index: u64) -> [u8; KEY_BYTES] {
    let mut key = [0u8; KEY_BYTES];
    key[..8].copy_from_slice(&index.to_be_bytes());
    key[8..].copy_from_slice(&index.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29).to_le_bytes());
    key
}

/// Fills `value` half with random bytes and half with zeros: about 50% compressible.
pub fn fill_value(rng: &mut Rng, value: &mut [u8]) {
    let half = value.len() / 2;
    rng.fill(&mut value[..half]);
    value[half..].fill(0);
}

/// Puts keys `0..keys` once each from `clients` threads; returns the seconds it took.
pub fn load(target: &dyn KvTarget, keys: u64, clients: usize, seed: u64) -> Result<f64, String> {
    let started = Instant::now();
    let clients = clients.max(1) as u64;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|client| {
                scope.spawn(move || {
                    let mut rng = Rng::new(seed ^ client.wrapping_mul(0x51ed));
                    let mut value = vec![0u8; VALUE_BYTES];
                    for index in (client..keys).step_by(clients as usize) {
                        fill_value(&mut rng, &mut value);
                        target.put(&key_for(index), &value).map_err(|e| format!("loading key {index}: {e}"))?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("a load client panicked"))
    })?;
    Ok(started.elapsed().as_secs_f64())
}

/// One measured run.
#[derive(Clone, Copy, Debug)]
pub struct MixConfig {
    /// Keys `0..keys` were loaded; operations pick among them uniformly.
    pub keys: u64,
    pub clients: usize,
    /// Percent of operations that are GETs (70 in the paper).
    pub get_percent: u64,
    pub warmup: Duration,
    pub window: Duration,
    pub seed: u64,
}

/// What one run measured over its window.
#[derive(Clone, Copy, Debug, Default)]
pub struct MixReport {
    pub clients: usize,
    pub seconds: f64,
    pub gets: u64,
    pub puts: u64,
    pub ops_per_s: f64,
    pub cpu_seconds: f64,
    pub cpu_us_per_op: f64,
    /// The part of `cpu_us_per_op` spent inside the emulated drive ([`KvTarget::drive_cpu_ns`]).
    pub drive_cpu_us_per_op: f64,
    /// The drive's deflate, inflate and background thread alone
    /// ([`KvTarget::drive_codec_cpu_ns`]), a part of `drive_cpu_us_per_op`.
    pub drive_codec_cpu_us_per_op: f64,
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub put_p50_us: f64,
    pub put_p99_us: f64,
}

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPING: u8 = 2;

/// Latencies one client recorded in the window, in nanoseconds.
#[derive(Default)]
struct Recorded {
    gets: Vec<u64>,
    puts: Vec<u64>,
}

/// Runs the mix: clients start at once, warm up, then record every operation that starts and
/// ends inside the window. A GET that finds no value, or one of the wrong size, is an error:
/// every key was loaded.
pub fn run_mix(target: &dyn KvTarget, config: &MixConfig) -> Result<MixReport, String> {
    assert!(config.keys > 0 && config.clients > 0, "a run needs keys and clients");
    let phase = AtomicU8::new(WARMING);
    let failed_ops = AtomicU64::new(0);
    let (recorded, seconds, cpu_seconds, drive_seconds, codec_seconds) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..config.clients)
            .map(|client| {
                let (phase, failed_ops) = (&phase, &failed_ops);
                let seed = config.seed ^ (client as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                scope.spawn(move || client_loop(target, config, phase, failed_ops, seed))
            })
            .collect();
        std::thread::sleep(config.warmup);
        let cpu_before = process_cpu_seconds();
        let drive_before = target.drive_cpu_ns();
        let codec_before = target.drive_codec_cpu_ns();
        let started = Instant::now();
        phase.store(MEASURING, Ordering::SeqCst);
        std::thread::sleep(config.window);
        phase.store(STOPPING, Ordering::SeqCst);
        let seconds = started.elapsed().as_secs_f64();
        let cpu_seconds = process_cpu_seconds() - cpu_before;
        let drive_seconds = target.drive_cpu_ns().saturating_sub(drive_before) as f64 / 1e9;
        let codec_seconds = target.drive_codec_cpu_ns().saturating_sub(codec_before) as f64 / 1e9;
        let recorded: Vec<Result<Recorded, String>> =
            handles.into_iter().map(|h| h.join().expect("a load client panicked")).collect();
        (recorded, seconds, cpu_seconds, drive_seconds, codec_seconds)
    });
    let mut gets = Vec::new();
    let mut puts = Vec::new();
    for r in recorded {
        let r = r?;
        gets.extend(r.gets);
        puts.extend(r.puts);
    }
    let ops = (gets.len() + puts.len()) as u64;
    if ops == 0 {
        return Err(format!("no operation completed inside the {seconds:.3} s window"));
    }
    Ok(MixReport {
        clients: config.clients,
        seconds,
        gets: gets.len() as u64,
        puts: puts.len() as u64,
        ops_per_s: ops as f64 / seconds,
        cpu_seconds,
        cpu_us_per_op: cpu_seconds * 1e6 / ops as f64,
        drive_cpu_us_per_op: drive_seconds * 1e6 / ops as f64,
        drive_codec_cpu_us_per_op: codec_seconds * 1e6 / ops as f64,
        get_p50_us: percentile_us(&mut gets, 50),
        get_p99_us: percentile_us(&mut gets, 99),
        put_p50_us: percentile_us(&mut puts, 50),
        put_p99_us: percentile_us(&mut puts, 99),
    })
}

fn client_loop(
    target: &dyn KvTarget,
    config: &MixConfig,
    phase: &AtomicU8,
    failed_ops: &AtomicU64,
    seed: u64,
) -> Result<Recorded, String> {
    let mut rng = Rng::new(seed);
    let mut value = vec![0u8; VALUE_BYTES];
    let mut recorded = Recorded::default();
    loop {
        let at_start = phase.load(Ordering::Relaxed);
        if at_start == STOPPING || failed_ops.load(Ordering::Relaxed) > 0 {
            return Ok(recorded);
        }
        let index = rng.below(config.keys);
        let key = key_for(index);
        let is_get = rng.below(100) < config.get_percent;
        let began = Instant::now();
        let result = if is_get {
            match target.get(&key) {
                Ok(Some(v)) if v.len() == VALUE_BYTES => Ok(()),
                Ok(Some(v)) => Err(format!("key {index} holds {} bytes, not {VALUE_BYTES}", v.len())),
                Ok(None) => Err(format!("key {index} was loaded but is missing")),
                Err(e) => Err(e),
            }
        } else {
            fill_value(&mut rng, &mut value);
            target.put(&key, &value)
        };
        let nanos = began.elapsed().as_nanos() as u64;
        if let Err(error) = result {
            failed_ops.fetch_add(1, Ordering::Relaxed);
            return Err(format!("{} of key {index}: {error}", if is_get { "GET" } else { "PUT" }));
        }
        if at_start == MEASURING && phase.load(Ordering::Relaxed) == MEASURING {
            if is_get { recorded.gets.push(nanos) } else { recorded.puts.push(nanos) }
        }
    }
}

/// The `p`th percentile of `samples` (nanoseconds) in microseconds; 0 without samples.
fn percentile_us(samples: &mut [u64], p: usize) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_unstable();
    let at = (samples.len() * p / 100).min(samples.len() - 1);
    samples[at] as f64 / 1e3
}

/// User plus system CPU time of the whole process so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_values_half_compressible() {
        let keys: std::collections::HashSet<_> = (0..10_000).map(key_for).collect();
        assert_eq!(keys.len(), 10_000);
        let mut rng = Rng::new(1);
        let mut value = vec![0u8; VALUE_BYTES];
        fill_value(&mut rng, &mut value);
        assert!(value[VALUE_BYTES / 2..].iter().all(|&b| b == 0));
        assert!(value[..VALUE_BYTES / 2].iter().filter(|&&b| b == 0).count() < 10);
    }

    /// The generator against the store at a tiny size: it loads, runs the mix with every GET
    /// checked, and reports a 7:3 mix with latencies and CPU time.
    #[test]
    fn a_tiny_mix_on_the_store() {
        use std::sync::Arc;
        use tundra_device::csd::CsdDevice;
        use tundra_device::mem::MemDevice;

        let options =
            crate::HashKvOptions { wal_blocks: 64, overflow_blocks: 256, ..crate::HashKvOptions::for_keys(2000) };
        let drive_options = crate::tests::drive_options(&options, 8 << 20);
        let media = Arc::new(MemDevice::new(drive_options.geometry().unwrap().total_bytes() / 4096));
        let drive = CsdDevice::format(media, &drive_options, crate::tests::quiet()).unwrap();
        crate::HashKv::format(&drive, &options).unwrap();
        let store = crate::HashKv::open(Arc::new(drive), crate::HashKvConfig { sections: 2 }).unwrap();
        load(&store, 2000, 4, 9).unwrap();
        let config = MixConfig {
            keys: 2000,
            clients: 3,
            get_percent: 70,
            warmup: Duration::from_millis(20),
            window: Duration::from_millis(300),
            seed: 4,
        };
        let report = run_mix(&store, &config).unwrap();
        let ops = report.gets + report.puts;
        assert!(ops > 0 && report.puts > 0, "{report:?}");
        // The window is short and the machine may be busy: check the mix only on enough ops.
        let get_share = report.gets as f64 / ops as f64;
        assert!(ops < 300 || (0.6..0.8).contains(&get_share), "{report:?}");
        assert!(report.get_p99_us >= report.get_p50_us && report.put_p50_us > 0.0, "{report:?}");
        // The process's CPU time comes from getrusage, which the kernel may count in whole
        // ticks, so over a short window it is only checked to be there at all.
        assert!(report.cpu_us_per_op >= 0.0 && report.drive_cpu_us_per_op > 0.0, "{report:?}");
    }

    #[test]
    fn percentiles_pick_from_the_sorted_samples() {
        let mut samples: Vec<u64> = (1..=100).rev().map(|n| n * 1000).collect();
        assert_eq!(percentile_us(&mut samples, 50), 51.0);
        assert_eq!(percentile_us(&mut samples, 99), 100.0);
        assert_eq!(percentile_us(&mut [], 99), 0.0);
    }
}
