//! Reader leases and LSN_min (seed 000 §2.1): each read-only node holds a lease
//! on the LSN it reads at, and LSN_min, the oldest LSN any reader may still read at, is the
//! minimum over live leases and the durable LSN. Pages are folded only up to LSN_min, so a
//! lease is what keeps a reader's versions buildable.
//!
//! Leases are soft state with a time to live: a reader renews its lease with its apply LSN
//! (which never goes back), and a reader that stops renewing (it crashed, its network broke)
//! stops holding LSN_min back once its lease expires. A reader further than the maximum lag
//! behind the durable LSN loses its lease and is told to resync, so one slow reader cannot
//! stall materialization for the whole volume. LSN_min never moves backwards.
//!
//! The table is I/O-free: time comes from the injected [`Clock`], lease ids from the injected
//! random stream, and the owner publishes [`Leases::lsn_min`] to the volume's
//! [`crate::PageVersions`]. Leases are not persisted: after a restart,
//! [`Leases::restarted`] holds the last published LSN_min for one time to live, so readers can
//! register again before folding passes them (Neon blocks GC after a restart for the same
//! reason).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tundra_env::{Clock, Env, Rng};
use tundra_store::ids::Lsn;
use tundra_store::store::Watermarks;

use crate::versions::{Bug, injected};

/// Ended leases remembered, so that a late renewal hears why its lease ended.
const ENDED_KEPT: usize = 4096;

/// A reader: a read-only compute node, named by its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReaderId(pub u64);

/// A lease's id: random, so an id from before a restart does not name a new reader's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// How leases behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a lease lives without a renewal. Readers renew well within it (a third of it
    /// is the usual choice), so that one lost renewal does not cost the lease.
    pub ttl: Duration,
    /// How far (in LSN units) behind the durable LSN a reader may be before its lease is
    /// revoked.
    pub max_lag: u64,
}

impl Default for LeaseConfig {
    /// A crashed reader holds folding back for at most 30 s; a reader may lag by 1 GiB of
    /// stream (when LSNs count bytes of redo, as they do for the reference compute node).
    fn default() -> LeaseConfig {
        LeaseConfig { ttl: Duration::from_secs(30), max_lag: 1 << 30 }
    }
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// The LSN the lease holds: the reader may read at it and above.
    pub granted_lsn: Lsn,
    /// The lease ends at this time of the table's clock unless renewed.
    pub valid_until: Duration,
}

/// What a renewal answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub valid_until: Duration,
    /// LSN_min after the renewal.
    pub lsn_min: Lsn,
}

/// Why a lease was refused or ended. Each message tells the reader what to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseRefusal {
    #[error("start LSN {start_lsn} is below LSN_min {lsn_min}: start the reader at LSN {lsn_min} or later")]
    TooOld { start_lsn: Lsn, lsn_min: Lsn },
    #[error(
        "the reader is at LSN {lsn}, further than {max_lag} behind the durable LSN {durable_lsn}: \
         its lease is revoked; resync it from a recent LSN and register again"
    )]
    Lagging { lsn: Lsn, durable_lsn: Lsn, max_lag: u64 },
    #[error(
        "lease {0} expired without a renewal: versions it held may be gone; resync the reader \
         from a recent LSN and register again"
    )]
    Expired(LeaseId),
    #[error("lease {0} is not held (released, replaced or never granted here): register again")]
    Unknown(LeaseId),
    #[error("apply LSN {apply_lsn} is below the lease's {held_lsn}: a reader's apply LSN never goes back")]
    Backwards { apply_lsn: Lsn, held_lsn: Lsn },
}

#[derive(Clone, Copy, Debug)]
struct Held {
    reader: ReaderId,
    apply_lsn: Lsn,
    valid_until: Duration,
}

/// How a lease ended, kept for a while to answer a late renewal.
#[derive(Clone, Copy, Debug)]
enum Ended {
    Released,
    Expired,
    Revoked(LeaseRefusal),
}

