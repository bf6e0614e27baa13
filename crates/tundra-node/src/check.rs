//! What the node knows of damage: the offline check `tundra fsck` runs over both stores, and
//! what recovery found in each store's journal (and the drive's) when the node opened.

use tundra_store::pages::CheckReport;
use tundra_store::store::Recovery;

use crate::Result;
use crate::layout;
use crate::node::{Device, Node, PAGE_SIZES};

impl Node {
    /// Checks the whole node (what `tundra fsck` runs, offline): every page of both stores read
    /// and verified, every block referenced once, no leaked blocks.
    pub fn check(&self) -> Result<Vec<(Device, CheckReport)>> {
        let mut reports = Vec::new();
        for device in [Device::Drive, Device::Fast] {
            // Each page size's path reads its own volumes' pages; both count every block.
            let mut merged = CheckReport::default();
            for page_size in PAGE_SIZES {
                let report = self.paths[&(device, page_size.bytes() as u32)].check()?;
                merged.pages += report.pages;
                merged.referenced_bytes = report.referenced_bytes;
                merged.device_mapped_bytes = report.device_mapped_bytes;
                for line in report.damaged {
                    if !merged.damaged.contains(&line) {
                        merged.damaged.push(line);
                    }
                }
            }
            reports.push((device, merged));
        }
        Ok(reports)
    }

    /// What recovery found and dealt with in each store's journal when the node opened.
    pub fn recovery(&self) -> Vec<(Device, Recovery)> {
        let mut drive = self.data.recovery().clone();
        let notes = self.drive.recovery_notes().iter();
        drive.notes.extend(notes.map(|note| format!("the emulated drive in {}: {note}", layout::DRIVE_FILE)));
        vec![(Device::Drive, drive), (Device::Fast, self.fast.recovery().clone())]
    }
}
