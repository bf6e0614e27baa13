//! `tundra sim trim` at the tiny scale: the JSON contract of docs/cli.md, the model's columns
//! beside Table 1, the store on the emulated drive beside the model, and refusals of bad flags.

mod common;

use common::{fails, succeeds};

fn report(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["sim", "trim", "--scale", "tiny", "--json"];
    all.extend_from_slice(args);
    let out = succeeds(&all);
    serde_json::from_slice(&out.stdout).expect("sim trim --json is JSON")
}

#[test]
fn the_table_1_columns_run_and_trim_assisted_beats_current_practice() {
    let report = report(&[]);
    let runs = report["runs"].as_array().expect("runs");
    let columns: Vec<(String, f64)> =
        runs.iter().map(|r| (r["mode"].as_str().unwrap().to_string(), r["gamma_th"].as_f64().unwrap())).collect();
    let expected = [("current", 1.2), ("current", 1.3), ("current", 1.4), ("trim", 1.2)];
    assert_eq!(columns, expected.map(|(m, g)| (m.to_string(), g)));
    for run in runs {
        let model = &run["model"];
        for key in [
            "user_bytes",
            "gc_bytes",
            "trim_bytes",
            "write_amplification",
            "gc_write_amplification",
            "trim_write_amplification",
            "physical_amplification_average",
            "physical_amplification_peak",
            "logical_amplification_average",
            "logical_amplification_peak",
            "zeroed_sectors",
            "trimmed_sectors",
            "segments_collected",
        ] {
            assert!(model[key].is_number(), "model.{key} in {run}");
        }
        assert!(run["paper"]["write_amplification"].is_number(), "{run}");
        assert!(run["drive"].is_null());
    }
    let wa = |i: usize| runs[i]["model"]["write_amplification"].as_f64().unwrap();
    assert!(wa(0) > wa(1) && wa(1) > wa(2), "a higher gamma_th writes less");
    assert_eq!(report["targets"]["trim_write_amplification_below_current_at_1_3"], true, "{report}");
    assert_eq!(report["targets"]["trim_physical_not_above_current_at_1_2"], true, "{report}");
    assert!(report["targets"]["drive_within_5pct_of_model"].is_null());
}

#[test]
fn the_store_on_the_drive_runs_beside_the_model() {
    let report = report(&["--mode", "trim", "--gamma-th", "1.2", "--cap", "3", "--drive"]);
    let run = &report["runs"][0];
    assert_eq!(run["logical_cap"], 3.0);
    let drive = &run["drive"];
    assert_eq!(drive["verified_elements"], report["elements"], "{drive}");
    assert_eq!(drive["user_bytes"], run["model"]["user_bytes"]);
    assert_eq!(drive["trim_bytes"], run["model"]["trim_bytes"], "the store takes the model's decisions");
    let ratio = drive["physical_average_vs_model"].as_f64().unwrap();
    assert!((ratio - 1.0).abs() < 0.05, "{drive}");
    assert!(drive["drive_compression_ratio"].as_f64().unwrap() > 1.0, "zeroed halves compress: {drive}");
}

#[test]
fn bad_flags_are_refused() {
    fails(&["sim", "trim", "--mode", "lazy"], "expected \"current\" or \"trim\"");
    fails(&["sim", "trim", "--gamma-th", "0.9"], "gamma_th 0.9: it must be a number above 1");
    fails(&["sim", "trim", "--mode", "trim", "--cap", "1.1"], "logical cap 1.1");
    fails(&["sim", "trim", "--scale", "huge"], "expected paper, drive or tiny");
    fails(&["sim", "trim", "--scale", "tiny", "--element-size", "3000"], "power of two");
    fails(&["sim", "trim", "--drive"], "at most 1.00 GiB of live data");
    fails(&["sim", "trim", "--scale", "tiny", "--measured-passes", "0"], "--measured-passes");
}
