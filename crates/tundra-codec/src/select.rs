//! Algorithm 1 of seed 000 (§3.3.2): the per-page choice between lz4 and zstd, made when a page
//! is written, without I/O.
//!
//! ```text
//! if CPU utilisation > 20%:          lz4                        (no CPU to spare for choosing)
//! elif first write or updates > 30%: compare both               (the page's content changed)
//! else:                              the page's last algorithm  (choosing again would not pay)
//! ```
//!
//! Comparing weighs zstd's saving in 4 KiB-rounded bytes (less to read) against its extra
//! decompression time, at the paper's exchange rate of 300 bytes per microsecond (one 4 KiB block
//! less to read saves 12–14 µs). The rule is written without the paper's division:
//!
//! ```text
//! zstd  iff  benefit_bytes > threshold_bytes_per_us × overhead_us
//! ```
//!
//! that is, iff zstd's estimated read time (I/O at the threshold's rate plus decompression) is
//! strictly lower than lz4's. Where the paper's rule is defined (overhead > 0) the two agree. It
//! also decides the cases the paper's division leaves open: when zstd decompresses no slower
//! (overhead ≤ 0), zstd wins if it is smaller, or equal in blocks and strictly faster; a tie goes
//! to lz4, the paper's default. The one case where zstd can win while larger is overhead < 0 with
//! the extra bytes worth less than the time saved, which follows from the same exchange rate (it
//! arises only when lz4's page would be decompressed while zstd's is stored raw).
//!
//! Candidates are compared as they would be stored: a candidate that saves no 4 KiB block is
//! raw, costs the full page and needs no decompression.
//!
//! Tundra's addition for a compressing drive (not in the paper): when both candidates take the
//! same number of 4 KiB blocks, the read does the same I/O and the paper's rule gives lz4. But the
//! drive below stores each block compressed, so the difference is real: zstd's entropy-coded
//! output is what the drive keeps, while lz4's literals are only partly squeezed by the drive
//! (on 8 KiB PostgreSQL pages of nycflights13, every page ties at one block, and lz4 + drive
//! stores 16% more than zstd + drive, 1% more than the drive alone). With
//! [`SelectorConfig::tie_bytes_per_us`] set, a tie is decided by the same kind of rule on the
//! byte-granular sizes: zstd iff `lz4_bytes − zstd_bytes > tie_bytes_per_us × overhead_us`.
//! The rate is a space-for-latency policy, lower than the paper's read-latency rate because a
//! byte saved on the drive saves no read I/O; docs/measurements.md shows the mix and ratios at
//! several rates.

use crate::codec::Encoding;
use crate::{Algorithm, DecompressCost, EncodedPage, Error, PageCodec, PageSize, Result};

/// The thresholds of Algorithm 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SelectorConfig {
    /// Bytes of 4 KiB-rounded storage zstd must save per extra microsecond of decompression.
    pub threshold_bytes_per_us: f64,
    /// Above this busy fraction of the host's CPU, pages get lz4 without comparing.
    pub cpu_busy_threshold: f64,
    /// Above this estimated fraction of a page updated since it was last compressed, the choice
    /// is made again.
    pub update_threshold: f64,
    /// On a compressing drive: byte-granular bytes zstd must save per extra microsecond of
    /// decompression when both candidates take the same 4 KiB blocks. None: the paper's rule
    /// (a tie goes to lz4).
    pub tie_bytes_per_us: Option<f64>,
}

/// The tie rate Tundra uses above a compressing drive.
pub const DRIVE_TIE_BYTES_PER_US: f64 = 100.0;

impl Default for SelectorConfig {
    /// The paper's thresholds, for a drive that does not compress.
    fn default() -> SelectorConfig {
        SelectorConfig {
            threshold_bytes_per_us: 300.0,
            cpu_busy_threshold: 0.20,
            update_threshold: 0.30,
            tie_bytes_per_us: None,
        }
    }
}

impl SelectorConfig {
    /// The paper's thresholds plus the tie rule at [`DRIVE_TIE_BYTES_PER_US`], for a store whose
    /// data device compresses.
    pub fn over_compressing_drive() -> SelectorConfig {
        SelectorConfig { tie_bytes_per_us: Some(DRIVE_TIE_BYTES_PER_US), ..SelectorConfig::default() }
    }
}

