//! Out-of-order groups for real: three nodes in this process, each with its own directory
//! (fdatasync on), over loopback TCP. Parallel mode drives a block volume, dependent mode
//! a key-value store; the leader is stopped and restarted from its directory.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Body, Declared, Entry, Mode};
use chorus_runtime::ooo::{OooNode, OooNodeConfig};
use chorus_runtime::Outcome;

type State = Arc<Mutex<BTreeMap<u64, u64>>>;

/// What an entry writes (blocks or one key) with the value: the first 8 bytes of data.
fn apply_to(state: &State, e: &Entry) {
    let v = u64::from_le_bytes(e.data()[..8].try_into().unwrap_or([0; 8]));
    let mut s = state.lock().unwrap();
    match &e.body {
        Body::Parallel { ranges, .. } => {
            for r in ranges {
                for b in r.start..r.end {
                    s.insert(b, v);
                }
            }
        }
        Body::Dependent { write_set, .. } => {
            for k in write_set {
                s.insert(*k, v);
            }
        }
        Body::Null => {}
    }
}

struct Cluster {
    mode: Mode,
    dirs: Vec<tempfile::TempDir>,
    addrs: Vec<std::net::SocketAddr>,
    nodes: Vec<Option<OooNode>>,
    states: Vec<State>,
}

impl Cluster {
    fn new(mode: Mode) -> Self {
        let listeners: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut c = Self {
            mode,
            dirs: (0..3).map(|_| tempfile::tempdir().unwrap()).collect(),
            addrs,
            nodes: Vec::new(),
            states: (0..3).map(|_| State::default()).collect(),
        };
        for (i, l) in listeners.into_iter().enumerate() {
            let n = c.start(i, l);
            c.nodes.push(Some(n));
        }
        c
    }

    fn start(&self, i: usize, l: TcpListener) -> OooNode {
        let cfg = OooNodeConfig {
            id: i as u64 + 1,
            voters: self
                .addrs
                .iter()
                .enumerate()
                .map(|(j, a)| (j as u64 + 1, *a))
                .collect(),
            mode: self.mode,
            dir: self.dirs[i].path().to_path_buf(),
            election_timeout: Duration::from_millis(300),
            link_jitter: None,
            group: 7,
            // Node 1 applies on its driver thread, nodes 2 and 3 on pools of 1 and 2.
            apply_threads: i,
            catchup_rate: 0,
        };
        let st = self.states[i].clone();
        OooNode::start(cfg, l, Arc::new(move |e| apply_to(&st, e))).unwrap()
    }

    fn leader(&self) -> usize {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            for (i, n) in self.nodes.iter().enumerate() {
                if n.as_ref()
                    .and_then(|n| n.status())
                    .is_some_and(|s| s.serving)
                {
                    return i;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no serving leader within 20 s");
    }

    fn append_many(&self, from: u64, n: u64) {
        let l = self.leader();
        let node = self.nodes[l].as_ref().unwrap();
        for i in from..from + n {
            let v = i * 7919 + 1;
            let d = match self.mode {
                Mode::Parallel { .. } => {
                    Declared::Blocks(vec![BlockRange::new(i % 13, 1 + i % 3).unwrap()])
                }
                Mode::Dependent => Declared::Txn {
                    read_set: vec![i % 5],
                    write_set: vec![i % 11],
                },
            };
            assert_eq!(
                node.append(d, v.to_le_bytes().to_vec()).unwrap(),
                Outcome::Committed
            );
        }
    }

    /// Every live node applies up to the leader's committed head and holds the same state.
    fn converge(&self) {
        let t0 = Instant::now();
        loop {
            let st: Vec<_> = self
                .nodes
                .iter()
                .flatten()
                .map(|n| n.status().unwrap())
                .collect();
            let top = st.iter().map(|s| s.committed_head).max().unwrap();
            if st.iter().all(|s| s.applied_head == top) {
                let live: Vec<_> = (0..3).filter(|&i| self.nodes[i].is_some()).collect();
                let first = self.states[live[0]].lock().unwrap().clone();
                for &i in &live[1..] {
                    assert_eq!(
                        *self.states[i].lock().unwrap(),
                        first,
                        "node {} differs",
                        i + 1
                    );
                }
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no convergence: {st:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn run(mode: Mode) {
    let mut c = Cluster::new(mode);
    c.append_many(0, 200);
    c.converge();
    // Stop the leader; the others elect, merge and serve.
    let l = c.leader();
    c.nodes[l] = None;
    c.append_many(200, 100);
    // Restart it from its directory (its state machine replays the log).
    *c.states[l].lock().unwrap() = BTreeMap::new();
    let listener = TcpListener::bind(c.addrs[l]).unwrap();
    let n = c.start(l, listener);
    c.nodes[l] = Some(n);
    c.append_many(300, 50);
    c.converge();
}

#[test]
fn parallel_mode_replicates_over_tcp_and_survives_a_leader_restart() {
    run(Mode::Parallel { span: 2 });
}

#[test]
fn dependent_mode_replicates_over_tcp_and_survives_a_leader_restart() {
    run(Mode::Dependent);
}
