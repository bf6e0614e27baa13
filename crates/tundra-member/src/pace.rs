//! The pace of a chunk move's catch-up traffic (seed 000 §4.2: migrations are throttled so
//! that clients keep their I/O), one budget per node of `[cluster] move_bytes_per_sec`.
//!
//! Two places draw on it. While a chunk's leader adds a learner (a move's target), the
//! snapshot of the chunk's compressed images it sends that learner waits until its bytes, after
//! those reserved before, would have taken their time at the rate (at most [`WAIT_MAX`]).
//! Log entries are not held back: openraft gives an append the heartbeat interval to answer,
//! and a delayed one would be sent again. So the executor also paces (rebalance.rs): a move
//! that took less than its chunk's physical bytes at the rate is followed by a pause until it
//! did. Messages to voters, which carry clients' writes, never wait.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The longest a message waits: well within the transport's time for an answer and the
/// time a learner has to catch up.
pub const WAIT_MAX: Duration = Duration::from_secs(8);

/// One node's budget for catch-up traffic.
#[derive(Debug, Default)]
pub struct CatchUpPace {
    /// 0: unlimited.
    bytes_per_sec: AtomicU64,
    state: Mutex<PaceState>,
}

#[derive(Debug, Default)]
struct PaceState {
    /// (chunk group, learner) pairs catching up now, with how many adds of each are running.
    learners: BTreeMap<(u64, u64), usize>,
    /// When the bytes reserved so far will have been sent at the rate.
    free_at: Option<Instant>,
    /// Bytes paced since the node started, and the time they waited.
    paced_bytes: u64,
    waited: Duration,
}

impl CatchUpPace {
    pub fn set_rate(&self, bytes_per_sec: u64) {
        self.bytes_per_sec.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// Marks `learner` of `group` as catching up until the guard drops.
    pub fn catching_up(self: &std::sync::Arc<Self>, group: u64, learner: u64) -> CatchingUp {
        *self.state.lock().learners.entry((group, learner)).or_insert(0) += 1;
        CatchingUp { pace: self.clone(), key: (group, learner) }
    }

    /// Whether messages of `group` to `to` are paced now.
    pub fn paces(&self, group: u64, to: u64) -> bool {
        self.bytes_per_sec.load(Ordering::Relaxed) > 0 && self.state.lock().learners.contains_key(&(group, to))
    }

    /// Reserves `bytes` of the budget and answers how long to wait before sending them: until
    /// they would have been sent at the rate, after the bytes reserved before them.
    pub fn reserve(&self, bytes: u64) -> Duration {
        let rate = self.bytes_per_sec.load(Ordering::Relaxed);
        if rate == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        let start = state.free_at.filter(|&at| at > now).unwrap_or(now);
        let takes = Duration::from_secs_f64(bytes as f64 / rate as f64);
        state.free_at = Some(start + takes);
        let wait = (start + takes - now).min(WAIT_MAX);
        state.paced_bytes += bytes;
        state.waited += wait;
        wait
    }

    /// Bytes paced and the time they waited, since the node started.
    pub fn totals(&self) -> (u64, Duration) {
        let state = self.state.lock();
        (state.paced_bytes, state.waited)
    }
}

/// A learner catching up; dropping it ends the pacing of its messages.
pub struct CatchingUp {
    pace: std::sync::Arc<CatchUpPace>,
    key: (u64, u64),
}

impl Drop for CatchingUp {
    fn drop(&mut self) {
        let mut state = self.pace.state.lock();
        if let Some(count) = state.learners.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                state.learners.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `wait` is `expected`, less the little time the test itself took.
    fn about(wait: Duration, expected: Duration) -> bool {
        wait <= expected && wait + Duration::from_millis(200) >= expected
    }

    #[test]
    fn paced_bytes_take_their_time_at_the_rate() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let _entered = runtime.enter();
        let pace = std::sync::Arc::new(CatchUpPace::default());
        pace.set_rate(1 << 20);
        assert!(!pace.paces(7, 2), "nothing is paced before a learner catches up");
        let guard = pace.catching_up(7, 2);
        assert!(pace.paces(7, 2) && !pace.paces(7, 3) && !pace.paces(8, 2));
        let first = pace.reserve(1 << 20);
        assert!(about(first, Duration::from_secs(1)), "a MiB takes a second: {first:?}");
        let second = pace.reserve(1 << 19);
        assert!(about(second, Duration::from_millis(1500)), "the second waits for the first: {second:?}");
        assert_eq!(pace.reserve(1 << 40), WAIT_MAX, "no message waits past the limit");
        assert_eq!(pace.totals().0, (1 << 20) + (1 << 19) + (1 << 40));
        drop(guard);
        assert!(!pace.paces(7, 2), "the pacing ends with the catch-up");
        pace.set_rate(0);
        assert!(!pace.paces(7, 2));
        assert_eq!(pace.reserve(u64::MAX), Duration::ZERO, "0 is unlimited");
    }
}
