//! Which volumes of a node are replicated, and on which nodes: `cluster-volumes.json` in the
//! data directory, replaced atomically (written to a new file, synced, renamed). A volume is
//! entered here before its store creates it, so a node that crashed in between finds the entry
//! at its next start and creates the volume then: a replicated volume never becomes a local
//! one by accident.
//!
//! It also keeps the ids of the replicated volumes deleted here (delete.rs): a node that was
//! down while a volume was deleted learns it from a peer's list at its catalog catch-up, and
//! "not in the catalog" alone cannot tell a deleted volume from one not adopted yet. Volume
//! ids are never given out twice, so the list only grows, by four bytes a delete.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::messages::VolumeDef;

pub const CATALOG_FILE: &str = "cluster-volumes.json";
/// Format 2 added `deleted`; a format 1 file reads as one with none.
const CATALOG_FORMAT: u32 = 2;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    format: u32,
    volumes: Vec<VolumeDef>,
    #[serde(default)]
    deleted: Vec<u32>,
}

/// The replicated volumes of one node.
#[derive(Debug)]
pub struct Catalog {
    path: PathBuf,
    volumes: Vec<VolumeDef>,
    /// The ids of the replicated volumes deleted here, ascending.
    deleted: Vec<u32>,
}

impl Catalog {
    /// Reads the catalog in `data_dir` (empty if there is none yet).
    pub fn open(data_dir: &Path) -> Result<Catalog, String> {
        let path = data_dir.join(CATALOG_FILE);
        let (volumes, deleted) = match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), Vec::new()),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
            Ok(bytes) => {
                let stored: Stored = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{} is damaged: {e}; restore it from another replica's", path.display()))?;
                if !(1..=CATALOG_FORMAT).contains(&stored.format) {
                    return Err(format!(
                        "{} is of format {}; this build reads {CATALOG_FORMAT}",
                        path.display(),
                        stored.format
                    ));
                }
                let mut deleted = stored.deleted;
                deleted.sort_unstable();
                deleted.dedup();
                (stored.volumes, deleted)
            }
        };
        Ok(Catalog { path, volumes, deleted })
    }

    pub fn volumes(&self) -> &[VolumeDef] {
        &self.volumes
    }

    /// The ids of the replicated volumes deleted here, ascending.
    pub fn deleted(&self) -> &[u32] {
        &self.deleted
    }

    pub fn is_deleted(&self, id: u32) -> bool {
        self.deleted.binary_search(&id).is_ok()
    }

    pub fn get(&self, id: u32) -> Option<&VolumeDef> {
        self.volumes.iter().find(|v| v.id == id)
    }

    /// Enters a volume, durably; the same definition again changes nothing, another under
    /// the same id or name is refused.
    pub fn add(&mut self, def: VolumeDef) -> Result<(), String> {
        if let Some(existing) = self.volumes.iter().find(|v| v.id == def.id || v.name == def.name) {
            if *existing == def {
                return Ok(());
            }
            return Err(format!("volume {:?} (id {}) is replicated here already as another volume", def.name, def.id));
        }
        if self.is_deleted(def.id) {
            return Err(format!("volume {:?} (id {}) was deleted here", def.name, def.id));
        }
        let mut volumes = self.volumes.clone();
        volumes.push(def);
        self.write(&volumes, &self.deleted)?;
        self.volumes = volumes;
        Ok(())
    }

    /// Enters chunk `chunk`'s replica set and its move under way (replacing any earlier move
    /// of it), durably.
    pub fn set_chunk(
        &mut self,
        volume: u32,
        chunk: u32,
        replicas: Vec<u64>,
        moving: Option<crate::messages::ChunkMove>,
    ) -> Result<(), String> {
        self.update(volume, |def| {
            let count = crate::cluster::chunk_spans(def.size_bytes).len();
            if chunk as usize >= count || replicas.is_empty() {
                return Err(format!("chunk {chunk} of volume {:?} with replicas {replicas:?}", def.name));
            }
            if def.chunks.len() != count {
                def.chunks = (0..count as u32).map(|index| def.replicas_of(index).to_vec()).collect();
            }
            // The redo group keeps its replicas whatever the chunks' become.
            if def.redo.is_none() {
                def.redo = Some(def.replicas.clone());
            }
            def.chunks[chunk as usize] = replicas;
            def.moves.retain(|m| m.chunk != chunk);
            def.moves.extend(moving);
            let mut all: Vec<u64> = def.chunks.iter().flatten().copied().collect();
            all.sort_unstable();
            all.dedup();
            def.replicas = all;
            Ok(())
        })
    }

    /// Enters the volume's redo replica set and the move of one under way, durably.
    pub fn set_redo(
        &mut self,
        volume: u32,
        mut replicas: Vec<u64>,
        moving: Option<crate::messages::RedoMove>,
    ) -> Result<(), String> {
        self.update(volume, |def| {
            if replicas.is_empty() {
                return Err(format!("the redo group of volume {:?} with no replica", def.name));
            }
            replicas.sort_unstable();
            replicas.dedup();
            def.redo = Some(replicas);
            def.redo_move = moving;
            Ok(())
        })
    }

    /// Marks a volume deleting, durably (delete.rs); an unknown id is refused.
    pub fn mark_deleting(&mut self, volume: u32) -> Result<(), String> {
        if self.get(volume).is_some_and(|def| def.deleting) {
            return Ok(());
        }
        self.update(volume, |def| {
            def.deleting = true;
            Ok(())
        })
    }

    /// A resize's first phase here (resize.rs), durably: the volume's size becomes
    /// `size_bytes` with the replica sets of its chunks past the old last one in `added`
    /// (one per new chunk), while `served_bytes` keeps the size served before. The same
    /// growth again changes nothing; a smaller size is refused.
    pub fn grow(&mut self, volume: u32, size_bytes: u64, added: &[Vec<u64>]) -> Result<(), String> {
        self.update(volume, |def| {
            if size_bytes < def.size_bytes {
                return Err(format!(
                    "volume {:?} is {} bytes here; a replicated volume does not shrink (to {size_bytes})",
                    def.name, def.size_bytes
                ));
            }
            let before = crate::cluster::chunk_spans(def.size_bytes).len();
            let after = crate::cluster::chunk_spans(size_bytes).len();
            if added.len() != after - before || added.iter().any(Vec::is_empty) {
                return Err(format!(
                    "volume {:?} grown to {size_bytes} bytes takes {} new chunks, and {} replica sets came",
                    def.name,
                    after - before,
                    added.len()
                ));
            }
            if def.chunks.len() != before {
                def.chunks = (0..before as u32).map(|index| def.replicas_of(index).to_vec()).collect();
            }
            // The redo group keeps its replicas whatever the chunks' become.
            if def.redo.is_none() {
                def.redo = Some(def.replicas.clone());
            }
            def.chunks.extend(added.iter().cloned());
            let mut all: Vec<u64> = def.chunks.iter().flatten().copied().collect();
            all.sort_unstable();
            all.dedup();
            def.replicas = all;
            def.served_bytes = Some(def.served_size());
            def.size_bytes = size_bytes;
            if def.served_bytes == Some(def.size_bytes) {
                def.served_bytes = None;
            }
            Ok(())
        })
    }

    /// A resize's second phase here, durably: the volume serves its whole `size_bytes`, which
    /// must be what the first phase entered.
    pub fn serve_all(&mut self, volume: u32, size_bytes: u64) -> Result<(), String> {
        if self.get(volume).is_some_and(|def| def.served_bytes.is_none() && def.size_bytes == size_bytes) {
            return Ok(());
        }
        self.update(volume, |def| {
            if def.size_bytes != size_bytes {
                return Err(format!(
                    "volume {:?} is {} bytes here, not {size_bytes}: its resize's first phase did not reach this node",
                    def.name, def.size_bytes
                ));
            }
            def.served_bytes = None;
            Ok(())
        })
    }

    /// Changes volume `volume`'s definition with `change`, durably: written whole to the file
    /// before it is taken here; an unknown id, or a change that fails, changes nothing.
    fn update(&mut self, volume: u32, change: impl FnOnce(&mut VolumeDef) -> Result<(), String>) -> Result<(), String> {
        let mut volumes = self.volumes.clone();
        let def = volumes
            .iter_mut()
            .find(|v| v.id == volume)
            .ok_or_else(|| format!("volume id {volume} is not replicated here"))?;
        change(def)?;
        self.write(&volumes, &self.deleted)?;
        self.volumes = volumes;
        Ok(())
    }

    /// Removes a volume and enters its id among the deleted, durably: the last step of its
    /// delete here. An unknown id changes nothing.
    pub fn remove(&mut self, volume: u32) -> Result<(), String> {
        if self.get(volume).is_none() {
            return Ok(());
        }
        let volumes: Vec<VolumeDef> = self.volumes.iter().filter(|v| v.id != volume).cloned().collect();
        let mut deleted = self.deleted.clone();
        if let Err(at) = deleted.binary_search(&volume) {
            deleted.insert(at, volume);
        }
        self.write(&volumes, &deleted)?;
        self.volumes = volumes;
        self.deleted = deleted;
        Ok(())
    }

    fn write(&self, volumes: &[VolumeDef], deleted: &[u32]) -> Result<(), String> {
        let stored = Stored { format: CATALOG_FORMAT, volumes: volumes.to_vec(), deleted: deleted.to_vec() };
        let bytes = serde_json::to_vec_pretty(&stored).map_err(|e| e.to_string())?;
        write_durably(&self.path, &bytes).map_err(|e| format!("writing {}: {e}", self.path.display()))
    }
}

