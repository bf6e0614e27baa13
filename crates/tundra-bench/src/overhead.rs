//! What the protocol costs per request: the same page reads and writes as in-process calls on a
//! [`Service`] and through a [`Server`] on 127.0.0.1 with a [`Client`], at queue depth 1 and at a
//! deeper queue. Client and server share the machine's cores with each other (and with the
//! service's own threads), as a node and a database engine on one host would.
//!
//! At depth 1 the overhead is the difference of median latencies: a request's round trip through
//! two sockets and two thread wake-ups. A bare TCP echo of 20 bytes, measured in the same run,
//! shows how much of that the machine costs before the protocol does anything. At depth N it is
//! the difference of wall time per operation, which is what a pipelining engine sees as
//! throughput.

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use tundra_client::{Client, Error, RequestId, Result};
use tundra_proto::frame::HEADER_BYTES;
use tundra_proto::{Server, Service, ServiceError, WriteMode};

/// What to run. `ops` reads and `ops` writes per phase, after a warm-up of a tenth as many.
#[derive(Clone, Debug)]
pub struct OverheadConfig {
    pub volume: u32,
    pub page_size: usize,
    pub ops: usize,
    pub queue_depth: usize,
    pub write_mode: WriteMode,
}

/// Latencies of one kind of operation in one phase.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OpStats {
    pub ops: usize,
    /// From the call (or submission) to its answer.
    pub latency_us_median: f64,
    pub latency_us_mean: f64,
    pub latency_us_p99: f64,
    /// The phase's wall time divided by its operations.
    pub wall_us_per_op: f64,
}

/// Reads and writes of one phase.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Phase {
    pub queue_depth: usize,
    pub read: OpStats,
    pub write: OpStats,
}

/// The protocol's cost against the in-process calls, for one kind of operation.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Overhead {
    /// Depth 1: median latency over the protocol minus in process.
    pub qd1_us_median: f64,
    pub qd1_ratio_median: f64,
    pub qd1_us_mean: f64,
    /// Depth N: wall time per operation over the protocol minus in process (negative when
    /// pipelining hides more than the protocol costs).
    pub qdn_us_per_op: f64,
    pub qdn_ratio_per_op: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    pub page_size: usize,
    pub ops: usize,
    pub write_mode: WriteMode,
    /// Cores this process may use.
    pub cpus: usize,
    pub in_process: Phase,
    /// 20-byte messages echoed over a bare TCP connection on 127.0.0.1: what the machine's
    /// network stack and thread wake-ups cost before any protocol does.
    pub tcp_round_trip: OpStats,
    /// Empty PINGs at depth 1: the round trip with no service call and no page, the floor
    /// under every request.
    pub protocol_ping: OpStats,
    pub protocol_qd1: Phase,
    pub protocol_qdn: Phase,
    pub read: Overhead,
    pub write: Overhead,
}

/// Runs `ops` reads and writes of `page_size` bytes on `volume` at depth 1 and 16 with
/// automatic compression. The volume must exist; its first `ops` pages (at most) are overwritten.
pub fn overhead(service: Arc<dyn Service>, volume: u32, page_size: usize, ops: usize) -> Result<OverheadReport> {
    overhead_with(service, &OverheadConfig { volume, page_size, ops, queue_depth: 16, write_mode: WriteMode::Auto })
}

pub fn overhead_with(service: Arc<dyn Service>, config: &OverheadConfig) -> Result<OverheadReport> {
    assert!(config.ops >= 1 && config.queue_depth >= 1, "at least one operation at depth one or more");
    let pages = usable_pages(&*service, config)?;
    let data = Workload { pages, images: sample_pages(config.page_size, 64) };

    let in_process = Phase {
        queue_depth: 1,
        write: measure(config.ops, |i| {
            service.write_page(config.volume, data.page(i), config.write_mode, data.image(i))
        })?,
        read: {
            let mut out = Vec::with_capacity(config.page_size);
            measure(config.ops, |i| {
                out.clear();
                service.read_page(config.volume, data.page(i), &mut out)
            })?
        },
    };

    let tcp_round_trip = measure_tcp_round_trip(config.ops)?;
    let server = Server::start("127.0.0.1:0", Arc::clone(&service))?;
    let mut client = Client::connect(server.local_addr())?;
    let protocol_ping = measure(config.ops, |_| client.ping(b"").map(drop))?;
    let protocol_qd1 = Phase {
        queue_depth: 1,
        write: measure(config.ops, |i| {
            client.write_page(config.volume, data.page(i), config.write_mode, data.image(i))
        })?,
        read: {
            let mut out = Vec::new();
            measure(config.ops, |i| client.read_page_into(config.volume, data.page(i), &mut out))?
        },
    };
    let depth = config.queue_depth;
    let protocol_qdn = Phase {
        queue_depth: depth,
        write: measure_pipelined(&mut client, config.ops, depth, |client, i| {
            client.submit_write_page(config.volume, data.page(i), config.write_mode, data.image(i))
        })?,
        read: measure_pipelined(&mut client, config.ops, depth, |client, i| {
            client.submit_read_page(config.volume, data.page(i))
        })?,
    };
    drop(client);
    server.shutdown();

    Ok(OverheadReport {
        page_size: config.page_size,
        ops: config.ops,
        write_mode: config.write_mode,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        read: compare(&in_process.read, &protocol_qd1.read, &protocol_qdn.read),
        write: compare(&in_process.write, &protocol_qd1.write, &protocol_qdn.write),
        in_process,
        tcp_round_trip,
        protocol_ping,
        protocol_qd1,
        protocol_qdn,
    })
}