/// The leases of one volume and its LSN_min.
pub struct Leases {
    clock: Arc<dyn Clock>,
    rng: Rng,
    config: LeaseConfig,
    live: BTreeMap<LeaseId, Held>,
    by_reader: BTreeMap<ReaderId, LeaseId>,
    ended: BTreeMap<LeaseId, Ended>,
    /// After a restart: the LSN_min published before it, held until the time given.
    restart_hold: Option<(Lsn, Duration)>,
    durable_lsn: Lsn,
    lsn_min: Lsn,
}

impl Leases {
    /// A volume no reader reads yet: LSN_min is the durable LSN until one registers.
    pub fn new(env: &Env, config: LeaseConfig, durable_lsn: Lsn) -> Leases {
        assert!(config.ttl > Duration::ZERO, "a lease lives for some time");
        Leases {
            clock: env.clock.clone(),
            rng: env.fork_rng(),
            config,
            live: BTreeMap::new(),
            by_reader: BTreeMap::new(),
            ended: BTreeMap::new(),
            restart_hold: None,
            durable_lsn,
            lsn_min: durable_lsn,
        }
    }

    /// The table after a restart, from the volume's journalled watermarks: LSN_min stays at
    /// `marks.min_reader_lsn` for one time to live, while readers register again.
    pub fn restarted(env: &Env, config: LeaseConfig, marks: Watermarks) -> Leases {
        let mut leases = Leases::new(env, config, marks.durable_lsn);
        let until = leases.clock.now() + config.ttl;
        leases.restart_hold = Some((marks.min_reader_lsn, until));
        leases.lsn_min = marks.min_reader_lsn.min(marks.durable_lsn);
        leases
    }

    /// A reader asks for a lease at `start_lsn`. A reader that holds a lease already gives it
    /// up (it restarted). A start above the durable LSN is granted: reads there wait until
    /// the stream gets there.
    pub fn register(&mut self, reader: ReaderId, start_lsn: Lsn) -> Result<Lease, LeaseRefusal> {
        self.expire();
        if start_lsn < self.lsn_min {
            return Err(LeaseRefusal::TooOld { start_lsn, lsn_min: self.lsn_min });
        }
        if let Some(refusal) = self.lag_refusal(start_lsn) {
            return Err(refusal);
        }
        if let Some(previous) = self.by_reader.get(&reader).copied() {
            self.end(previous, Ended::Released);
        }
        let id = self.new_id();
        let valid_until = self.clock.now() + self.config.ttl;
        self.live.insert(id, Held { reader, apply_lsn: start_lsn, valid_until });
        self.by_reader.insert(reader, id);
        self.refresh_lsn_min();
        Ok(Lease { id, granted_lsn: start_lsn, valid_until })
    }

    /// The reader of lease `id` has applied the stream up to `apply_lsn` (never less than
    /// before) and keeps reading: the lease lives another time to live and holds `apply_lsn`.
    pub fn renew(&mut self, id: LeaseId, apply_lsn: Lsn) -> Result<Renewed, LeaseRefusal> {
        self.expire();
        let Some(held) = self.live.get(&id).copied() else {
            return Err(match self.ended.get(&id) {
                Some(Ended::Expired) => LeaseRefusal::Expired(id),
                Some(Ended::Revoked(refusal)) => *refusal,
                Some(Ended::Released) | None => LeaseRefusal::Unknown(id),
            });
        };
        if apply_lsn < held.apply_lsn {
            return Err(LeaseRefusal::Backwards { apply_lsn, held_lsn: held.apply_lsn });
        }
        if let Some(refusal) = self.lag_refusal(apply_lsn) {
            self.end(id, Ended::Revoked(refusal));
            self.refresh_lsn_min();
            return Err(refusal);
        }
        let valid_until = self.clock.now() + self.config.ttl;
        self.live.insert(id, Held { apply_lsn, valid_until, ..held });
        self.refresh_lsn_min();
        Ok(Renewed { valid_until, lsn_min: self.lsn_min })
    }

