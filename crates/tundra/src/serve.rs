//! `tundra serve`: the node process, `tundra mount` (the node with one more volume mounted as a
//! file), and `tundra fsck`, its offline check.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use tundra_node::{Config, Node};

#[derive(Args)]
pub struct NodeArgs {
    /// A TOML config (docs/cli.md lists every key); without one, the embedded default.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The data directory, overriding the config's `data_dir` (default ./tundra-data).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl NodeArgs {
    pub fn config(&self) -> Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(dir) = &self.data_dir {
            config.data_dir = dir.clone();
        }
        Ok(config)
    }
}

fn say(line: &str) {
    eprintln!("tundra: {line}");
}

#[derive(Args)]
pub struct MountArgs {
    /// The volume to show as a file.
    volume: String,
    /// The file to mount it on: a regular file (created empty if missing); its size becomes
    /// the volume's while mounted.
    file: PathBuf,
    #[command(flatten)]
    node: NodeArgs,
    /// Create the volume with this size (e.g. 4GiB) if it does not exist.
    #[arg(long)]
    size: Option<String>,
    /// For a volume created here: 8KiB (default) or 16KiB.
    #[arg(long)]
    page_size: Option<String>,
    /// For a volume created here: normal (compressed, default) or none (the fast device).
    #[arg(long)]
    mode: Option<String>,
}

/// `tundra mount`: the node, as `tundra serve` runs it with the same configuration, plus one
/// `[[mount]]`. The mount lives in the node's process, the shortest path from a kernel
/// filesystem to the store; a node that is already running has its mounts in its own
/// configuration instead.
pub fn mount(args: MountArgs) -> Result<()> {
    let mut config = args.node.config()?;
    config.mount.push(tundra_node::config::MountConfig {
        volume: args.volume,
        file: std::path::absolute(&args.file).with_context(|| format!("{}", args.file.display()))?,
        size: args.size,
        page_size: args.page_size,
        mode: args.mode,
        io_uring: None,
    });
    config.validate()?;
    serve_config(config)
}

/// Marks the node's process as an I/O flusher (`PR_SET_IO_FLUSHER`, Linux 5.6), before any of
/// its threads start so that all of them inherit it. A node that serves a kernel filesystem on
/// its own machine (a `[[mount]]`, or NBD attached locally) is on that filesystem's writeback
/// path: when a memory cgroup shared with the filesystem's writers is full, an allocation of
/// the node's would otherwise reclaim by waiting for a dirty page to be written back, which
/// only the node can write, and both stop for good. As an I/O flusher its allocations never
/// wait on I/O (the kernel clears __GFP_IO and __GFP_FS for them), as for the kernel's own loop
/// and NBD threads. It takes CAP_SYS_RESOURCE; without it the node runs as before and says so
/// where it mounts volumes.
fn become_io_flusher(config: &Config) {
    if let Err(e) = rustix::process::configure_io_flusher_behavior(true)
        && !config.mount.is_empty()
    {
        say(&format!(
            "warning: could not mark the node as an I/O flusher (prctl PR_SET_IO_FLUSHER: {e}; it needs \
             CAP_SYS_RESOURCE): a filesystem on its mounted volumes can deadlock the node when their \
             memory cgroup is full"
        ));
    }
}

/// Caps glibc's malloc arenas at the number of CPUs (at least 2) unless `MALLOC_ARENA_MAX` is
/// set. By default glibc gives up to eight arenas per CPU to a process's threads, and the node
/// has dozens of them (FUSE, NBD, the drive, folds), each of which would otherwise keep freed
/// memory in an arena of its own.
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let cpus = libc::c_int::try_from(cpus).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only sets an allocator parameter; it is called before the node starts
    // its threads, and a value glibc refuses leaves its default in place.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, cpus);
    }
}

pub fn serve(args: NodeArgs) -> Result<()> {
    serve_config(args.config()?)
}

