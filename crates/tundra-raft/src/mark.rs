//! A chunk group's apply mark: the log id of the last entry applied to the chunk and the
//! membership in force, journalled by the store in the same commit as the entry's effect
//! ([`tundra_store::store::Store::apply_marked`]), so that after a crash the state machine
//! tells openraft exactly where it stands and no entry is applied twice or skipped.
//!
//! Layout (version 1): a version byte, then unsigned LEB128 integers: the applied log id (a
//! presence flag, then term, leader, index), the membership's log id (the same), the number of
//! configs and for each its voter count and ids, then the learner count and ids. Small ids
//! and terms take a byte each, so three voters fit in about 20 bytes of the store's 80.

use std::collections::BTreeSet;

use openraft::{CommittedLeaderId, EmptyNode, LogId, Membership, StoredMembership};

use crate::types::NodeId;

const MARK_FORMAT: u64 = 1;

/// Where a chunk's state machine stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyMark {
    pub applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, EmptyNode>,
}

impl ApplyMark {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        put(&mut out, MARK_FORMAT);
        put_log_id(&mut out, self.applied.as_ref());
        put_log_id(&mut out, self.membership.log_id().as_ref());
        let membership = self.membership.membership();
        let configs = membership.get_joint_config();
        put(&mut out, configs.len() as u64);
        for config in configs {
            put(&mut out, config.len() as u64);
            config.iter().for_each(|&id| put(&mut out, id));
        }
        let learners: Vec<NodeId> = membership.learner_ids().collect();
        put(&mut out, learners.len() as u64);
        learners.iter().for_each(|&id| put(&mut out, id));
        out
    }

    /// Decodes a mark the store kept; every count is checked against the bytes left, so a
    /// damaged mark is an error, never a panic or a huge allocation.
    pub fn decode(bytes: &[u8]) -> Result<ApplyMark, String> {
        let mut r = Reader { bytes, at: 0 };
        let version = r.get()?;
        if version != MARK_FORMAT {
            return Err(format!("an apply mark of format {version}; this build reads format {MARK_FORMAT}"));
        }
        let applied = r.log_id()?;
        let membership_log_id = r.log_id()?;
        let config_count = r.count()?;
        let mut configs = Vec::with_capacity(config_count);
        for _ in 0..config_count {
            let voters = r.count()?;
            configs.push((0..voters).map(|_| r.get()).collect::<Result<BTreeSet<NodeId>, String>>()?);
        }
        let learner_count = r.count()?;
        let learners = (0..learner_count).map(|_| r.get()).collect::<Result<BTreeSet<NodeId>, String>>()?;
        if r.at != bytes.len() {
            return Err(format!("an apply mark followed by {} stray bytes", bytes.len() - r.at));
        }
        let membership = Membership::new(configs, learners);
        Ok(ApplyMark { applied, membership: StoredMembership::new(membership_log_id, membership) })
    }
}

fn put(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_log_id(out: &mut Vec<u8>, log_id: Option<&LogId<NodeId>>) {
    match log_id {
        None => put(out, 0),
        Some(log_id) => {
            put(out, 1);
            put(out, log_id.leader_id.term);
            put(out, log_id.leader_id.node_id);
            put(out, log_id.index);
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn get(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at).ok_or("an apply mark cut short")?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("an apply mark with an integer longer than 64 bits".into())
    }

    /// A count of items of at least one byte each, bounded by the bytes left.
    fn count(&mut self) -> Result<usize, String> {
        let count = self.get()?;
        if count > (self.bytes.len() - self.at) as u64 {
            return Err(format!("an apply mark counting {count} items in {} bytes", self.bytes.len() - self.at));
        }
        Ok(count as usize)
    }

    fn log_id(&mut self) -> Result<Option<LogId<NodeId>>, String> {
        match self.get()? {
            0 => Ok(None),
            1 => {
                let (term, node_id, index) = (self.get()?, self.get()?, self.get()?);
                Ok(Some(LogId::new(CommittedLeaderId::new(term, node_id), index)))
            }
            other => Err(format!("an apply mark with log id flag {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_damage_is_refused() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let joint = vec![voters.clone(), [2, 3, 4].into()];
        let log_id = |t, n, i| Some(LogId::new(CommittedLeaderId::new(t, n), i));
        let marks = [
            ApplyMark::default(),
            ApplyMark {
                applied: log_id(7, 2, 300),
                membership: StoredMembership::new(log_id(1, 1, 1), Membership::new(vec![voters], ())),
            },
            ApplyMark {
                applied: log_id(u64::MAX, u64::MAX, u64::MAX),
                membership: StoredMembership::new(log_id(9, 3, 40), Membership::new(joint, BTreeSet::from([9]))),
            },
        ];
        for mark in marks {
            let bytes = mark.encode();
            assert!(bytes.len() <= tundra_store::journal::MAX_CHUNK_MARK_BYTES, "{} bytes", bytes.len());
            assert_eq!(ApplyMark::decode(&bytes).unwrap(), mark);
            for cut in 0..bytes.len() {
                assert!(ApplyMark::decode(&bytes[..cut]).is_err());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(ApplyMark::decode(&longer).is_err());
        }
        assert!(ApplyMark::decode(&[2]).is_err());
        assert!(ApplyMark::decode(&[1, 0, 0, 0xff, 0xff, 0xff, 0x7f]).is_err());
    }
}
