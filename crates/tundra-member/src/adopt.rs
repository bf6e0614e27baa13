//! A node that was down while replicated volumes were created learns them (issue 15): a
//! volume's creation needs only a majority of the nodes (cluster.rs's `create_replicated`),
//! and the others adopt its definition from their peers' catalogs at their catalog catch-up
//! (dead_nodes.rs), a few seconds after they start and then every 30 s.
//!
//! Adopting a volume is what `Forward::CreateVolume` does at a creation: the definition
//! entered in the node's catalog durably, then the volume created in its store with the same
//! id and its groups started (`ClusterNode::enter_volume`; normally none, since placement chose only up
//! nodes). From then on the node serves the volume's I/O by forwarding it to the chunks'
//! leaders. A crash between the two writes leaves the catalog naming a volume the store lacks,
//! which the node's start creates, as after a creation.
//!
//! A node refuses to adopt a volume whose id or name one of its own volumes has (a node-local
//! volume made while it was away from the cluster, or a replicated one under another id):
//! entering it would route the local volume's I/O to the replicated volume's groups (its
//! pages read back as another volume's) and stop the node from starting again. It says so in
//! its log once and in `tundra cluster status` (`refused_volumes`), keeps its own volume, and
//! serves nothing of the other.
//!
//! The same catch-up carries deletes: a volume can be deleted while a node is down (delete.rs
//! needs a majority of the nodes and of each of the volume's groups). A peer that lists a
//! volume marked deleting, or among the ids it deleted ([`Forward::DeletedVolumes`]), tells
//! the node of the delete: it marks its own entry, and its delete upkeep finishes it. Such a
//! volume is never adopted, nor one this node deleted itself. A node asks a majority of the
//! nodes (else the pass is tried again) and a decided delete marked a majority, so it meets
//! one of them; a peer of an older build, which does not answer the deleted ids, counts only
//! through its marks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tundra_store::ids::VolumeId;

use crate::cluster::ClusterNode;
use crate::messages::{Answer, Forward, Refusal, VolumeDef};

/// How long a node waits for one peer's catalog.
const CATALOG_WAIT: Duration = Duration::from_secs(3);

/// A test-only hook: `TUNDRA_TEST_ADOPT_UNCHECKED=1` adopts a peer's volume even when one of
/// the node's own volumes has its id or name (the twin of the conflict check). Unset in
/// production.
fn unchecked_for_test() -> bool {
    std::env::var("TUNDRA_TEST_ADOPT_UNCHECKED").is_ok_and(|v| v == "1")
}

/// A test-only hook: `TUNDRA_TEST_CATCH_UP_IGNORES_DELETES=1` learns no delete from the peers
/// (the twin of a returning node's delete). Unset in production.
fn ignores_deletes_for_test() -> bool {
    std::env::var("TUNDRA_TEST_CATCH_UP_IGNORES_DELETES").is_ok_and(|v| v == "1")
}

impl ClusterNode {
    /// Adopts the volumes its peers' catalogs list and its own lacks, and marks its own
    /// volumes that a peer deleted or marks deleting (module doc); answers whether a majority
    /// of the cluster's nodes (this one among them) answered and every volume found was
    /// adopted or refused for good, and every delete learnt marked.
    pub(crate) async fn adopt_new_volumes(&self) -> bool {
        let nodes = self.membership.ids();
        let mut answered = 1;
        let mut found: BTreeMap<u32, VolumeDef> = BTreeMap::new();
        let mut deleted: BTreeSet<u32> = BTreeSet::new();
        for &node in nodes.iter().filter(|&&node| node != self.me) {
            if let Some(defs) = self.catalog_of(node).await {
                answered += 1;
                for def in defs {
                    if def.deleting {
                        deleted.insert(def.id);
                    } else {
                        found.entry(def.id).or_insert(def);
                    }
                }
                if let Ok(Ok(Answer::DeletedVolumes(ids))) =
                    tokio::time::timeout(CATALOG_WAIT, self.ask(node, Forward::DeletedVolumes)).await
                {
                    deleted.extend(ids);
                }
            }
        }
        let mut complete = answered > nodes.len() / 2;
        if !ignores_deletes_for_test() {
            complete &= self.mark_deleted_elsewhere(&deleted).await;
        }
        for def in found.into_values().filter(|def| !deleted.contains(&def.id)) {
            let known = {
                let catalog = self.catalog.lock();
                catalog.get(def.id).is_some() || catalog.is_deleted(def.id)
            };
            if known || self.refused_volumes.lock().contains_key(&def.id) {
                continue;
            }
            complete &= self.adopt(def).await;
        }
        complete
    }

