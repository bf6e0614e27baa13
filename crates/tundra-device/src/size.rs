//! Byte sizes as users type them: `4096`, `64KiB`, `4GiB`, `1.5TiB`, `10GB`.

use crate::{Error, Result};

/// Parses a size with an optional binary (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB, TB) suffix.
/// A bare `K`, `M`, `G` or `T` is binary.
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    if number.is_empty() {
        // No number at all ("abc", "-5"): not a size, rather than an unknown suffix.
        return Err(Error::invalid(format!("{text:?} is not a size like 4096, 64KiB or 4GiB")));
    }
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(Error::invalid(format!("unknown size suffix {other:?} in {text:?}"))),
    };
    let value: f64 =
        number.parse().map_err(|_| Error::invalid(format!("{text:?} is not a size like 4096, 64KiB or 4GiB")))?;
    let bytes = value * multiplier as f64;
    if !(0.0..=u64::MAX as f64).contains(&bytes) || bytes.fract() != 0.0 {
        return Err(Error::invalid(format!("{text:?} is not a whole number of bytes")));
    }
    Ok(bytes as u64)
}

/// Formats a byte count with a binary suffix, for people.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.2} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_size(" 2 MiB ").unwrap(), 2 << 20);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_size("").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("0.3").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }
}
