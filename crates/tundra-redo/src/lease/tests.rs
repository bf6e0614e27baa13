//! Leases on a manual clock: expiry, the lag cap, restarts, and a seeded model test that checks
//! LSN_min against the live leases after every operation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tundra_env::{Env, FixedCpu, ManualClock, Rng, seed_from_env};

use super::*;
use crate::versions::{Bug, inject};

const TTL: Duration = Duration::from_secs(10);

fn table(durable: u64, max_lag: u64) -> (Leases, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let env = Env::new(clock.clone(), Rng::new(7), Arc::new(FixedCpu(0.0)));
    (Leases::new(&env, LeaseConfig { ttl: TTL, max_lag }, Lsn(durable)), clock)
}

#[test]
fn lsn_min_is_the_slowest_live_reader_and_the_durable_lsn_without_readers() {
    let (mut leases, clock) = table(100, 1000);
    assert_eq!(leases.lsn_min(), Lsn(100));
    let a = leases.register(ReaderId(1), Lsn(100)).unwrap();
    assert_eq!((a.granted_lsn, a.valid_until), (Lsn(100), TTL));
    leases.durable(Lsn(200));
    let b = leases.register(ReaderId(2), Lsn(150)).unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(leases.lsn_min(), Lsn(100));
    clock.advance(Duration::from_secs(1));
    let renewed = leases.renew(a.id, Lsn(180)).unwrap();
    assert_eq!(renewed, Renewed { valid_until: TTL + Duration::from_secs(1), lsn_min: Lsn(150) });
    assert!(leases.release(b.id));
    assert!(!leases.release(b.id), "released twice");
    assert_eq!(leases.lsn_min(), Lsn(180));
    assert_eq!(leases.live_count(), 1);
    assert_eq!(leases.renew(b.id, Lsn(190)), Err(LeaseRefusal::Unknown(b.id)));
}

#[test]
fn a_start_below_lsn_min_is_too_old() {
    let (mut leases, _) = table(100, 1000);
    let refusal = leases.register(ReaderId(1), Lsn(99)).unwrap_err();
    assert_eq!(refusal, LeaseRefusal::TooOld { start_lsn: Lsn(99), lsn_min: Lsn(100) });
    assert!(refusal.to_string().contains("start the reader at LSN 100 or later"), "{refusal}");
    // Above the durable LSN is granted: the reader's reads wait for the stream.
    assert!(leases.register(ReaderId(1), Lsn(120)).is_ok());
}

#[test]
fn a_reader_that_stops_renewing_stops_holding_lsn_min_after_its_ttl() {
    let (mut leases, clock) = table(10, 1000);
    let crashed = leases.register(ReaderId(1), Lsn(10)).unwrap();
    let alive = leases.register(ReaderId(2), Lsn(10)).unwrap();
    leases.durable(Lsn(50));
    for _ in 0..3 {
        clock.advance(TTL / 3);
        leases.renew(alive.id, Lsn(40)).unwrap();
        assert_eq!(leases.lsn_min(), Lsn(10), "the crashed reader's lease is still live");
    }
    clock.advance(TTL / 3);
    assert_eq!(leases.lsn_min(), Lsn(40));
    let refusal = leases.renew(crashed.id, Lsn(20)).unwrap_err();
    assert_eq!(refusal, LeaseRefusal::Expired(crashed.id));
    assert!(refusal.to_string().contains("resync"), "{refusal}");
    assert_eq!(leases.live_count(), 1);
}

#[test]
fn a_lease_ends_exactly_at_its_valid_until() {
    let (mut leases, clock) = table(10, 1000);
    let lease = leases.register(ReaderId(1), Lsn(10)).unwrap();
    clock.advance(TTL - Duration::from_nanos(1));
    assert!(leases.renew(lease.id, Lsn(10)).is_ok());
    clock.advance(TTL);
    assert_eq!(leases.expire(), vec![lease.id]);
    assert_eq!(leases.renew(lease.id, Lsn(10)), Err(LeaseRefusal::Expired(lease.id)));
}

