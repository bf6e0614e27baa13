//! The protocol's overhead benchmark on the in-memory service at a tiny size, so it cannot rot,
//! and its refusal of a volume that does not fit its configuration.

use std::sync::Arc;

use tundra_bench::overhead;
use tundra_proto::mem::MemService;
use tundra_proto::{Status, VolumeMode, VolumeSpec};

const PAGE: usize = 16384;

fn spec(name: &str, pages: u64) -> VolumeSpec {
    VolumeSpec { name: name.into(), size_bytes: pages * PAGE as u64, page_size: PAGE as u32, mode: VolumeMode::Normal }
}

#[test]
fn the_overhead_benchmark_runs_at_a_tiny_size() {
    let service = Arc::new(MemService::new());
    let info = tundra_proto::Service::volume_create(&*service, spec("bench", 64)).unwrap();
    let ops = std::env::var("TUNDRA_BENCH_OPS").ok().and_then(|ops| ops.parse().ok()).unwrap_or(200);
    let report = overhead::overhead(service, info.id, PAGE, ops).unwrap();
    println!("{report}");
    for phase in [&report.in_process, &report.protocol_qd1, &report.protocol_qdn] {
        for stats in [&phase.read, &phase.write] {
            assert_eq!(stats.ops, ops);
            assert!(stats.latency_us_median > 0.0 && stats.latency_us_median <= stats.latency_us_p99);
            assert!(stats.wall_us_per_op > 0.0);
        }
    }
    assert_eq!(report.protocol_qdn.queue_depth, 16);
    assert!(report.to_string().contains("read overhead: depth 1"));
}

#[test]
fn the_overhead_benchmark_checks_its_volume() {
    let service = Arc::new(MemService::new());
    let info = tundra_proto::Service::volume_create(&*service, spec("bench", 8)).unwrap();
    let error = overhead::overhead(service.clone(), info.id + 1, PAGE, 10).unwrap_err();
    assert_eq!(error.status(), Some(Status::NotFound));
    let error = overhead::overhead(service, info.id, 8192, 10).unwrap_err();
    assert_eq!(error.status(), Some(Status::Invalid));
}
