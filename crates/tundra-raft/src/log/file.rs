//! The node's shared Raft log as a file in its data directory (`raft.log`, docs/format.md,
//! "Raft log"): every flush of the writer task appends one batch frame holding all the records
//! the groups queued, then one `fdatasync` makes it durable, whatever number of groups' appends,
//! votes and truncations the batch carries (group commit across groups).
//!
//! A batch frame is a 24-byte header (magic, sequence number, body length, body checksum, and
//! a checksum of those) and the body, the postcard encoding of the batch's records. At open,
//! frames are read in order until the file ends. A frame that does not verify ends the log as a
//! torn write only if no later frame verifies with the next sequence number: a crash leaves
//! garbage or zeros after the last synced frame only, so a verified frame after a damaged one
//! means damage in the middle of the log, which would silently roll back acknowledged Raft
//! state. That is refused (as the store's journal refuses it) rather than truncated. One case
//! cannot be told from a torn write: damage inside the newest frame, which is then dropped.
//!
//! The file only grows between compactions: when it exceeds twice its size after the last
//! compaction (and at least `compact_bytes`), the writer replaces it with the live records
//! ([`super::LogMedia::compact`]), written to a new file, synced and renamed over the old one.
//!
//! On the operating system's file system ([`OsLogFile`]) the file grows ahead of its frames,
//! [`PREALLOCATE_BYTES`] of zeros at a time, and frames are written into those zeros: a sync
//! that changed no file size or extent needs no journal commit, so it costs what writing the
//! frame's blocks costs (`scripts/concurrent-syncs` measures both; docs/measurements.md). To a
//! reader the zeros after the last frame are a torn tail, cut off at the next open.
//!
//! [`LogFile`] is the file as the log uses it (append, sync, replace), so that crash tests run
//! the same code over [`MemLogFile`], which keeps a written and a durable image and loses,
//! tears or flips bits of what a crash may.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use tundra_env::Rng;

use super::{LogMedia, LogRecord};
use crate::codec;

const FILE_MAGIC: &[u8; 16] = b"TUNDRA RAFT LOG\n";
/// Version 2 added the `Reset` record, version 3 `ResetHeld`; a file of an older version (no
/// such record) is read and rewritten as the current version when opened, so that a build
/// that reads only older versions refuses the file rather than meeting a record it does not
/// know.
const FILE_FORMAT: u32 = 3;
const OLDEST_FILE_FORMAT: u32 = 1;
const FILE_HEADER_BYTES: usize = 24;
const FRAME_MAGIC: u32 = 0x544c_4f47;
const FRAME_HEADER_BYTES: usize = 24;
/// A batch larger than this is refused when appended and taken as damage when read.
pub const MAX_BATCH_BYTES: usize = 1 << 30;

/// The file as the log uses it.
pub trait LogFile: Send + Sync + 'static {
    /// The whole file (empty if it does not exist yet).
    fn read_all(&self) -> std::io::Result<Vec<u8>>;
    /// Appends bytes at the end (volatile until `sync`).
    fn append(&self, bytes: &[u8]) -> std::io::Result<()>;
    /// Makes every appended byte durable.
    fn sync(&self) -> std::io::Result<()>;
    /// Drops everything from `len` on, durably (a torn tail found at open).
    fn truncate(&self, len: u64) -> std::io::Result<()>;
    /// Replaces the whole file with `bytes`, atomically and durably.
    fn replace(&self, bytes: &[u8]) -> std::io::Result<()>;
}

/// A bug the log can be built with, for the tests that show its checks catch it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FileLogBug {
    #[default]
    None,
    /// A flush that never syncs: acknowledged records can be lost by a crash.
    SyncIgnored,
    /// Replay that trusts a frame's body without its checksum: damage reads as records.
    BodyUnchecked,
}

struct State {
    next_seq: u64,
    size_bytes: u64,
    compact_at: u64,
}

/// The shared log in a [`LogFile`].
pub struct FileLog<F: LogFile> {
    file: F,
    records: Vec<LogRecord>,
    state: Mutex<State>,
    compact_bytes: u64,
    bug: FileLogBug,
}

struct Header {
    seq: u64,
    body_len: usize,
    body_crc: u32,
}

