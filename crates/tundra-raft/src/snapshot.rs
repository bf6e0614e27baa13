//! A chunk's snapshot as a manifest plus extents (seed 000 §3.2.1: a replica that fell behind,
//! or a new one, receives the chunk's stored images, never compressed again).
//!
//! - The **manifest** is what openraft carries as the snapshot's data: the chunk, its apply
//!   mark (last log id and membership), and one line per stored image (a page's, or a heavy
//!   segment's with the pages pointing into it, seed 000 §3.2.3) with its place and length in
//!   the extents and its crc32c; a crc32c of its own closes it (docs/format.md, "Snapshot
//!   manifest").
//! - The **extents** are the images' exact stored bytes back to back, written to a file on the
//!   sender's disk when openraft asks for a builder (between two applies: a point-in-time copy
//!   while applies go on), and pushed to the receiver in pieces of at most [`PIECE_BYTES`] over
//!   the node's one link per peer ([`crate::network::Rpc::SnapshotPiece`]).
//! - The **receiver** stages the pieces in a file keyed by the group and snapshot id, checking
//!   each piece's crc32c; every answer says how many bytes it holds, so a transfer cut by a
//!   dropped link or started again by the sender resumes there. A piece of another snapshot id
//!   discards the stage. Install reads the staged images one at a time, checks each against the
//!   manifest, and replaces the chunk all or nothing ([`Store::replace_chunk_images`]).
//!
//! Memory per transfer: one piece on each side, one image at install, and the manifest (some
//! 30 bytes per page).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use parking_lot::Mutex;
use tundra_store::ErrorKind;
use tundra_store::command::PagePut;
use tundra_store::ids::{ChunkId, Lsn, PageNo};
use tundra_store::index::{Encoding, PageEntry};
use tundra_store::store::{ChunkImage, HeavySlot, PageImage, Store};

use crate::types::GroupId;

/// Where [`SnapshotFiles::write_extents`] hands the bytes it is given, piece after piece.
pub type ExtentsSink<'a> = dyn FnMut(&[u8]) -> Result<(), String> + 'a;

/// The most bytes one piece carries.
pub const PIECE_BYTES: usize = 1 << 20;

const MAGIC: &[u8; 8] = b"TNDSNAP\0";

/// A page a capture could not copy as good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadImage {
    pub page: PageNo,
    /// The image was read, and failed its check; otherwise the read itself failed.
    pub readable: bool,
    pub why: String,
}

/// A chunk's images read and checked ahead of a capture, while the group's applies go on
/// ([`Precopy::fill`]), so that the capture, which holds the applies, copies from memory what
/// has not changed since and reads only the rest. A capture of the busy chunks of PostgreSQL
/// on a replicated mount held their applies for half a second to a second, writing nothing
/// meanwhile (bench/results/2026-12-01-restart-under-load, cause 1). An image serves a
/// capture only for exactly the entry it was read for (the page's place, encoding, checksum
/// and LSN), and a heavy segment's only for the same pages pointing into it: a page written
/// since is read again, so the capture is still of exactly the state between two applies.
#[derive(Default)]
pub struct Precopy {
    images: Mutex<HashMap<(PageNo, PageEntry), ChunkImage>>,
    /// When the fill finished, once it has.
    filled_at: std::sync::OnceLock<std::time::Instant>,
    /// Images it gave captures.
    served: std::sync::atomic::AtomicUsize,
    /// The injected bug of a twin: an image serves any entry of its page.
    any_entry: std::sync::atomic::AtomicBool,
}

impl Precopy {
    /// Reads every image of `group`'s chunk as the index stands at each step and keeps those
    /// that pass `check`; an image whose page changes while it is read, or that fails its
    /// check, is left out (the capture reads it again, and deals with a bad one).
    pub fn fill(&self, store: &Store, group: GroupId, check: &dyn Fn(&ChunkImage) -> tundra_store::Result<()>) {
        for (page, entry, slots) in store.snapshot_plan(group) {
            if let Ok(Some(image)) = checked_image(store, group, (page, &entry, slots), check) {
                self.images.lock().insert((page, entry), image);
            }
        }
        let _ = self.filled_at.set(std::time::Instant::now());
    }

