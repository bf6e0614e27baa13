//! The store on the emulated compressing drive (tundra-device's `CsdDevice`, its media in
//! memory) under the workload of a model run: the same keys in the same order, each element
//! filling its slot with incompressible bytes, so that the drive's physical accounting can be
//! set beside the model's count of uncleared slots. At the end every key is read back and
//! checked against the last value written to it.

use std::sync::Arc;
use std::time::Instant;

use tundra_device::csd::{CompressionMode, CsdConfig, CsdDevice, FormatOptions};
use tundra_device::mem::MemDevice;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice};
use tundra_env::Rng;

use crate::error::{Error, Result};
use crate::meter::Figures;
use crate::store::{DATA_START_LBA, Lss};
use crate::workload::{RunConfig, UpdateWorkload};

/// What a run of the store on the drive measured.
#[derive(Clone, Copy, Debug)]
pub struct DriveRun {
    /// Write amplification from the store's counts; physical space from the drive's accounting.
    pub figures: Figures,
    /// The same window with physical space counted in uncleared slots, as the model counts it.
    pub slot_figures: Figures,
    /// Blocks the drive received from the host in the window over the user bytes: every sector
    /// write, partial rewrites before a flush included.
    pub drive_write_amplification: f64,
    /// The drive's mapped bytes over its physical bytes at the end.
    pub drive_compression_ratio: f64,
    pub verified_elements: u64,
    pub seconds: f64,
}

/// Runs `config`'s workload through the store on a fresh emulated drive.
pub fn run_on_drive(config: &RunConfig) -> Result<DriveRun> {
    let began = Instant::now();
    let geometry = config.geometry()?;
    let logical_bytes = (DATA_START_LBA + geometry.total_sectors()) * BLOCK_SIZE_BYTES;
    // Physical space for the whole logical range: the store never runs the drive short.
    let options = FormatOptions::new(logical_bytes, logical_bytes);
    let media_blocks = options.geometry()?.total_bytes() / BLOCK_SIZE_BYTES;
    let media = Arc::new(MemDevice::new(media_blocks));
    let drive_config = CsdConfig { compression: CompressionMode::Inline, background: false, ..CsdConfig::default() };
    let drive = Arc::new(CsdDevice::format(media, &options, drive_config)?);
    let mut store = Lss::format(drive.clone() as Arc<dyn BlockDevice>, geometry, config.policy)?;
    let value_bytes = store.max_value_bytes(8);
    if value_bytes < 8 {
        return Err(Error::invalid("elements too small to carry their check number"));
    }
    let mut workload = UpdateWorkload::new(config.elements(), config.seed);
    let mut values = Rng::new(config.seed ^ 0x5eed_7a1e);
    let mut last_write = vec![0u64; config.elements() as usize];
    let mut value = vec![0u8; value_bytes];
    let warmup = config.warmup_writes();
    let (mut start, mut drive_start) = (store.stats().core, drive.stats().counters);
    for written in 0..warmup + config.measured_writes() {
        if written == warmup {
            start = store.stats().core;
            drive_start = drive.stats().counters;
            store.start_measuring();
        }
        let key = workload.next_key();
        values.fill(&mut value);
        value[..8].copy_from_slice(&written.to_le_bytes());
        last_write[key as usize] = written;
        store.put(&key.to_le_bytes(), &value)?;
        if written >= warmup && (written - warmup).is_multiple_of(config.sample_every) {
            store.sample();
        }
    }
    let meters = store.finish_measuring();
    let end = store.stats().core;
    let drive_written = drive.stats().counters.since(&drive_start).host_written_blocks * BLOCK_SIZE_BYTES;
    store.flush()?;
    let mut verified_elements = 0;
    for (key, &written) in last_write.iter().enumerate() {
        let value = store.get(&(key as u64).to_le_bytes())?;
        match value {
            Some(v) if v[..8] == written.to_le_bytes() => verified_elements += 1,
            other => {
                return Err(Error::corrupted(format!(
                    "key {key} should hold write {written} and holds {:?}",
                    other.map(|v| u64::from_le_bytes(v[..8].try_into().expect("eight bytes")))
                )));
            }
        }
    }
    let figures = Figures::from_window(&start, &end, geometry.slot_bytes, &meters.device);
    let slot_figures = Figures::from_window(&start, &end, geometry.slot_bytes, &meters.slots);
    let stats = drive.stats();
    Ok(DriveRun {
        figures,
        slot_figures,
        drive_write_amplification: if figures.user_bytes == 0 {
            0.0
        } else {
            drive_written as f64 / figures.user_bytes as f64
        },
        drive_compression_ratio: stats.compression_ratio(),
        verified_elements,
        seconds: began.elapsed().as_secs_f64(),
    })
}
