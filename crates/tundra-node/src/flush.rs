//! Durability: a client's flush of one volume or of every volume, the write-back cache's dirty
//! pages written to the store (several writers at once, pages of one chunk with one journal
//! commit), and the final flush and checkpoints of [`Node::close`].

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tundra_device::BlockDevice;
use tundra_store::ids::VolumeId;

use crate::node::{Node, VolumeRef, WriteMode};
use crate::writeback::{Content, Snapshot};
use crate::{Error, Result};

/// Pages of one chunk a flush stores with one journal commit.
const FLUSH_BATCH_PAGES: usize = 64;

impl Node {
    /// Makes acknowledged writes durable: those of `volume` (an NBD FLUSH covers its own
    /// export), or of every volume. Their dirty pages are written to the store (compressed,
    /// journalled). A flush of the uncompressed redo volume therefore never waits for data
    /// pages to be compressed: redo writes bypass the compression path (seed 000 §3.3.1).
    ///
    /// The store's writes are durable when they return (their journal commit flushes the data
    /// device, then the journal), and a volume's writes that are not in the write-back cache
    /// went to the store: so once the volume's cached pages are stored there is nothing of it
    /// left to flush on the devices, and a flush of a volume with nothing cached does no I/O.
    /// A flush of every volume (`None`) flushes both devices as well.
    pub fn flush(&self, volume: Option<&VolumeRef>) -> Result<()> {
        let started = self.clock.now();
        match volume {
            Some(volume) => {
                volume.check_live()?;
                self.flush_dirty_of(Some(volume.volume.id))?;
                volume.latency.flush.observe(self.clock.now().saturating_sub(started));
            }
            None => {
                self.flush_dirty()?;
                self.drive.flush()?;
                self.fast_device.flush()?;
            }
        }
        Ok(())
    }

    /// Writes every page that was dirty when it was called to the store.
    pub(crate) fn flush_dirty(&self) -> Result<()> {
        self.flush_dirty_of(None)
    }

    /// Writes the pages dirty when it was called (of one volume, or of every volume, one volume
    /// after another) to the store.
    fn flush_dirty_of(&self, only: Option<VolumeId>) -> Result<()> {
        if self.writeback.is_empty() {
            return Ok(());
        }
        match only {
            Some(volume) => self.flush_volume_dirty(volume),
            None => self.writeback.dirty_volumes().into_iter().try_for_each(|volume| self.flush_volume_dirty(volume)),
        }
    }

    /// Writes the pages of `volume` dirty when it was called to the store, several at a time so
    /// that their journal records share group commits. One flush of a volume runs at a time;
    /// flushes of different volumes run side by side (writeback.rs).
    fn flush_volume_dirty(&self, volume_id: VolumeId) -> Result<()> {
        let _exclusive = self.writeback.flushing(volume_id);
        let dirty = self.writeback.snapshot(volume_id);
        if dirty.is_empty() {
            return Ok(());
        }
        // Batches of pages of one chunk, each stored with one journal commit; trims alone. The
        // snapshot is of one volume, in page order: the volume is looked up once.
        let mut batches: Vec<std::ops::Range<usize>> = Vec::new();
        let mut volume: Option<(VolumeId, Option<VolumeRef>)> = None;
        let mut chunk_of = |d: &Snapshot| {
            if volume.as_ref().is_none_or(|(id, _)| *id != d.key.0) {
                volume = Some((d.key.0, self.volume(d.key.0).ok()));
            }
            match (&d.content, volume.as_ref().and_then(|(_, v)| v.as_ref())) {
                (Content::Page(_), Some(v)) => v.volume.locate(d.key.1).ok().map(|(chunk, _)| chunk),
                _ => None,
            }
        };
        let mut start = 0;
        let mut start_chunk = chunk_of(&dirty[0]);
        for i in 1..=dirty.len() {
            let chunk = if i < dirty.len() { chunk_of(&dirty[i]) } else { None };
            if i == dirty.len() || chunk.is_none() || chunk != start_chunk || i - start >= FLUSH_BATCH_PAGES {
                batches.push(start..i);
                start = i;
                start_chunk = chunk;
            }
        }
        let next = AtomicUsize::new(0);
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= batches.len() || failure.lock().is_some() {
                    break;
                }
                let batch = &dirty[batches[i].clone()];
                match self.flush_batch(batch) {
                    Ok(()) => batch.iter().for_each(|d| self.writeback.flushed(d)),
                    Err(error) => {
                        failure.lock().get_or_insert(error);
                        break;
                    }
                }
            }
        };
        // The calling thread is one of the writers: a flush of one batch (a redo volume's
        // commit) starts no thread.
        std::thread::scope(|scope| {
            for _ in 1..self.flush_writers.min(batches.len()) {
                scope.spawn(work);
            }
            work();
        });
        match failure.into_inner() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Stores one batch of a flush: pages of one chunk together, or one trim.
    fn flush_batch(&self, batch: &[Snapshot]) -> Result<()> {
        let (volume_id, first) = batch[0].key;
        // A volume deleted since has nothing left to write.
        let Ok(volume) = self.volume(volume_id) else { return Ok(()) };
        if let [Snapshot { content: Content::Trimmed, .. }] = batch {
            let (chunk, page) = volume.volume.locate(first)?;
            return Ok(volume.pages.trim_page(chunk, page)?);
        }
        let (chunk, _) = volume.volume.locate(first)?;
        let mut items = Vec::with_capacity(batch.len());
        for d in batch {
            let Content::Page(content) = &d.content else { unreachable!("trims are flushed alone") };
            let (_, page) = volume.volume.locate(d.key.1)?;
            let WriteMode::Auto { update_fraction } = self.block_write_mode(&volume, d.key.1) else {
                unreachable!("block writes use Algorithm 1")
            };
            items.push((page, content.as_slice(), self.next_lsn(), update_fraction));
        }
        Ok(volume.pages.write_pages(chunk, &items)?)
    }

    /// Writes the write-back cache out and checkpoints both stores and the drive, so the next
    /// start recovers at once.
    pub fn close(&self) -> Result<()> {
        self.flush_dirty()?;
        self.data.checkpoint()?;
        self.fast.checkpoint()?;
        self.drive.checkpoint()?;
        self.fast_device.flush()?;
        Ok(())
    }
}
