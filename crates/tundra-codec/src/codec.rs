//! Page compression and the storage rule for compressed pages: a page is stored compressed only
//! when that saves at least one 4 KiB block, since the store allocates whole blocks (seed 000
//! §3.2.1) and a compressed page that takes as many blocks as the raw one only costs a
//! decompression on every read.

use crate::{Algorithm, Error, PageSize, Result, blocks_4k, bytes_4k, lz4_block, zstd_frame};

/// How a page's stored bytes are to be read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The page as is.
    Raw,
    /// The page compressed with this algorithm.
    Compressed(Algorithm),
}

impl Encoding {
    /// `raw`, `lz4` or `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Compressed(algorithm) => algorithm.name(),
        }
    }
}

/// A page as the store writes it: an encoding and its bytes. The store keeps the exact length of
/// `data` (the blocks are zero-padded, and neither lz4 nor zstd ignores trailing zeros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedPage {
    pub encoding: Encoding,
    pub data: Vec<u8>,
}

impl EncodedPage {
    /// Applies the storage rule to a page and its compressed form under `algorithm`: the
    /// compressed form if it takes fewer 4 KiB blocks than the page, the page raw otherwise.
    pub fn choose(algorithm: Algorithm, page: &[u8], compressed: Vec<u8>) -> EncodedPage {
        if blocks_4k(compressed.len()) < blocks_4k(page.len()) {
            EncodedPage { encoding: Encoding::Compressed(algorithm), data: compressed }
        } else {
            EncodedPage { encoding: Encoding::Raw, data: page.to_vec() }
        }
    }

    /// The 4 KiB blocks the stored bytes take.
    pub fn blocks_4k(&self) -> usize {
        blocks_4k(self.data.len())
    }

    /// The stored bytes rounded up to whole 4 KiB blocks: what the page costs the store.
    pub fn bytes_4k(&self) -> usize {
        bytes_4k(self.data.len())
    }

    /// The stored bytes zero-padded to whole 4 KiB blocks, as they are written to the device.
    pub fn padded_4k(&self) -> Vec<u8> {
        let mut blocks = self.data.clone();
        blocks.resize(self.bytes_4k(), 0);
        blocks
    }
}

/// Compresses and decompresses pages. It holds only settings: the compression contexts are
/// per thread and reused, so a `PageCodec` is cheap to copy into every thread that needs one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCodec {
    zstd_level: i32,
}

impl Default for PageCodec {
    fn default() -> PageCodec {
        PageCodec { zstd_level: PageCodec::DEFAULT_ZSTD_LEVEL }
    }
}

impl PageCodec {
    /// Level 1: pages are compressed on the write path, where zstd's fastest level already has
    /// the entropy coding that sets it apart from lz4 (seed 000 §3.3.2).
    pub const DEFAULT_ZSTD_LEVEL: i32 = 1;

    /// A codec that runs zstd at `zstd_level` (zstd's own range, negative levels included).
    pub fn new(zstd_level: i32) -> Result<PageCodec> {
        let range = zstd_frame::level_range();
        if !range.contains(&zstd_level) {
            return Err(Error::invalid(format!(
                "zstd level {zstd_level} is outside {}..={}",
                range.start(),
                range.end()
            )));
        }
        Ok(PageCodec { zstd_level })
    }

    pub fn zstd_level(&self) -> i32 {
        self.zstd_level
    }

    /// Compresses one page (8 or 16 KiB). The output may be longer than the page.
    pub fn compress(&self, algorithm: Algorithm, page: &[u8]) -> Result<Vec<u8>> {
        PageSize::of(page)?;
        self.compress_bytes(algorithm, page)
    }

    /// Compresses a byte string of any length with the page settings. For measurements that
    /// compare input sizes (seed 000 Figure 2b); pages go through [`PageCodec::compress`].
    pub fn compress_bytes(&self, algorithm: Algorithm, data: &[u8]) -> Result<Vec<u8>> {
        match algorithm {
            Algorithm::Lz4 => Ok(lz4_block::compress(data)),
            Algorithm::Zstd => zstd_frame::compress(data, self.zstd_level),
        }
    }

    /// Compresses one page and applies the storage rule ([`EncodedPage::choose`]).
    pub fn encode(&self, algorithm: Algorithm, page: &[u8]) -> Result<EncodedPage> {
        let compressed = self.compress(algorithm, page)?;
        Ok(EncodedPage::choose(algorithm, page, compressed))
    }

    /// Decompresses bytes that must expand to exactly one page of `page_size`; anything else is
    /// a Corrupted error.
    pub fn decompress(&self, algorithm: Algorithm, compressed: &[u8], page_size: PageSize) -> Result<Vec<u8>> {
        let mut page = vec![0u8; page_size.bytes()];
        self.decompress_into(algorithm, compressed, &mut page)?;
        Ok(page)
    }

    /// Decompresses into `out`, which must be one page; the bytes must fill it exactly.
    pub fn decompress_into(&self, algorithm: Algorithm, compressed: &[u8], out: &mut [u8]) -> Result<()> {
        PageSize::of(out)?;
        match algorithm {
            Algorithm::Lz4 => lz4_block::decompress_into(compressed, out),
            Algorithm::Zstd => zstd_frame::decompress_into(compressed, out),
        }
    }

