//! The fourth way of committing redo, `node_protocol`: the same batch sent as AppendRedo over
//! the native protocol on 127.0.0.1 to a real node on files in the measurement's directory,
//! answered once the node has made it durable. Against `redo_log` it shows what the network,
//! the request's decoding and the node's bookkeeping add to the log's own commit.
//!
//! The node's redo stream is its own: a ring of the node's fixed size at the end of its
//! `fast.img`, truncated only behind folded pages. So the node folds (outside the timings, as
//! its background pass would) whenever a part of its ring's size has been appended since the
//! last fold; before timing anything its stream is lapped once like the other logs.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tundra_client::Client;
use tundra_node::{Config, FOLD_PAGES_PER_PASS, Node};
use tundra_proto::{AppendOutcome, RedoAppend, Server};
use tundra_redo::RedoBatch;
use tundra_redo::codec::BATCH_HEADER_BYTES;
use tundra_store::volume::VolumeMode;

/// Stream bytes appended between folds: half of the node's 16 MiB stream, so a batch never
/// finds it full.
const FOLD_EVERY_BYTES: u64 = 6 << 20;

pub struct NodeLog {
    node: Arc<Node>,
    server: Server,
    client: Client,
    volume: u32,
    since_fold: u64,
}

impl NodeLog {
    /// A node in `data_dir` (which must not exist) with one volume of `pages` pages of
    /// `page_size` bytes, served on 127.0.0.1, and a client connected to it.
    pub fn open(data_dir: &Path, page_size: u32, pages: u64) -> Result<NodeLog> {
        let volume_bytes = pages * u64::from(page_size);
        let mut config = Config::parse(&format!(
            "[drive]\nphysical = \"{}\"\nlogical = \"{}\"\n[fast]\nvolumes = \"64MiB\"\n",
            (volume_bytes * 2).max(64 << 20),
            (volume_bytes * 4).max(128 << 20)
        ))?;
        config.data_dir = data_dir.to_path_buf();
        let node = Arc::new(Node::open(&config, &mut |_| {}).context("opening the node")?);
        let volume = node
            .volume_create("redo-bench", volume_bytes, page_size, VolumeMode::Normal)
            .context("creating the node's volume")?;
        let server = tundra_node::native::start("127.0.0.1:0", node.clone()).context("starting the node's server")?;
        let client = Client::connect(server.local_addr()).context("connecting to the node")?;
        Ok(NodeLog { node, server, client, volume: volume.volume.id.0, since_fold: 0 })
    }

    /// Sends one batch, whose encoding is `encoded`, and waits until the node has made it
    /// durable.
    pub fn append(&mut self, batch: &RedoBatch, encoded: &[u8]) -> Result<()> {
        let append = RedoAppend {
            volume: self.volume,
            writer_epoch: batch.epoch.0,
            prev_lsn: batch.prev_lsn.0,
            end_lsn: batch.end_lsn.0,
            record_count: batch.records.len() as u32,
            records: &encoded[BATCH_HEADER_BYTES..],
        };
        match self.client.append_redo(&append)? {
            AppendOutcome::Ok { .. } => {}
            refused => bail!("the node refused a batch of the benchmark's one writer: {refused:?}"),
        }
        self.since_fold += encoded.len() as u64;
        Ok(())
    }

    /// Folds every page with redo, so the node truncates its stream, once enough was appended.
    pub fn fold_if_due(&mut self) -> Result<()> {
        if self.since_fold < FOLD_EVERY_BYTES {
            return Ok(());
        }
        while self.node.fold_redo(FOLD_PAGES_PER_PASS).context("folding the node's redo")? > 0 {}
        self.since_fold = 0;
        Ok(())
    }

    pub fn close(self) -> Result<()> {
        drop(self.client);
        self.server.shutdown();
        self.node.close().context("closing the node")?;
        Ok(())
    }
}
