//! The corruption campaign's machinery: the seeded workload and its model, sparse images of a
//! data directory and their copies, the oracle that judges a flipped copy, and the table.

pub mod regions;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use tundra_env::Rng;
use tundra_node::{Config, Layout, Node, WriteMode};
use tundra_store::volume::VolumeMode;

pub use regions::RegionGroup;

const BLOCK: usize = 4096;
const DEFAULT_SEED: u64 = 0x7d2a_11c0_5eed_0011;
const DEFAULT_FLIPS: usize = 3;

/// The seed of this run: `TUNDRA_SEED` or a fixed default.
pub fn seed() -> u64 {
    tundra_env::seed_from_env(DEFAULT_SEED)
}

fn flips_per_region() -> usize {
    match std::env::var("TUNDRA_CORRUPTION_FLIPS") {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| panic!("TUNDRA_CORRUPTION_FLIPS={text:?} is not a number")),
        Err(_) => DEFAULT_FLIPS,
    }
}

/// The small node every copy opens: sizes near the minimum, no write-back cache (so partial
/// writes are stored at once, raw) and no page cache.
fn config(data_dir: &Path) -> Config {
    let mut config = Config::parse(
        r#"
        [drive]
        physical = "64MiB"
        logical = "128MiB"
        [fast]
        volumes = "16MiB"
        [cache]
        pages = 0
        write_back = "0"
        "#,
    )
    .expect("campaign config");
    config.data_dir = data_dir.to_path_buf();
    config
}

/// What every page of one volume must read: None reads as zeros.
#[derive(Clone, Debug)]
pub struct VolumeModel {
    pub name: String,
    pub page_size: usize,
    pub pages: Vec<Option<Vec<u8>>>,
}

/// The last acknowledged content of every page of every volume.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub volumes: Vec<VolumeModel>,
}

impl Model {
    pub fn first_written_page(&self) -> Option<(usize, usize)> {
        self.volumes.iter().enumerate().find_map(|(v, m)| m.pages.iter().position(Option::is_some).map(|p| (v, p)))
    }
}

/// Page content that looks like a database's: text rows, numbers, zeros or random bytes.
fn content(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    match rng.below(20) {
        0..=10 => {
            let words = ["tundra ", "page ", "store ", "volume ", "drive ", "order ", "lineitem ", "\n"];
            while out.len() < len {
                out.extend_from_slice(words[rng.below(8) as usize].as_bytes());
            }
        }
        11..=14 => {
            while out.len() < len {
                let row = format!("{:08}|{:>12}|{:.4}\n", rng.below(1 << 20), rng.below(1 << 40), rng.below(10_000));
                out.extend_from_slice(row.as_bytes());
            }
        }
        15..=16 => out.resize(len, 0),
        _ => {
            out.resize(len, 0);
            rng.fill(&mut out);
        }
    }
    out.truncate(len);
    out
}

fn write_mode(rng: &mut Rng) -> WriteMode {
    // Named algorithms only: Algorithm 1 depends on measured costs, which would make the
    // images (and so the flip positions) differ from run to run.
    [WriteMode::Lz4, WriteMode::Zstd, WriteMode::None][rng.below(3) as usize]
}

struct Workload<'a> {
    node: &'a Node,
    model: &'a mut Model,
    rng: Rng,
}

impl Workload<'_> {
    fn write(&mut self, v: usize, page: usize) {
        let volume = self.node.volume_by_name(&self.model.volumes[v].name).expect("volume");
        let data = content(&mut self.rng, volume.page_size());
        let mode = write_mode(&mut self.rng);
        self.node.write_page(&volume, page as u64, mode, &data).expect("page write");
        self.model.volumes[v].pages[page] = Some(data);
    }

    fn trim(&mut self, v: usize, page: usize) {
        let volume = self.node.volume_by_name(&self.model.volumes[v].name).expect("volume");
        self.node.trim_pages(&volume, page as u64, 1).expect("trim");
        self.model.volumes[v].pages[page] = None;
    }

    /// An unaligned piece of a page: merged into the stored page and stored raw.
    fn partial(&mut self, v: usize, page: usize) {
        let volume = self.node.volume_by_name(&self.model.volumes[v].name).expect("volume");
        let size = volume.page_size();
        let within = 1 + self.rng.below(size as u64 / 2) as usize;
        let len = 1 + self.rng.below(1000) as usize;
        let piece = content(&mut self.rng, len);
        self.node.write_bytes(&volume, (page * size + within) as u64, &piece).expect("byte write");
        let stored = self.model.volumes[v].pages[page].get_or_insert_with(|| vec![0u8; size]);
        stored[within..within + piece.len()].copy_from_slice(&piece);
    }

    /// The first life: every page of both volumes written, some not.
    fn fill(&mut self) {
        for v in 0..self.model.volumes.len() {
            for page in 0..self.model.volumes[v].pages.len() {
                if !self.rng.chance(0.08) {
                    self.write(v, page);
                }
            }
        }
    }

    /// The second life, after a restart: overwrites, trims and partial writes.
    fn churn(&mut self) {
        for v in 0..self.model.volumes.len() {
            let pages = self.model.volumes[v].pages.len();
            for _ in 0..pages {
                let page = self.rng.below(pages as u64) as usize;
                match self.rng.below(10) {
                    0 => self.trim(v, page),
                    1 => self.partial(v, page),
                    _ => self.write(v, page),
                }
            }
        }
    }
}

