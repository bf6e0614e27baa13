//! The async runtime openraft runs on: tokio, with the one random choice openraft makes (the
//! length of each election timeout) drawn from a seeded `tundra_env::Rng` instead of the
//! operating system's entropy.
//!
//! That is what makes a simulated cluster a function of its seed: on a current-thread tokio
//! runtime with its clock paused, tasks run in the order they were woken and time moves only
//! when every task waits, so the remaining source of difference between two runs was this
//! generator (see ARCHITECTURE.md, "Replication"). A real node seeds it from the clock.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioInstant};

thread_local! {
    static RAFT_RNG: RefCell<Option<tundra_env::Rng>> = const { RefCell::new(None) };
}

/// Seeds the generator openraft draws election timeouts from, on this thread. The simulation
/// calls it before it builds a cluster; a thread never seeded draws from a clock seed.
pub fn seed_thread_rng(seed: u64) {
    RAFT_RNG.with(|rng| *rng.borrow_mut() = Some(tundra_env::Rng::new(seed)));
}

pub(crate) fn next_u64() -> u64 {
    RAFT_RNG.with(|rng| {
        let mut rng = rng.borrow_mut();
        let rng = rng.get_or_insert_with(|| {
            let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            tundra_env::Rng::new(clock as u64)
        });
        rng.next_u64()
    })
}

/// The thread's seeded generator, as the `rand` interface openraft asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRng;

impl rand::RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        (next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            chunk.copy_from_slice(&next_u64().to_le_bytes()[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// Tokio with a seeded generator (see the module's overview).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeededTokio;

impl AsyncRuntime for SeededTokio {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = ThreadRng;
    type OneshotSender<T: OptionalSend> = openraft::async_runtime::TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (openraft::async_runtime::TokioOneShotSender(tx), rx)
    }
}