/// Times `ops` round trips of a 20-byte message (a frame header's size) through an echo thread.
fn measure_tcp_round_trip(ops: usize) -> Result<OpStats> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    let echo = thread::spawn(move || -> std::io::Result<()> {
        let mut server = server;
        server.set_nodelay(true)?;
        let mut message = [0u8; HEADER_BYTES];
        while server.read_exact(&mut message).is_ok() {
            server.write_all(&message)?;
        }
        Ok(())
    });
    client.set_nodelay(true)?;
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut message = [0u8; HEADER_BYTES];
    let stats = measure(ops, |_| {
        client.write_all(&message)?;
        client.read_exact(&mut message)
    });
    drop(client);
    let _ = echo.join();
    stats
}

/// The pages the benchmark cycles through: the volume's first `ops`, or all of it.
fn usable_pages(service: &dyn Service, config: &OverheadConfig) -> Result<u64> {
    let volumes = service.volume_list().map_err(status_error)?;
    let Some(info) = volumes.iter().find(|info| info.id == config.volume) else {
        return Err(status_error(ServiceError::not_found(format!("no volume has id {}", config.volume))));
    };
    if info.page_size as usize != config.page_size {
        return Err(status_error(ServiceError::invalid(format!(
            "volume {:?} has {}-byte pages, not {}",
            info.name, info.page_size, config.page_size
        ))));
    }
    Ok(info.page_count().min(config.ops as u64).max(1))
}

fn status_error(error: ServiceError) -> Error {
    error.into()
}

struct Workload {
    pages: u64,
    images: Vec<Vec<u8>>,
}

impl Workload {
    fn page(&self, i: usize) -> u64 {
        i as u64 % self.pages
    }

    fn image(&self, i: usize) -> &[u8] {
        &self.images[i % self.images.len()]
    }
}

/// Pages that compress about as well as table pages do (two to three times): rows of a counter,
/// a few random bytes from a small alphabet and zero padding. Deterministic.
pub fn sample_pages(page_size: usize, count: usize) -> Vec<Vec<u8>> {
    let mut rng = tundra_env::Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut next = move || rng.next_u64();
    (0..count)
        .map(|page| {
            let mut bytes = vec![0u8; page_size];
            for (row, chunk) in bytes.chunks_mut(64).enumerate() {
                let counter = ((page * page_size / 64 + row) as u64).to_le_bytes();
                let fill = chunk.len().min(8);
                chunk[..fill].copy_from_slice(&counter[..fill]);
                for byte in chunk.iter_mut().skip(8).take(24) {
                    *byte = b"abcdefghijklmnop"[(next() % 16) as usize];
                }
            }
            bytes
        })
        .collect()
}

/// Times `ops` sequential calls after a warm-up.
fn measure<E: Into<Error>>(ops: usize, mut op: impl FnMut(usize) -> Result<(), E>) -> Result<OpStats> {
    for i in 0..ops / 10 {
        op(i).map_err(Into::into)?;
    }
    let mut latencies = Vec::with_capacity(ops);
    let start = Instant::now();
    for i in 0..ops {
        let begun = Instant::now();
        op(i).map_err(Into::into)?;
        latencies.push(begun.elapsed());
    }
    Ok(summarize(latencies, start.elapsed()))
}