#[test]
fn a_reader_past_the_maximum_lag_loses_its_lease_and_is_told_to_resync() {
    let (mut leases, _) = table(100, 50);
    let slow = leases.register(ReaderId(1), Lsn(100)).unwrap();
    let fast = leases.register(ReaderId(2), Lsn(100)).unwrap();
    assert_eq!(leases.durable(Lsn(150)), vec![], "exactly the maximum lag is allowed");
    leases.renew(fast.id, Lsn(150)).unwrap();
    assert_eq!(leases.durable(Lsn(151)), vec![slow.id]);
    assert_eq!(leases.lsn_min(), Lsn(150), "the slow reader no longer holds LSN_min");
    let refusal = leases.renew(slow.id, Lsn(120)).unwrap_err();
    assert_eq!(refusal, LeaseRefusal::Lagging { lsn: Lsn(100), durable_lsn: Lsn(151), max_lag: 50 });
    assert!(refusal.to_string().contains("resync it from a recent LSN"), "{refusal}");
    // A renewal that is itself too far behind revokes the lease at once.
    leases.durable(Lsn(260));
    assert!(matches!(leases.renew(fast.id, Lsn(200)), Err(LeaseRefusal::Lagging { .. })));
    assert_eq!(leases.live_count(), 0);
    // And a registration that far behind is refused.
    assert!(matches!(leases.register(ReaderId(3), Lsn(260 - 51)), Err(LeaseRefusal::TooOld { .. })));
    let (mut fresh, _) = table(100, 50);
    fresh.durable(Lsn(200));
    assert!(matches!(fresh.register(ReaderId(3), Lsn(149)), Err(LeaseRefusal::TooOld { .. })));
}

#[test]
fn an_apply_lsn_going_back_is_refused_and_keeps_the_lease() {
    let (mut leases, _) = table(10, 1000);
    let lease = leases.register(ReaderId(1), Lsn(10)).unwrap();
    leases.durable(Lsn(30));
    leases.renew(lease.id, Lsn(20)).unwrap();
    let refusal = leases.renew(lease.id, Lsn(19)).unwrap_err();
    assert_eq!(refusal, LeaseRefusal::Backwards { apply_lsn: Lsn(19), held_lsn: Lsn(20) });
    assert_eq!(leases.lsn_min(), Lsn(20));
    assert!(leases.renew(lease.id, Lsn(20)).is_ok(), "the same LSN again is fine");
}

#[test]
fn a_reader_registering_again_replaces_its_lease() {
    let (mut leases, _) = table(10, 1000);
    let old = leases.register(ReaderId(1), Lsn(10)).unwrap();
    leases.durable(Lsn(40));
    let new = leases.register(ReaderId(1), Lsn(40)).unwrap();
    assert_eq!(leases.live_count(), 1);
    assert_eq!(leases.lsn_min(), Lsn(40), "the restarted reader's old lease no longer holds 10");
    assert_eq!(leases.renew(old.id, Lsn(40)), Err(LeaseRefusal::Unknown(old.id)));
    assert!(leases.renew(new.id, Lsn(40)).is_ok());
}

#[test]
fn after_a_restart_lsn_min_is_held_for_one_ttl_while_readers_return() {
    let clock = Arc::new(ManualClock::default());
    let env = Env::new(clock.clone(), Rng::new(3), Arc::new(FixedCpu(0.0)));
    let marks = Watermarks { durable_lsn: Lsn(500), min_reader_lsn: Lsn(300) };
    let mut leases = Leases::restarted(&env, LeaseConfig { ttl: TTL, max_lag: 1000 }, marks);
    assert_eq!(leases.lsn_min(), Lsn(300));
    // A reader of before the restart registers again at its LSN.
    let back = leases.register(ReaderId(1), Lsn(350)).unwrap();
    clock.advance(TTL / 2);
    assert_eq!(leases.lsn_min(), Lsn(300), "the hold still covers readers not back yet");
    leases.renew(back.id, Lsn(360)).unwrap();
    clock.advance(TTL / 2);
    assert_eq!(leases.lsn_min(), Lsn(360), "the hold ended");
    assert!(matches!(leases.register(ReaderId(2), Lsn(320)), Err(LeaseRefusal::TooOld { .. })));
}

/// The model: which leases are live, whose and at what LSN, and the LSN_min they give.
#[derive(Default)]
struct Model {
    live: BTreeMap<LeaseId, (ReaderId, Lsn, Duration)>,
    durable: Lsn,
    lsn_min: Lsn,
}

impl Model {
    fn settle(&mut self, now: Duration, max_lag: u64) {
        let durable = self.durable;
        self.live.retain(|_, (_, lsn, until)| *until > now && durable.0.saturating_sub(lsn.0) <= max_lag);
        let lowest = self.live.values().map(|(_, lsn, _)| *lsn).fold(durable, Lsn::min);
        self.lsn_min = self.lsn_min.max(lowest);
    }

