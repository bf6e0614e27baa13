//! Serves an in-memory export over NBD, for trying clients by hand:
//!
//! ```text
//! cargo run -p tundra-nbd --example mem_server -- [ADDR] [SIZE_MIB] [NAME]
//! ```
//!
//! ADDR defaults to 127.0.0.1:0 (any free port), SIZE_MIB to 64, NAME to "mem". The export is
//! also the default export. Prints the URI to use, then serves until killed.

use std::sync::Arc;

use tundra_nbd::mem::MemExport;
use tundra_nbd::{ExportMap, Server};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args.first().map_or("127.0.0.1:0", String::as_str);
    let size_mib: u64 = match args.get(1) {
        Some(text) => text.parse().map_err(|_| std::io::Error::other(format!("bad size in MiB: {text}")))?,
        None => 64,
    };
    let name = args.get(2).map_or("mem", String::as_str);

    let exports = Arc::new(ExportMap::new());
    exports.insert(name, format!("{size_mib} MiB in memory"), Arc::new(MemExport::new(size_mib << 20)));
    exports.set_default(Some(name));
    let server = Server::start(addr, exports)?;
    println!("nbd://{}/{name}", server.local_addr());
    loop {
        std::thread::park();
    }
}
