//! `tundra-bench store` end to end: real bytes through the store onto an emulated drive.

mod common;

use common::{fails, succeeds};

#[test]
fn measure_reports_every_layout_from_real_usage() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("table.dat");
    let mut data = Vec::new();
    for i in 0..20_000u32 {
        data.extend_from_slice(
            format!("{i:08}|2013-01-01|UA|N{:05}|EWR|IAH|{}\n", i * 7 % 99_991, i % 1440).as_bytes(),
        );
    }
    std::fs::write(&file, &data).unwrap();
    let out = succeeds(&[
        "store",
        file.to_str().unwrap(),
        "--page-size",
        "16KiB",
        "--json",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pages = (data.len() as u64).div_ceil(16384);
    let layouts = report["layouts"].as_array().unwrap();
    let names: Vec<&str> = layouts.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["none", "lz4", "zstd", "adaptive"]);
    // Storing pages raw through the store costs the drive exactly what writing the file does.
    assert_eq!(layouts[0]["physical_bytes"], report["drive_only_physical_bytes"]);
    for layout in layouts {
        let counted = ["lz4_pages", "zstd_pages", "raw_pages"].iter().map(|k| layout[k].as_u64().unwrap()).sum::<u64>();
        assert_eq!(counted, pages, "{layout}");
        assert!(layout["ratio"].as_f64().unwrap() >= 1.0);
        // The read path taken apart: the parts are timed, and the store's overhead is what is left.
        let part = |k: &str| layout[k].as_f64().unwrap();
        assert!(part("device_read_us_mean") > 0.0 && part("decompress_us_mean") > 0.0, "{layout}");
        let left = part("read_us_mean") - part("device_read_us_mean") - part("decompress_us_mean");
        assert!((part("read_overhead_us") - left).abs() < 1e-6, "{layout}");
    }
    // Text compresses: zstd's pages take fewer blocks than raw ones.
    assert!(layouts[2]["software_4k_bytes"].as_u64() < layouts[0]["software_4k_bytes"].as_u64());
    fails(&["store", "/nonexistent/file"], "/nonexistent/file");
}