    fn held(&self, id: LeaseId) -> Option<Lsn> {
        self.live.get(&id).map(|(_, lsn, _)| *lsn)
    }
}

/// Random registrations, renewals, releases, time and stream movements; after each, the
/// table's answer, its LSN_min and its live leases equal the model's, and no live lease is
/// below LSN_min. `Err` names the first difference.
fn run_lease_model(seed: u64, steps: usize) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let max_lag = 40;
    let (mut leases, clock) = table(0, max_lag);
    let mut model = Model::default();
    let mut known: Vec<LeaseId> = Vec::new();
    for step in 0..steps {
        match rng.below(6) {
            0 => {
                let reader = ReaderId(rng.below(4));
                let start = Lsn((model.lsn_min.0 + rng.below(10)).saturating_sub(rng.below(3) * 3));
                match leases.register(reader, start) {
                    Ok(lease) if start >= model.lsn_min => {
                        model.live.retain(|_, (owner, _, _)| *owner != reader);
                        model.live.insert(lease.id, (reader, start, lease.valid_until));
                        known.push(lease.id);
                    }
                    Err(LeaseRefusal::TooOld { .. }) if start < model.lsn_min => {}
                    answer => return Err(format!("step {step}: register at {start}: {answer:?}")),
                }
            }
            1 | 2 if !known.is_empty() => {
                let id = *rng.pick(&known);
                let held = model.held(id);
                let apply = Lsn((held.unwrap_or(model.lsn_min).0 + rng.below(8)).saturating_sub(rng.below(4) * 3));
                let lagging = model.durable.0.saturating_sub(apply.0) > max_lag;
                match (leases.renew(id, apply), held) {
                    (Ok(renewed), Some(lsn)) if apply >= lsn && !lagging => {
                        let reader = model.live[&id].0;
                        model.live.insert(id, (reader, apply, renewed.valid_until));
                    }
                    (Err(LeaseRefusal::Backwards { .. }), Some(lsn)) if apply < lsn => {}
                    (Err(LeaseRefusal::Lagging { .. }), Some(lsn)) if apply >= lsn && lagging => {
                        model.live.remove(&id);
                    }
                    (Err(LeaseRefusal::Expired(_) | LeaseRefusal::Unknown(_) | LeaseRefusal::Lagging { .. }), None) => {
                    }
                    (answer, held) => {
                        return Err(format!("step {step}: renew {id:?} held {held:?} at {apply}: {answer:?}"));
                    }
                }
            }
            3 if !known.is_empty() => {
                let id = *rng.pick(&known);
                if leases.release(id) != model.live.remove(&id).is_some() {
                    return Err(format!("step {step}: release of {id:?} disagrees"));
                }
            }
            4 => {
                model.durable = Lsn(model.durable.0 + rng.below(12));
                leases.durable(model.durable);
            }
            _ => clock.advance(Duration::from_millis(rng.below(4000))),
        }
        model.settle(clock.now(), max_lag);
        let lsn_min = leases.lsn_min();
        if lsn_min != model.lsn_min {
            return Err(format!("step {step}: LSN_min {lsn_min}, the model says {}", model.lsn_min));
        }
        if let Some((id, (_, lsn, _))) = model.live.iter().find(|(_, (_, lsn, _))| *lsn < lsn_min) {
            return Err(format!("step {step}: live lease {id:?} at {lsn} is below LSN_min {lsn_min}"));
        }
        let live: Vec<LeaseId> = leases.live.keys().copied().collect();
        if live != model.live.keys().copied().collect::<Vec<_>>() {
            return Err(format!("step {step}: live leases {live:?}, the model has {:?}", model.live.keys()));
        }
    }
    Ok(())
}

fn lease_model_runs() -> (u64, usize) {
    let runs = std::env::var("TUNDRA_MODEL_RUNS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(20);
    (runs, 400)
}

#[test]
fn lsn_min_matches_the_model_and_never_passes_a_live_reader() {
    let seed = seed_from_env(0x1ea5e);
    let (runs, steps) = lease_model_runs();
    for run in 0..runs {
        run_lease_model(seed + run, steps).unwrap_or_else(|e| panic!("seed {}: {e}", seed + run));
    }
}

/// The model check catches the bug it guards against: LSN_min following the durable LSN over
/// the readers' heads.
#[test]
fn the_lease_model_fails_when_lsn_min_passes_readers() {
    let _bug = inject(Bug::LsnMinPassesReaders);
    let failed = (0..20).any(|run| run_lease_model(run, 400).is_err());
    assert!(failed, "the injected bug went unnoticed");
}