    /// The reader is done: its lease stops holding LSN_min at once. False when the lease was
    /// not held (already ended, or unknown).
    pub fn release(&mut self, id: LeaseId) -> bool {
        let held = self.live.contains_key(&id);
        if held {
            self.end(id, Ended::Released);
            self.refresh_lsn_min();
        }
        held
    }

    /// The stream is durable to `lsn` (forward only). Readers now too far behind lose their
    /// leases; their ids are returned.
    pub fn durable(&mut self, lsn: Lsn) -> Vec<LeaseId> {
        self.durable_lsn = self.durable_lsn.max(lsn);
        self.expire()
    }

    /// Ends the leases whose time ran out and those too far behind the durable LSN, and
    /// returns their ids. Every other method does this first, so LSN_min never counts a lease
    /// the clock says has ended. A volume has a handful of readers, so a scan costs less than
    /// keeping the leases in a second order by expiry.
    pub fn expire(&mut self) -> Vec<LeaseId> {
        let now = self.clock.now();
        let mut ended = Vec::new();
        let ids: Vec<(LeaseId, Held)> = self.live.iter().map(|(id, held)| (*id, *held)).collect();
        for (id, held) in ids {
            if held.valid_until <= now {
                self.end(id, Ended::Expired);
                ended.push(id);
            } else if let Some(refusal) = self.lag_refusal(held.apply_lsn) {
                self.end(id, Ended::Revoked(refusal));
                ended.push(id);
            }
        }
        if self.restart_hold.is_some_and(|(_, until)| until <= now) {
            self.restart_hold = None;
        }
        self.refresh_lsn_min();
        ended
    }

    /// LSN_min: the minimum of the durable LSN and every live lease's LSN (and, for one time to
    /// live after a restart, the LSN_min of before), never lower than it was.
    pub fn lsn_min(&mut self) -> Lsn {
        self.expire();
        self.lsn_min
    }

    /// Live leases, after expiring those whose time ran out.
    pub fn live_count(&mut self) -> usize {
        self.expire();
        self.live.len()
    }

    pub fn durable_lsn(&self) -> Lsn {
        self.durable_lsn
    }

    pub fn config(&self) -> LeaseConfig {
        self.config
    }

    fn lag_refusal(&self, lsn: Lsn) -> Option<LeaseRefusal> {
        let lag = self.durable_lsn.0.saturating_sub(lsn.0);
        (lag > self.config.max_lag).then_some(LeaseRefusal::Lagging {
            lsn,
            durable_lsn: self.durable_lsn,
            max_lag: self.config.max_lag,
        })
    }

    fn end(&mut self, id: LeaseId, how: Ended) {
        let held = self.live.remove(&id).expect("only a live lease ends");
        if self.by_reader.get(&held.reader) == Some(&id) {
            self.by_reader.remove(&held.reader);
        }
        self.ended.insert(id, how);
        // Ids are random, so the oldest ended lease is not the smallest id; forgetting any is
        // fine: a renewal of a forgotten lease hears "not held" and registers again.
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_first();
        }
    }

    fn new_id(&mut self) -> LeaseId {
        loop {
            let id = LeaseId(self.rng.next_u64());
            if !self.live.contains_key(&id) && !self.ended.contains_key(&id) {
                return id;
            }
        }
    }

    fn refresh_lsn_min(&mut self) {
        if injected(Bug::LsnMinPassesReaders) {
            self.lsn_min = self.lsn_min.max(self.durable_lsn);
            return;
        }
        let leases = self.live.values().map(|held| held.apply_lsn);
        let hold = self.restart_hold.map(|(lsn, _)| lsn);
        let lowest = leases.chain(hold).fold(self.durable_lsn, Lsn::min);
        self.lsn_min = self.lsn_min.max(lowest);
    }
}

#[cfg(test)]
mod tests;