impl SelectorConfig {
    fn check(&self) -> Result<()> {
        let fraction = |x: f64| (0.0..=1.0).contains(&x);
        if !(self.threshold_bytes_per_us.is_finite() && self.threshold_bytes_per_us > 0.0) {
            return Err(Error::invalid(format!("threshold {} B/µs is not positive", self.threshold_bytes_per_us)));
        }
        if !fraction(self.cpu_busy_threshold) || !fraction(self.update_threshold) {
            return Err(Error::invalid("the CPU and update thresholds are fractions between 0 and 1"));
        }
        if let Some(rate) = self.tie_bytes_per_us
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(Error::invalid(format!("tie rate {rate} B/µs is not positive")));
        }
        Ok(())
    }
}

/// What the caller knows of the page's past.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PageHistory {
    /// The page has never been stored.
    FirstWrite,
    /// The page was stored with `last_algorithm` (whether or not it ended up raw), and the
    /// database layer estimates `update_fraction` of it changed since, from the redo volume
    /// written for it over the page size (so it may exceed 1).
    Rewrite { last_algorithm: Algorithm, update_fraction: f64 },
}

/// The two candidates of a comparison, as they would be stored, and the outcome.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub lz4_bytes_4k: usize,
    pub zstd_bytes_4k: usize,
    /// The candidates' byte-granular sizes as stored (the page size when raw).
    pub lz4_bytes: usize,
    pub zstd_bytes: usize,
    /// True when the tie rule decided.
    pub tie_rule: bool,
    pub lz4_decompress_us: f64,
    pub zstd_decompress_us: f64,
    pub chosen: Algorithm,
}

impl Comparison {
    /// Storage zstd saves, in 4 KiB-rounded bytes (negative when it takes more blocks).
    pub fn benefit_bytes(&self) -> i64 {
        self.lz4_bytes_4k as i64 - self.zstd_bytes_4k as i64
    }

    /// Decompression time zstd adds, in microseconds (negative when it is faster).
    pub fn overhead_us(&self) -> f64 {
        self.zstd_decompress_us - self.lz4_decompress_us
    }
}

/// Why a selection came out as it did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reason {
    /// The host was busy: lz4 without comparing.
    CpuBusy,
    /// A rewrite with few updates: the page's last algorithm.
    KeptLastAlgorithm,
    /// Both algorithms were run and compared.
    Compared(Comparison),
}

/// The outcome of Algorithm 1 for one page.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// The algorithm chosen; the page may still be stored raw if it saves no block with it.
    pub algorithm: Algorithm,
    /// The page as it is to be stored.
    pub page: EncodedPage,
    pub reason: Reason,
}

/// Algorithm 1 with its thresholds, the page codec and the machine's decompression costs.
#[derive(Clone, Debug)]
pub struct Selector {
    config: SelectorConfig,
    codec: PageCodec,
    cost: DecompressCost,
}

impl Selector {
    pub fn new(config: SelectorConfig, codec: PageCodec, cost: DecompressCost) -> Result<Selector> {
        config.check()?;
        Ok(Selector { config, codec, cost })
    }

    pub fn config(&self) -> &SelectorConfig {
        &self.config
    }

    pub fn cost(&self) -> &DecompressCost {
        &self.cost
    }

    /// Chooses the algorithm for `page` and compresses it. `cpu_busy_fraction` is the host's
    /// current CPU utilisation in [0, 1] ([`crate::CpuSampler`]).
    pub fn select(&self, page: &[u8], history: PageHistory, cpu_busy_fraction: f64) -> Result<Selection> {
        assert!((0.0..=1.0).contains(&cpu_busy_fraction), "CPU utilisation {cpu_busy_fraction} is not a fraction");
        let page_size = PageSize::of(page)?;
        if page_size != self.cost.page_size {
            return Err(Error::invalid(format!(
                "a page of {page_size} given to a selector calibrated for {}",
                self.cost.page_size
            )));
        }
        if cpu_busy_fraction > self.config.cpu_busy_threshold {
            return self.encode(Algorithm::Lz4, page, Reason::CpuBusy);
        }
        match history {
            PageHistory::Rewrite { last_algorithm, update_fraction } => {
                assert!(update_fraction >= 0.0, "update fraction {update_fraction} is not a non-negative number");
                if update_fraction <= self.config.update_threshold {
                    return self.encode(last_algorithm, page, Reason::KeptLastAlgorithm);
                }
            }
            PageHistory::FirstWrite => {}
        }
        let lz4 = self.codec.encode(Algorithm::Lz4, page)?;
        let zstd = self.codec.encode(Algorithm::Zstd, page)?;
        let comparison = self.compare(&lz4, &zstd);
        let chosen = if comparison.chosen == Algorithm::Zstd { zstd } else { lz4 };
        Ok(Selection { algorithm: comparison.chosen, page: chosen, reason: Reason::Compared(comparison) })
    }

