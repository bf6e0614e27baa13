//! TRIM: a trim record (the first LBA and a block count) appended to the user head, and the map
//! entries it covers dropped. Writes of all-zero blocks take the same path, so zeros cost no
//! payload. Trim records keep their sequence numbers when relocated, since they must order
//! against the older data they erase.

use crate::Result;

use super::Shared;
use super::layout::RecordKind;
use super::state::{HeadKind, State};

/// A trim record's payload is the block count.
const TRIM_PAYLOAD_BYTES: usize = 8;
/// A trim record on the media: header and the padded count.
pub(super) const TRIM_RECORD_BYTES: u64 = 32;

impl Shared {
    /// Trims `count` blocks from `lba` for the host.
    pub(super) fn trim(&self, lba: u64, count: u64) -> Result<()> {
        let mut state = self.lock_for_append(TRIM_RECORD_BYTES)?;
        self.append_trim(&mut state, lba, count)?;
        state.counters.host_trimmed_blocks += count;
        Ok(())
    }

    pub(super) fn append_trim(&self, state: &mut State, lba: u64, count: u64) -> Result<()> {
        let header = state.header(RecordKind::Trim, lba, TRIM_PAYLOAD_BYTES)?;
        state.append(self.media.as_ref(), HeadKind::User, header, &count.to_le_bytes())?;
        for key in lba..lba + count {
            if state.map.get(key).is_some() {
                state.replace(key, None);
            }
        }
        Ok(())
    }
}
