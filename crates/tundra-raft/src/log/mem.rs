//! A shared log in memory with the crash behaviour of a real one, for the simulation: records
//! appended since the last flush are volatile, and a crash keeps a random prefix of them (a
//! torn tail), never a record after a lost one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tundra_env::Rng;

use super::{LogMedia, LogRecord};

/// A fault the log can be told to have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFault {
    #[default]
    None,
    /// An injected bug: a flush reports success but makes durable only what the previous
    /// flush covered, as a drive with a volatile cache that ignores flushes would. The
    /// simulation's checker must catch the writes this loses.
    FlushLies,
    /// An injected bug of the node above the log: a group's entries are purged without its
    /// store's deferred applies made durable first (the host's purge guard skipped), so a
    /// crash can leave a replica whose durable state is older than its log's first entry.
    PurgeUnsynced,
    /// An injected bug of the node above the log: a leader applies (and answers) its own
    /// entries before its log made them durable ([`super::AheadBug::ApplyUnflushed`]).
    ApplyUnflushed,
    /// An injected bug of the node above the log: a leader tells its followers of commits past
    /// its own durable entries ([`super::AheadBug::CommitUnflushed`]).
    CommitUnflushed,
    /// An injected bug of the node above the log: a leader restarted with its vote committed
    /// resumes its term ([`super::AheadBug::ResumeTerm`]).
    ResumeTerm,
    /// An injected bug of the node above the log: every append carries one entry, and one cut
    /// short answers openraft that the follower took them all
    /// ([`crate::Host::set_append_claims_all`]).
    AppendClaimsAll,
    /// An injected bug of the node above the log: a leader answers a proposal as its entry
    /// enters the leader's log, before it commits ([`crate::Host::set_answer_at_append`]).
    AnswerAtAppend,
}

#[derive(Default)]
struct State {
    durable: Vec<LogRecord>,
    tail: Vec<LogRecord>,
    /// Records of the tail the previous flush should have made durable (under `FlushLies`).
    owed: usize,
}

/// An in-memory [`LogMedia`].
#[derive(Default)]
pub struct MemLog {
    state: Mutex<State>,
    fault: LogFault,
    /// Slow flushes: the chance that one takes longer, and the generator that decides.
    stalls: Mutex<Option<(Rng, f64)>>,
    /// Flushes wait until released (a medium stalled for as long as a test needs).
    held: AtomicBool,
    /// A crash loses the whole volatile tail rather than a random part of it.
    lose_tail: AtomicBool,
    stalled: std::sync::atomic::AtomicU64,
}

impl MemLog {
    pub fn new(fault: LogFault) -> MemLog {
        MemLog { state: Mutex::new(State::default()), fault, ..MemLog::default() }
    }

    /// Makes a flush take 5 to 60 ms longer with chance `chance`, drawn from `rng` (a sync
    /// that meets a busy device).
    pub fn set_stalls(&self, rng: Rng, chance: f64) {
        *self.stalls.lock() = Some((rng, chance));
    }

    /// Holds every flush until released.
    pub fn hold_flushes(&self, held: bool) {
        self.held.store(held, Ordering::Relaxed);
    }

    /// Makes the next crashes lose every record not flushed.
    pub fn lose_whole_tail(&self) {
        self.lose_tail.store(true, Ordering::Relaxed);
    }

    /// Power loss: a prefix of the volatile tail, chosen by `rng`, reaches the medium; the
    /// rest is lost. Returns how many records were lost.
    pub fn crash(&self, rng: &mut Rng) -> usize {
        let mut state = self.state.lock();
        let tail = std::mem::take(&mut state.tail);
        let kept = if self.lose_tail.load(Ordering::Relaxed) { 0 } else { rng.below(tail.len() as u64 + 1) as usize };
        let lost = tail.len() - kept;
        state.durable.extend(tail.into_iter().take(kept));
        state.owed = 0;
        lost
    }

    pub fn fault(&self) -> LogFault {
        self.fault
    }

    /// How many flushes [`MemLog::set_stalls`] made slow.
    pub fn stalled(&self) -> u64 {
        self.stalled.load(Ordering::Relaxed)
    }

    pub fn durable_records(&self) -> usize {
        self.state.lock().durable.len()
    }
}

impl LogMedia for MemLog {
    fn append(&self, records: &[LogRecord]) -> Result<(), String> {
        self.state.lock().tail.extend_from_slice(records);
        Ok(())
    }

    fn flush(&self) -> Result<(), String> {
        let mut state = self.state.lock();
        let upto = match self.fault {
            LogFault::None
            | LogFault::PurgeUnsynced
            | LogFault::ResumeTerm
            | LogFault::ApplyUnflushed
            | LogFault::CommitUnflushed
            | LogFault::AppendClaimsAll
            | LogFault::AnswerAtAppend => state.tail.len(),
            LogFault::FlushLies => {
                let len = state.tail.len();
                std::mem::replace(&mut state.owed, len).min(len)
            }
        };
        let flushed: Vec<LogRecord> = state.tail.drain(..upto).collect();
        state.owed -= upto.min(state.owed);
        state.durable.extend(flushed);
        Ok(())
    }

    fn replay(&self) -> Result<Vec<LogRecord>, String> {
        let state = self.state.lock();
        Ok(state.durable.clone())
    }

    fn flush_stall(&self) -> Duration {
        let mut stalls = self.stalls.lock();
        let Some((rng, chance)) = stalls.as_mut() else { return Duration::ZERO };
        if !rng.chance(*chance) {
            return Duration::ZERO;
        }
        self.stalled.fetch_add(1, Ordering::Relaxed);
        Duration::from_millis(rng.range(5..60))
    }

    fn flush_held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }
}