/// How the directory was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The node dropped without close, as a kill leaves it.
    Killed = 0,
    /// After a clean close.
    Closed = 1,
}

/// A directory's files as their non-zero blocks, so a copy costs what was written, not the
/// files' (sparse) sizes; zero blocks read as zeros from holes exactly as from the original.
pub struct Image {
    pub files: BTreeMap<String, (u64, BTreeMap<u64, Vec<u8>>)>,
}

impl Image {
    fn capture(dir: &Path) -> Image {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir).expect("data dir") {
            let path = entry.expect("dir entry").path();
            let file = std::fs::File::open(&path).expect("open image file");
            let len = file.metadata().expect("metadata").len();
            let mut blocks = BTreeMap::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..n], at).expect("read image");
                for (i, block) in buf[..n].chunks(BLOCK).enumerate() {
                    if block.iter().any(|&b| b != 0) {
                        blocks.insert((at as usize / BLOCK + i) as u64, block.to_vec());
                    }
                }
                at += n as u64;
            }
            files.insert(path.file_name().unwrap().to_string_lossy().into_owned(), (len, blocks));
        }
        Image { files }
    }

    /// `len` bytes of `file` at `offset`.
    pub fn read(&self, file: &str, offset: u64, len: usize) -> Vec<u8> {
        let (_, blocks) = &self.files[file];
        let mut out = vec![0u8; len];
        let first = offset / BLOCK as u64;
        let last = (offset + len as u64).div_ceil(BLOCK as u64);
        for (&index, block) in blocks.range(first..last) {
            let start = index * BLOCK as u64;
            for (i, &b) in block.iter().enumerate() {
                let at = start + i as u64;
                if at >= offset && at < offset + len as u64 {
                    out[(at - offset) as usize] = b;
                }
            }
        }
        out
    }

    /// Writes the image into `dir`, with `flip` (file, byte offset, bit) applied.
    fn restore(&self, dir: &Path, flip: Option<&Flip>) {
        std::fs::create_dir_all(dir).expect("copy dir");
        for (name, (len, blocks)) in &self.files {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))
                .expect("create copy");
            file.set_len(*len).expect("size copy");
            let mut run: Vec<u8> = Vec::new();
            let mut run_start = 0u64;
            for (&index, block) in blocks {
                if !run.is_empty() && run_start + (run.len() / BLOCK) as u64 != index {
                    file.write_all_at(&run, run_start * BLOCK as u64).expect("write copy");
                    run.clear();
                }
                if run.is_empty() {
                    run_start = index;
                }
                run.extend_from_slice(block);
            }
            if !run.is_empty() {
                file.write_all_at(&run, run_start * BLOCK as u64).expect("write copy");
            }
            if let Some(flip) = flip.filter(|f| &f.file == name) {
                let mut byte = [0u8];
                file.read_exact_at(&mut byte, flip.offset).expect("read flipped byte");
                byte[0] ^= 1 << flip.bit;
                file.write_all_at(&byte, flip.offset).expect("write flipped byte");
            }
        }
    }
}

/// The workload's result: images of the directory as a kill and as a close leave it, the model,
/// and the layout the regions are computed from.
pub struct Pristine {
    pub images: [Image; 2],
    pub model: Model,
    pub layout: Layout,
    pub work: tempfile::TempDir,
}

