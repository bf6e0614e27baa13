//! A shared log in memory with the crash behaviour of a real one, for the simulation: records
//! appended since the last flush are volatile, and a crash keeps a random prefix of them (a
//! torn tail), never a record after a lost one.

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
    /// An injected bug of the node above the log: a leader that resumed its term after a
    /// restart reads before it applied its log as it held it at start.
    ReadsBeforeCatchUp,
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
}

impl MemLog {
    pub fn new(fault: LogFault) -> MemLog {
        MemLog { state: Mutex::new(State::default()), fault }
    }

    /// Power loss: a prefix of the volatile tail, chosen by `rng`, reaches the medium; the
    /// rest is lost. Returns how many records were lost.
    pub fn crash(&self, rng: &mut Rng) -> usize {
        let mut state = self.state.lock();
        let tail = std::mem::take(&mut state.tail);
        let kept = rng.below(tail.len() as u64 + 1) as usize;
        let lost = tail.len() - kept;
        state.durable.extend(tail.into_iter().take(kept));
        state.owed = 0;
        lost
    }

    pub fn fault(&self) -> LogFault {
        self.fault
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
            LogFault::None | LogFault::PurgeUnsynced | LogFault::ReadsBeforeCatchUp => state.tail.len(),
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
}
