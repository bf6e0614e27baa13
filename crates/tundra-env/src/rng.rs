//! The project's one seeded random generator.

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A seeded generator: xoshiro256++, whose output for a seed is fixed by its published
/// algorithm, so a failing seed replays on any machine.
#[derive(Clone, Debug)]
pub struct Rng {
    inner: Xoshiro256PlusPlus,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { inner: Xoshiro256PlusPlus::seed_from_u64(seed) }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A number in `0..n`; `n` must not be zero. Lemire's multiply-shift: unbiased enough for
    /// tests and simulation (the bias is below 2^-64 * n).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no answer");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `range` (half open, not empty).
    pub fn range(&mut self, range: std::ops::Range<u64>) -> u64 {
        assert!(range.start < range.end, "an empty range {range:?}");
        range.start + self.below(range.end - range.start)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    /// Fills `bytes` with random bytes.
    pub fn fill(&mut self, bytes: &mut [u8]) {
        self.inner.fill_bytes(bytes);
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        self.fill(&mut bytes);
        bytes
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A generator of its own, seeded from this one's stream: parts of a simulation draw from
    /// their own streams, so adding a draw in one part does not shift every other part.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// The seed of a test: `$TUNDRA_SEED` when set (to replay a failure), else `default`. The seed
/// is printed, so a failure's output says how to replay it.
pub fn seed_from_env(default: u64) -> u64 {
    let seed = match std::env::var("TUNDRA_SEED") {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| panic!("TUNDRA_SEED={text:?} is not a u64")),
        Err(_) => default,
    };
    eprintln!("seed {seed} (replay with TUNDRA_SEED={seed})");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(Rng::new(8).next_u64(), xs[0]);
    }

    #[test]
    fn the_stream_is_fixed_across_versions() {
        // xoshiro256++ seeded through SplitMix64 from 0: pinned so a dependency update that
        // changed the stream (and every recorded failing seed with it) fails here first.
        let first = Rng::new(0).next_u64();
        assert_eq!(first, Rng::new(0).next_u64());
        assert_eq!(first, PINNED_FIRST_OF_SEED_0);
    }

    /// Computed independently from the published algorithm (SplitMix64 seeding, then one
    /// xoshiro256++ step) in a few lines of Python, not read back from this crate.
    const PINNED_FIRST_OF_SEED_0: u64 = 5_987_356_902_031_041_503;

    #[test]
    fn below_and_range_stay_inside() {
        let mut rng = Rng::new(1);
        for n in [1u64, 2, 3, 10, 1 << 40] {
            for _ in 0..1000 {
                assert!(rng.below(n) < n);
            }
        }
        for _ in 0..1000 {
            let x = rng.range(5..9);
            assert!((5..9).contains(&x));
        }
        let mut seen = [false; 4];
        for _ in 0..200 {
            seen[rng.below(4) as usize] = true;
        }
        assert_eq!(seen, [true; 4], "every value of a small range turns up");
    }

    #[test]
    fn chance_extremes() {
        let mut rng = Rng::new(3);
        assert!((0..1000).all(|_| !rng.chance(0.0)));
        assert!((0..1000).all(|_| rng.chance(1.0)));
        let hits = (0..10_000).filter(|_| rng.chance(0.25)).count();
        assert!((2_000..3_000).contains(&hits), "{hits} of 10000 at p = 0.25");
    }

    #[test]
    fn forks_are_deterministic_and_distinct() {
        let mut a = Rng::new(11);
        let mut b = Rng::new(11);
        let (mut fa, mut fb) = (a.fork(), b.fork());
        assert_eq!(fa.next_u64(), fb.next_u64());
        assert_ne!(a.next_u64(), fa.next_u64());
    }
}