    fn encode(&self, algorithm: Algorithm, page: &[u8], reason: Reason) -> Result<Selection> {
        Ok(Selection { algorithm, page: self.codec.encode(algorithm, page)?, reason })
    }

    /// Lines 6–18 of Algorithm 1 on two candidates already compressed and put through the storage
    /// rule: no compression, no I/O. See the module documentation for the rule.
    pub fn compare(&self, lz4: &EncodedPage, zstd: &EncodedPage) -> Comparison {
        let lz4_decompress_us = self.cost.estimate_us(lz4.encoding, lz4.data.len());
        let zstd_decompress_us = self.cost.estimate_us(zstd.encoding, zstd.data.len());
        let mut comparison = Comparison {
            lz4_bytes_4k: lz4.bytes_4k(),
            zstd_bytes_4k: zstd.bytes_4k(),
            lz4_bytes: lz4.data.len(),
            zstd_bytes: zstd.data.len(),
            tie_rule: false,
            lz4_decompress_us,
            zstd_decompress_us,
            chosen: Algorithm::Lz4,
        };
        if comparison.benefit_bytes() as f64 > self.config.threshold_bytes_per_us * comparison.overhead_us() {
            comparison.chosen = Algorithm::Zstd;
        } else if let Some(rate) = self.config.tie_bytes_per_us
            && comparison.benefit_bytes() == 0
        {
            comparison.tie_rule = true;
            let saved = comparison.lz4_bytes as f64 - comparison.zstd_bytes as f64;
            if saved > rate * comparison.overhead_us() {
                comparison.chosen = Algorithm::Zstd;
            }
        }
        comparison
    }
}