fn serve_config(config: Config) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).context("installing the signal handlers")?;
    }
    for (addr, what) in
        [(&config.listen.native, "native"), (&config.listen.nbd, "nbd"), (&config.listen.metrics, "metrics")]
    {
        check_local(addr, what)?;
    }
    // A cluster's membership is checked before anything is opened: a node that may not
    // listen where it is told to formats nothing.
    if let Some(cluster) = &config.cluster {
        tundra_member::peers::Membership::from_config(cluster).map_err(|e| anyhow::anyhow!(e))?;
    }
    // A new data directory is set up only once the ports are known to be free, so a second
    // node started by mistake formats nothing.
    if !config.data_dir.join("layout.toml").exists() {
        check_ports(&config)?;
    }
    become_io_flusher(&config);
    limit_malloc_arenas();
    let node = Arc::new(open_node(&config)?);
    // A member of a cluster serves its volumes through the cluster: replicated ones go to
    // their chunks' leaders, the node's own ones as a node alone serves them.
    let cluster = match &config.cluster {
        None => None,
        Some(cluster_config) => {
            let cluster = tundra_member::ClusterNode::start(cluster_config, node.clone())
                .map_err(|e| anyhow::anyhow!("joining the cluster: {e}"))?;
            say(&format!(
                "cluster node {} listening for peers on {} ({} nodes; peers {})",
                cluster.me,
                tundra_member::peers::Membership::from_config(cluster_config)
                    .map(|m| m.my_addr().to_string())
                    .unwrap_or_default(),
                cluster_config.peers.len(),
                if cluster_config.key_file.is_some() {
                    "authenticated with the cluster key"
                } else {
                    "on loopback, unauthenticated"
                }
            ));
            Some(cluster)
        }
    };
    let service: Arc<dyn tundra_proto::Service> = match &cluster {
        Some(cluster) => Arc::new(tundra_member::ClusterService::new(cluster.clone())),
        None => Arc::new(tundra_node::native::NodeService(node.clone())),
    };
    let exports: Arc<dyn tundra_nbd::Exports> = match &cluster {
        Some(cluster) => Arc::new(tundra_member::ClusterExports::new(cluster.clone())),
        None => Arc::new(tundra_node::nbd::NodeExports(node.clone())),
    };
    let layout = node.layout();
    say(&format!(
        "data in {}: drive {} logical / {} physical, {} for uncompressed volumes; {} volume(s)",
        config.data_dir.display(),
        tundra_device::size::format_size(layout.drive_logical_bytes),
        tundra_device::size::format_size(layout.drive_physical_bytes),
        tundra_device::size::format_size(layout.fast_volume_bytes),
        node.volumes().len()
    ));
    let running = node.configuration();
    say(&format!(
        "compression: software {} (compression.software), drive {} (drive.compression)",
        running.software_compression, running.drive_compression
    ));
    let native = if config.listen.native.is_empty() {
        None
    } else {
        let server = tundra_proto::Server::start_with(&config.listen.native, service.clone(), config.limits.native()?)
            .with_context(|| format!("listening on {} (native protocol)", config.listen.native))?;
        say(&format!("native protocol on {}", server.local_addr()));
        Some(server)
    };
    let nbd = if config.listen.nbd.is_empty() {
        None
    } else {
        let server = tundra_nbd::Server::start_with(&config.listen.nbd, exports.clone(), config.limits.nbd()?)
            .with_context(|| format!("listening on {} (NBD)", config.listen.nbd))?;
        // A deleted volume's NBD connections are closed: nothing they could serve remains.
        let close_export = server.export_closer();
        node.on_volume_deleted(Box::new(move |name| {
            let closed = close_export(name);
            say(&format!("volume {name:?} deleted: closed its {closed} NBD connection(s)"));
        }));
        let limits = server.limits();
        say(&format!(
            "NBD on {} (export names are volume names; at most {} connections, {} of payload buffered)",
            server.local_addr(),
            limits.max_connections,
            tundra_device::size::format_size(limits.max_buffered_bytes)
        ));
        Some(server)
    };
    let metrics = if config.listen.metrics.is_empty() {
        None
    } else {
        let server = tundra_node::metrics::MetricsServer::start(&config.listen.metrics, node.clone())
            .with_context(|| format!("listening on {} (metrics)", config.listen.metrics))?;
        say(&format!("Prometheus metrics on http://{}/metrics", server.local_addr()));
        Some(server)
    };
    let mut mounts = Vec::new();
    for entry in &config.mount {
        // A cluster node mounts a replicated volume through its chunks' leaders.
        let mount = match &cluster {
            Some(cluster) => cluster.mount(entry),
            None => tundra_node::mount::Mount::configured(node.clone(), entry),
        }
        .with_context(|| format!("mounting volume {:?} on {}", entry.volume, entry.file.display()))?;
        let how = match mount.stats().transport.as_str() {
            "io_uring" => format!(
                "FUSE over io_uring in this process, {} threads per CPU queue",
                tundra_node::mount::MOUNT_URING_THREADS_PER_QUEUE
            ),
            _ => format!("FUSE through /dev/fuse in this process, {} threads", tundra_node::mount::MOUNT_THREADS),
        };
        let replicated = node.volume_by_name(&entry.volume).is_ok_and(|v| node.is_cluster_volume(v.volume.id));
        let through = if replicated { "replicated: every write through its chunk's leader, " } else { "" };
        say(&format!("volume {:?} mounted on {} ({through}{how})", entry.volume, entry.file.display()));
        mounts.push(mount);
    }
    say("ready; SIGTERM or Ctrl-C stops");
    let background = {
        let node = node.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("tundra-background".into())
            .spawn(move || tundra_node::background_loop(&node, Duration::from_secs(1), &stop, &|l| say(l)))?
    };
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    say("stopping: unmounting and closing connections");
    // Mounts first: a filesystem over one must already be unmounted and its loop device
    // detached, or the mount stays busy and is detached lazily (said on the log).
    for mount in mounts {
        let file = mount.file().display().to_string();
        match mount.unmount() {
            Ok(()) => say(&format!("unmounted {file}")),
            Err(e) => say(&format!("unmounting {file}: {e}")),
        }
    }
    if let Some(server) = nbd {
        server.shutdown();
    }
    if let Some(server) = native {
        server.shutdown();
    }
    if let Some(server) = metrics {
        server.shutdown();
    }
    let _ = background.join();
    if let Some(cluster) = &cluster {
        cluster.shutdown();
    }
    node.close().context("checkpointing the node")?;
    say("stopped cleanly");
    Ok(())
}

