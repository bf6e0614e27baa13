//! Deterministic sample bytes: rows of text like a table's, and random bytes. Calibration mixes
//! them into pages that spread the compressed sizes, and tests use them as fixtures; ratios are
//! never claimed on them.
//!
//! Both draw from the project's seeded generator ([`tundra_env::Rng`]), so the same seed gives
//! the same bytes on every machine.

use tundra_env::Rng;

/// `len` bytes that do not compress.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// `len` bytes of CSV-like rows of flights, which compress several times over.
pub fn text_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let carriers = ["UA", "AA", "B6", "DL", "EV", "MQ", "US", "WN"];
    let airports = ["EWR", "JFK", "LGA", "IAH", "MIA", "ATL", "ORD", "BOS", "SFO", "LAX"];
    let mut text = Vec::with_capacity(len + 64);
    let mut row = 0u64;
    while text.len() < len {
        let r = rng.next_u64();
        let line = format!(
            "{row:07},2013-{:02}-{:02},{},N{:05},{},{},{}\n",
            1 + r % 12,
            1 + (r >> 8) % 28,
            carriers[(r >> 16) as usize % carriers.len()],
            (r >> 20) % 99_991,
            airports[(r >> 40) as usize % airports.len()],
            airports[(r >> 44) as usize % airports.len()],
            (r >> 48) % 1440
        );
        text.extend_from_slice(line.as_bytes());
        row += 1;
    }
    text.truncate(len);
    text
}

/// A page of text rows.
#[cfg(test)]
pub fn text_page(size: crate::PageSize, seed: u64) -> Vec<u8> {
    text_bytes(size.bytes(), seed)
}