    /// Whether it was filled less than `fresh` ago (a fill still running is not).
    pub fn is_fresh(&self, fresh: std::time::Duration) -> bool {
        self.filled_at.get().is_some_and(|at| at.elapsed() < fresh)
    }

    /// How many images it gave captures.
    pub fn served(&self) -> usize {
        self.served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether [`Precopy::fill`] has finished.
    pub fn is_done(&self) -> bool {
        self.filled_at.get().is_some()
    }

    /// How many images it holds.
    pub fn len(&self) -> usize {
        self.images.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the image read ahead for `page` at exactly `entry` (and, for a heavy
    /// segment, `slots`): it stays for the captures after this one.
    fn image_for(&self, page: PageNo, entry: &PageEntry, slots: &[HeavySlot]) -> Option<ChunkImage> {
        let images = self.images.lock();
        let key = if self.any_entry.load(std::sync::atomic::Ordering::Relaxed) {
            images.keys().find(|(p, _)| *p == page).copied()?
        } else {
            (page, *entry)
        };
        let image = match images.get(&key)? {
            ChunkImage::Heavy { pages, .. } if pages != slots => return None,
            image => image.clone(),
        };
        self.served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(image)
    }

    /// Injects a twin's bug: an image read ahead serves its page whatever the page's entry is
    /// now.
    pub fn set_any_entry(&self, on: bool) {
        self.any_entry.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The stored image of one step of [`Store::snapshot_plan`] if it passes `check`: `None` if
/// the page is gone; a [`BadImage`] if it cannot be read or fails the check; any other error
/// as [`CaptureError::Failed`].
fn checked_image(
    store: &Store,
    group: GroupId,
    (page, entry, slots): (PageNo, &PageEntry, Vec<HeavySlot>),
    check: &dyn Fn(&ChunkImage) -> tundra_store::Result<()>,
) -> Result<Option<ChunkImage>, CaptureError> {
    let image = match store.snapshot_image(group, page, entry, slots) {
        Ok(Some(image)) => image,
        Ok(None) => return Ok(None),
        Err(error) if matches!(error.kind(), ErrorKind::Corrupted | ErrorKind::Io) => {
            return Err(CaptureError::BadPages(vec![BadImage { page, readable: false, why: error.to_string() }]));
        }
        Err(error) => return Err(CaptureError::Failed(error.to_string())),
    };
    match check(&image) {
        Ok(()) => Ok(Some(image)),
        Err(error) => Err(CaptureError::BadPages(vec![BadImage { page, readable: true, why: error.to_string() }])),
    }
}

/// Why [`SnapshotFiles::capture`] gave no snapshot.
#[derive(Debug)]
pub enum CaptureError {
    /// These pages' images here are bad; every other image was good.
    BadPages(Vec<BadImage>),
    /// Anything else (the snapshot files, the store).
    Failed(String),
}

impl From<String> for CaptureError {
    fn from(why: String) -> CaptureError {
        CaptureError::Failed(why)
    }
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::BadPages(bad) => {
                let pages: Vec<String> = bad.iter().map(|b| format!("page {}: {}", b.page.0, b.why)).collect();
                write!(f, "{} bad page image(s) here: {}", bad.len(), pages.join("; "))
            }
            CaptureError::Failed(why) => f.write_str(why),
        }
    }
}

const MANIFEST_FORMAT: u16 = 1;
const KIND_PAGE: u8 = 0;
const KIND_HEAVY: u8 = 1;

/// What a snapshot holds, without the image bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub chunk: ChunkId,
    /// The chunk's apply mark ([`crate::mark::ApplyMark`]'s encoding): last log id and
    /// membership the snapshot stands for.
    pub mark: Vec<u8>,
    /// Bytes of the extents: every image's, back to back.
    pub extents_len: u64,
    pub images: Vec<ImageLine>,
}

/// One stored image in the extents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageLine {
    pub offset: u64,
    pub len: u32,
    /// crc32c of the image's stored bytes.
    pub crc: u32,
    pub what: Holds,
}

/// Whose image it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holds {
    /// A page's own image: its encoding, the checksum of its content, its LSN.
    Page { page: PageNo, encoding: Encoding, checksum: u32, lsn: Lsn },
    /// A heavy segment and the pages of the chunk that point into it.
    Heavy(Vec<HeavySlot>),
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.images.len() * 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&MANIFEST_FORMAT.to_le_bytes());
        out.extend_from_slice(&self.chunk.0.to_le_bytes());
        out.push(self.mark.len() as u8);
        out.extend_from_slice(&self.mark);
        out.extend_from_slice(&self.extents_len.to_le_bytes());
        out.extend_from_slice(&(self.images.len() as u64).to_le_bytes());
        for line in &self.images {
            out.extend_from_slice(&line.offset.to_le_bytes());
            out.extend_from_slice(&line.len.to_le_bytes());
            out.extend_from_slice(&line.crc.to_le_bytes());
            match &line.what {
                Holds::Page { page, encoding, checksum, lsn } => {
                    out.push(KIND_PAGE);
                    out.extend_from_slice(&page.0.to_le_bytes());
                    out.push(encoding.to_bits());
                    out.extend_from_slice(&checksum.to_le_bytes());
                    out.extend_from_slice(&lsn.0.to_le_bytes());
                }
                Holds::Heavy(slots) => {
                    out.push(KIND_HEAVY);
                    out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
                    for slot in slots {
                        out.extend_from_slice(&slot.page.0.to_le_bytes());
                        out.extend_from_slice(&slot.position.to_le_bytes());
                        out.extend_from_slice(&slot.checksum.to_le_bytes());
                        out.extend_from_slice(&slot.lsn.0.to_le_bytes());
                    }
                }
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a manifest from a peer: its own checksum first, then every field and count
    /// against the bytes left; images must lie in order inside the extents.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        if bytes.len() < MAGIC.len() + 6 {
            return Err(format!("a snapshot manifest of {} bytes", bytes.len()));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        if crc32c::crc32c(body) != crc {
            return Err("a snapshot manifest that fails its checksum".into());
        }
        let mut r = Reader { bytes: body, at: 0 };
        if r.take(MAGIC.len())? != MAGIC {
            return Err("not a snapshot manifest".into());
        }
        let format = r.u16()?;
        if format != MANIFEST_FORMAT {
            return Err(format!("a snapshot manifest of format {format}; this build reads {MANIFEST_FORMAT}"));
        }
        let chunk = ChunkId(r.u64()?);
        let mark_len = usize::from(r.u8()?);
        let mark = r.take(mark_len)?.to_vec();
        let extents_len = r.u64()?;
        let count = r.u64()?;
        // Every line takes at least 18 bytes: a count beyond the bytes left is damage.
        if count > (body.len() - r.at) as u64 / 18 {
            return Err(format!("a snapshot manifest naming {count} images in {} bytes", body.len()));
        }
        let mut images = Vec::with_capacity(count as usize);
        let mut end = 0u64;
        for _ in 0..count {
            let (offset, len, crc) = (r.u64()?, r.u32()?, r.u32()?);
            if offset != end || offset + u64::from(len) > extents_len {
                return Err(format!(
                    "an image at {offset}+{len} in extents of {extents_len} bytes (expected at {end})"
                ));
            }
            end = offset + u64::from(len);
            let what = match r.u8()? {
                KIND_PAGE => {
                    let page = PageNo(r.u32()?);
                    let bits = r.u8()?;
                    let encoding = Encoding::from_bits(bits)
                        .filter(|&e| e != Encoding::Heavy)
                        .ok_or_else(|| format!("a page image of encoding {bits}"))?;
                    Holds::Page { page, encoding, checksum: r.u32()?, lsn: Lsn(r.u64()?) }
                }
                KIND_HEAVY => {
                    let slots = r.u32()?;
                    if u64::from(slots) > (body.len() - r.at) as u64 / 18 {
                        return Err(format!("a heavy segment of {slots} pages"));
                    }
                    let mut list = Vec::with_capacity(slots as usize);
                    for _ in 0..slots {
                        let page = PageNo(r.u32()?);
                        let position = r.u16()?;
                        list.push(HeavySlot { page, position, checksum: r.u32()?, lsn: Lsn(r.u64()?) });
                    }
                    Holds::Heavy(list)
                }
                other => return Err(format!("an image of kind {other}")),
            };
            images.push(ImageLine { offset, len, crc, what });
        }
        if end != extents_len || r.at != body.len() {
            return Err(format!("a snapshot manifest whose images cover {end} of {extents_len} bytes"));
        }
        Ok(Manifest { chunk, mark, extents_len, images })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end =
            self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or("a truncated snapshot manifest")?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
}

/// Bugs for the tests to catch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SnapshotBug {
    #[default]
    None,
    /// The receiver stages a piece without checking its checksum.
    SkipPieceChecksum,
    /// The sender starts every transfer again from the first byte.
    ResumeFromZero,
}

