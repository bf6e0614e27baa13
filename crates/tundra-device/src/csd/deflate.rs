//! Per-block compression of the emulated drive: raw deflate at level 5 (seed 000 §3.2.2:
//! PolarCSD compresses each 4 KiB block with gzip level 5), through libdeflate, which measured
//! fastest on real database pages (docs/measurements.md).

use std::cell::RefCell;

use libdeflater::{CompressionLvl, Compressor, Decompressor};

use crate::{BLOCK_SIZE, Error, Result};

use super::layout::{MAX_PAYLOAD_UNITS, UNIT_BYTES, units};

pub const DEFLATE_LEVEL: i32 = 5;

thread_local! {
    static COMPRESSOR: RefCell<Compressor> =
        RefCell::new(Compressor::new(CompressionLvl::new(DEFLATE_LEVEL).expect("level 5 is valid")));
    static DECOMPRESSOR: RefCell<Decompressor> = RefCell::new(Decompressor::new());
}

/// How one block is stored.
pub enum Stored {
    /// The block compressed; this is the payload.
    Deflate(Vec<u8>),
    /// Compression does not save a 16-byte unit: the block is stored as is.
    Raw,
}

/// Compresses one block, deciding between deflate and raw.
pub fn compress_block(block: &[u8]) -> Stored {
    assert_eq!(block.len(), BLOCK_SIZE);
    let mut out = vec![0u8; BLOCK_SIZE];
    let written = COMPRESSOR.with(|c| c.borrow_mut().deflate_compress(block, &mut out));
    match written {
        // libdeflate reports an output that does not fit as an error: incompressible.
        Ok(len) if units(len) < MAX_PAYLOAD_UNITS => {
            out.truncate(len);
            Stored::Deflate(out)
        }
        _ => Stored::Raw,
    }
}

/// Decompresses a payload that must expand to exactly one block.
pub fn decompress_block(payload: &[u8], out: &mut [u8]) -> Result<()> {
    assert_eq!(out.len(), BLOCK_SIZE);
    let result = DECOMPRESSOR.with(|d| d.borrow_mut().deflate_decompress(payload, out));
    match result {
        Ok(BLOCK_SIZE) => Ok(()),
        Ok(n) => Err(Error::corrupted(format!("compressed block expanded to {n} bytes, not {BLOCK_SIZE}"))),
        Err(e) => Err(Error::corrupted(format!("compressed block does not decompress: {e}"))),
    }
}

/// The bytes one block costs the drive after 16-byte rounding (0 for an all-zero block).
pub fn stored_payload_bytes(block: &[u8]) -> usize {
    if crate::is_zero(block) {
        return 0;
    }
    match compress_block(block) {
        Stored::Deflate(payload) => units(payload.len()) * UNIT_BYTES,
        Stored::Raw => BLOCK_SIZE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::block_content;

    #[test]
    fn compressible_block_round_trips() {
        let block = block_content(5, 1);
        let Stored::Deflate(payload) = compress_block(&block) else { panic!("text compresses") };
        assert!(payload.len() < 1024);
        let mut out = vec![0u8; BLOCK_SIZE];
        decompress_block(&payload, &mut out).unwrap();
        assert_eq!(out, block);
    }

    #[test]
    fn random_block_is_raw_and_garbage_is_an_error() {
        assert!(matches!(compress_block(&block_content(5, 3)), Stored::Raw));
        let mut out = vec![0u8; BLOCK_SIZE];
        assert!(decompress_block(&[0xff; 40], &mut out).is_err());
    }
}