impl Pristine {
    pub fn build(seed: u64) -> Pristine {
        let work = tempfile::tempdir().expect("temp dir");
        let dir = work.path().join("pristine");
        let config = config(&dir);
        let mut model = Model::default();
        let mut rng = Rng::new(seed);
        {
            let node = Node::open(&config, &mut |_| {}).expect("fresh node");
            node.volume_create("pg", 2 << 20, 8192, VolumeMode::Normal).expect("pg");
            node.volume_create("wal", 1 << 20, 8192, VolumeMode::None).expect("wal");
            node.volume_create("big", 1 << 20, 16384, VolumeMode::Normal).expect("big");
            for (name, page_size, bytes) in [("pg", 8192, 2 << 20), ("wal", 8192, 1 << 20), ("big", 16384, 1 << 20)] {
                model.volumes.push(VolumeModel { name: name.into(), page_size, pages: vec![None; bytes / page_size] });
            }
            let mut w = Workload { node: &node, model: &mut model, rng: rng.fork() };
            w.fill();
            node.close().expect("close");
        }
        let node = Node::open(&config, &mut |_| {}).expect("reopen");
        let layout = node.layout().clone();
        Workload { node: &node, model: &mut model, rng: rng.fork() }.churn();
        // Every write above returned after its journal commit was flushed: the files now hold
        // what a kill would leave.
        let killed = Image::capture(&dir);
        node.close().expect("close");
        drop(node);
        let closed = Image::capture(&dir);
        Pristine { images: [killed, closed], model, layout, work }
    }
}

/// One flipped bit.
#[derive(Clone, Debug)]
pub struct Flip {
    pub file: String,
    pub offset: u64,
    pub bit: u8,
}

/// What a flip did, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// The node panicked: a bug in its own right.
    Panic,
    /// A page read other content than its last acknowledged write, or a volume vanished.
    Silent,
    /// The node refused to open.
    Refused,
    /// Some page failed to read.
    ReadError,
    /// Every page read right, but the check reported damage.
    CheckFlagged,
    /// Nothing noticed, nothing wrong.
    NoEffect,
}

pub struct Judged {
    pub outcome: Outcome,
    /// What was wrong or what the node said.
    pub detail: String,
}

/// Opens a copy of `image` with `flip` applied and judges it against `model`.
pub fn judge_copy(pristine: &Pristine, image: &Image, flip: Option<&Flip>, model: &Model) -> Judged {
    let dir = pristine.work.path().join("copy");
    let _ = std::fs::remove_dir_all(&dir);
    image.restore(&dir, flip);
    let judged = catch_unwind(AssertUnwindSafe(|| judge(&dir, model))).unwrap_or_else(|panic| {
        let what =
            panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        Judged { outcome: Outcome::Panic, detail: what.unwrap_or_default() }
    });
    std::fs::remove_dir_all(&dir).expect("remove copy");
    judged
}

/// The oracle: open, read every page of every volume, check.
fn judge(dir: &Path, model: &Model) -> Judged {
    let node = match Node::open(&config(dir), &mut |_| {}) {
        Ok(node) => node,
        Err(e) => return Judged { outcome: Outcome::Refused, detail: e.to_string() },
    };
    let mut read_error = None;
    for expected in &model.volumes {
        let Ok(volume) = node.volume_by_name(&expected.name) else {
            return Judged { outcome: Outcome::Silent, detail: format!("volume {:?} is gone", expected.name) };
        };
        let mut out = vec![0u8; expected.page_size];
        for (page, want) in expected.pages.iter().enumerate() {
            match node.read_page(&volume, page as u64, &mut out) {
                Err(e) => {
                    read_error.get_or_insert(format!("{} page {page}: {e}", expected.name));
                }
                Ok(()) if !matches_model(&out, want.as_deref()) => {
                    let what = if want.is_some() { "not its last write" } else { "not zeros (trimmed or unwritten)" };
                    return Judged {
                        outcome: Outcome::Silent,
                        detail: format!("{} page {page} read {what}", expected.name),
                    };
                }
                Ok(()) => {}
            }
        }
    }
    if let Some(detail) = read_error {
        return Judged { outcome: Outcome::ReadError, detail };
    }
    match node.check() {
        Err(e) => Judged { outcome: Outcome::CheckFlagged, detail: e.to_string() },
        Ok(reports) => match reports.iter().find_map(|(_, r)| r.damaged.first()) {
            Some(line) => Judged { outcome: Outcome::CheckFlagged, detail: line.clone() },
            None => Judged { outcome: Outcome::NoEffect, detail: String::new() },
        },
    }
}