/// Keeps `depth` requests in flight until `ops` have been answered, after a warm-up.
fn measure_pipelined(
    client: &mut Client,
    ops: usize,
    depth: usize,
    mut submit: impl FnMut(&mut Client, usize) -> Result<RequestId>,
) -> Result<OpStats> {
    run_pipelined(client, ops / 10, depth, &mut submit)?;
    let start = Instant::now();
    let latencies = run_pipelined(client, ops, depth, &mut submit)?;
    Ok(summarize(latencies, start.elapsed()))
}

fn run_pipelined(
    client: &mut Client,
    ops: usize,
    depth: usize,
    submit: &mut impl FnMut(&mut Client, usize) -> Result<RequestId>,
) -> Result<Vec<Duration>> {
    let mut submitted_at = HashMap::with_capacity(depth);
    let mut latencies = Vec::with_capacity(ops);
    let mut submitted = 0;
    while latencies.len() < ops {
        while submitted < ops && submitted_at.len() < depth {
            let id = submit(client, submitted)?;
            submitted_at.insert(id, Instant::now());
            submitted += 1;
        }
        let (id, result) = client.wait_any()?;
        result?;
        let Some(begun) = submitted_at.remove(&id) else {
            return Err(Error::Protocol(format!("an answer to {id}, which the benchmark did not submit")));
        };
        latencies.push(begun.elapsed());
    }
    Ok(latencies)
}

fn summarize(mut latencies: Vec<Duration>, wall: Duration) -> OpStats {
    latencies.sort_unstable();
    let us = |duration: Duration| duration.as_secs_f64() * 1e6;
    let ops = latencies.len();
    let at = |fraction: f64| us(latencies[((ops - 1) as f64 * fraction).round() as usize]);
    OpStats {
        ops,
        latency_us_median: at(0.5),
        latency_us_mean: latencies.iter().map(|&d| us(d)).sum::<f64>() / ops as f64,
        latency_us_p99: at(0.99),
        wall_us_per_op: us(wall) / ops as f64,
    }
}

fn compare(local: &OpStats, qd1: &OpStats, qdn: &OpStats) -> Overhead {
    let ratio = |over: f64, base: f64| if base > 0.0 { over / base } else { f64::INFINITY };
    Overhead {
        qd1_us_median: qd1.latency_us_median - local.latency_us_median,
        qd1_ratio_median: ratio(qd1.latency_us_median, local.latency_us_median),
        qd1_us_mean: qd1.latency_us_mean - local.latency_us_mean,
        qdn_us_per_op: qdn.wall_us_per_op - local.wall_us_per_op,
        qdn_ratio_per_op: ratio(qdn.wall_us_per_op, local.wall_us_per_op),
    }
}

impl fmt::Display for OverheadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} reads and {} writes of {}-byte pages, write mode {:?}, {} cpus",
            self.ops, self.ops, self.page_size, self.write_mode, self.cpus
        )?;
        writeln!(f, "{:<22} {:>12} {:>12} {:>12} {:>12}", "phase", "median us", "mean us", "p99 us", "wall us/op")?;
        let phases = [
            ("in process", &self.in_process),
            ("protocol, depth 1", &self.protocol_qd1),
            (&*format!("protocol, depth {}", self.protocol_qdn.queue_depth), &self.protocol_qdn),
        ];
        for (name, phase) in phases {
            for (kind, stats) in [("read", &phase.read), ("write", &phase.write)] {
                writeln!(
                    f,
                    "{:<22} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
                    format!("{name} {kind}"),
                    stats.latency_us_median,
                    stats.latency_us_mean,
                    stats.latency_us_p99,
                    stats.wall_us_per_op
                )?;
            }
        }
        let floors = [("bare TCP round trip", &self.tcp_round_trip), ("protocol, empty ping", &self.protocol_ping)];
        for (name, stats) in floors {
            writeln!(
                f,
                "{:<22} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
                name, stats.latency_us_median, stats.latency_us_mean, stats.latency_us_p99, stats.wall_us_per_op
            )?;
        }
        for (kind, overhead) in [("read", &self.read), ("write", &self.write)] {
            writeln!(
                f,
                "{kind} overhead: depth 1 {:+.2} us median ({:.2}x), depth {} {:+.2} us per op ({:.2}x)",
                overhead.qd1_us_median,
                overhead.qd1_ratio_median,
                self.protocol_qdn.queue_depth,
                overhead.qdn_us_per_op,
                overhead.qdn_ratio_per_op
            )?;
        }
        Ok(())
    }
}
