//! The checker's model: every version of every key, by the LSN of the commit that wrote it, so
//! the answer to any read at any committed LSN can be computed and compared.

use std::collections::BTreeMap;

use tundra_store::ids::Lsn;

/// A key's versions, oldest first, each with its commit's LSN; `None` is a delete.
type Versions = Vec<(Lsn, Option<Vec<u8>>)>;

/// Keys with their versions.
#[derive(Debug, Default)]
pub struct Model {
    history: BTreeMap<Vec<u8>, Versions>,
    /// Every commit's LSN, in order.
    commits: Vec<Lsn>,
}

impl Model {
    /// Records a commit at `lsn` with its changes (the last change to a key wins).
    pub fn commit(&mut self, lsn: Lsn, changes: BTreeMap<Vec<u8>, Option<Vec<u8>>>) {
        assert!(self.commits.last().is_none_or(|&last| last < lsn), "commits move forward");
        for (key, value) in changes {
            self.history.entry(key).or_default().push((lsn, value));
        }
        self.commits.push(lsn);
    }

    /// The value of `key` as of `lsn`.
    pub fn get(&self, key: &[u8], lsn: Lsn) -> Option<&[u8]> {
        let versions = self.history.get(key)?;
        let index = versions.partition_point(|(at, _)| *at <= lsn);
        versions[..index].last().and_then(|(_, value)| value.as_deref())
    }

    /// The value of `key` after the last commit.
    pub fn latest(&self, key: &[u8]) -> Option<&[u8]> {
        self.get(key, Lsn(u64::MAX))
    }

    /// Up to `limit` records from `start` on, as of `lsn`.
    pub fn scan(&self, start: &[u8], limit: usize, lsn: Lsn) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.history
            .range(start.to_vec()..)
            .filter_map(|(key, _)| self.get(key, lsn).map(|value| (key.clone(), value.to_vec())))
            .take(limit)
            .collect()
    }

    /// Every commit's LSN, oldest first.
    pub fn commits(&self) -> &[Lsn] {
        &self.commits
    }
}
