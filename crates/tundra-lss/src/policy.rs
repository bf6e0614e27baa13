//! What the log does about garbage: the two policies of seed 001 §3.2.3 and their parameters.
//! None of it is on the media: the same store may be opened under either policy.
//!
//! - **Current practice**: closed segments are immutable; garbage collection runs whenever the
//!   bloating factor γ = (C_val + C_inval) / C_val exceeds γ_th (§3.2.1).
//! - **Trim-assisted**: a sector whose γ_s = 4 KiB / S_val exceeds γ_th is trimmed when it holds
//!   nothing live and zeroed by read-modify-write otherwise (virtual data trim, §3.2.2), so the
//!   drive's compression gives its physical space back; garbage collection runs on the adjusted
//!   factor γ_t = (C_val + C_inval − C_trim) / C_val of equation 1.
//!
//! The paper does not bound the logical footprint in trim-assisted mode, and it must be bounded:
//! once every dead element is zeroed, γ_t stays near 1 and garbage collection would never run,
//! so the log would grow through its whole logical space. [`Policy::logical_cap`] is that bound,
//! the footprint (C_val + C_inval) allowed as a multiple of C_val; past it the collector runs as
//! current practice would. Running out of free segments also starts it, under either policy.

use crate::error::{Error, Result};

/// The two policies of Table 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Immutable closed segments, GC on γ.
    CurrentPractice,
    /// Virtual data trim of sectors above γ_th, GC on γ_t (equation 1) or the logical cap.
    TrimAssisted,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::CurrentPractice => "current",
            Mode::TrimAssisted => "trim",
        }
    }

    pub fn parse(text: &str) -> Result<Mode> {
        match text {
            "current" | "current-practice" => Ok(Mode::CurrentPractice),
            "trim" | "trim-assisted" => Ok(Mode::TrimAssisted),
            other => Err(Error::invalid(format!("mode {other:?}: expected \"current\" or \"trim\""))),
        }
    }
}

/// The policy a log runs under.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub mode: Mode,
    /// γ_th: garbage collection starts above it (γ or γ_t), and a sector is trimmed above it (γ_s).
    pub gamma_th: f64,
    /// Trim-assisted only: the logical footprint allowed, as a multiple of the live data.
    pub logical_cap: f64,
    /// Trim-assisted only: sectors waiting for their trim decision before the log flushes and
    /// carries them out (at most one segment's sectors wait, however large this is). A dead
    /// element may be zeroed only once the version replacing it is durable, so trims wait for a
    /// flush, and batching them keeps flushes rare.
    pub trim_batch_sectors: usize,
}

impl Policy {
    pub const DEFAULT_LOGICAL_CAP: f64 = 2.5;
    pub const DEFAULT_TRIM_BATCH_SECTORS: usize = 256;

    pub fn current_practice(gamma_th: f64) -> Policy {
        Policy {
            mode: Mode::CurrentPractice,
            gamma_th,
            logical_cap: gamma_th,
            trim_batch_sectors: Self::DEFAULT_TRIM_BATCH_SECTORS,
        }
    }

    pub fn trim_assisted(gamma_th: f64, logical_cap: f64) -> Policy {
        Policy { mode: Mode::TrimAssisted, gamma_th, logical_cap, trim_batch_sectors: Self::DEFAULT_TRIM_BATCH_SECTORS }
    }

    /// Checks the numbers: γ_th above 1 (a log cannot hold less than its live data), a cap no
    /// lower than γ_th, a non-empty trim batch.
    pub fn validate(&self) -> Result<()> {
        if !(self.gamma_th.is_finite() && self.gamma_th > 1.0) {
            return Err(Error::invalid(format!("gamma_th {}: it must be a number above 1", self.gamma_th)));
        }
        if self.mode == Mode::TrimAssisted && !(self.logical_cap.is_finite() && self.logical_cap >= self.gamma_th) {
            return Err(Error::invalid(format!(
                "logical cap {}: it must be a number no lower than gamma_th {}",
                self.logical_cap, self.gamma_th
            )));
        }
        if self.trim_batch_sectors == 0 {
            return Err(Error::invalid("the trim batch must hold at least one sector"));
        }
        Ok(())
    }

    /// The most logical space the log lets its footprint take, as a multiple of the live data.
    pub fn footprint_limit(&self) -> f64 {
        match self.mode {
            Mode::CurrentPractice => self.gamma_th,
            Mode::TrimAssisted => self.logical_cap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_numbers_are_refused() {
        assert!(Policy::current_practice(1.0).validate().is_err());
        assert!(Policy::current_practice(f64::NAN).validate().is_err());
        assert!(Policy::trim_assisted(1.2, 1.1).validate().is_err());
        assert!(Policy::trim_assisted(1.2, f64::INFINITY).validate().is_err());
        assert!(Policy::trim_assisted(1.2, 2.5).validate().is_ok());
        assert_eq!(Mode::parse("trim").unwrap(), Mode::TrimAssisted);
        assert!(Mode::parse("lazy").is_err());
    }
}
