//! [`MemExport`], an export held in memory: the reference export of this crate's tests and the
//! node's, with a count of the calls it received, errors on demand, and slow reads and writes at
//! chosen offsets (to see requests overtake each other).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::{Export, ExportError};

/// Bytes in a `Vec<u8>` behind a lock. Trimmed and zeroed ranges read as zeros.
pub struct MemExport {
    data: RwLock<Vec<u8>>,
    preferred_block_size: u32,
    calls: CallCounters,
    injected: Mutex<Option<ExportError>>,
    /// Reads and writes starting at these offsets sleep this long first.
    delays: Mutex<HashMap<u64, Duration>>,
}

/// How many calls of each kind a [`MemExport`] received, and with which flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemCalls {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub fua_trims: u64,
    pub write_zeroes: u64,
    /// Write-zeroes that allowed deallocation (`NBD_CMD_FLAG_NO_HOLE` absent).
    pub may_trim_write_zeroes: u64,
    pub fua_write_zeroes: u64,
    /// The most reads and writes that were running at once.
    pub max_concurrent: u64,
}

#[derive(Default)]
struct CallCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    fua_trims: AtomicU64,
    write_zeroes: AtomicU64,
    may_trim_write_zeroes: AtomicU64,
    fua_write_zeroes: AtomicU64,
    running: AtomicU64,
    max_concurrent: AtomicU64,
}

/// A read or write in progress, counted while it lives.
struct Running<'a>(&'a CallCounters);

