//! A cluster's membership as `[cluster]` states it: this node's id, every node's id and peer
//! address (`"ID@HOST:PORT"`), and the shared key. A node refuses to listen for peers on an
//! address other than loopback without a key: anyone who could reach the port could then
//! vote in its groups and write its volumes.
//!
//! Nodes added while the node runs (`tundra cluster add-node`, join.rs) are kept in
//! `cluster-peers.json` in its data directory and added to the configured ones at every start,
//! so a node restarted with its old `peers` still knows them.

use std::path::Path;

use parking_lot::RwLock;
use tundra_node::ClusterConfig;

use crate::wire::ClusterKey;

/// The file of the nodes added to a running cluster (join.rs), in the data directory.
pub const JOINED_FILE: &str = "cluster-peers.json";

/// The nodes of a cluster, as this node knows them.
#[derive(Debug)]
pub struct Membership {
    pub me: u64,
    /// Every node (this one included), by id; nodes added while running join it.
    nodes: RwLock<Vec<(u64, String)>>,
    pub key: Option<ClusterKey>,
    /// The members of the cluster manager's group, lowest first.
    pub managers: Vec<u64>,
}

/// Parses one `"ID@HOST:PORT"`.
pub fn parse_peer(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text.split_once('@').ok_or_else(|| format!("peer {text:?} is not of the form ID@HOST:PORT"))?;
    let id: u64 =
        id.trim().parse().map_err(|_| format!("peer {text:?}: {id:?} is not a node id (a positive integer)"))?;
    if id == 0 {
        return Err(format!("peer {text:?}: node ids start at 1"));
    }
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("peer {text:?}: no port in {addr:?}"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("peer {text:?}: {addr:?} is not HOST:PORT"));
    }
    Ok((id, addr.to_string()))
}

