//! What the process-level tests share: free loopback ports and a `chorus server` child
//! that is SIGKILLed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