fn frame_header(bytes: &[u8]) -> Option<Header> {
    let head = bytes.get(..FRAME_HEADER_BYTES)?;
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    if word(0) != FRAME_MAGIC || word(20) != crc32c::crc32c(&head[..20]) {
        return None;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&head[4..12]);
    let body_len = word(12) as usize;
    (body_len <= MAX_BATCH_BYTES).then_some(Header { seq: u64::from_le_bytes(seq), body_len, body_crc: word(16) })
}

fn encode_frame(seq: u64, records: &[LogRecord]) -> Vec<u8> {
    let body = codec::encode(&records);
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn file_header() -> Vec<u8> {
    header_of_version(FILE_FORMAT)
}

fn header_of_version(version: u32) -> Vec<u8> {
    let mut out = FILE_MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// What reading a log file found.
struct Scan {
    records: Vec<LogRecord>,
    next_seq: u64,
    /// Where the verified frames end: a torn tail after it is cut off.
    end: usize,
    /// The file's format version.
    version: u32,
}

/// The format version a file's header names, or why it names none this build reads.
fn header_version(bytes: &[u8]) -> Result<u32, String> {
    let head = bytes.get(..FILE_HEADER_BYTES).filter(|h| &h[..16] == FILE_MAGIC);
    let Some(head) = head else {
        return Err("the Raft log's header is damaged or of another format".into());
    };
    let version = u32::from_le_bytes([head[16], head[17], head[18], head[19]]);
    if head[..] != header_of_version(version)[..] {
        return Err("the Raft log's header is damaged".into());
    }
    if !(OLDEST_FILE_FORMAT..=FILE_FORMAT).contains(&version) {
        return Err(format!(
            "the Raft log is of format version {version}; this build reads versions {OLDEST_FILE_FORMAT} to {FILE_FORMAT}"
        ));
    }
    Ok(version)
}

fn scan(bytes: &[u8], bug: FileLogBug) -> Result<Scan, String> {
    if bytes.is_empty() {
        return Ok(Scan { records: Vec::new(), next_seq: 0, end: 0, version: FILE_FORMAT });
    }
    let version = header_version(bytes)?;
    let mut records = Vec::new();
    let mut at = FILE_HEADER_BYTES;
    let mut expected: Option<u64> = None;
    while at < bytes.len() {
        let verified = frame_header(&bytes[at..]).filter(|h| expected.is_none_or(|seq| h.seq == seq)).and_then(|h| {
            let body = bytes.get(at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + h.body_len)?;
            (bug == FileLogBug::BodyUnchecked || crc32c::crc32c(body) == h.body_crc).then_some((h, body))
        });
        let Some((header, body)) = verified else {
            if let Some(later) = later_frame(bytes, at + 1, expected) {
                return Err(format!(
                    "the Raft log is damaged at byte {at} and a valid batch follows at byte {later}: \
                     acknowledged Raft state would be lost"
                ));
            }
            break;
        };
        let batch: Vec<LogRecord> =
            codec::decode(body).map_err(|e| format!("the Raft log's batch at byte {at} verifies but is {e}"))?;
        records.extend(batch);
        expected = Some(header.seq + 1);
        at += FRAME_HEADER_BYTES + header.body_len;
    }
    let end = if at > bytes.len() { bytes.len() } else { at };
    Ok(Scan { records, next_seq: expected.unwrap_or(0), end, version })
}

/// The first byte from `from` on where a frame header verifies with a sequence number of at
/// least `seq` (any when none is expected yet).
fn later_frame(bytes: &[u8], from: usize, seq: Option<u64>) -> Option<usize> {
    let magic = FRAME_MAGIC.to_le_bytes();
    (from..bytes.len().saturating_sub(FRAME_HEADER_BYTES - 1)).find(|&at| {
        bytes[at..at + 4] == magic && frame_header(&bytes[at..]).is_some_and(|h| seq.is_none_or(|s| h.seq >= s))
    })
}

impl<F: LogFile> FileLog<F> {
    /// Opens the log in `file`: reads every verified batch, cuts a torn tail off, and refuses
    /// damage that would lose synced batches. The file is compacted once it passes
    /// `compact_bytes` and twice its size after the last compaction.
    pub fn open(file: F, compact_bytes: u64, bug: FileLogBug) -> Result<FileLog<F>, String> {
        let bytes = file.read_all().map_err(|e| format!("reading the Raft log: {e}"))?;
        let scan = scan(&bytes, bug)?;
        if bytes.is_empty() {
            file.replace(&file_header()).map_err(|e| format!("creating the Raft log: {e}"))?;
        } else if scan.version != FILE_FORMAT {
            // The frames as they are under the current header; a torn tail is left behind.
            let mut upgraded = file_header();
            upgraded.extend_from_slice(&bytes[FILE_HEADER_BYTES..scan.end]);
            file.replace(&upgraded)
                .map_err(|e| format!("rewriting the Raft log as format version {FILE_FORMAT}: {e}"))?;
        } else if scan.end < bytes.len() {
            file.truncate(scan.end as u64).map_err(|e| format!("cutting the Raft log's torn tail: {e}"))?;
        }
        let size_bytes = scan.end.max(FILE_HEADER_BYTES) as u64;
        let state = State { next_seq: scan.next_seq, size_bytes, compact_at: (2 * size_bytes).max(compact_bytes) };
        Ok(FileLog { file, records: scan.records, state: Mutex::new(state), compact_bytes, bug })
    }

    pub fn file(&self) -> &F {
        &self.file
    }

    pub fn size_bytes(&self) -> u64 {
        self.state.lock().size_bytes
    }
}

impl<F: LogFile> LogMedia for FileLog<F> {
    fn append(&self, records: &[LogRecord]) -> Result<(), String> {
        let mut state = self.state.lock();
        let frame = encode_frame(state.next_seq, records);
        if frame.len() - FRAME_HEADER_BYTES > MAX_BATCH_BYTES {
            return Err(format!("a Raft log batch of {} bytes is over the limit", frame.len()));
        }
        self.file.append(&frame).map_err(|e| format!("appending to the Raft log: {e}"))?;
        state.next_seq += 1;
        state.size_bytes += frame.len() as u64;
        Ok(())
    }

    fn flush(&self) -> Result<(), String> {
        if self.bug == FileLogBug::SyncIgnored {
            return Ok(());
        }
        self.file.sync().map_err(|e| format!("syncing the Raft log: {e}"))
    }

    fn replay(&self) -> Result<Vec<LogRecord>, String> {
        Ok(self.records.clone())
    }

    fn wants_compaction(&self) -> bool {
        let state = self.state.lock();
        state.size_bytes >= state.compact_at
    }

    fn compact(&self, live: &[LogRecord]) -> Result<(), String> {
        let mut state = self.state.lock();
        let mut bytes = file_header();
        bytes.extend_from_slice(&encode_frame(state.next_seq, live));
        self.file.replace(&bytes).map_err(|e| format!("replacing the Raft log: {e}"))?;
        state.next_seq += 1;
        state.size_bytes = bytes.len() as u64;
        state.compact_at = (2 * state.size_bytes).max(self.compact_bytes);
        Ok(())
    }
}

/// How far ahead of its frames an [`OsLogFile`] grows, in zeros written.
pub const PREALLOCATE_BYTES: u64 = 8 << 20;

/// The log's file on the operating system's file system, grown ahead of its frames (module
/// doc).
pub struct OsLogFile {
    path: PathBuf,
    file: Mutex<Option<OpenLog>>,
    /// [`PREALLOCATE_BYTES`], or 0 for a file that grows by its frames alone.
    ahead: u64,
}

struct OpenLog {
    file: std::fs::File,
    ahead: u64,
    /// Where the next frame goes: the end of what was appended.
    end: u64,
    /// The file's size: zeros from `end` on.
    allocated: u64,
}

impl OpenLog {
    /// Writes `bytes` at the end, first growing the file by zeros when they do not fit.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let needed = self.end + bytes.len() as u64;
        if needed > self.allocated && self.ahead > 0 {
            let grown = needed.next_multiple_of(self.ahead);
            let zeros = vec![0u8; (1 << 20).min(grown - self.allocated) as usize];
            let mut at = self.allocated;
            while at < grown {
                let len = zeros.len().min((grown - at) as usize);
                self.file.write_all_at(&zeros[..len], at)?;
                at += len as u64;
            }
            self.allocated = grown;
        }
        self.file.write_all_at(bytes, self.end)?;
        self.end = needed;
        self.allocated = self.allocated.max(needed);
        Ok(())
    }
}

impl OsLogFile {
    pub fn new(path: &Path) -> OsLogFile {
        OsLogFile { path: path.to_path_buf(), file: Mutex::new(None), ahead: PREALLOCATE_BYTES }
    }

    /// A file that grows by its frames alone, every sync committing its new size: what the
    /// benchmarks compare the grown-ahead file with.
    pub fn appending(path: &Path) -> OsLogFile {
        OsLogFile { ahead: 0, ..OsLogFile::new(path) }
    }

    /// The file's size, zeros grown ahead included.
    pub fn allocated_bytes(&self) -> std::io::Result<u64> {
        self.with_file(|open| Ok(open.allocated))
    }

    /// Runs `f` on the open file; opened at its size, all of it taken as frames (a log opens
    /// its file only after [`FileLog::open`] cut any torn tail, zeros grown ahead included).
    fn with_file<T>(&self, f: impl FnOnce(&mut OpenLog) -> std::io::Result<T>) -> std::io::Result<T> {
        let mut file = self.file.lock();
        if file.is_none() {
            let opened = std::fs::OpenOptions::new().write(true).open(&self.path)?;
            let len = opened.metadata()?.len();
            *file = Some(OpenLog { file: opened, ahead: self.ahead, end: len, allocated: len });
        }
        f(file.as_mut().expect("opened above"))
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
            _ => std::fs::File::open(".")?.sync_all(),
        }
    }
}