impl Selection {
    /// How the page is stored: raw, or compressed with the chosen algorithm.
    pub fn encoding(&self) -> Encoding {
        self.page.encoding
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LinearCost;
    use crate::samples::{random_bytes, text_page};

    /// Fixed costs, so that decisions do not depend on this machine's speed: lz4 2 µs, zstd 6 µs
    /// (+1 µs per KiB each).
    fn selector() -> Selector {
        let cost = DecompressCost {
            page_size: PageSize::Kib16,
            lz4: LinearCost { fixed_us: 2.0, us_per_byte: 1.0 / 1024.0 },
            zstd: LinearCost { fixed_us: 6.0, us_per_byte: 1.0 / 1024.0 },
        };
        Selector::new(SelectorConfig::default(), PageCodec::default(), cost).unwrap()
    }

    fn candidate(algorithm: Algorithm, len: usize) -> EncodedPage {
        EncodedPage::choose(algorithm, &[0u8; 16384], vec![1u8; len])
    }

    #[test]
    fn zstd_wins_when_it_saves_a_whole_block() {
        // The paper's example: lz4 4097 bytes (two blocks), zstd 4096 (one). Benefit 4096 B,
        // overhead 4 µs: 1024 B/µs > 300.
        let c = selector().compare(&candidate(Algorithm::Lz4, 4097), &candidate(Algorithm::Zstd, 4096));
        assert_eq!((c.benefit_bytes(), c.overhead_us()), (4096, 4.0 + (4096.0 - 4097.0) / 1024.0));
        assert_eq!(c.chosen, Algorithm::Zstd);
    }

    #[test]
    fn lz4_wins_when_zstd_saves_no_block() {
        // Fewer bytes but the same number of blocks: no benefit, 4 µs of overhead.
        let c = selector().compare(&candidate(Algorithm::Lz4, 8000), &candidate(Algorithm::Zstd, 4500));
        assert_eq!(c.benefit_bytes(), 0);
        assert_eq!(c.chosen, Algorithm::Lz4);
    }

    #[test]
    fn a_block_saved_can_cost_too_much_time() {
        let slow_zstd = DecompressCost {
            page_size: PageSize::Kib16,
            lz4: LinearCost { fixed_us: 2.0, us_per_byte: 0.0 },
            zstd: LinearCost { fixed_us: 20.0, us_per_byte: 0.0 },
        };
        let selector = Selector::new(SelectorConfig::default(), PageCodec::default(), slow_zstd).unwrap();
        // 4096 B for 18 µs is 227 B/µs, under 300.
        let c = selector.compare(&candidate(Algorithm::Lz4, 5000), &candidate(Algorithm::Zstd, 4000));
        assert_eq!(c.chosen, Algorithm::Lz4);
        // Two blocks for 18 µs is 455 B/µs.
        let c = selector.compare(&candidate(Algorithm::Lz4, 9000), &candidate(Algorithm::Zstd, 4000));
        assert_eq!(c.chosen, Algorithm::Zstd);
    }

    #[test]
    fn the_tie_rule_decides_ties_on_bytes() {
        let tie = |config: SelectorConfig, lz4: usize, zstd: usize| {
            let cost = selector().cost;
            let s = Selector::new(config, PageCodec::default(), cost).unwrap();
            s.compare(&candidate(Algorithm::Lz4, lz4), &candidate(Algorithm::Zstd, zstd))
        };
        // One block each; overhead 4 µs + (zstd - lz4) bytes at 1 µs/KiB.
        let paper = tie(SelectorConfig::default(), 3500, 2300);
        assert_eq!((paper.chosen, paper.tie_rule), (Algorithm::Lz4, false));
        let drive = SelectorConfig { tie_bytes_per_us: Some(100.0), ..SelectorConfig::default() };
        // 1200 B saved for 4 - 1200/1024 = 2.83 µs: 424 B/µs > 100.
        let c = tie(drive, 3500, 2300);
        assert_eq!((c.chosen, c.tie_rule, c.lz4_bytes, c.zstd_bytes), (Algorithm::Zstd, true, 3500, 2300));
        // 200 B saved for 3.8 µs: 53 B/µs < 100.
        assert_eq!(tie(drive, 3500, 3300).chosen, Algorithm::Lz4);
        // Not a tie: the block rule decides, the tie rule is not consulted.
        let c = tie(drive, 4097, 4096);
        assert_eq!((c.chosen, c.tie_rule), (Algorithm::Zstd, false));
        let bad = SelectorConfig { tie_bytes_per_us: Some(0.0), ..SelectorConfig::default() };
        assert!(Selector::new(bad, PageCodec::default(), selector().cost).is_err());
    }

    #[test]
    fn overhead_of_zero_or_less() {
        let flat = LinearCost { fixed_us: 5.0, us_per_byte: 0.0 };
        let fast_zstd = LinearCost { fixed_us: 4.0, us_per_byte: 0.0 };
        let page_size = PageSize::Kib16;
        let equal = Selector::new(
            SelectorConfig::default(),
            PageCodec::default(),
            DecompressCost { page_size, lz4: flat, zstd: flat },
        )
        .unwrap();
        // Equal speed: zstd only if it saves a block; a tie stays lz4.
        assert_eq!(
            equal.compare(&candidate(Algorithm::Lz4, 5000), &candidate(Algorithm::Zstd, 4000)).chosen,
            Algorithm::Zstd
        );
        assert_eq!(
            equal.compare(&candidate(Algorithm::Lz4, 4000), &candidate(Algorithm::Zstd, 3000)).chosen,
            Algorithm::Lz4
        );
        let faster = Selector::new(
            SelectorConfig::default(),
            PageCodec::default(),
            DecompressCost { page_size, lz4: flat, zstd: fast_zstd },
        )
        .unwrap();
        // Same blocks and faster: zstd. One block larger for 1 µs (worth 300 B): lz4.
        assert_eq!(
            faster.compare(&candidate(Algorithm::Lz4, 4000), &candidate(Algorithm::Zstd, 3000)).chosen,
            Algorithm::Zstd
        );
        assert_eq!(
            faster.compare(&candidate(Algorithm::Lz4, 4000), &candidate(Algorithm::Zstd, 5000)).chosen,
            Algorithm::Lz4
        );
        // Raw costs no decompression: a raw zstd candidate against an lz4 one that saves one block
        // (12288 B, 5 µs) trades 4096 B for 5 µs, 819 B/µs: lz4 keeps the block.
        let c = faster.compare(&candidate(Algorithm::Lz4, 12_000), &candidate(Algorithm::Zstd, 16_000));
        assert_eq!((c.zstd_decompress_us, c.chosen), (0.0, Algorithm::Lz4));
    }

    #[test]
    fn busy_cpu_means_lz4_without_comparing() {
        let page = text_page(PageSize::Kib16, 3);
        let s = selector().select(&page, PageHistory::FirstWrite, 0.5).unwrap();
        assert_eq!((s.algorithm, s.reason), (Algorithm::Lz4, Reason::CpuBusy));
        assert_eq!(s.encoding(), Encoding::Compressed(Algorithm::Lz4));
        let history = PageHistory::Rewrite { last_algorithm: Algorithm::Zstd, update_fraction: 0.9 };
        assert_eq!(selector().select(&page, history, 0.21).unwrap().reason, Reason::CpuBusy);
    }

    #[test]
    fn few_updates_keep_the_last_algorithm() {
        let page = text_page(PageSize::Kib16, 4);
        for last_algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
            let history = PageHistory::Rewrite { last_algorithm, update_fraction: 0.1 };
            let s = selector().select(&page, history, 0.05).unwrap();
            assert_eq!((s.algorithm, s.reason), (last_algorithm, Reason::KeptLastAlgorithm));
            assert_eq!(PageCodec::default().decode(s.encoding(), &s.page.data, PageSize::Kib16).unwrap(), page);
        }
        // Exactly at the threshold still keeps it: the paper re-selects above 30%.
        let history = PageHistory::Rewrite { last_algorithm: Algorithm::Zstd, update_fraction: 0.3 };
        assert_eq!(selector().select(&page, history, 0.0).unwrap().reason, Reason::KeptLastAlgorithm);
    }