fn matches_model(read: &[u8], want: Option<&[u8]>) -> bool {
    match want {
        Some(want) => read == want,
        None => read.iter().all(|&b| b == 0),
    }
}

/// One region's results.
#[derive(Default)]
struct Tally {
    tried: usize,
    counts: BTreeMap<String, usize>,
    /// The first message of each kind, to show what the node said.
    examples: BTreeMap<String, String>,
    silent: Vec<String>,
}

fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Panic => "panic",
        Outcome::Silent => "silent",
        Outcome::Refused => "refused",
        Outcome::ReadError => "read error",
        Outcome::CheckFlagged => "fsck",
        Outcome::NoEffect => "no effect",
    }
}

/// Flips bits in every region of `group`, in both scenarios; prints the table and fails on any
/// silent wrong data or panic.
pub fn run_campaign(group: RegionGroup) {
    let seed = seed();
    let flips = flips_per_region();
    let started = std::time::Instant::now();
    let pristine = Pristine::build(seed);
    let mut rows: Vec<(String, Tally)> = Vec::new();
    for scenario in [Scenario::Killed, Scenario::Closed] {
        let image = &pristine.images[scenario as usize];
        for (r, region) in regions::regions(image, &pristine.layout, group).into_iter().enumerate() {
            let mut tally = Tally::default();
            let mut rng = Rng::new(seed ^ (scenario as u64 + 1).wrapping_mul(0x1000_0000_01b3) ^ (r as u64) << 20);
            for _ in 0..flips {
                let flip = region.pick(&mut rng);
                let judged = judge_copy(&pristine, image, Some(&flip), &pristine.model);
                let name = outcome_name(judged.outcome).to_string();
                tally.tried += 1;
                *tally.counts.entry(name.clone()).or_default() += 1;
                tally.examples.entry(name).or_insert_with(|| judged.detail.clone());
                if judged.outcome <= Outcome::Silent {
                    tally.silent.push(format!("{flip:?}: {}", judged.detail));
                }
                if judged.outcome == Outcome::Refused && !names_damage(&judged.detail) {
                    tally.silent.push(format!("{flip:?}: a refusal that does not name the damage: {}", judged.detail));
                }
            }
            rows.push((format!("{scenario:?}: {}", region.name), tally));
        }
    }
    print_table(seed, &rows, started.elapsed());
    let bad: Vec<String> =
        rows.iter().flat_map(|(name, t)| t.silent.iter().map(move |s| format!("{name}: {s}"))).collect();
    assert!(
        bad.is_empty(),
        "{} flips gave silent wrong data or a panic (seed {seed}; replay with TUNDRA_SEED={seed} cargo test -p \
         tundra-node --test corruption_campaign -- --include-ignored --nocapture):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Whether a refusal says what is damaged, rather than failing for some unrelated reason.
fn names_damage(message: &str) -> bool {
    let message = message.to_lowercase();
    ["corrupt", "checksum", "verif", "valid", "damage"].iter().any(|word| message.contains(word))
}

fn print_table(seed: u64, rows: &[(String, Tally)], elapsed: std::time::Duration) {
    let columns = ["no effect", "read error", "refused", "fsck", "silent", "panic"];
    println!("corruption campaign, seed {seed} ({:.1} s)", elapsed.as_secs_f64());
    println!(
        "{:<58} {:>5} {:>9} {:>10} {:>7} {:>5} {:>6} {:>5}",
        "region", "tried", columns[0], columns[1], columns[2], columns[3], columns[4], columns[5]
    );
    for (name, t) in rows {
        let n = |c: &str| t.counts.get(c).copied().unwrap_or(0);
        println!(
            "{:<58} {:>5} {:>9} {:>10} {:>7} {:>5} {:>6} {:>5}",
            name,
            t.tried,
            n(columns[0]),
            n(columns[1]),
            n(columns[2]),
            n(columns[3]),
            n(columns[4]),
            n(columns[5])
        );
    }
    println!("what the node said, first of each kind per region:");
    for (name, t) in rows {
        for (kind, detail) in t.examples.iter().filter(|(k, _)| k.as_str() != "no effect") {
            println!("  {name} [{kind}]: {}", detail.chars().take(160).collect::<String>());
        }
    }
}