/// Replaces the file at `path` with `bytes` atomically and durably: written beside it, synced,
/// renamed over it, the directory synced.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = std::path::PathBuf::from(temporary);
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(id: u32, name: &str) -> VolumeDef {
        VolumeDef::for_test(id, name, 16 << 20, 0)
    }

    #[test]
    fn a_delete_mark_and_a_removal_are_durable_and_touch_only_their_volume() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut catalog = Catalog::open(dir.path()).expect("open");
        catalog.add(def(1, "a")).expect("add a");
        catalog.add(def(2, "b")).expect("add b");
        catalog.mark_deleting(1).expect("mark a");
        assert!(catalog.mark_deleting(9).is_err(), "an unknown volume is refused");

        let mut reopened = Catalog::open(dir.path()).expect("reopen");
        assert!(reopened.get(1).expect("a").deleting, "the mark survives a reopen");
        assert!(!reopened.get(2).expect("b").deleting, "only volume a is marked");
        reopened.remove(1).expect("remove a");
        reopened.remove(1).expect("removing it again changes nothing");

        let mut last = Catalog::open(dir.path()).expect("reopen");
        assert!(last.get(1).is_none(), "the removal survives a reopen");
        assert_eq!(last.get(2), Some(&def(2, "b")), "volume b is as it was");
        assert_eq!(last.deleted(), &[1], "the deleted id survives a reopen, entered once");
        assert!(last.is_deleted(1) && !last.is_deleted(2));
        assert!(last.add(def(1, "a")).is_err(), "a deleted volume is not entered again");
        last.remove(7).expect("an unknown id changes nothing");
        assert_eq!(last.deleted(), &[1], "nor enters a deleted id");
    }

    #[test]
    fn a_catalog_written_before_delete_marks_reads_as_unmarked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let old =
            r#"{"format":1,"volumes":[{"id":4,"name":"v","size_bytes":16777216,"page_size":8192,"replicas":[1,2,3]}]}"#;
        std::fs::write(dir.path().join(CATALOG_FILE), old).expect("write");
        let catalog = Catalog::open(dir.path()).expect("open");
        assert!(!catalog.get(4).expect("v").deleting);
        assert_eq!(catalog.get(4).expect("v").served_bytes, None, "an older catalog serves its whole size");
        assert_eq!(catalog.get(4).expect("v").served_size(), 16 << 20);
        assert!(catalog.deleted().is_empty(), "an older catalog lists no deleted volume");
    }

    #[test]
    fn a_catalog_of_a_newer_format_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(CATALOG_FILE), r#"{"format":3,"volumes":[]}"#).expect("write");
        let refused = Catalog::open(dir.path()).expect_err("a format this build does not know");
        assert!(refused.contains("format 3"), "{refused}");
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_growth_keeps_the_served_size_until_served_and_is_durable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut catalog = Catalog::open(dir.path()).expect("open");
        catalog.add(def(1, "a")).expect("add a");
        catalog.add(def(2, "b")).expect("add b");
        // Within the first chunk: no new chunk.
        assert!(catalog.grow(1, 32 << 20, &[vec![1, 2, 3]]).is_err(), "a replica set for no new chunk");
        catalog.grow(1, 32 << 20, &[]).expect("grow within the chunk");
        // Across into a second chunk, placed on other nodes.
        catalog.grow(1, GIB + (64 << 20), &[vec![2, 3, 4]]).expect("grow into a new chunk");
        let reopened = Catalog::open(dir.path()).expect("reopen");
        let a = reopened.get(1).expect("a");
        assert_eq!(a.size_bytes, GIB + (64 << 20));
        assert_eq!(a.served_bytes, Some(16 << 20), "the size served before the first growth");
        assert_eq!(a.served_size(), 16 << 20);
        assert_eq!(a.chunks, vec![vec![1, 2, 3], vec![2, 3, 4]]);
        assert_eq!(a.replicas, vec![1, 2, 3, 4]);
        assert_eq!(a.redo_replicas(), &[1, 2, 3], "the redo group keeps its replicas");
        assert_eq!(reopened.get(2), Some(&def(2, "b")), "volume b is as it was");

        let mut catalog = reopened;
        catalog.grow(1, GIB + (64 << 20), &[]).expect("the same growth again changes nothing");
        assert!(catalog.grow(1, GIB, &[]).is_err(), "a shrink is refused");
        assert!(catalog.serve_all(1, 2 * GIB).is_err(), "a size the first phase did not enter");
        assert_eq!(catalog.get(1).expect("a").served_size(), 16 << 20, "refusals change nothing");
        catalog.serve_all(1, GIB + (64 << 20)).expect("serve");
        catalog.serve_all(1, GIB + (64 << 20)).expect("serving again changes nothing");
        let last = Catalog::open(dir.path()).expect("reopen");
        assert_eq!(last.get(1).expect("a").served_bytes, None);
        assert_eq!(last.get(1).expect("a").served_size(), GIB + (64 << 20));
    }

    /// The twin of the served size: a definition whose range is its store's size would serve
    /// the grown range before the second phase; `served_size` does not.
    #[test]
    fn between_the_phases_the_served_size_is_the_old_one() {
        let mut grown = def(1, "a");
        grown.size_bytes = 64 << 20;
        grown.served_bytes = Some(16 << 20);
        assert_ne!(grown.served_size(), grown.size_bytes);
        assert_eq!(grown.served_size(), 16 << 20);
    }
}