/// A node's snapshot files: the extents it captured as a sender, the stages it receives into.
/// In a directory on the node's disk, or in memory (the simulation's nodes have no disk).
pub struct SnapshotFiles {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<String, Vec<u8>>>,
    /// The snapshot id each group's stage is of.
    stages: Mutex<HashMap<GroupId, String>>,
    /// The snapshot id of each group's claimed stage: whole and verified, out of reach of
    /// pieces, waiting for openraft to install it.
    claimed: Mutex<HashMap<GroupId, String>>,
    bug: Mutex<SnapshotBug>,
    /// Chunks captured since the files were opened.
    captures: std::sync::atomic::AtomicU64,
}

impl SnapshotFiles {
    /// How many chunks were captured (to be sent) since the files were opened.
    pub fn captures(&self) -> u64 {
        self.captures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Files in memory.
    pub fn in_memory() -> SnapshotFiles {
        SnapshotFiles {
            dir: None,
            memory: Mutex::default(),
            stages: Mutex::default(),
            claimed: Mutex::default(),
            bug: Mutex::default(),
            captures: Default::default(),
        }
    }

    /// Files in `dir`, created if needed; files left by a previous run are removed (a sender's
    /// extents are captured again; a stage of a transfer is kept: its id is in its name).
    pub fn in_dir(dir: PathBuf) -> Result<SnapshotFiles, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let files = SnapshotFiles { dir: Some(dir.clone()), ..SnapshotFiles::in_memory() };
        let listing = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in listing.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix("stage-")
                && let Some((group, id)) = rest.split_once('-')
                && let Ok(group) = group.parse::<u64>()
            {
                files.stages.lock().insert(ChunkId(group), id.to_string());
            } else {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(files)
    }

    /// Whether the files are on disk (their I/O blocks).
    pub fn on_disk(&self) -> bool {
        self.dir.is_some()
    }

    /// Test-only fault switch.
    pub fn set_bug(&self, bug: SnapshotBug) {
        *self.bug.lock() = bug;
    }

    pub(crate) fn bug(&self) -> SnapshotBug {
        *self.bug.lock()
    }

    fn extents_name(group: GroupId, id: &str) -> String {
        format!("send-{}-{id}", group.0)
    }

    fn stage_name(group: GroupId, id: &str) -> String {
        format!("stage-{}-{id}", group.0)
    }

    fn claimed_name(group: GroupId, id: &str) -> String {
        format!("install-{}-{id}", group.0)
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(name))
    }

