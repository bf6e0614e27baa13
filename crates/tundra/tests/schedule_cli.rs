//! `tundra sim schedule` at a small size: the JSON contract of docs/cli.md, both policies on
//! the same input, arrivals in eras, a CSV input, and refusals of bad input naming what is wrong.

mod common;

use common::{fails, succeeds};

const SMALL: [&str; 8] = ["--nodes", "30", "--chunk-count", "1000", "--steps", "80", "--growth-steps", "8"];

fn report(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["sim", "schedule", "--json"];
    args.extend_from_slice(&SMALL);
    args.extend_from_slice(extra);
    serde_json::from_slice(&succeeds(&args).stdout).expect("sim schedule --json is JSON")
}

#[test]
fn both_policies_report_the_documented_keys() {
    let r = report(&["--points"]);
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["policy"], "logical");
    assert_eq!(runs[1]["policy"], "compression-aware");
    for run in runs {
        for key in [
            "nodes_in_band_fraction",
            "stranded_logical_fraction",
            "stranded_physical_fraction",
            "usable_capacity_bytes",
            "migrated_bytes",
            "migrations",
            "migrated_physical_bytes",
            "final_plan_moves",
            "placed_chunks",
            "refused_chunks",
            "band_low",
            "band_high",
            "ratio_average",
        ] {
            assert!(run[key].is_number(), "{key} in {run}");
        }
        assert_eq!(run["placed_chunks"], 1000);
        assert_eq!(run["points"].as_array().unwrap().len(), 30);
        assert_eq!(run["timeline"].as_array().unwrap().len(), 80);
    }
    assert!(r["comparison"]["stranded_reduction_factor"].is_number());
    assert_eq!(r["input"]["chunks"], 1000);
    // The same seed gives the same figures.
    let again = report(&["--points"]);
    assert_eq!(r["runs"][1]["migrated_bytes"], again["runs"][1]["migrated_bytes"]);
    assert_eq!(r["runs"][1]["points"], again["runs"][1]["points"]);
}

#[test]
fn eras_change_the_input_and_name_themselves() {
    let mixed = report(&[]);
    let eras = report(&["--eras", "4"]);
    assert!(eras["input"]["source"].as_str().unwrap().contains("4 eras of one dataset each"), "{}", eras["input"]);
    assert!(!mixed["input"]["source"].as_str().unwrap().contains("eras"));
    assert_ne!(mixed["input"]["physical_bytes"], eras["input"]["physical_bytes"], "other chunks");
    assert_eq!(eras["runs"][1]["placed_chunks"], 1000);
    let out = common::tundra(&["sim", "schedule", "--chunks", "x.csv", "--eras", "2"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

#[test]
fn a_csv_file_is_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chunks.csv");
    let mut text = String::from("chunk_id,logical_bytes,physical_bytes\n");
    for i in 0..300u64 {
        let ratio_percent = [120, 300, 450][(i % 3) as usize];
        text.push_str(&format!("{i},{},{}\n", 1u64 << 30, (100u64 << 30) / ratio_percent));
    }
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap();
    let out =
        succeeds(&["sim", "schedule", "--json", "--chunks", path, "--nodes", "12", "--policy", "compression-aware"]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["runs"].as_array().unwrap().len(), 1);
    assert_eq!(r["input"]["chunks"], 300);
    assert_eq!(r["runs"][0]["placed_chunks"], 300);
    // One policy: its figures are the report's own keys too.
    assert_eq!(r["policy"], "compression-aware");
    for key in [
        "nodes_in_band_fraction",
        "stranded_logical_fraction",
        "stranded_physical_fraction",
        "usable_capacity_bytes",
        "migrated_bytes",
        "migrations",
    ] {
        assert!(!r[key].is_null(), "{key} missing at the top level");
        assert_eq!(r[key], r["runs"][0][key], "{key}");
    }
}

#[test]
fn bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.csv");
    std::fs::write(&path, "chunk_id,logical_bytes,physical_bytes\n1,100,40\n2,100,lots\n").unwrap();
    fails(&["sim", "schedule", "--chunks", path.to_str().unwrap()], "line 3: physical_bytes \"lots\"");
    fails(&["sim", "schedule", "--policy", "random"], "unknown policy \"random\"");
    fails(&["sim", "schedule", "--ratios", "magic"], "--ratios");
    fails(&["sim", "schedule", "--nodes", "2"], "2 nodes cannot hold 3 replicas");
    fails(&["sim", "schedule", "--node-physical", "lots"], "--node-physical");
}