/// Whether `addr` (HOST:PORT) is on loopback.
pub fn is_loopback(addr: &str) -> bool {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host).trim_matches(['[', ']']);
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Membership {
    /// Checks and reads `[cluster]`: ids unique, this node among the peers, the key read from
    /// its file, and a key present unless every address is on loopback.
    pub fn from_config(config: &ClusterConfig) -> Result<Membership, String> {
        let mut nodes = Vec::new();
        for text in &config.peers {
            let (id, addr) = parse_peer(text)?;
            if nodes.iter().any(|(other, _)| *other == id) {
                return Err(format!("[cluster] peers names node {id} twice"));
            }
            nodes.push((id, addr));
        }
        nodes.sort();
        if !nodes.iter().any(|(id, _)| *id == config.node_id) {
            return Err(format!(
                "[cluster] node_id = {} is not among the peers; list this node as \"{}@HOST:PORT\"",
                config.node_id, config.node_id
            ));
        }
        let key = match &config.key_file {
            None => None,
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|e| format!("[cluster] key_file {}: {e}", path.display()))?;
                let trimmed = String::from_utf8_lossy(&bytes).trim().as_bytes().to_vec();
                Some(ClusterKey::new(trimmed).map_err(|e| format!("[cluster] key_file {}: {e}", path.display()))?)
            }
        };
        if key.is_none()
            && let Some((id, addr)) = nodes.iter().find(|(_, addr)| !is_loopback(addr))
        {
            return Err(format!(
                "[cluster] node {id} is at {addr}, not on loopback: peers must prove they hold the cluster's \
                 key there; set key_file to a file of at least 32 secret bytes, the same on every node"
            ));
        }
        let managers = match &config.managers {
            None => nodes.iter().take(3).map(|(id, _)| *id).collect(),
            Some(ids) => {
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                if ids.is_empty() || ids.len() != config.managers.as_ref().map_or(0, Vec::len) {
                    return Err("[cluster] managers must name at least one node, each once".into());
                }
                if let Some(stray) = ids.iter().find(|id| !nodes.iter().any(|(n, _)| n == *id)) {
                    return Err(format!("[cluster] managers names node {stray}, which is not among the peers"));
                }
                ids
            }
        };
        Ok(Membership { me: config.node_id, nodes: RwLock::new(nodes), key, managers })
    }

    /// [`Membership::from_config`] and the nodes added while running that `data_dir`'s
    /// [`JOINED_FILE`] lists. A listed node whose address differs from the configured one is
    /// refused: which is right cannot be told.
    pub fn load(config: &ClusterConfig, data_dir: &Path) -> Result<Membership, String> {
        let membership = Membership::from_config(config)?;
        let path = data_dir.join(JOINED_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(membership),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let joined: Vec<String> = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a list of \"ID@HOST:PORT\": {e}", path.display()))?;
        for text in &joined {
            let (id, addr) = parse_peer(text).map_err(|e| format!("{}: {e}", path.display()))?;
            membership.add(id, &addr).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(membership)
    }

    /// Adds node `id` at peer address `addr`: false if it is known at that address already;
    /// refused if it is known at another, or if `addr` is not on loopback and the cluster has
    /// no key (the rule `from_config` keeps).
    pub fn add(&self, id: u64, addr: &str) -> Result<bool, String> {
        if id == 0 {
            return Err("node ids start at 1".into());
        }
        let mut nodes = self.nodes.write();
        if let Some((_, known)) = nodes.iter().find(|(other, _)| *other == id) {
            if known == addr {
                return Ok(false);
            }
            return Err(format!("node {id} is at {known} already, not {addr}"));
        }
        if let Some((other, _)) = nodes.iter().find(|(_, known)| known == addr) {
            return Err(format!("node {other} is at {addr} already"));
        }
        if self.key.is_none() && !is_loopback(addr) {
            return Err(format!(
                "node {id} is at {addr}, not on loopback, and this cluster has no key_file: peers must prove they \
                 hold the cluster's key there"
            ));
        }
        nodes.push((id, addr.to_string()));
        nodes.sort();
        Ok(true)
    }

    /// Writes the nodes that `configured` (the config's `peers`) does not list to
    /// `data_dir`'s [`JOINED_FILE`], durably (beside, synced, renamed, the directory synced).
    pub fn save_joined(&self, configured: &[String], data_dir: &Path) -> Result<(), String> {
        let configured: Vec<(u64, String)> = configured.iter().filter_map(|p| parse_peer(p).ok()).collect();
        let joined: Vec<String> = self
            .nodes
            .read()
            .iter()
            .filter(|node| !configured.contains(node))
            .map(|(id, addr)| format!("{id}@{addr}"))
            .collect();
        let path = data_dir.join(JOINED_FILE);
        let text = serde_json::to_string_pretty(&joined).map_err(|e| e.to_string())?;
        crate::catalog::write_durably(&path, text.as_bytes()).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Every node and its peer address, by id.
    pub fn nodes(&self) -> Vec<(u64, String)> {
        self.nodes.read().clone()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.read().iter().map(|(id, _)| *id).collect()
    }

    /// Node `id`'s peer address, if it is a member.
    pub fn addr_of(&self, id: u64) -> Option<String> {
        self.nodes.read().iter().find(|(other, _)| *other == id).map(|(_, addr)| addr.clone())
    }

    pub fn my_addr(&self) -> String {
        self.addr_of(self.me).unwrap_or_default()
    }

    pub fn others(&self) -> Vec<(u64, String)> {
        self.nodes.read().iter().filter(|(id, _)| *id != self.me).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(peers: &[&str], key_file: Option<std::path::PathBuf>) -> ClusterConfig {
        ClusterConfig {
            node_id: 1,
            peers: peers.iter().map(|p| p.to_string()).collect(),
            key_file,
            ..ClusterConfig::default()
        }
    }

    #[test]
    fn peers_parse_and_are_checked() {
        assert_eq!(parse_peer("2@127.0.0.1:7812").unwrap(), (2, "127.0.0.1:7812".to_string()));
        for bad in ["2", "x@127.0.0.1:1", "0@127.0.0.1:1", "2@127.0.0.1", "2@:1", "2@h:port"] {
            assert!(parse_peer(bad).is_err(), "{bad}");
        }
        assert!(Membership::from_config(&config(&["1@127.0.0.1:1", "1@127.0.0.1:2"], None)).is_err());
        assert!(Membership::from_config(&config(&["2@127.0.0.1:1"], None)).is_err());
        let ok = Membership::from_config(&config(&["2@127.0.0.1:2", "1@127.0.0.1:1"], None)).unwrap();
        assert_eq!(ok.ids(), vec![1, 2]);
        assert_eq!(ok.my_addr(), "127.0.0.1:1");
    }

    #[test]
    fn the_managers_default_to_the_three_lowest_ids_and_must_be_peers() {
        let peers = ["4@127.0.0.1:4", "2@127.0.0.1:2", "1@127.0.0.1:1", "3@127.0.0.1:3"];
        assert_eq!(Membership::from_config(&config(&peers, None)).unwrap().managers, vec![1, 2, 3]);
        assert!(Membership::from_config(&config(&peers[..2], None)).unwrap_err().contains("node_id = 1"));
        let two = ["2@127.0.0.1:2", "1@127.0.0.1:1"];
        assert_eq!(Membership::from_config(&config(&two, None)).unwrap().managers, vec![1, 2]);
        let chosen = |managers: Vec<u64>| ClusterConfig { managers: Some(managers), ..config(&peers, None) };
        assert_eq!(Membership::from_config(&chosen(vec![4, 2, 3])).unwrap().managers, vec![2, 3, 4]);
        for bad in [vec![], vec![2, 2], vec![1, 9]] {
            assert!(Membership::from_config(&chosen(bad.clone())).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_non_loopback_peer_needs_a_key() {
        let error = Membership::from_config(&config(&["1@10.0.0.1:7811", "2@10.0.0.2:7811"], None)).unwrap_err();
        assert!(error.contains("key_file"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "too short").unwrap();
        assert!(Membership::from_config(&config(&["1@10.0.0.1:7811"], Some(short))).is_err());
        let good = dir.path().join("key");
        std::fs::write(&good, "0123456789abcdef0123456789abcdef\n").unwrap();
        assert!(Membership::from_config(&config(&["1@10.0.0.1:7811"], Some(good))).unwrap().key.is_some());
        assert!(is_loopback("127.0.0.1:1") && is_loopback("[::1]:1") && is_loopback("localhost:1"));
        assert!(!is_loopback("0.0.0.0:1") && !is_loopback("10.0.0.1:1"));
    }

    #[test]
    fn nodes_added_while_running_are_checked_kept_and_loaded_again() {
        let dir = tempfile::tempdir().expect("dir");
        let config = config(&["1@127.0.0.1:1", "2@127.0.0.1:2"], None);
        let membership = Membership::load(&config, dir.path()).expect("no file yet");
        assert_eq!(membership.add(3, "127.0.0.1:3"), Ok(true));
        assert_eq!(membership.add(3, "127.0.0.1:3"), Ok(false), "known at that address");
        assert!(membership.add(3, "127.0.0.1:9").unwrap_err().contains("node 3 is at 127.0.0.1:3"));
        assert!(membership.add(4, "127.0.0.1:2").unwrap_err().contains("node 2 is at"));
        assert!(membership.add(4, "10.0.0.4:7").unwrap_err().contains("no key_file"));
        assert!(membership.add(0, "127.0.0.1:7").is_err());
        assert_eq!(membership.ids(), vec![1, 2, 3], "refusals add nothing");
        membership.save_joined(&config.peers, dir.path()).expect("save");
        let text = std::fs::read_to_string(dir.path().join(JOINED_FILE)).expect("file");
        assert_eq!(serde_json::from_str::<Vec<String>>(&text).expect("json"), vec!["3@127.0.0.1:3".to_string()]);
        let again = Membership::load(&config, dir.path()).expect("load");
        assert_eq!(again.ids(), vec![1, 2, 3]);
        assert_eq!(again.addr_of(3).as_deref(), Some("127.0.0.1:3"));
        // A kept node the config now lists at another address stops the node.
        let moved = super::tests::config(&["1@127.0.0.1:1", "2@127.0.0.1:2", "3@127.0.0.1:33"], None);
        assert!(Membership::load(&moved, dir.path()).unwrap_err().contains(JOINED_FILE));
        std::fs::write(dir.path().join(JOINED_FILE), "[\"3@\"]").expect("write");
        assert!(Membership::load(&config, dir.path()).unwrap_err().contains(JOINED_FILE));
    }
}
