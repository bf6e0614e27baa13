//! Zstandard frames through reused per-thread contexts. Creating a zstd context allocates and
//! initialises tables larger than a page, so every thread keeps one compressor per use (pages,
//! heavy segments) and one decompressor.
//!
//! Page frames leave out the content size, the checksum and the dictionary id: the caller knows
//! the page size and checks its own checksum of the page, so those header bytes would be waste.

use std::cell::RefCell;

use zstd::bulk::{Compressor, Decompressor};
use zstd::zstd_safe::CParameter;

use crate::{Error, Result};

thread_local! {
    /// The page compressor and the level it was created for.
    static PAGE_COMPRESSOR: RefCell<Option<(i32, Compressor<'static>)>> = const { RefCell::new(None) };
    /// The heavy-segment compressor; its parameters are set again for every segment.
    static SEGMENT_COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The range of levels zstd accepts.
pub fn level_range() -> std::ops::RangeInclusive<i32> {
    zstd::compression_level_range()
}

fn zstd_error(what: &str, e: std::io::Error) -> Error {
    Error::invalid(format!("zstd could not {what}: {e}"))
}

fn page_compressor(level: i32) -> Result<Compressor<'static>> {
    let mut compressor = Compressor::new(level).map_err(|e| zstd_error("create a compressor", e))?;
    for parameter in
        [CParameter::ContentSizeFlag(false), CParameter::ChecksumFlag(false), CParameter::DictIdFlag(false)]
    {
        compressor.set_parameter(parameter).map_err(|e| zstd_error("set a parameter", e))?;
    }
    Ok(compressor)
}

/// Compresses `data` (any length) at `level` into a frame without content size or checksum.
pub fn compress(data: &[u8], level: i32) -> Result<Vec<u8>> {
    PAGE_COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(cached, _)| *cached != level) {
            *slot = Some((level, page_compressor(level)?));
        }
        let (_, compressor) = slot.as_mut().expect("just filled");
        compressor.compress(data).map_err(|e| zstd_error("compress", e))
    })
}

/// Compresses `data` at `level` with a window of `2^window_log` bytes, recording the content size.
pub fn compress_with_window(data: &[u8], level: i32, window_log: u32) -> Result<Vec<u8>> {
    SEGMENT_COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Compressor::new(level).map_err(|e| zstd_error("create a compressor", e))?);
        }
        let compressor = slot.as_mut().expect("just filled");
        // Parameters stick to a context, so every one this function relies on is set each time.
        compressor.set_compression_level(level).map_err(|e| zstd_error("set the level", e))?;
        for parameter in [
            CParameter::WindowLog(window_log),
            CParameter::ContentSizeFlag(true),
            CParameter::ChecksumFlag(false),
            CParameter::DictIdFlag(false),
        ] {
            compressor.set_parameter(parameter).map_err(|e| zstd_error("set a parameter", e))?;
        }
        compressor.compress(data).map_err(|e| zstd_error("compress", e))
    })
}

/// Decompresses `compressed`, which must expand to exactly `out.len()` bytes.
pub fn decompress_into(compressed: &[u8], out: &mut [u8]) -> Result<()> {
    let expected = out.len();
    let written = DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(|e| zstd_error("create a decompressor", e))?);
        }
        let decompressor = slot.as_mut().expect("just filled");
        // The output buffer bounds what the frame may produce: a frame that claims more fails
        // here instead of allocating.
        decompressor
            .decompress_to_buffer(compressed, out)
            .map_err(|e| Error::corrupted(format!("zstd data does not decompress to {expected} bytes: {e}")))
    })?;
    if written != expected {
        return Err(Error::corrupted(format!("zstd data expanded to {written} bytes, not {expected}")));
    }
    Ok(())
}
