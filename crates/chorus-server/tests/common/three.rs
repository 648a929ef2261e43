//! Ordered group 1 on `n` real `chorus server` processes on loopback (lease 1 s, 4 MiB
//! blocks), and what tests of it share: its leader and its whole log. Included with
//! `#[path = "common/three.rs"] mod three;`; not every test uses every item.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};

use super::common::{free_port, Server};

/// A node: its id, API endpoint, replication address and process.
pub struct Node {
    pub id: u64,
    pub api: String,
    pub repl: String,
    pub server: Server,
}

impl std::ops::Deref for Node {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

/// Starts `n` nodes holding group 1 (voters 1..=n).
pub fn cluster(root: &Path, n: u64) -> Vec<Node> {
    let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
    let mut nodes = Vec::new();
    for i in 1..=n {
        let (api, repl) = ports[(i - 1) as usize];
        let mut peers = String::new();
        for j in 1..=n {
            if j != i {
                peers.push_str(&format!(
                    "\"{j}\" = \"127.0.0.1:{}\"\n",
                    ports[(j - 1) as usize].1
                ));
            }
        }
        let cfg = root.join(format!("n{i}.toml"));
        let mut f = std::fs::File::create(&cfg).unwrap();
        write!(
            f,
            "node = {i}\ndata_dir = \"{}\"\nlisten = \"127.0.0.1:{repl}\"\napi_listen = \"127.0.0.1:{api}\"\n\
             io_workers = 2\nlog_filter = \"info\"\n\n[peers]\n{peers}\n[[groups]]\nid = 1\nvoters = [{}]\n\n\
             [replica]\nlease_ms = 1000\nheartbeat_ms = 100\nping_ms = 100\nresend_ms = 200\n\n[log]\nblock_size = 4194304\n",
            root.join(format!("n{i}")).display(),
            (1..=n).map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
        )
        .unwrap();
        let mut node = Node {
            id: i,
            api: format!("http://127.0.0.1:{api}"),
            repl: format!("127.0.0.1:{repl}"),
            server: Server::new(cfg, root.join(format!("n{i}.log"))),
        };
        node.start();
        nodes.push(node);
    }
    nodes
}

/// The node that leads group 1, asking every endpoint until `timeout`.
pub async fn leader_of(eps: &[String], timeout: Duration) -> u64 {
    let end = Instant::now() + timeout;
    loop {
        let mut c = Client::new(eps.to_vec());
        for (_, r) in c.status_all(1).await {
            if let Ok(s) = r {
                if s.groups.iter().any(|g| g.role == "leader") {
                    return s.node;
                }
            }
        }
        assert!(Instant::now() < end, "no leader within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every committed record of group 1 at `ep`.
pub async fn read_all(ep: &str) -> Vec<pb::Record> {
    let mut c = Client::new(vec![ep.to_string()]);
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let r = c.read(1, from, 10_000).await.unwrap();
        if r.records.is_empty() {
            return out;
        }
        from = r.next_lsn;
        out.extend(r.records);
    }
}