/// Opens the node; a node already running there is said as it is, other failures name the
/// directory.
fn open_node(config: &Config) -> Result<Node> {
    Node::open(config, &mut |line| say(line)).map_err(|e| match e {
        tundra_node::Error::Exists(message) => anyhow::anyhow!(message),
        e => anyhow::Error::new(e).context(format!("opening the node in {}", config.data_dir.display())),
    })
}

/// Binds each configured address for a moment: a port in use is refused before anything is
/// written.
fn check_ports(config: &Config) -> Result<()> {
    for (addr, what) in
        [(&config.listen.native, "native"), (&config.listen.nbd, "nbd"), (&config.listen.metrics, "metrics")]
    {
        if !addr.is_empty() {
            std::net::TcpListener::bind(addr.as_str()).with_context(|| {
                format!("listen.{what} = {addr:?} cannot be used (is another node running?); choose another port")
            })?;
        }
    }
    Ok(())
}

/// The node listens on loopback unless configured otherwise; a non-local address is refused
/// until the protocols have authentication.
fn check_local(addr: &str, what: &str) -> Result<()> {
    if addr.is_empty() {
        return Ok(());
    }
    let host = addr.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']'])).unwrap_or(addr);
    match host {
        "127.0.0.1" | "localhost" | "::1" => Ok(()),
        _ => bail!(
            "listen.{what} = {addr:?}: Tundra's protocols have no authentication yet, so it listens on loopback only"
        ),
    }
}

#[derive(Args)]
pub struct FsckArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Checks a node's data directory offline: fails if the node is running (the devices are
/// locked), reads and verifies every page, checks block ownership and leaks.
pub fn fsck(args: FsckArgs) -> Result<()> {
    let config = args.node.config()?;
    if !config.data_dir.join("layout.toml").exists() {
        bail!("{} holds no Tundra node (no layout.toml)", config.data_dir.display());
    }
    let node = match Node::open(&config, &mut |line| say(line)) {
        Ok(node) => node,
        // Damage the node refuses to start with is fsck's finding, not a failure to run.
        Err(tundra_node::Error::Corrupted(problem)) => return refused(&problem, args.json),
        // A node running on the directory holds its lock: said as it is.
        Err(tundra_node::Error::Exists(message)) => bail!(message),
        Err(error) => {
            return Err(error).with_context(|| format!("opening {}", config.data_dir.display()));
        }
    };
    let recovered: Vec<String> = node.recovery().into_iter().flat_map(|(_, r)| r.notes).collect();
    let reports = node.check()?;
    let damaged: usize = reports.iter().map(|(_, r)| r.damaged.len()).sum();
    if args.json {
        let json: Vec<_> = reports
            .iter()
            .map(|(device, r)| {
                serde_json::json!({
                    "device": device,
                    "pages": r.pages,
                    "referenced_bytes": r.referenced_bytes,
                    "device_mapped_bytes": r.device_mapped_bytes,
                    "damaged": r.damaged,
                })
            })
            .collect();
        let report = serde_json::json!({ "clean": damaged == 0, "stores": json, "recovered": recovered });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for (device, r) in &reports {
            println!(
                "{:?} store: {} pages verified, {} bytes referenced, {} bytes mapped on the device, {} problem(s)",
                device,
                r.pages,
                r.referenced_bytes,
                r.device_mapped_bytes,
                r.damaged.len()
            );
            for line in &r.damaged {
                println!("  {line}");
            }
        }
    }
    drop(node);
    if !args.json {
        for line in &recovered {
            println!("recovered: {line}");
        }
    }
    if damaged > 0 {
        bail!("{damaged} problem(s) found");
    }
    if !args.json {
        println!("clean");
    }
    Ok(())
}

/// Reports damage that keeps the node from opening, and fails.
fn refused(problem: &str, json: bool) -> Result<()> {
    if json {
        let report = serde_json::json!({ "clean": false, "opened": false, "problem": problem });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("the node refuses to start: {problem}");
    }
    bail!("1 problem(s) found")
}