    /// Reads back a stored page of `page_size` from its encoding and its exact stored bytes.
    pub fn decode(&self, encoding: Encoding, stored: &[u8], page_size: PageSize) -> Result<Vec<u8>> {
        match encoding {
            Encoding::Raw if stored.len() == page_size.bytes() => Ok(stored.to_vec()),
            Encoding::Raw => {
                Err(Error::corrupted(format!("a raw page of {page_size} is stored as {} bytes", stored.len())))
            }
            Encoding::Compressed(algorithm) => self.decompress(algorithm, stored, page_size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::samples::{random_bytes, text_page};

    const ALGORITHMS: [Algorithm; 2] = [Algorithm::Lz4, Algorithm::Zstd];
    const SIZES: [PageSize; 2] = [PageSize::Kib8, PageSize::Kib16];

    #[test]
    fn pages_round_trip_with_both_algorithms_and_sizes() {
        let codec = PageCodec::default();
        for size in SIZES {
            for page in [text_page(size, 7), vec![0u8; size.bytes()], random_bytes(size.bytes(), 3)] {
                for algorithm in ALGORITHMS {
                    let compressed = codec.compress(algorithm, &page).unwrap();
                    assert_eq!(codec.decompress(algorithm, &compressed, size).unwrap(), page, "{algorithm} {size}");
                    let encoded = codec.encode(algorithm, &page).unwrap();
                    assert_eq!(codec.decode(encoded.encoding, &encoded.data, size).unwrap(), page);
                }
            }
        }
    }

    #[test]
    fn text_compresses_and_random_data_is_stored_raw() {
        let codec = PageCodec::default();
        for algorithm in ALGORITHMS {
            let text = codec.encode(algorithm, &text_page(PageSize::Kib16, 1)).unwrap();
            assert_eq!(text.encoding, Encoding::Compressed(algorithm));
            assert!(text.blocks_4k() < 4);
            let random = codec.encode(algorithm, &random_bytes(16384, 9)).unwrap();
            assert_eq!(random.encoding, Encoding::Raw);
            assert_eq!(random.bytes_4k(), 16384);
        }
    }

    #[test]
    fn a_page_that_saves_no_block_is_raw() {
        let page = vec![1u8; 8192];
        // 4097 bytes take two blocks, as many as the page: no saving.
        assert_eq!(EncodedPage::choose(Algorithm::Lz4, &page, vec![0; 4097]).encoding, Encoding::Raw);
        let one_block = EncodedPage::choose(Algorithm::Zstd, &page, vec![0; 4096]);
        assert_eq!(one_block.encoding, Encoding::Compressed(Algorithm::Zstd));
        assert_eq!(one_block.padded_4k().len(), 4096);
    }

    #[test]
    fn wrong_sizes_are_invalid() {
        let codec = PageCodec::default();
        assert_eq!(codec.compress(Algorithm::Lz4, &[0u8; 4096]).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(
            codec.decompress_into(Algorithm::Zstd, &[], &mut [0u8; 100]).unwrap_err().kind(),
            ErrorKind::Invalid
        );
        assert_eq!(PageCodec::new(1000).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(PageCodec::new(19).unwrap().zstd_level(), 19);
    }

    /// Every way stored bytes can be wrong gives a Corrupted error, never a panic or a page.
    #[test]
    fn corrupt_input_is_an_error() {
        let codec = PageCodec::default();
        let size = PageSize::Kib16;
        let page = text_page(size, 2);
        for algorithm in ALGORITHMS {
            let good = codec.compress(algorithm, &page).unwrap();
            let mut cases: Vec<Vec<u8>> = vec![vec![], vec![0; 40], vec![0xff; 300], random_bytes(2000, 5)];
            cases.push(good[..good.len() / 2].to_vec());
            cases.push(good[..good.len() - 1].to_vec());
            // The same page at the other size: it expands to the wrong length.
            cases.push(codec.compress(algorithm, &text_page(PageSize::Kib8, 2)).unwrap());
            for (i, bad) in cases.iter().enumerate() {
                let error = codec.decompress(algorithm, bad, size).unwrap_err();
                assert_eq!(error.kind(), ErrorKind::Corrupted, "{algorithm} case {i}: {error}");
            }
            // Flipped bits either fail or, where the format cannot tell, decode to a page of the
            // right size; they never panic.
            for bit in (0..good.len() * 8).step_by(37) {
                let mut flipped = good.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                if let Ok(out) = codec.decompress(algorithm, &flipped, size) {
                    assert_eq!(out.len(), size.bytes());
                }
            }
        }
        // Arbitrary bytes of every short length, and valid frames with random tails.
        for seed in 0..2000u64 {
            let len = (seed as usize * 7) % 600;
            let mut bytes = random_bytes(len, seed);
            if seed % 3 == 0 {
                bytes = [codec.compress(ALGORITHMS[seed as usize % 2], &page).unwrap(), bytes].concat();
            }
            for algorithm in ALGORITHMS {
                if let Ok(out) = codec.decompress(algorithm, &bytes, size) {
                    assert_eq!(out.len(), size.bytes());
                }
            }
        }
        let raw = codec.decode(Encoding::Raw, &[0u8; 100], size).unwrap_err();
        assert_eq!(raw.kind(), ErrorKind::Corrupted);
    }
}
