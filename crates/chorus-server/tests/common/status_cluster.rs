//! A three-node cluster of real `chorus server` processes with a group of every kind a
//! node reports metrics for: the control plane's ordered group [`CTRL`] (so the control
//! nodes render the chunk-server and volume metrics), an ordered group [`ORDERED`] and a
//! parallel-mode out-of-order group [`PARALLEL`]. Included by the status page and
//! dashboard tests (`#[path = "common/status_cluster.rs"] mod status_cluster;`); not every
//! one uses every item.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};

use super::common::{free_port, Server};

/// The control plane's ordered group.
pub const CTRL: u64 = 1;
/// An ordered group for appends.
pub const ORDERED: u64 = 2;
/// A parallel-mode out-of-order group for appends.
pub const PARALLEL: u64 = 3;

/// The running cluster; its processes are killed when it is dropped.
pub struct Cluster {
    /// Node `i` is `nodes[i - 1]`.
    pub nodes: Vec<Server>,
    /// Client API endpoints (`http://...`), node `i` at `i - 1`.
    pub eps: Vec<String>,
    /// Metrics listen addresses (`host:port`), node `i` at `i - 1`.
    pub metrics: Vec<String>,
    /// Holds every node's data, configuration and log.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts three nodes.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<[u16; 3]> = (0..3)
            .map(|_| [free_port(), free_port(), free_port()])
            .collect();
        let endpoints = ports
            .iter()
            .map(|p| format!("\"127.0.0.1:{}\"", p[0]))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::new();
        for i in 1..=3u64 {
            let [api, repl, metrics] = ports[(i - 1) as usize];
            let peers: String = (1..=3u64)
                .filter(|j| *j != i)
                .map(|j| format!("\"{j}\" = \"127.0.0.1:{}\"\n", ports[(j - 1) as usize][1]))
                .collect();
            let cfg = dir.path().join(format!("n{i}.toml"));
            let mut f = std::fs::File::create(&cfg).unwrap();
            write!(
                f,
                "node = {i}\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
                 metrics_listen = \"127.0.0.1:{metrics}\"\nio_workers = 2\nlog_filter = \"info\"\n\n\
                 [peers]\n{peers}\n\
                 [[groups]]\nid = {CTRL}\nvoters = [1, 2, 3]\n\n\
                 [[groups]]\nid = {ORDERED}\nvoters = [1, 2, 3]\n\n\
                 [[groups]]\nid = {PARALLEL}\nvoters = [1, 2, 3]\nmode = \"parallel\"\n\n\
                 [out_of_order]\nelection_timeout_ms = 300\n\n\
                 [control]\ngroup = {CTRL}\nendpoints = [{endpoints}]\nrack = \"r{i}\"\nheartbeat_ms = 200\n\n\
                 [archive]\nurl = \"file://{}\"\ngroups = [{ORDERED}]\nflush_ms = 200\n",
                dir.path().join(format!("n{i}")).display(),
                dir.path().join("archive").display(),
            )
            .unwrap();
            let mut n = Server::new(cfg, dir.path().join(format!("n{i}.log")));
            n.start();
            nodes.push(n);
        }
        Cluster {
            nodes,
            eps: ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{}", p[0]))
                .collect(),
            metrics: ports
                .iter()
                .map(|p| format!("127.0.0.1:{}", p[2]))
                .collect(),
            dir,
        }
    }

    /// Appends `n` records of 100 bytes to the ordered group, in batches of 20, each
    /// committed; returns the committed end the last one reached.
    pub async fn append_ordered(&self, n: usize) -> u64 {
        let mut c = Client::new(self.eps.clone());
        let mut end = 0;
        for batch in 0..n.div_ceil(20) {
            let recs: Vec<Vec<u8>> = (0..20.min(n - batch * 20))
                .map(|i| format!("{batch:04}-{i:04}-").repeat(10).into_bytes())
                .collect();
            let res = c.append(ORDERED, recs, 0).await.expect("append");
            for r in &res {
                assert_eq!(r.outcome, pb::Outcome::Committed as i32, "{res:?}");
                end = end.max(r.lsn);
            }
        }
        end
    }

    /// Appends `n` single-block records to the parallel group, each committed.
    pub async fn append_parallel(&self, n: u64) {
        let mut c = Client::new(self.eps.clone());
        for i in 0..n {
            let rec = pb::OutOfOrderRecord {
                data: vec![(i % 251) as u8; 4096],
                blocks: vec![pb::BlockRange {
                    start: i % 16,
                    count: 1,
                }],
                ..Default::default()
            };
            let res = c
                .append_out_of_order(PARALLEL, vec![rec])
                .await
                .expect("append");
            assert_eq!(res[0].outcome, pb::Outcome::Committed as i32, "{res:?}");
        }
    }

    /// Waits until every group has a leader serving appends (the client retries a
    /// refused call at the leader, but not a cluster still electing for long).
    pub async fn wait_leaders(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let mut c = Client::new(self.eps.clone());
            let mut led = std::collections::BTreeSet::new();
            for (_, r) in c.status_all(0).await {
                if let Ok(s) = r {
                    for g in s.groups {
                        if g.role == "leader" && (g.mode == "ordered" || g.serving) {
                            led.insert(g.group);
                        }
                    }
                }
            }
            if [CTRL, ORDERED, PARALLEL].iter().all(|g| led.contains(g)) {
                return;
            }
            if Instant::now() > end {
                self.dump_logs();
                panic!("groups without a serving leader: led {led:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Prints the end of every node's log (on a failure).
    pub fn dump_logs(&self) {
        for i in 1..=self.nodes.len() {
            let log = std::fs::read_to_string(self.dir.path().join(format!("n{i}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "--- node {i} ---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// `GET path` on `addr` (`host:port`): the status code and the body, if it answers.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}
