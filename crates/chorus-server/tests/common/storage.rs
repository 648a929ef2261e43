//! A storage cluster of real `chorus server` processes for the storage-layer tests:
//! `nodes` chunk servers, each in a rack of its own, the first three also control nodes
//! (the control state in ordered group [`CTRL`]), chunks of [`CHUNK`] bytes. Included by
//! the tests that need it (`#[path = "common/storage.rs"] mod storage;`); not every one
//! reads every field.
#![allow(dead_code)]

use std::io::Write;

use super::common::{free_port, Server};

/// The control plane's ordered group.
pub const CTRL: u64 = 1;
/// Chunk size: 1 MiB.
pub const CHUNK: u64 = 1 << 20;

/// The running cluster; its processes are killed when it is dropped.
pub struct Cluster {
    /// Node `i` is `nodes[i - 1]`.
    pub nodes: Vec<Server>,
    /// Client API addresses of the control nodes.
    pub control: Vec<String>,
    /// Metrics addresses of the control nodes.
    pub metrics: Vec<String>,
    /// Holds every node's data, configuration and log.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `nodes` nodes; a node down `replace_after_ms` has its chunks moved.
    pub fn start(nodes: u64, replace_after_ms: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<[u16; 3]> = (0..nodes)
            .map(|_| [free_port(), free_port(), free_port()])
            .collect();
        let control: Vec<String> = (0..3)
            .map(|i| format!("127.0.0.1:{}", ports[i][0]))
            .collect();
        let endpoints = control
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut servers = Vec::new();
        for i in 1..=nodes {
            let [api, repl, metrics] = ports[(i - 1) as usize];
            let peers: String = (1..=nodes)
                .filter(|j| *j != i)
                .map(|j| format!("\"{j}\" = \"127.0.0.1:{}\"\n", ports[(j - 1) as usize][1]))
                .collect();
            let groups = if i <= 3 {
                format!("[[groups]]\nid = {CTRL}\nvoters = [1, 2, 3]\n\n")
            } else {
                String::new()
            };
            let cfg = dir.path().join(format!("n{i}.toml"));
            let mut f = std::fs::File::create(&cfg).unwrap();
            write!(
                f,
                "node = {i}\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
                 metrics_listen = \"127.0.0.1:{metrics}\"\n\
                 io_workers = 2\nlog_filter = \"info,chorus_server::ctrl=debug\"\n\n[peers]\n{peers}\n{groups}\
                 [out_of_order]\nelection_timeout_ms = 300\ncompact_bytes = 262144\n\n\
                 [control]\ngroup = {}\nendpoints = [{endpoints}]\nrack = \"r{i}\"\n\
                 heartbeat_ms = 200\ndown_after_ms = 1500\nreplace_after_ms = {replace_after_ms}\nchunk_bytes = {CHUNK}\n",
                dir.path().join(format!("n{i}")).display(),
                if i <= 3 { CTRL } else { 0 },
            )
            .unwrap();
            let mut n = Server::new(cfg, dir.path().join(format!("n{i}.log")));
            n.start();
            servers.push(n);
        }
        Cluster {
            nodes: servers,
            control,
            metrics: (0..3)
                .map(|i| format!("127.0.0.1:{}", ports[i][2]))
                .collect(),
            dir,
        }
    }

    /// Prints the end of every node's log (on a failure).
    pub fn dump_logs(&self) {
        for i in 1..=self.nodes.len() {
            let log = std::fs::read_to_string(self.dir.path().join(format!("n{i}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!(
                "--- node {i} ---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// The metrics text a node serves at `addr`, if it answers.
pub fn metrics_text(addr: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The control-plane metrics of the control node that leads (the one rendering
/// `chorus_control_leader 1`), if one does.
pub fn leader_metrics(metrics: &[String]) -> Option<String> {
    metrics.iter().find_map(|addr| {
        metrics_text(addr).filter(|t| t.lines().any(|l| l == "chorus_control_leader 1"))
    })
}

/// A counter summed over every control node that answers (each counts what it did
/// while it led).
pub fn control_counter(metrics: &[String], name: &str) -> u64 {
    metrics
        .iter()
        .filter_map(|a| metrics_text(a))
        .map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}
