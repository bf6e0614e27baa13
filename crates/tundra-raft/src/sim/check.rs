//! The simulation's checkers: the model of acknowledged writes every read is held to, and the
//! record of what each replica held after applying each log index.

use std::collections::BTreeMap;

use tundra_store::ids::{ChunkId, PageNo};
use tundra_store::store::Store;

/// What a page may read as: the last acknowledged write's value, or the value of a write sent
/// after it whose outcome is unknown (it may have committed). `None` is an absent page.
#[derive(Clone, Debug, Default)]
struct PageModel {
    acked: Option<u64>,
    uncertain: Vec<Option<u64>>,
}

/// Every page's model. Values are write sequence numbers, which each written page carries in
/// its first bytes.
#[derive(Default)]
pub struct Model {
    pages: BTreeMap<(ChunkId, PageNo), PageModel>,
}

impl Model {
    /// A write was sent: until it is answered it may or may not take effect.
    pub fn sent(&mut self, chunk: ChunkId, page: PageNo, value: Option<u64>) {
        self.pages.entry((chunk, page)).or_default().uncertain.push(value);
    }

    /// The last write sent was acknowledged: it is the page's value, and no write sent before
    /// it can take effect later (Raft orders it after all of them).
    pub fn acked(&mut self, chunk: ChunkId, page: PageNo) {
        let model = self.pages.entry((chunk, page)).or_default();
        let value = model.uncertain.pop().expect("an acked write was sent");
        model.acked = value;
        model.uncertain.clear();
    }

    /// The last write sent certainly had no effect.
    pub fn failed(&mut self, chunk: ChunkId, page: PageNo) {
        self.pages.entry((chunk, page)).or_default().uncertain.pop();
    }

    /// Checks a linearizable read's value; a value of an unknown write makes it the page's
    /// value from now on.
    pub fn read(&mut self, chunk: ChunkId, page: PageNo, value: Option<u64>) -> Result<(), String> {
        let model = self.pages.entry((chunk, page)).or_default();
        if let Some(at) = model.uncertain.iter().rposition(|&v| v == value) {
            model.acked = value;
            model.uncertain.drain(..=at);
            return Ok(());
        }
        if value == model.acked {
            return Ok(());
        }
        Err(format!(
            "chunk {} page {} read {value:?}; the last acknowledged write is {:?} and the unknown ones {:?}",
            chunk.0, page.0, model.acked, model.uncertain
        ))
    }

    pub fn pages(&self) -> Vec<(ChunkId, PageNo)> {
        self.pages.keys().copied().collect()
    }
}

/// A digest of a chunk's logical content on one replica: every page's encoding, stored
/// length, checksum and LSN (placement aside).
pub fn chunk_digest(store: &Store, chunk: ChunkId) -> u32 {
    let mut digest = 0;
    for (page, entry) in store.chunk_entries(chunk) {
        let line =
            format!("{} {:?} {} {:08x} {}", page.0, entry.encoding, entry.stored_len, entry.checksum, entry.lsn.0);
        digest = crc32c::crc32c_append(digest, line.as_bytes());
    }
    digest
}

/// What every replica held after applying each index of each group: two replicas that
/// applied the same prefix of a group's log must hold the same pages.
#[derive(Default)]
pub struct Applied {
    digests: BTreeMap<(ChunkId, u64), (u64, u32)>,
    pub checks: u64,
    pub violations: Vec<String>,
}

impl Applied {
    pub fn record(&mut self, node: u64, chunk: ChunkId, index: u64, digest: u32) {
        self.checks += 1;
        match self.digests.get(&(chunk, index)) {
            Some(&(first, expected)) if expected != digest => self.violations.push(format!(
                "chunk {} after index {index}: node {node} holds {digest:08x}, node {first} held {expected:08x}",
                chunk.0
            )),
            Some(_) => {}
            None => {
                self.digests.insert((chunk, index), (node, digest));
            }
        }
    }
}
