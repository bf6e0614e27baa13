//! LZ4 in the block format (no frame, no stored length): the caller knows how long the page is,
//! so the frame's header and checksum would only cost bytes. lz4_flex runs with its safe encoder
//! and decoder, which return errors on malformed input instead of reading out of bounds.

use crate::{Error, Result};

/// Compresses `data` (any length). The output may be longer than the input when nothing repeats.
pub fn compress(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; lz4_flex::block::get_maximum_output_size(data.len())];
    // The buffer has the encoder's own worst-case size, so it cannot run out of room.
    let written = lz4_flex::block::compress_into(data, &mut out).expect("the output buffer has the worst-case size");
    out.truncate(written);
    out
}

/// Decompresses `compressed`, which must expand to exactly `out.len()` bytes.
pub fn decompress_into(compressed: &[u8], out: &mut [u8]) -> Result<()> {
    match lz4_flex::block::decompress_into(compressed, out) {
        Ok(n) if n == out.len() => Ok(()),
        Ok(n) => Err(Error::corrupted(format!("lz4 data expanded to {n} bytes, not {}", out.len()))),
        Err(e) => Err(Error::corrupted(format!("lz4 data does not decompress to {} bytes: {e}", out.len()))),
    }
}