impl<'a> Running<'a> {
    fn start(calls: &'a CallCounters) -> Running<'a> {
        let now = calls.running.fetch_add(1, Ordering::SeqCst) + 1;
        calls.max_concurrent.fetch_max(now, Ordering::SeqCst);
        Running(calls)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn bump(counter: &AtomicU64, yes: bool) {
    if yes {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl MemExport {
    /// An export of `size_bytes` zeros with a preferred block size of 4 KiB.
    pub fn new(size_bytes: u64) -> MemExport {
        let size = usize::try_from(size_bytes).expect("export size fits in memory");
        MemExport::from_bytes(vec![0u8; size])
    }

    /// An export holding exactly `data`.
    pub fn from_bytes(data: Vec<u8>) -> MemExport {
        MemExport {
            data: RwLock::new(data),
            preferred_block_size: 4096,
            calls: CallCounters::default(),
            injected: Mutex::new(None),
            delays: Mutex::new(HashMap::new()),
        }
    }

    /// The same export advertising `bytes` as its preferred block size (a volume's page size).
    pub fn with_preferred_block_size(mut self, bytes: u32) -> MemExport {
        self.preferred_block_size = bytes;
        self
    }

    /// A copy of the whole contents.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().clone()
    }

    /// A copy of `len` bytes at `offset`. Panics if the range is outside the export.
    pub fn bytes_at(&self, offset: u64, len: usize) -> Vec<u8> {
        let start = usize::try_from(offset).expect("offset fits in memory");
        self.data.read()[start..start + len].to_vec()
    }

    /// The calls received so far.
    pub fn calls(&self) -> MemCalls {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let calls = &self.calls;
        MemCalls {
            reads: get(&calls.reads),
            writes: get(&calls.writes),
            fua_writes: get(&calls.fua_writes),
            flushes: get(&calls.flushes),
            trims: get(&calls.trims),
            fua_trims: get(&calls.fua_trims),
            write_zeroes: get(&calls.write_zeroes),
            may_trim_write_zeroes: get(&calls.may_trim_write_zeroes),
            fua_write_zeroes: get(&calls.fua_write_zeroes),
            max_concurrent: get(&calls.max_concurrent),
        }
    }

    /// Makes reads and writes that start at `offset` take at least `delay` (None: no delay).
    pub fn delay_at(&self, offset: u64, delay: Option<Duration>) {
        let mut delays = self.delays.lock();
        match delay {
            Some(delay) => delays.insert(offset, delay),
            None => delays.remove(&offset),
        };
    }

    fn wait_at(&self, offset: u64) {
        let delay = self.delays.lock().get(&offset).copied();
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
    }

    /// Makes every call fail with `error` until called again with `None`.
    pub fn inject_error(&self, error: Option<ExportError>) {
        *self.injected.lock() = error;
    }

    fn injected(&self) -> Result<(), ExportError> {
        match &*self.injected.lock() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// The range as indices into the vector; the server checks ranges, this checks again.
    fn range(data_len: usize, offset: u64, len: u64) -> Result<std::ops::Range<usize>, ExportError> {
        let out_of_range = || ExportError::invalid(format!("{len} bytes at {offset} are outside {data_len} bytes"));
        let start = usize::try_from(offset).map_err(|_| out_of_range())?;
        let len = usize::try_from(len).map_err(|_| out_of_range())?;
        let end = start.checked_add(len).filter(|&end| end <= data_len).ok_or_else(out_of_range)?;
        Ok(start..end)
    }

    fn zero(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        let mut data = self.data.write();
        let range = MemExport::range(data.len(), offset, len)?;
        data[range].fill(0);
        Ok(())
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn preferred_block_size(&self) -> u32 {
        self.preferred_block_size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        bump(&self.calls.reads, true);
        let _running = Running::start(&self.calls);
        self.wait_at(offset);
        self.injected()?;
        let data = self.data.read();
        let range = MemExport::range(data.len(), offset, buf.len() as u64)?;
        buf.copy_from_slice(&data[range]);
        Ok(())
    }

    fn write(&self, offset: u64, bytes: &[u8], fua: bool) -> Result<(), ExportError> {
        bump(&self.calls.writes, true);
        bump(&self.calls.fua_writes, fua);
        let _running = Running::start(&self.calls);
        self.wait_at(offset);
        self.injected()?;
        let mut data = self.data.write();
        let range = MemExport::range(data.len(), offset, bytes.len() as u64)?;
        data[range].copy_from_slice(bytes);
        Ok(())
    }

    fn flush(&self) -> Result<(), ExportError> {
        bump(&self.calls.flushes, true);
        self.injected()
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        bump(&self.calls.trims, true);
        bump(&self.calls.fua_trims, fua);
        self.injected()?;
        self.zero(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> Result<(), ExportError> {
        bump(&self.calls.write_zeroes, true);
        bump(&self.calls.may_trim_write_zeroes, may_trim);
        bump(&self.calls.fua_write_zeroes, fua);
        self.injected()?;
        self.zero(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExportErrorKind;

    #[test]
    fn reads_back_writes_and_zeros() {
        let export = MemExport::new(8192);
        export.write(4000, &[7u8; 200], true).expect("write");
        let mut buf = vec![0u8; 300];
        export.read(3950, &mut buf).expect("read");
        assert_eq!(&buf[..50], &[0u8; 50]);
        assert_eq!(&buf[50..250], &[7u8; 200]);
        export.trim(4000, 100, false).expect("trim");
        export.write_zeroes(4100, 100, false, true).expect("zero");
        assert_eq!(export.bytes_at(4000, 200), vec![0u8; 200]);
        let calls = export.calls();
        assert_eq!((calls.writes, calls.fua_writes, calls.trims, calls.write_zeroes), (1, 1, 1, 1));
        assert_eq!((calls.may_trim_write_zeroes, calls.fua_write_zeroes), (0, 1));
    }

    #[test]
    fn refuses_ranges_outside_and_injects_errors() {
        let export = MemExport::new(100);
        assert_eq!(export.write(99, &[1, 2], false).map_err(|e| e.kind()), Err(ExportErrorKind::Invalid));
        assert_eq!(export.trim(u64::MAX, 2, false).map_err(|e| e.kind()), Err(ExportErrorKind::Invalid));
        export.inject_error(Some(ExportError::io("media gone")));
        assert_eq!(export.flush().map_err(|e| e.errno()), Err(5));
        export.inject_error(None);
        assert_eq!(export.flush(), Ok(()));
    }
}