impl LogFile for OsLogFile {
    fn read_all(&self) -> std::io::Result<Vec<u8>> {
        match std::fs::read(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            other => other,
        }
    }

    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.with_file(|open| open.append(bytes))
    }

    fn sync(&self) -> std::io::Result<()> {
        self.with_file(|open| open.file.sync_data())
    }

    fn truncate(&self, len: u64) -> std::io::Result<()> {
        self.with_file(|open| {
            open.file.set_len(len)?;
            open.file.sync_all()?;
            (open.end, open.allocated) = (len, len);
            Ok(())
        })
    }

    fn replace(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(".new");
        let temporary = PathBuf::from(temporary);
        {
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(bytes)?;
            file.sync_all()?;
        }
        let mut file = self.file.lock();
        std::fs::rename(&temporary, &self.path)?;
        self.sync_dir()?;
        *file = None;
        Ok(())
    }
}

/// A log file in memory that crashes as a real one may: bytes appended since the last sync
/// are lost in part (a prefix survives, then zeros where the file grew but its data did not
/// reach the medium).
#[derive(Default)]
pub struct MemLogFile {
    images: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl MemLogFile {
    /// Power loss: the written image becomes the durable one plus a random prefix of what was
    /// not synced, and a random run of zeros.
    pub fn crash(&self, rng: &mut Rng) {
        let mut images = self.images.lock();
        let (written, durable) = &mut *images;
        let unsynced = written.len().saturating_sub(durable.len());
        let kept = rng.below(unsynced as u64 + 1) as usize;
        let zeros = rng.below((unsynced - kept) as u64 + 1) as usize;
        let mut image = written[..durable.len() + kept].to_vec();
        image.resize(image.len() + zeros, 0);
        *written = image.clone();
        *durable = image;
    }

    /// Flips bit `bit` of the durable (and written) image.
    pub fn flip_bit(&self, bit: u64) {
        let mut images = self.images.lock();
        let (written, durable) = &mut *images;
        let byte = (bit / 8) as usize;
        for image in [written, durable] {
            if let Some(b) = image.get_mut(byte) {
                *b ^= 1 << (bit % 8);
            }
        }
    }

    pub fn durable_len(&self) -> usize {
        self.images.lock().1.len()
    }
}

impl LogFile for MemLogFile {
    fn read_all(&self) -> std::io::Result<Vec<u8>> {
        Ok(self.images.lock().0.clone())
    }

    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.images.lock().0.extend_from_slice(bytes);
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        let mut images = self.images.lock();
        images.1 = images.0.clone();
        Ok(())
    }

    fn truncate(&self, len: u64) -> std::io::Result<()> {
        let mut images = self.images.lock();
        images.0.truncate(len as usize);
        images.1 = images.0.clone();
        Ok(())
    }

    fn replace(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut images = self.images.lock();
        images.0 = bytes.to_vec();
        images.1 = bytes.to_vec();
        Ok(())
    }
}

impl<F: LogFile> LogFile for std::sync::Arc<F> {
    fn read_all(&self) -> std::io::Result<Vec<u8>> {
        (**self).read_all()
    }
    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        (**self).append(bytes)
    }
    fn sync(&self) -> std::io::Result<()> {
        (**self).sync()
    }
    fn truncate(&self, len: u64) -> std::io::Result<()> {
        (**self).truncate(len)
    }
    fn replace(&self, bytes: &[u8]) -> std::io::Result<()> {
        (**self).replace(bytes)
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
