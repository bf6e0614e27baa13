//! Heavy compression (seed 000 §3.2.3): a run of consecutive pages compressed as one zstd frame
//! at a high level, with a window that spans the whole run so that every page can refer back to
//! every earlier one. It is for archived and snapshot pages, which are read rarely and in order;
//! reading one page costs decompressing its whole heavy segment, which [`SegmentCache`] keeps
//! for the next page.
//!
//! "Heavy segment" is this layer's word for such a run; it is not a drive segment.
//!
//! [`SegmentCache`]: crate::SegmentCache

use crate::{Error, PageSize, Result, zstd_frame};

/// The largest heavy segment, in bytes. It bounds the window (2^26 bytes: below zstd's default
/// decoder limit of 2^27, so decoding needs no special setting) and the memory one decompressed
/// segment holds in the cache.
pub const MAX_SEGMENT_BYTES: usize = 64 << 20;

/// Settings of heavy compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeavyConfig {
    /// The zstd level; 19 is the highest level that needs no "ultra" window.
    pub level: i32,
}

impl Default for HeavyConfig {
    fn default() -> HeavyConfig {
        HeavyConfig { level: HeavyConfig::DEFAULT_LEVEL }
    }
}

impl HeavyConfig {
    pub const DEFAULT_LEVEL: i32 = 19;
}

/// The window log that covers `len` bytes: the smallest power of two at least `len`, within the
/// range zstd accepts (2^10 to 2^26 here).
fn window_log(len: usize) -> u32 {
    len.next_power_of_two().trailing_zeros().clamp(10, MAX_SEGMENT_BYTES.trailing_zeros())
}

/// Checks that a segment of `page_count` pages of `page_size` is within bounds and returns its
/// byte length.
fn segment_bytes(page_size: PageSize, page_count: usize) -> Result<usize> {
    match page_count.checked_mul(page_size.bytes()) {
        Some(bytes) if page_count > 0 && bytes <= MAX_SEGMENT_BYTES => Ok(bytes),
        _ => Err(Error::invalid(format!(
            "a heavy segment holds 1 to {} pages of {page_size}, not {page_count}",
            MAX_SEGMENT_BYTES / page_size.bytes()
        ))),
    }
}

/// Compresses `pages`, consecutive pages of `page_size`, as one heavy segment.
pub fn compress_segment(pages: &[u8], page_size: PageSize, config: HeavyConfig) -> Result<Vec<u8>> {
    if !pages.len().is_multiple_of(page_size.bytes()) {
        return Err(Error::invalid(format!("{} bytes are not whole pages of {page_size}", pages.len())));
    }
    segment_bytes(page_size, pages.len() / page_size.bytes())?;
    let level_range = zstd_frame::level_range();
    if !level_range.contains(&config.level) {
        return Err(Error::invalid(format!("zstd level {} is outside {level_range:?}", config.level)));
    }
    zstd_frame::compress_with_window(pages, config.level, window_log(pages.len()))
}

/// Decompresses a heavy segment that must hold exactly `page_count` pages of `page_size`. The
/// count comes from the caller's index; a segment that expands to anything else is Corrupted.
pub fn decompress_segment(compressed: &[u8], page_size: PageSize, page_count: usize) -> Result<HeavySegment> {
    let bytes = segment_bytes(page_size, page_count)?;
    let mut data = vec![0u8; bytes];
    zstd_frame::decompress_into(compressed, &mut data)?;
    Ok(HeavySegment { page_size, data })
}

/// A decompressed heavy segment: its pages, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeavySegment {
    page_size: PageSize,
    data: Vec<u8>,
}

impl HeavySegment {
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    pub fn page_count(&self) -> usize {
        self.data.len() / self.page_size.bytes()
    }

    /// The page at `index` within the segment, or None past its end.
    pub fn page(&self, index: usize) -> Option<&[u8]> {
        self.data.chunks_exact(self.page_size.bytes()).nth(index)
    }

    /// The decompressed size in bytes.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::samples::{random_bytes, text_page};

    fn pages(size: PageSize, count: usize) -> Vec<u8> {
        (0..count as u64)
            .flat_map(|i| if i % 5 == 4 { random_bytes(size.bytes(), i) } else { text_page(size, i) })
            .collect()
    }

    #[test]
    fn segment_round_trips_page_by_page() {
        for size in [PageSize::Kib8, PageSize::Kib16] {
            let data = pages(size, 12);
            let compressed = compress_segment(&data, size, HeavyConfig::default()).unwrap();
            assert!(compressed.len() < data.len());
            let segment = decompress_segment(&compressed, size, 12).unwrap();
            assert_eq!(segment.page_count(), 12);
            for (i, page) in data.chunks_exact(size.bytes()).enumerate() {
                assert_eq!(segment.page(i).unwrap(), page);
            }
            assert_eq!(segment.page(12), None);
        }
    }

    #[test]
    fn a_segment_compresses_better_than_its_pages_alone() {
        let size = PageSize::Kib16;
        let data = pages(size, 8);
        let heavy = compress_segment(&data, size, HeavyConfig::default()).unwrap().len();
        let codec = crate::PageCodec::default();
        let per_page: usize =
            data.chunks_exact(size.bytes()).map(|p| codec.compress(crate::Algorithm::Zstd, p).unwrap().len()).sum();
        assert!(heavy < per_page, "heavy {heavy} vs per page {per_page}");
    }

    #[test]
    fn bad_requests_and_corrupt_segments_are_errors() {
        let size = PageSize::Kib8;
        let config = HeavyConfig { level: 3 };
        assert_eq!(compress_segment(&[0u8; 100], size, config).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(compress_segment(&[], size, config).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(
            compress_segment(&[0u8; 8192], size, HeavyConfig { level: 99 }).unwrap_err().kind(),
            ErrorKind::Invalid
        );
        let data = pages(size, 4);
        let compressed = compress_segment(&data, size, config).unwrap();
        // The index says a different page count: the frame expands to more or less.
        assert_eq!(decompress_segment(&compressed, size, 3).unwrap_err().kind(), ErrorKind::Corrupted);
        assert_eq!(decompress_segment(&compressed, size, 5).unwrap_err().kind(), ErrorKind::Corrupted);
        assert_eq!(decompress_segment(&compressed, size, 0).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(decompress_segment(&compressed, size, usize::MAX).unwrap_err().kind(), ErrorKind::Invalid);
        for bad in [&compressed[..compressed.len() / 2], &[0u8; 64][..], &random_bytes(500, 1)[..]] {
            assert_eq!(decompress_segment(bad, size, 4).unwrap_err().kind(), ErrorKind::Corrupted);
        }
    }

    #[test]
    fn window_covers_the_segment() {
        assert_eq!(window_log(1), 10);
        assert_eq!(window_log(16384), 14);
        assert_eq!(window_log(16384 * 3), 16);
        assert_eq!(window_log(MAX_SEGMENT_BYTES), 26);
    }
}
