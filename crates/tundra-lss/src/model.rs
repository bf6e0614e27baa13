//! The fast model: the workload driven through [`LogCore`] with no device, counting instead of
//! writing. It takes exactly the decisions the store takes (the same core, the same order of
//! events, flushes at the same points), so at the scale the store runs it gives the store's
//! counts, and at Table 1's scale (64 MB segments, millions of elements) it runs in seconds.
//!
//! Physical space here is slots whose bytes are on the media (live and dead, not cleared) times
//! the slot size: elements that do not compress, each sector costing what its uncleared slots
//! hold. The store measures the same thing from the drive's own accounting instead.

use crate::core::{Action, LogCore, WriteKind};
use crate::error::Result;
use crate::geometry::SlotAddr;
use crate::meter::{Figures, Meter};
use crate::workload::{RunConfig, UpdateWorkload};

const NOWHERE: u32 = u32::MAX;

/// Runs the workload of `config` through the policy and returns the measured window's figures.
pub fn run_model(config: &RunConfig) -> Result<Figures> {
    let geometry = config.geometry()?;
    let mut core = LogCore::new(geometry, config.policy)?;
    let elements = config.elements() as usize;
    // Where each element lives, and which element each slot holds: what the store keeps in its
    // index and reads back from the media.
    let mut location = vec![NOWHERE; elements];
    let mut owner = vec![NOWHERE; geometry.total_slots() as usize];
    let mut workload = UpdateWorkload::new(config.elements(), config.seed);
    let slot_bytes = u64::from(geometry.slot_bytes);
    let warmup = config.warmup_writes();
    let mut meter = Meter::default();
    let mut start = core.counters();
    for written in 0..warmup + config.measured_writes() {
        if written == warmup {
            start = core.counters();
            meter = Meter::default();
        }
        let key = workload.next_key() as usize;
        let new = core.place(WriteKind::User)?;
        let old = std::mem::replace(&mut location[key], new.0 as u32);
        owner[new.0 as usize] = key as u32;
        if old != NOWHERE {
            core.kill(SlotAddr(u64::from(old)));
        }
        maintain(&mut core, &mut location, &mut owner, &mut meter, slot_bytes)?;
        if written >= warmup && (written - warmup).is_multiple_of(config.sample_every) {
            let live = core.live_slots_total() * slot_bytes;
            meter.sample(core.physical_slots() * slot_bytes, core.footprint_slots() * slot_bytes, live);
        }
    }
    Ok(Figures::from_window(&start, &core.counters(), geometry.slot_bytes, &meter))
}

/// Carries out the core's actions as the store does, with flushes reduced to `flushed`.
fn maintain(
    core: &mut LogCore,
    location: &mut [u32],
    owner: &mut [u32],
    meter: &mut Meter,
    slot_bytes: u64,
) -> Result<()> {
    while let Some(action) = core.next_action() {
        match action {
            Action::Trim => {
                core.flushed();
                core.take_trim_work();
            }
            Action::Collect(victim) => {
                core.flushed();
                for from in core.live_slots(victim) {
                    let element = owner[from.0 as usize];
                    let to = core.relocate(from)?;
                    owner[to.0 as usize] = element;
                    location[element as usize] = to.0 as u32;
                }
                core.flushed();
                let live = core.live_slots_total() * slot_bytes;
                meter.sample_gc_peak(core.physical_slots() * slot_bytes, core.footprint_slots() * slot_bytes, live);
                core.finish_collect(victim, |_| {});
            }
        }
    }
    Ok(())
}
