//! Prometheus metrics: the figures of `tundra stats` encoded by prometheus-client, served at
//! `GET /metrics` by a small HTTP/1.0 responder (one request per connection, bounded reads).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::Node;

/// The node's metrics in the OpenMetrics text format.
pub fn render(node: &Node) -> String {
    let stats = node.stats();
    let mut registry = Registry::with_prefix("tundra");
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: f64| {
        registry.register(name, help, ConstGauge::new(value));
    };
    let c = &stats.compressed;
    gauge(&mut registry, "logical_bytes", "Bytes of the compressed volumes' written pages", c.logical_bytes as f64);
    gauge(
        &mut registry,
        "software_bytes",
        "Bytes those pages take after software compression (4 KiB blocks)",
        c.software_bytes as f64,
    );
    gauge(
        &mut registry,
        "physical_bytes",
        "Bytes the drive stores after its own compression",
        stats.drive.physical_used_bytes as f64,
    );
    gauge(&mut registry, "software_ratio", "Logical over software bytes", stats.software_ratio);
    gauge(&mut registry, "drive_ratio", "The drive's mapped over physical bytes", stats.drive_ratio);
    gauge(&mut registry, "ratio", "Logical over physical bytes, both layers", stats.ratio);
    for (name, value) in [("lz4", c.lz4_pages), ("zstd", c.zstd_pages), ("raw", c.raw_pages), ("heavy", c.heavy_pages)]
    {
        let sub = registry.sub_registry_with_label(("encoding".into(), name.into()));
        sub.register("pages", "Compressed volumes' pages by how they are stored", ConstGauge::new(value as f64));
    }
    gauge(
        &mut registry,
        "drive_gc_write_amplification",
        "Media bytes written per byte the host wrote",
        stats.drive.gc_write_amplification,
    );
    gauge(
        &mut registry,
        "drive_gc_moved_bytes",
        "Bytes garbage collection relocated",
        stats.drive.gc_moved_bytes as f64,
    );
    gauge(&mut registry, "drive_free_segments", "Free segments of the drive", stats.drive.free_segments as f64);
    gauge(
        &mut registry,
        "drive_deferred_pending_blocks",
        "Blocks stored raw, waiting for the drive's background compression",
        stats.drive.deferred_pending_blocks as f64,
    );
    gauge(
        &mut registry,
        "rechoose_pending_pages",
        "Pages written while the host was busy, waiting to be compared again",
        stats.rechoose.pending_pages as f64,
    );
    gauge(
        &mut registry,
        "rechoose_saved_bytes",
        "Software bytes the idle-host pass won back by choosing again",
        stats.rechoose.bytes_before.saturating_sub(stats.rechoose.bytes_after) as f64,
    );
    for (part, value) in [("host", stats.cpu.host_seconds), ("drive", stats.cpu.drive_seconds)] {
        let sub = registry.sub_registry_with_label(("part".into(), part.into()));
        sub.register(
            "cpu_seconds",
            "The node process's CPU time: the emulated drive's (done in hardware by a real drive) and the rest",
            ConstGauge::new(value),
        );
    }
    gauge(&mut registry, "index_memory_bytes", "Memory of the page index", stats.index_memory_bytes as f64);
    gauge(&mut registry, "cache_hits", "Page cache hits", stats.cache_hits as f64);
    gauge(&mut registry, "cache_misses", "Page cache misses", stats.cache_misses as f64);
    gauge(
        &mut registry,
        "write_back_dirty_bytes",
        "Block-device writes held in the write-back cache until the next flush",
        stats.write_back_dirty_bytes as f64,
    );
    gauge(
        &mut registry,
        "write_back_pieces",
        "Block-device writes of less than a page merged into their page in the write-back cache",
        stats.write_back_pieces as f64,
    );
    gauge(
        &mut registry,
        "write_back_piece_reads",
        "Pieces whose page was read from the store first (read-modify-write)",
        stats.write_back_piece_reads as f64,
    );
    for (store, journal) in [("drive", stats.journals.drive), ("fast", stats.journals.fast)] {
        let sub = registry.sub_registry_with_label(("store".into(), store.into()));
        sub.register(
            "journal_group_commits",
            "Group commits of the store's journal: one log write and one flush of the log each",
            ConstGauge::new(journal.group_commits as f64),
        );
        sub.register(
            "journal_data_flushes",
            "Group commits that flushed the data device first (the others carried their page images)",
            ConstGauge::new(journal.data_flushes as f64),
        );
        sub.register(
            "journal_waiting_images",
            "Carried page images waiting now to be written to their blocks (write-behind)",
            ConstGauge::new(journal.waiting_images as f64),
        );
    }
    for volume in node.volumes() {
        let v = stats.volumes.iter().find(|s| s.id == volume.volume.id.0);
        let sub = registry.sub_registry_with_label(("volume".into(), volume.volume.name.clone().into()));
        if let Some(v) = v {
            sub.register(
                "volume_logical_bytes",
                "Bytes of the volume's written pages",
                ConstGauge::new(v.space.logical_bytes as f64),
            );
            sub.register(
                "volume_software_bytes",
                "The volume's bytes after software compression",
                ConstGauge::new(v.space.software_bytes as f64),
            );
            sub.register(
                "volume_physical_bytes",
                "The drive's physical bytes attributed to the volume by its software bytes",
                ConstGauge::new(v.physical_bytes_attributed as f64),
            );
            if let Some(redo) = v.redo {
                let redo_gauges = [
                    ("redo_durable_lsn", "The end of the volume's last durable redo batch", redo.durable_lsn),
                    ("redo_complete_lsn", "The newest LSN the volume's pages can be read at", redo.complete_lsn),
                    ("redo_lsn_min", "The lowest LSN a reader of the volume may still read at", redo.lsn_min),
                    (
                        "redo_unfolded_bytes",
                        "Redo records held in memory, not yet folded into pages",
                        redo.unfolded_bytes,
                    ),
                    ("redo_leases", "Live reader leases of the volume", redo.leases),
                    (
                        "redo_spilled_records",
                        "Records not yet folded that left memory for their page's log slot or the redo log",
                        redo.spilled_records,
                    ),
                    (
                        "redo_slot_physical_bytes",
                        "The drive's physical bytes holding the volume's per-page log slots",
                        redo.slot_physical_bytes,
                    ),
                    ("redo_rebuilt_pages", "Page reads that applied redo records", redo.rebuilt_pages),
                    (
                        "redo_rebuild_device_reads",
                        "Device reads (images, log slots, redo log batches) those rebuilds took",
                        redo.rebuild_device_reads,
                    ),
                ];
                for (name, help, value) in redo_gauges {
                    sub.register(name, help, ConstGauge::new(value as f64));
                }
            }
        }
        sub.register("page_read_seconds", "Page read latency", volume.latency.page_read.clone());
        sub.register("page_write_seconds", "Page write latency", volume.latency.page_write.clone());
        sub.register("flush_seconds", "Flush latency", volume.latency.flush.clone());
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

/// The HTTP endpoint.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: &str, node: Arc<Node>) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("tundra-metrics".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = respond(stream, &node);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        })?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Answers one request: the metrics for `GET /metrics`, 404 for any other path, 405 for any
/// other method.
fn respond(mut stream: TcpStream, node: &Node) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    // The request line and headers end at an empty line; 8 KiB is plenty.
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && !request.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 || request.len() > 8192 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(request.split(|&b| b == b'\n').next().unwrap_or_default()).to_string();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(node)),
        ("GET", _) => ("404 Not Found", "text/plain", "Tundra serves /metrics only\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "GET /metrics\n".to_string()),
    };
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