    fn len(&self, name: &str) -> Result<u64, String> {
        match self.path(name) {
            Some(path) => match std::fs::metadata(&path) {
                Ok(meta) => Ok(meta.len()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
                Err(e) => Err(format!("{}: {e}", path.display())),
            },
            None => Ok(self.memory.lock().get(name).map_or(0, |v| v.len() as u64)),
        }
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        match self.path(name) {
            Some(path) => {
                let mut file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                file.seek(SeekFrom::Start(offset)).map_err(|e| format!("{}: {e}", path.display()))?;
                let mut out = Vec::with_capacity(len);
                file.take(len as u64).read_to_end(&mut out).map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(out)
            }
            None => {
                let memory = self.memory.lock();
                let data = memory.get(name).ok_or_else(|| format!("no snapshot file {name}"))?;
                let start = (offset as usize).min(data.len());
                Ok(data[start..(start + len).min(data.len())].to_vec())
            }
        }
    }

    fn append(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        match self.path(name) {
            Some(path) => {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                file.write_all(bytes).map_err(|e| format!("{}: {e}", path.display()))
            }
            None => {
                self.memory.lock().entry(name.to_string()).or_default().extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    fn remove(&self, name: &str) {
        match self.path(name) {
            Some(path) => {
                let _ = std::fs::remove_file(path);
            }
            None => {
                self.memory.lock().remove(name);
            }
        }
    }

    /// Removes the extents of the group's snapshots other than `keep`.
    fn remove_other_extents(&self, group: GroupId, keep: &str) {
        let prefix = format!("send-{}-", group.0);
        let keep = Self::extents_name(group, keep);
        match &self.dir {
            Some(dir) => {
                for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with(&prefix) && name != keep {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
            None => self.memory.lock().retain(|name, _| !name.starts_with(&prefix) || *name == keep),
        }
    }

    /// Captures `group`'s chunk as it stands in `store` into the extents of snapshot `id`, and
    /// answers the manifest. Called between two applies: the copy is of exactly the state the
    /// apply mark `mark` names. The extents are written to a new file, then renamed over any of
    /// the same id (a transfer reading an older copy keeps its own).
    ///
    /// Each image goes through `check` first (the state machine decompresses it and compares
    /// its checksum; a heavy segment's, every page of it), so a bad copy here is not handed on
    /// as the chunk's. A page that cannot be read or fails `check` does not stop the capture:
    /// every such page (a heavy segment's first) is listed in [`CaptureError::BadPages`], for
    /// the caller to repair from a peer and capture again. An image `ahead` holds for exactly
    /// the page's entry is taken from it, checked already ([`Precopy`]).
    pub fn capture(
        &self,
        store: &Store,
        (group, id): (GroupId, &str),
        mark: Vec<u8>,
        check: &dyn Fn(&ChunkImage) -> tundra_store::Result<()>,
        ahead: Option<&Precopy>,
    ) -> Result<Manifest, CaptureError> {
        self.captures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = Self::extents_name(group, id);
        let fresh = format!("{name}.new");
        self.remove(&fresh);
        let mut out = CaptureWriter::open(self, &fresh)?;
        let mut images = Vec::new();
        let mut bad = Vec::new();
        for (page, entry, slots) in store.snapshot_plan(group) {
            let read = match ahead.and_then(|ahead| ahead.image_for(page, &entry, &slots)) {
                Some(image) => Ok(Some(image)),
                None => checked_image(store, group, (page, &entry, slots), check),
            };
            let image = match read {
                Ok(Some(image)) => image,
                Ok(None) => continue,
                Err(CaptureError::BadPages(found)) => {
                    bad.extend(found);
                    continue;
                }
                Err(failed) => return Err(failed),
            };
            let (bytes, what) = match image {
                ChunkImage::Page(put) => {
                    let what = Holds::Page {
                        page: put.page,
                        encoding: put.image.encoding,
                        checksum: put.image.checksum,
                        lsn: put.lsn,
                    };
                    (put.image.bytes, what)
                }
                ChunkImage::Heavy { segment, pages } => (segment, Holds::Heavy(pages)),
            };
            images.push(ImageLine { offset: out.len, len: bytes.len() as u32, crc: crc32c::crc32c(&bytes), what });
            out.write(&bytes)?;
        }
        let extents_len = out.finish()?;
        if !bad.is_empty() {
            self.remove(&fresh);
            return Err(CaptureError::BadPages(bad));
        }
        self.rename(&fresh, name)?;
        self.remove_other_extents(group, id);
        Ok(Manifest { chunk: group, mark, extents_len, images })
    }

    /// Bytes of the captured extents of snapshot `id`, and a piece of them.
    pub fn extents_len(&self, group: GroupId, id: &str) -> Result<u64, String> {
        self.len(&Self::extents_name(group, id))
    }

    pub fn extents_piece(&self, group: GroupId, id: &str, offset: u64, max: usize) -> Result<Vec<u8>, String> {
        self.read_at(&Self::extents_name(group, id), offset, max)
    }

    /// A piece of snapshot `id`'s extents for `group`, at `offset`, with its crc32c, as the
    /// receiver takes it: staged if it is the next piece and verifies. Answers the bytes the
    /// stage holds now, so the sender knows where to go on. A piece of another id than the
    /// stage's discards the stage first.
    pub fn receive_piece(
        &self,
        group: GroupId,
        id: &str,
        total: u64,
        offset: u64,
        data: &[u8],
        crc: u32,
    ) -> Result<u64, String> {
        if id.is_empty() || id.contains(['/', '\\']) || id.len() > 128 {
            return Err(format!("a snapshot id {id:?}"));
        }
        let name = Self::stage_name(group, id);
        {
            let mut stages = self.stages.lock();
            if let Some(old) = stages.get(&group).filter(|old| *old != id) {
                self.remove(&Self::stage_name(group, old));
            }
            if stages.get(&group).map(String::as_str) != Some(id) {
                self.remove(&name);
                stages.insert(group, id.to_string());
            }
        }
        let held = self.len(&name)?;
        let verified = self.bug() == SnapshotBug::SkipPieceChecksum || crc32c::crc32c(data) == crc;
        if data.is_empty() || !verified || offset != held || held + data.len() as u64 > total {
            return Ok(held);
        }
        self.append(&name, data)?;
        Ok(held + data.len() as u64)
    }

    /// Writes snapshot `id`'s extents for `group` with `fill`, which hands its bytes in pieces
    /// to the writer it is given: to a new file, renamed over any of the same id once whole
    /// (as [`SnapshotFiles::capture`] does for a chunk). Answers their length and crc32c. A
    /// redo group's copy of its stream (redo_machine.rs) is written this way.
    pub fn write_extents(
        &self,
        group: GroupId,
        id: &str,
        fill: &mut dyn FnMut(&mut ExtentsSink<'_>) -> Result<(), String>,
    ) -> Result<(u64, u32), String> {
        let name = Self::extents_name(group, id);
        let fresh = format!("{name}.new");
        self.remove(&fresh);
        let mut out = CaptureWriter::open(self, &fresh)?;
        let mut crc = 0u32;
        let filled = fill(&mut |bytes: &[u8]| {
            crc = crc32c::crc32c_append(crc, bytes);
            out.write(bytes)
        });
        if let Err(why) = filled {
            drop(out);
            self.remove(&fresh);
            return Err(why);
        }
        let len = out.finish()?;
        self.rename(&fresh, name)?;
        self.remove_other_extents(group, id);
        Ok((len, crc))
    }

    /// Claims the group's stage of snapshot `id` whose extents are `len` bytes of crc32c
    /// `crc` (a redo group's copy): the stage must be whole and match, read in pieces. As
    /// [`SnapshotFiles::claim`], it then moves out of reach of later pieces.
    pub fn claim_whole(&self, group: GroupId, id: &str, len: u64, crc: u32) -> Result<(), String> {
        let mut stages = self.stages.lock();
        let name = Self::stage_name(group, id);
        let staged = if stages.get(&group).map(String::as_str) == Some(id) { self.len(&name)? } else { 0 };
        if staged != len {
            return Err(format!("snapshot {id}: {staged} of {len} bytes of its extents arrived"));
        }
        let mut at = 0u64;
        let mut sum = 0u32;
        while at < len {
            let piece = self.read_at(&name, at, PIECE_BYTES)?;
            if piece.is_empty() {
                return Err(format!("snapshot {id}: its stage ends at {at} of {len} bytes"));
            }
            sum = crc32c::crc32c_append(sum, &piece);
            at += piece.len() as u64;
        }
        if sum != crc {
            stages.remove(&group);
            self.remove(&name);
            return Err(format!("snapshot {id}: its extents fail their checksum; staging again"));
        }
        stages.remove(&group);
        self.take_claimed(group, id, &name)?;
        Ok(())
    }

    /// Renames file `from` to `to` (on disk, or in memory for the simulation).
    fn rename(&self, from: &str, to: String) -> Result<(), String> {
        match (self.path(from), self.path(&to)) {
            (Some(from), Some(to)) => std::fs::rename(&from, &to).map_err(|e| format!("{}: {e}", to.display()))?,
            _ => {
                let mut memory = self.memory.lock();
                let data = memory.remove(from).unwrap_or_default();
                memory.insert(to, data);
            }
        }
        Ok(())
    }

    /// Makes stage `name` the group's claimed stage of snapshot `id`, dropping an older claim.
    fn take_claimed(&self, group: GroupId, id: &str, name: &str) -> Result<(), String> {
        self.rename(name, Self::claimed_name(group, id))?;
        if let Some(old) = self.claimed.lock().insert(group, id.to_string()).filter(|old| old != id) {
            self.remove(&Self::claimed_name(group, &old));
        }
        Ok(())
    }

    /// Bytes of the group's claimed stage of snapshot `id` (0 if none is claimed), and a piece
    /// of them.
    pub fn claimed_len(&self, group: GroupId, id: &str) -> Result<u64, String> {
        if self.claimed.lock().get(&group).map(String::as_str) != Some(id) {
            return Ok(0);
        }
        self.len(&Self::claimed_name(group, id))
    }

    pub fn claimed_piece(&self, group: GroupId, id: &str, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        self.read_at(&Self::claimed_name(group, id), offset, len)
    }

    /// Claims the group's stage of snapshot `id` for its install, once the manifest arrived:
    /// the manifest must decode and name this chunk, the stage must be whole and every image
    /// in it pass its crc32c. The stage then moves out of reach of later pieces (a piece of
    /// another snapshot, from a new leader, would discard it), so the install that follows
    /// cannot find it changed. An error means nothing was claimed: the sender is to try again
    /// (the transfer resumes), and openraft is not asked to install what would fail.
    pub fn claim(&self, group: GroupId, id: &str, manifest: &[u8]) -> Result<(), String> {
        let manifest = Manifest::decode(manifest)?;
        if manifest.chunk != group {
            return Err(format!("a snapshot of chunk {} sent to chunk {}", manifest.chunk.0, group.0));
        }
        let mut stages = self.stages.lock();
        let name = Self::stage_name(group, id);
        let staged = if stages.get(&group).map(String::as_str) == Some(id) { self.len(&name)? } else { 0 };
        if staged != manifest.extents_len {
            return Err(format!("snapshot {id}: {staged} of {} bytes of its extents arrived", manifest.extents_len));
        }
        for line in &manifest.images {
            let bytes = self.read_at(&name, line.offset, line.len as usize)?;
            if bytes.len() != line.len as usize || crc32c::crc32c(&bytes) != line.crc {
                stages.remove(&group);
                self.remove(&name);
                return Err(format!("snapshot {id}: the image at {} fails its checksum; staging again", line.offset));
            }
        }
        stages.remove(&group);
        self.take_claimed(group, id, &name)?;
        Ok(())
    }

    /// Removes the group's claimed stage of snapshot `id`, installed or not.
    pub fn discard_claimed(&self, group: GroupId, id: &str) {
        let mut claimed = self.claimed.lock();
        if claimed.get(&group).map(String::as_str) == Some(id) {
            claimed.remove(&group);
            self.remove(&Self::claimed_name(group, id));
        }
    }

    /// Discards the group's stage if it is of snapshot `id`.
    pub fn discard_stage_of(&self, group: GroupId, id: &str) {
        let mut stages = self.stages.lock();
        if stages.get(&group).map(String::as_str) == Some(id) {
            stages.remove(&group);
            self.remove(&Self::stage_name(group, id));
        }
    }

    /// Discards the group's stage.
    pub fn discard_stage(&self, group: GroupId) {
        if let Some(id) = self.stages.lock().remove(&group) {
            self.remove(&Self::stage_name(group, &id));
        }
    }

    /// Replaces `group`'s chunk in `store` with snapshot `id`: the manifest `manifest` (bytes
    /// from the network, decoded with every check), the images from the stage, each checked
    /// against its line before the chunk changes. A stage that is short or an image that fails
    /// its checksum is discarded (the next transfer starts over) and nothing changes.
    pub fn install(&self, store: &Store, group: GroupId, id: &str, manifest: &[u8]) -> Result<Manifest, String> {
        let manifest = Manifest::decode(manifest)?;
        if manifest.chunk != group {
            return Err(format!("a snapshot of chunk {} sent to chunk {}", manifest.chunk.0, group.0));
        }
        let claimed = self.claimed.lock().get(&group).map(String::as_str) == Some(id);
        let name = if claimed { Self::claimed_name(group, id) } else { Self::stage_name(group, id) };
        let staged = if claimed || self.stages.lock().get(&group).map(String::as_str) == Some(id) {
            self.len(&name)?
        } else {
            0
        };
        if staged != manifest.extents_len {
            return Err(format!("snapshot {id}: {staged} of {} bytes of its extents arrived", manifest.extents_len));
        }
        let mut bad = false;
        let mut images = manifest.images.iter().map(|line| {
            let bytes = self.read_at(&name, line.offset, line.len as usize).map_err(tundra_store::Error::invalid)?;
            if bytes.len() != line.len as usize || crc32c::crc32c(&bytes) != line.crc {
                bad = true;
                return Err(tundra_store::Error::invalid(format!(
                    "snapshot {id}: the image at {} fails its checksum",
                    line.offset
                )));
            }
            Ok(match &line.what {
                Holds::Page { page, encoding, checksum, lsn } => ChunkImage::Page(PagePut {
                    page: *page,
                    image: PageImage { encoding: *encoding, bytes, checksum: *checksum },
                    lsn: *lsn,
                }),
                Holds::Heavy(slots) => ChunkImage::Heavy { segment: bytes, pages: slots.clone() },
            })
        });
        let result = store.replace_chunk_images(group, &mut images, &manifest.mark);
        drop(images);
        if bad || result.is_ok() {
            self.discard_stage_of(group, id);
            self.discard_claimed(group, id);
        }
        result.map_err(|e| e.to_string())?;
        Ok(manifest)
    }
}

/// The extents being captured: a buffered file, or memory.
struct CaptureWriter<'a> {
    files: &'a SnapshotFiles,
    name: String,
    file: Option<std::io::BufWriter<std::fs::File>>,
    len: u64,
}

impl<'a> CaptureWriter<'a> {
    fn open(files: &'a SnapshotFiles, name: &str) -> Result<CaptureWriter<'a>, String> {
        let file = match files.path(name) {
            Some(path) => Some(std::io::BufWriter::with_capacity(
                PIECE_BYTES,
                std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?,
            )),
            None => None,
        };
        Ok(CaptureWriter { files, name: name.to_string(), file, len: 0 })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        match &mut self.file {
            Some(file) => file.write_all(bytes).map_err(|e| format!("{}: {e}", self.name))?,
            None => self.files.append(&self.name, bytes)?,
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn finish(self) -> Result<u64, String> {
        if let Some(file) = self.file {
            file.into_inner().map_err(|e| format!("{}: {e}", self.name))?;
        }
        if self.len == 0 {
            self.files.append(&self.name, &[])?;
        }
        Ok(self.len)
    }
}
