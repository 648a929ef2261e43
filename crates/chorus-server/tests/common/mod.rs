//! What the process-level tests share: free loopback ports and a `chorus server` child
//! that is SIGKILLed when dropped.

pub mod tls;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A loopback port free at the time of asking, chosen below the kernel's ephemeral range
/// (32768 and up on Linux). A port the kernel hands out for `bind(0)` is in that range,
/// where the nodes' own outgoing connections take their local ports too: between asking
/// and the node's bind, one of them could take it (seen in CI as "Address already in
/// use"). Below the range only another test's explicit bind can, so each process walks
/// its own stretch of 20000..32000, starting from its pid.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let base = std::process::id().wrapping_mul(97);
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + base.wrapping_add(n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

/// A `chorus server --config CFG` process logging to LOG.
pub struct Server {
    /// Its configuration file.
    pub cfg: PathBuf,
    /// Its log file (appended to across restarts).
    pub log: PathBuf,
    /// The process while it runs.
    pub child: Option<Child>,
}

impl Server {
    /// A server not started yet.
    pub fn new(cfg: PathBuf, log: PathBuf) -> Self {
        Self {
            cfg,
            log,
            child: None,
        }
    }

    /// Starts it.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["server", "--config"])
            .arg(&self.cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}