    #[test]
    fn first_writes_and_heavy_updates_compare() {
        let page = text_page(PageSize::Kib16, 5);
        let first = selector().select(&page, PageHistory::FirstWrite, 0.0).unwrap();
        let Reason::Compared(comparison) = first.reason else { panic!("{:?}", first.reason) };
        assert_eq!(first.algorithm, comparison.chosen);
        assert_eq!(
            first.page.bytes_4k(),
            if comparison.chosen == Algorithm::Zstd { comparison.zstd_bytes_4k } else { comparison.lz4_bytes_4k }
        );
        assert_eq!(PageCodec::default().decode(first.encoding(), &first.page.data, PageSize::Kib16).unwrap(), page);
        let history = PageHistory::Rewrite { last_algorithm: Algorithm::Lz4, update_fraction: 0.31 };
        assert!(matches!(selector().select(&page, history, 0.0).unwrap().reason, Reason::Compared(_)));
        // Random data saves nothing with either: stored raw, lz4 by the tie rule.
        let random = selector().select(&random_bytes(16384, 1), PageHistory::FirstWrite, 0.0).unwrap();
        assert_eq!((random.algorithm, random.encoding()), (Algorithm::Lz4, Encoding::Raw));
    }

    #[test]
    fn bad_configs_and_pages_are_invalid() {
        let cost = *selector().cost();
        for config in [
            SelectorConfig { threshold_bytes_per_us: 0.0, ..SelectorConfig::default() },
            SelectorConfig { threshold_bytes_per_us: f64::NAN, ..SelectorConfig::default() },
            SelectorConfig { cpu_busy_threshold: 1.5, ..SelectorConfig::default() },
            SelectorConfig { update_threshold: -0.1, ..SelectorConfig::default() },
        ] {
            assert!(Selector::new(config, PageCodec::default(), cost).is_err(), "{config:?}");
        }
        let error = selector().select(&[0u8; 8192], PageHistory::FirstWrite, 0.0).unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Invalid);
        assert_eq!(
            selector().select(&[0u8; 100], PageHistory::FirstWrite, 0.0).unwrap_err().kind(),
            crate::ErrorKind::Invalid
        );
    }
}
