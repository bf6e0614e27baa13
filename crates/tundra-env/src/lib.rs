//! The environment a node runs in: everything that would make two runs differ.
//!
//! A run of Tundra is replayable only if every source of nondeterminism can be replaced. This
//! crate names those sources and gives each a real and a simulated implementation:
//!
//! - [`Clock`]: monotonic time ([`SystemClock`] reads the machine's, [`ManualClock`] moves only
//!   when told to);
//! - [`Rng`]: the one seeded random generator of the project (segment nonces, simulation,
//!   every test), xoshiro256++ from `rand_xoshiro`, so the same seed gives the same numbers on
//!   every machine and every version;
//! - [`CpuGauge`]: the host's CPU utilisation that Algorithm 1 looks at (seed 000 §3.3.2,
//!   line 2), real from /proc/stat in the codec crate or [`FixedCpu`] here.
//!
//! [`Env`] bundles them. Code that needs time, randomness or the CPU load takes them from an
//! `Env` it was given, never from the operating system directly, so that a whole node built
//! over memory devices with [`Env::simulated`] is a pure function of its seed.

mod clock;
mod rng;

use std::sync::Arc;

pub use clock::{Clock, ManualClock, SystemClock};
use parking_lot_free::Mutex;
pub use rng::{Rng, seed_from_env};

/// The host's CPU utilisation as a busy fraction in [0, 1].
pub trait CpuGauge: Send + Sync {
    /// The busy fraction since the previous call; an error when it cannot be read.
    fn busy_fraction(&self) -> Result<f64, String>;
}

/// A CPU load that never changes: an idle or a busy host, for tests, tools and simulation.
#[derive(Clone, Copy, Debug)]
pub struct FixedCpu(pub f64);

impl CpuGauge for FixedCpu {
    fn busy_fraction(&self) -> Result<f64, String> {
        Ok(self.0)
    }
}

/// The sources of nondeterminism one node (or one test) uses.
#[derive(Clone)]
pub struct Env {
    pub clock: Arc<dyn Clock>,
    rng: Arc<Mutex<Rng>>,
    pub cpu: Arc<dyn CpuGauge>,
}

impl Env {
    /// An environment from its parts.
    pub fn new(clock: Arc<dyn Clock>, rng: Rng, cpu: Arc<dyn CpuGauge>) -> Env {
        Env { clock, rng: Arc::new(Mutex::new(rng)), cpu }
    }

    /// A simulated environment: a manual clock at zero, randomness from `seed`, an idle CPU.
    /// Everything built on it is a function of the seed and of what the caller does.
    pub fn simulated(seed: u64) -> Env {
        Env::new(Arc::new(ManualClock::default()), Rng::new(seed), Arc::new(FixedCpu(0.0)))
    }

    /// The next number of the environment's random stream.
    pub fn next_u64(&self) -> u64 {
        self.rng.lock().next_u64()
    }

    /// A generator of its own, split off the environment's stream (deterministic given the
    /// environment's seed and the order of calls).
    pub fn fork_rng(&self) -> Rng {
        self.rng.lock().fork()
    }
}

mod parking_lot_free {
    //! A poison-free mutex over std's: a panic while holding it leaves the generator usable,
    //! which is all a random stream needs.
    pub struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Mutex<T> {
            Mutex(std::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }
}
