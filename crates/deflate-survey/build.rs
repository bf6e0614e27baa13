//! Records, for the report, the versions of the measured crates (read from the
//! workspace Cargo.lock), the rustc version and the build profile.

use std::{env, fs, path::PathBuf, process::Command};

const CRATES: &[&str] = &["libdeflater", "libdeflate-sys", "miniz_oxide", "flate2", "zlib-rs"];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let lock = manifest_dir.join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    println!("cargo:rerun-if-changed=build.rs");

    let text = fs::read_to_string(&lock).unwrap_or_default();
    for name in CRATES {
        let mut versions = Vec::new();
        let mut current: Option<&str> = None;
        for line in text.lines() {
            let line = line.trim();
            if line == "[[package]]" {
                current = None;
            } else if let Some(v) = line.strip_prefix("name = ") {
                current = Some(v.trim_matches('"'));
            } else if let Some(v) = line.strip_prefix("version = ")
                && current == Some(name)
            {
                versions.push(v.trim_matches('"').to_string());
            }
        }
        let versions = if versions.is_empty() { "unknown".to_string() } else { versions.join("+") };
        let key = name.to_uppercase().replace('-', "_");
        println!("cargo:rustc-env=SURVEY_VERSION_{key}={versions}");
    }

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SURVEY_RUSTC={rustc_version}");
    println!("cargo:rustc-env=SURVEY_PROFILE={}", env::var("PROFILE").unwrap_or_default());
    println!("cargo:rustc-env=SURVEY_OPT_LEVEL={}", env::var("OPT_LEVEL").unwrap_or_default());
    println!("cargo:rustc-env=SURVEY_TARGET_FEATURES={}", env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default());
}