    /// Node `node`'s catalog, if it answers within [`CATALOG_WAIT`].
    pub(crate) async fn catalog_of(&self, node: u64) -> Option<Vec<VolumeDef>> {
        match tokio::time::timeout(CATALOG_WAIT, self.ask(node, Forward::Catalog)).await {
            Ok(Ok(Answer::Catalog(defs))) => Some(defs),
            _ => None,
        }
    }

    /// Marks deleting this node's volumes whose ids are in `deleted` (a peer deleted them or
    /// marks them so); the delete upkeep finishes them. False when a mark failed.
    async fn mark_deleted_elsewhere(&self, deleted: &BTreeSet<u32>) -> bool {
        let learnt: Vec<VolumeDef> = {
            let catalog = self.catalog.lock();
            catalog.volumes().iter().filter(|def| !def.deleting && deleted.contains(&def.id)).cloned().collect()
        };
        let mut complete = true;
        for def in learnt {
            let _one = self.deletes.lock().await;
            match tokio::task::block_in_place(|| self.catalog.lock().mark_deleting(def.id)) {
                Ok(()) => eprintln!(
                    "tundra: catalog catch-up: volume {:?} (id {}) was deleted while this node was away; marked deleting \
                     here, finishing",
                    def.name, def.id
                ),
                Err(why) => {
                    eprintln!("tundra: catalog catch-up: marking volume {:?} deleting: {why}", def.name);
                    complete = false;
                }
            }
        }
        complete
    }

    /// Adopts one volume, or refuses it for good; false when it failed and is to be tried again.
    async fn adopt(&self, def: VolumeDef) -> bool {
        if let Some(why) = self.clash(&def).filter(|_| !unchecked_for_test()) {
            eprintln!("tundra: catalog catch-up: node {} refuses to adopt the replicated volume {why}", self.me);
            self.refused_volumes.lock().insert(def.id, why);
            return true;
        }
        match self.enter_volume(&def).await {
            Ok(()) => {
                eprintln!(
                    "tundra: catalog catch-up: adopted volume {:?} (id {}), created while this node was away",
                    def.name, def.id
                );
                true
            }
            Err(why) => {
                eprintln!("tundra: catalog catch-up: adopting volume {:?} (id {}): {why}", def.name, def.id);
                false
            }
        }
    }

    /// A move's target lacking volume `def` adopts it now rather than at its next catalog
    /// catch-up ([`Forward::Adopt`]): a node just added to the cluster may be a rebalance's or
    /// a drain's first choice before that. A volume it knows (or deleted) is left as it is;
    /// one that clashes with its own is refused for good, as at a catch-up.
    pub(crate) async fn adopt_for_move(&self, def: VolumeDef) -> Result<Answer, Refusal> {
        let known = |node: &ClusterNode| {
            let catalog = node.catalog.lock();
            catalog.get(def.id).is_some() || catalog.is_deleted(def.id)
        };
        if known(self) {
            return Ok(Answer::Done);
        }
        if let Some(why) = self.clash(&def).filter(|_| !unchecked_for_test()) {
            self.refused_volumes.lock().insert(def.id, why.clone());
            return Err(Refusal::Invalid(format!("node {} refuses to adopt the replicated volume {why}", self.me)));
        }
        match self.enter_volume(&def).await {
            Ok(()) => {
                eprintln!(
                    "tundra: node {}: adopted volume {:?} (id {}) to take a replica of it in a move",
                    self.me, def.name, def.id
                );
                Ok(Answer::Done)
            }
            // The catalog catch-up entered it meanwhile.
            Err(_) if known(self) => Ok(Answer::Done),
            Err(why) => Err(Refusal::Unavailable(format!("adopting volume {:?} (id {}): {why}", def.name, def.id))),
        }
    }

    /// Why `def` clashes with one of this node's own volumes, if it does.
    fn clash(&self, def: &VolumeDef) -> Option<String> {
        let what = format!("{:?} (id {})", def.name, def.id);
        if let Ok(own) = self.node.volume(VolumeId(def.id)) {
            return Some(format!("{what}: this node's volume {:?} has that id; it keeps its own", own.volume.name));
        }
        if let Ok(own) = self.node.volume_by_name(&def.name) {
            return Some(format!("{what}: this node's volume id {} has that name; it keeps its own", own.volume.id.0));
        }
        let catalog = self.catalog.lock();
        let named = catalog.volumes().iter().find(|other| other.name == def.name && other.id != def.id);
        named.map(|other| format!("{what}: this node's replicated volume id {} has that name", other.id))
    }
}
