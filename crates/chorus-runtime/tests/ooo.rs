//! Out-of-order groups for real: three nodes in this process, each an [`Env`] with its own
//! directory (fdatasync on) hosting the group, over loopback TCP on the environments'
//! shared transport. Parallel mode drives a block volume, dependent mode
//! a key-value store; the leader is stopped and restarted from its directory. The entries
//! files are compacted every few KiB, so a follower stopped for a while comes back behind
//! the leader's base and installs the leader's image.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::ooo::group::Record;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::OooAppendError;
use chorus_core::ooo::replica::{Declared, Footprint, Mode};
use chorus_runtime::ooo::{OooNode, OooNodeConfig, OooNodeError, OooStateMachine};
use chorus_runtime::transport::TlsFiles;
use chorus_runtime::{DiskSpace, Env, EnvConfig, Outcome};

mod common;

/// A map in memory with a "durable" copy that survives a stop (the last checkpoint or
/// installed image): a stopped node restarts from it, as from its disk.
#[derive(Default)]
struct Sm {
    live: Mutex<BTreeMap<u64, u64>>,
    durable: Mutex<BTreeMap<u64, u64>>,
    /// Every record applied, by (slot, place in its group).
    applied: Mutex<BTreeMap<(u64, u32), Record>>,
    /// What it reports as its checkpoint's cost.
    cost: std::sync::atomic::AtomicU64,
}

type State = Arc<Sm>;

impl Sm {
    fn crash(&self) {
        *self.live.lock().unwrap() = self.durable.lock().unwrap().clone();
    }
}

impl OooStateMachine for Sm {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> std::io::Result<()> {
        let mut seen = self.applied.lock().unwrap();
        for (i, r) in records {
            apply_to(&self.live, r);
            seen.insert((slot, *i), r.clone());
        }
        Ok(())
    }

    fn checkpoint(&self) -> std::io::Result<()> {
        *self.durable.lock().unwrap() = self.live.lock().unwrap().clone();
        Ok(())
    }

    fn checkpoint_cost(&self) -> u64 {
        self.cost.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn image(&self) -> std::io::Result<Vec<u8>> {
        let m = self.live.lock().unwrap();
        Ok(m.iter()
            .flat_map(|(k, v)| k.to_le_bytes().into_iter().chain(v.to_le_bytes()))
            .collect())
    }

    fn restore(&self, image: &[u8]) -> std::io::Result<()> {
        if !image.len().is_multiple_of(16) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "image length is not a multiple of 16",
            ));
        }
        let u = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
        let m: BTreeMap<u64, u64> = image.chunks(16).map(|c| (u(&c[..8]), u(&c[8..]))).collect();
        *self.durable.lock().unwrap() = m.clone();
        *self.live.lock().unwrap() = m;
        Ok(())
    }

    /// `u64 key | u64 present | u64 value` for every block or key of the scope.
    fn image_part(&self, scope: &Footprint) -> std::io::Result<Option<Vec<u8>>> {
        let m = self.live.lock().unwrap();
        let keys = scope
            .blocks
            .iter()
            .flat_map(|r| r.start..r.end)
            .chain(scope.keys.iter().copied());
        let mut out = Vec::new();
        for k in keys {
            let (present, v) = m.get(&k).map_or((0u64, 0), |&v| (1, v));
            for x in [k, present, v] {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        Ok(Some(out))
    }

    fn restore_part(&self, image: &[u8]) -> std::io::Result<()> {
        if !image.len().is_multiple_of(24) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "partial image length is not a multiple of 24",
            ));
        }
        let u = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
        let mut live = self.live.lock().unwrap();
        for c in image.chunks(24) {
            match u(&c[8..16]) {
                0 => live.remove(&u(&c[..8])),
                _ => live.insert(u(&c[..8]), u(&c[16..])),
            };
        }
        *self.durable.lock().unwrap() = live.clone();
        Ok(())
    }
}

/// What a record writes (blocks or keys) with the value: the first 8 bytes of data.
fn apply_to(state: &Mutex<BTreeMap<u64, u64>>, r: &Record) {
    let v = u64::from_le_bytes(r.data[..8].try_into().unwrap_or([0; 8]));
    let mut s = state.lock().unwrap();
    match &r.declared {
        Declared::Blocks(ranges) => {
            for r in ranges {
                for b in r.start..r.end {
                    s.insert(b, v);
                }
            }
        }
        Declared::Txn { write_set, .. } => {
            for k in write_set {
                s.insert(*k, v);
            }
        }
    }
}

struct Cluster {
    mode: Mode,
    dirs: Vec<tempfile::TempDir>,
    /// Each node's environment (None while the node is stopped); the group runs in it.
    envs: Vec<Option<Env>>,
    nodes: Vec<Option<Arc<OooNode>>>,
    states: Vec<State>,
    /// Each node's TLS files (none: plain TCP).
    tls: Vec<Option<TlsFiles>>,
    /// Nodes 1..=voters are the voters at creation; any after them are spares a
    /// membership change may add.
    voters: usize,
    /// Each node's [`OooNodeConfig::freeze_interval`].
    freeze: Vec<Duration>,
    /// Each node's free-space guard (floor 0: never low, until a test raises it).
    disks: Vec<Arc<DiskSpace>>,
    /// While a node is stopped, its old replication port, bound and not listening: the
    /// others' dials to it are refused, as to a crashed process, rather than reaching a
    /// listener another test of this binary opened on the freed port meanwhile.
    held: Vec<Option<socket2::Socket>>,
}

impl Cluster {
    fn new(mode: Mode) -> Self {
        Self::with_tls(mode, vec![None, None, None])
    }

    fn with_tls(mode: Mode, tls: Vec<Option<TlsFiles>>) -> Self {
        Self::build(mode, tls, 3)
    }

    /// Three voters and a spare (node 4).
    fn with_spare(mode: Mode) -> Self {
        Self::build(mode, vec![None; 4], 3)
    }

    fn build(mode: Mode, tls: Vec<Option<TlsFiles>>, voters: usize) -> Self {
        // Node 1 packs appends as PALF's adaptive group replication does; the others pack
        // every round: both paths run under every test's faults.
        let freeze = (0..tls.len())
            .map(|i| Duration::from_millis(u64::from(i == 0)))
            .collect();
        Self::build_with(mode, tls, voters, freeze)
    }

    fn build_with(
        mode: Mode,
        tls: Vec<Option<TlsFiles>>,
        voters: usize,
        freeze: Vec<Duration>,
    ) -> Self {
        let n = tls.len();
        let mut c = Self {
            mode,
            dirs: (0..n).map(|_| tempfile::tempdir().unwrap()).collect(),
            envs: (0..n).map(|_| None).collect(),
            nodes: (0..n).map(|_| None).collect(),
            states: (0..n).map(|_| State::default()).collect(),
            freeze,
            tls,
            voters,
            disks: (0..n)
                .map(|_| Arc::new(DiskSpace::new(std::env::temp_dir(), 0)))
                .collect(),
            held: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            c.restart(i);
        }
        c
    }

    /// Opens node `i`'s environment (listening on a free port, which the running nodes
    /// learn) and starts the group in it.
    fn start(&self, i: usize) -> (Env, Arc<OooNode>) {
        let id = i as u64 + 1;
        let mut ec = EnvConfig::new(id, self.dirs[i].path(), "127.0.0.1:0".parse().unwrap());
        ec.tls = self.tls[i].clone();
        let env = Env::open(ec).unwrap();
        for (j, other) in self.envs.iter().enumerate() {
            if let Some(other) = other {
                other.set_peer_addr(id, env.replication_addr().to_string());
                env.set_peer_addr(j as u64 + 1, other.replication_addr().to_string());
            }
        }
        let all = (1..=self.dirs.len() as u64).collect::<Vec<_>>();
        let cfg = OooNodeConfig {
            others: all[self.voters..].to_vec(),
            id: i as u64 + 1,
            voters: all[..self.voters].to_vec(),
            mode: self.mode,
            dir: self.dirs[i].path().join("ooo"),
            election_timeout: Duration::from_millis(300),
            group: 7,
            // Node 1 applies on its driver thread, nodes 2 and 3 on pools of 1 and 2.
            apply_threads: i,
            catchup_rate: 0,
            // Parallel clusters commit in conflict order on node 1 only: the leader
            // decides the order, so a replica's own setting matters only while it leads.
            conflict_order: i == 0,
            compact_bytes: 8 << 10,
            hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
            timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
            freeze_interval: self.freeze[i],
            preallocate: chorus_storage::ooo::DEFAULT_PREALLOCATE,
            direct_io: true,
            disk: Some(self.disks[i].clone()),
            fs: None,
        };
        let node = env.start_ooo_group(cfg, self.states[i].clone()).unwrap();
        (env, node)
    }

    /// Stops node `i` as a crash of its process would: the group and its environment.
    fn stop(&mut self, i: usize) {
        self.nodes[i] = None;
        if let Some(env) = self.envs[i].take() {
            let addr = env.replication_addr();
            env.shutdown();
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            // Best effort: another test may have taken the port already.
            if sock.bind(&addr.into()).is_ok() {
                self.held[i] = Some(sock);
            }
        }
        self.states[i].crash();
    }

    fn restart(&mut self, i: usize) {
        self.held[i] = None;
        let (env, node) = self.start(i);
        self.envs[i] = Some(env);
        self.nodes[i] = Some(node);
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

    /// Record `i`'s declaration and bytes.
    fn record(&self, i: u64) -> (Declared, Vec<u8>) {
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
        (d, v.to_le_bytes().to_vec())
    }

    /// Appends one record after another, each waiting for its result (one per group).
    /// A refusal because the node no longer leads (an election under a loaded machine)
    /// appended nothing: the record goes to the new leader, within 20 s.
    fn append_many(&self, from: u64, n: u64) {
        let t0 = Instant::now();
        for i in from..from + n {
            loop {
                let node = self.nodes[self.leader()].as_ref().unwrap();
                let (d, data) = self.record(i);
                match node.append(d, data) {
                    Err(OooNodeError::Refused(OooAppendError::NotLeader { .. }))
                        if t0.elapsed() < Duration::from_secs(20) =>
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    r => {
                        assert_eq!(r.unwrap(), Outcome::Committed);
                        break;
                    }
                }
            }
        }
    }

    /// Submits `n` records at once, so the driver packs them into group entries, and
    /// checks their results: all committed, at distinct (slot, index) places, increasing
    /// in submission order for records that conflict, some slots holding several
    /// records. Returns the places.
    fn append_burst(&self, from: u64, n: u64) -> Vec<(u64, u32)> {
        let l = self.leader();
        let node = self.nodes[l].as_ref().unwrap();
        let futs: Vec<_> = (from..from + n)
            .map(|i| {
                let (d, data) = self.record(i);
                node.submit(d, data)
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let places: Vec<(u64, u32)> = rt.block_on(async {
            let mut out = Vec::new();
            for f in futs {
                // Bounded: a result that never comes fails the test instead of hanging it.
                let r = tokio::time::timeout(std::time::Duration::from_secs(20), f)
                    .await
                    .expect("no result within 20 s")
                    .unwrap();
                assert_eq!(r.outcome, Outcome::Committed);
                out.push((r.seq, r.index));
            }
            out
        });
        // Records that touch a block or key in common keep submission order; others may
        // not, where a commit rule packs records that would wait after the rest
        // (`group::waiting_last`).
        let touched = |i: u64| -> Vec<u64> {
            match self.record(i).0 {
                Declared::Blocks(rs) => rs.iter().flat_map(|r| r.start..r.end).collect(),
                Declared::Txn {
                    read_set,
                    write_set,
                } => read_set.into_iter().chain(write_set).collect(),
            }
        };
        let distinct: std::collections::BTreeSet<(u64, u32)> = places.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            places.len(),
            "a place given twice: {places:?}"
        );
        for a in 0..n {
            for b in a + 1..n {
                let (ta, tb) = (touched(from + a), touched(from + b));
                if ta.iter().any(|x| tb.contains(x)) {
                    assert!(
                        places[a as usize] < places[b as usize],
                        "records {a} and {b} conflict but were placed out of submission order: {places:?}"
                    );
                }
            }
        }
        let slots: std::collections::BTreeSet<u64> = places.iter().map(|p| p.0).collect();
        assert!(
            (slots.len() as u64) < n,
            "{n} records submitted at once took {} slots: none was grouped",
            slots.len()
        );
        places
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
                let live: Vec<_> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].is_some())
                    .collect();
                let first = self.states[live[0]].live.lock().unwrap().clone();
                for &i in &live[1..] {
                    assert_eq!(
                        *self.states[i].live.lock().unwrap(),
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
    // A reader can wait for the committed head to move instead of polling: a follower's
    // subscription starts at its head and sees it pass five more slots once five more
    // records commit (one group each: each waits for its result).
    let l = c.leader();
    let follower = c.nodes[(l + 1) % 3].as_ref().unwrap();
    let mut head = follower.subscribe_committed();
    let before = *head.borrow_and_update();
    assert_eq!(before, follower.status().unwrap().committed_head);
    c.append_many(2000, 5);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let seen = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), head.wait_for(|h| *h >= before + 5))
            .await
            .map(|h| h.map(|h| *h))
    });
    assert!(
        matches!(seen, Ok(Ok(h)) if h >= before + 5),
        "the follower's committed head did not pass {}: {seen:?}",
        before + 5
    );
    // A burst is packed into group entries; every replica applies each record at the
    // place its writer was told (slot, and place in the slot's group).
    let places = c.append_burst(1000, 300);
    c.converge();
    for (i, st) in c.states.iter().enumerate() {
        let seen = st.applied.lock().unwrap();
        for (k, p) in places.iter().enumerate() {
            let (declared, data) = c.record(1000 + k as u64);
            assert_eq!(
                seen.get(p),
                Some(&Record { declared, data }),
                "node {} at {p:?}",
                i + 1
            );
        }
    }
    // A burst sent to a follower is refused whole, every record by name (a group is
    // refused as one entry; each of its writers hears why), and a record of the other
    // mode is refused alone, before it could join a group.
    let l = c.leader();
    let f = c.nodes[(l + 1) % 3].as_ref().unwrap();
    let futs: Vec<_> = (0..20)
        .map(|i| {
            let (d, data) = c.record(i);
            f.submit(d, data)
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for r in rt.block_on(async {
        let mut out = Vec::new();
        for fut in futs {
            out.push(fut.await);
        }
        out
    }) {
        assert!(
            matches!(
                r,
                Err(OooNodeError::Refused(OooAppendError::NotLeader { .. }))
            ),
            "{r:?}"
        );
    }
    let other = match mode {
        Mode::Parallel { .. } => Declared::Txn {
            read_set: vec![],
            write_set: vec![1],
        },
        Mode::Dependent => Declared::Blocks(vec![BlockRange::new(0, 1).unwrap()]),
    };
    let leader = c.nodes[l].as_ref().unwrap();
    let (good, bad) = rt.block_on(async {
        let (d, data) = c.record(7);
        let good = leader.submit(d, data);
        let bad = leader.submit(other, vec![0; 8]);
        (good.await, bad.await)
    });
    assert_eq!(good.unwrap().outcome, Outcome::Committed);
    assert!(
        matches!(
            bad,
            Err(OooNodeError::Refused(OooAppendError::WrongMode { .. }))
        ),
        "{bad:?}"
    );
    // Stop the leader; the others elect, merge and serve.
    let l = c.leader();
    c.stop(l);
    c.append_many(200, 100);
    // Restart it from its directory: its state machine starts from its last checkpoint
    // and replays the log from its base.
    c.restart(l);
    c.append_many(300, 50);
    c.converge();
    let st = c.nodes[l].as_ref().unwrap().status().unwrap();
    assert!(st.counters.base > 0, "compacted: {st:?}");
    assert!(st.counters.log_bytes < 64 << 10, "{st:?}");
    // Stop the node just restarted while the others go on and compact past it: when it
    // comes back it is behind the leader's base and installs the leader's image, a
    // partial one. It is the node to stop: a replica that restarted or installed an image
    // no longer knows what the slots it compacted before wrote, so it sends only a whole
    // image to a follower that applied less than that (`OooReplica::image_scope`). This
    // one came back above with an image of about the slot where the stop happens, and a
    // restarted follower has applied only up to its saved committed head, which may be
    // lower (seen under load: an election made it the leader while a follower was away;
    // back, the follower refused a partial image built for the slot it had stopped at,
    // and got a whole image). The two others ran throughout: whichever leads sends a
    // partial image. It is a follower unless an election since made it the leader; then
    // the others elect, as above.
    let (f, l) = (l, c.leader());
    // What it may hold: every slot the leader had assigned (no append is in flight:
    // `append_many` waits for each). Its own committed head is not enough — it may have
    // stored slots past it, acknowledged but not yet known committed, and then come back
    // needing only entries the leader still has.
    let head = c.nodes[l]
        .as_ref()
        .unwrap()
        .status()
        .unwrap()
        .committed_head;
    c.stop(f);
    // How far a node compacts depends on the entries' bytes (it checkpoints every
    // `compact_bytes`): append until every running node's base has passed where the
    // follower stopped, so no message sent from now on can carry a slot it lacks —
    // whichever of them leads when it comes back (an election under load may move the
    // lead) has only an image for it.
    let mut next = 350;
    loop {
        c.append_many(next, 50);
        next += 50;
        let bases: Vec<u64> = (0..3)
            .filter(|&i| i != f)
            .map(|i| c.nodes[i].as_ref().unwrap().status().unwrap().counters.base)
            .collect();
        if bases.iter().all(|&b| b > head) {
            break;
        }
        assert!(
            next < 350 + 2000,
            "the nodes did not compact past slot {head} in 2,000 appends: bases {bases:?}"
        );
    }
    // But the leader kept sending the stopped follower what it lacked while it still
    // held it — catch-up pieces from `head` at every resend, and each new slot as it was
    // appended — and what its transport queued since its last failed dial waits in the
    // outbox (the writer backs off, up to a second, between dials) and goes to the
    // follower's new address once it restarts. The follower then catches up from entries
    // the leader held when it sent them, and needs no image. Seen under load: stopped at
    // 358, the leader sent it 358..=403, 358..=468 and 358..=543 with its base still at
    // 358 (it compacts no further than the head of a follower heard within the election
    // timeout), then compacted to 557 at once; the follower came back behind base 557 and
    // caught up to 578 from those pieces. Each failed dial drops what was queued when it
    // began (the leader's heartbeats keep it dialling): two failed dials after the
    // compaction leave nothing from before it.
    let now_leading = c.leader();
    let lead = c.nodes[now_leading].as_ref().unwrap().status().unwrap();
    // Counted over both running nodes: under load the lead can move again, and whichever
    // node leads (or campaigns) is the one dialling the stopped follower.
    let dropped = |c: &Cluster| -> u64 {
        (0..3)
            .filter(|&i| i != f)
            .filter_map(|i| c.envs[i].as_ref())
            .map(|e| e.transport_stats().frames_dropped)
            .sum()
    };
    let (before, t0) = (dropped(&c), Instant::now());
    while dropped(&c) < before + 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the leader never redialled the stopped follower: frames dropped {} -> {}, \
             port held {}, statuses {:?}",
            before,
            dropped(&c),
            c.held[f].is_some(),
            (0..3)
                .filter(|&i| i != f)
                .map(|i| c.nodes[i].as_ref().and_then(|n| n.status()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.restart(f);
    c.append_many(next, 20);
    c.converge();
    let st = c.nodes[f].as_ref().unwrap().status().unwrap();
    assert!(
        st.counters.installs >= 1 && st.stats.snapshots_installed >= 1,
        "node {} came back behind base {} (it stopped when the leader, node {}, had assigned \
         up to {head}) and did not install an image: {st:?}",
        f + 1,
        lead.counters.base,
        l + 1
    );
    // It had applied what it held up to its own base and more: the leader sent only what
    // the slots from there on wrote (PolarFS 5.3 fast catch-up), and the states converged
    // (above) all the same.
    assert!(
        st.counters.partial_installs >= 1,
        "no partial image: {st:?}"
    );
    assert!(st.counters.base >= lead.counters.base, "{st:?} {lead:?}");
    // The log itself reads the same on every replica: from the highest base, the
    // committed prefix in slot order; below a replica's base, a clear refusal.
    let nodes: Vec<&OooNode> = c.nodes.iter().flatten().map(|n| &**n).collect();
    let sts: Vec<_> = nodes.iter().map(|n| n.status().unwrap()).collect();
    let from = sts.iter().map(|s| s.counters.base).max().unwrap();
    let upto = sts.iter().map(|s| s.committed_head).min().unwrap();
    let mut reads = Vec::new();
    for n in &nodes {
        let r = n.read(from, 100_000).unwrap().unwrap();
        assert!(r.committed_head >= upto);
        let got: Vec<_> = r
            .entries
            .iter()
            .take_while(|e| e.seq < upto)
            .map(|e| (e.seq, e.eid, e.data().to_vec()))
            .collect();
        assert_eq!(
            got.len() as u64,
            upto - from,
            "contiguous from {from} to {upto}"
        );
        reads.push(got);
    }
    assert!(
        reads.windows(2).all(|w| w[0] == w[1]),
        "replicas read different logs"
    );
    let low = sts.iter().map(|s| s.counters.base).min().unwrap();
    if low > 0 {
        let i = sts.iter().position(|s| s.counters.base == low).unwrap();
        assert!(matches!(
            nodes[i].read(low - 1, 10).unwrap(),
            Err(chorus_core::ooo::replica::OooReadError::Compacted { .. })
        ));
    }
}

#[test]
fn parallel_mode_replicates_over_tcp_and_survives_a_leader_restart() {
    run(Mode::Parallel { span: 2 });
}

#[test]
fn dependent_mode_replicates_over_tcp_and_survives_a_leader_restart() {
    run(Mode::Dependent);
}

/// Mutual TLS on the out-of-order transport: nodes 1 and 2 hold certificates of the
/// cluster's CA and replicate; node 3's certificate is from another CA, so its handshakes
/// are refused both ways and it never receives an entry.
#[test]
fn out_of_order_groups_replicate_over_mutual_tls_and_refuse_a_stranger() {
    let root = tempfile::tempdir().unwrap();
    let (good, evil) = (common::ca(), common::ca());
    let tls = (1..=3)
        .map(|n| {
            let authority = if n == 3 { &evil } else { &good };
            Some(common::node_files(root.path(), authority, n))
        })
        .collect();
    let c = Cluster::with_tls(Mode::Parallel { span: 2 }, tls);
    let l = c.leader();
    assert_ne!(l, 2, "the stranger cannot lead");
    c.append_many(0, 50);
    let other = 1 - l;
    let t0 = Instant::now();
    let want = c.nodes[l]
        .as_ref()
        .unwrap()
        .status()
        .unwrap()
        .committed_head;
    // Both must have applied it: a writer hears its result as soon as the entry commits,
    // which may be before the leader's own apply.
    let applied = |i: usize| c.nodes[i].as_ref().unwrap().status().unwrap().applied_head;
    while applied(other) < want || applied(l) < want {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no replication over TLS"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        *c.states[other].live.lock().unwrap(),
        *c.states[l].live.lock().unwrap()
    );
    let s3 = c.nodes[2].as_ref().unwrap().status().unwrap();
    assert_eq!(
        s3.counters.msgs_in, 0,
        "the stranger received messages: {s3:?}"
    );
    assert_eq!(s3.applied_head, 0);
}

/// A state machine that checkpoints by rewriting a large state reports its size as the
/// checkpoint's cost, and the driver lets the entries file grow past it first: with a
/// cost far above what the test writes no node checkpoints, though the file passes four
/// times `compact_bytes` (8 KiB here); once the cost is 0 every node checkpoints again.
#[test]
fn a_costly_checkpoint_waits_for_as_many_bytes_of_entries() {
    use std::sync::atomic::Ordering::Relaxed;
    let c = Cluster::new(Mode::Dependent);
    for s in &c.states {
        s.cost.store(1 << 30, Relaxed);
    }
    let counters = |i: usize| c.nodes[i].as_ref().unwrap().status().unwrap().counters;
    let mut from = 0;
    let t0 = Instant::now();
    while (0..3).any(|i| counters(i).log_bytes < 5 * (8 << 10)) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the entries files did not grow"
        );
        c.append_many(from, 50);
        from += 50;
    }
    for i in 0..3 {
        let k = counters(i);
        assert_eq!(k.checkpoints, 0, "node {} checkpointed: {k:?}", i + 1);
    }
    for s in &c.states {
        s.cost.store(0, Relaxed);
    }
    let t0 = Instant::now();
    while (0..3).any(|i| counters(i).checkpoints == 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no checkpoint once the cost fell"
        );
        c.append_many(from, 10);
        from += 10;
    }
}

/// Adaptive group replication (PALF section 6) with a freeze interval far longer than the
/// test: an append taken while the leader's log IO is idle is packed at once, and appends
/// taken while its write is in flight gather until that write is durable — neither waits
/// for the interval, and the gathered ones share entries.
#[test]
fn appends_gather_while_the_leaders_write_is_in_flight() {
    let long = Duration::from_secs(30);
    let c = Cluster::build_with(Mode::Parallel { span: 2 }, vec![None; 3], 3, vec![long; 3]);
    let l = c.leader();
    let node = c.nodes[l].as_ref().unwrap();
    let t0 = Instant::now();
    c.append_many(0, 10);
    assert!(
        t0.elapsed() < long / 3,
        "appends one at a time waited for the freeze interval: {:?}",
        t0.elapsed()
    );
    // A stream of appends, each sent while earlier ones are still being written (a
    // submission is queued to the driver when made; its result is awaited later).
    let before = node.status().unwrap().counters;
    let t0 = Instant::now();
    let futs: Vec<_> = (0..300)
        .map(|i| {
            // 16 KiB each, so the leader's writes take a while (and eight fill a group).
            let (d, mut data) = c.record(1000 + i);
            data.resize(16 << 10, 0);
            let f = node.submit(d, data);
            std::thread::sleep(Duration::from_micros(20));
            f
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let results = rt.block_on(async {
        let mut out = Vec::new();
        for f in futs {
            out.push(f.await);
        }
        out
    });
    assert!(
        t0.elapsed() < long / 3,
        "gathered appends waited for the freeze interval: {:?}",
        t0.elapsed()
    );
    for r in &results {
        assert_eq!(r.as_ref().unwrap().outcome, Outcome::Committed, "{r:?}");
    }
    let after = node.status().unwrap().counters;
    let (appends, groups) = (after.appends - before.appends, after.groups - before.groups);
    assert_eq!(appends, 300);
    assert!(
        groups <= 100,
        "300 appends streamed should share entries while writes are in flight: {groups} entries"
    );
    c.converge();
}

/// While its disk is below the guard's floor, the leader refuses appends by name with
/// nothing appended (a follower still answers NotLeader, so clients find the leader),
/// the group keeps running, and once the floor is met again appends commit — no restart.
#[test]
fn a_leader_refuses_appends_while_its_disk_is_low_and_resumes() {
    let c = Cluster::new(Mode::Dependent);
    let l = c.leader();
    c.append_many(0, 5);
    let node = c.nodes[l].as_ref().unwrap();
    for d in &c.disks {
        d.set_min_free(u64::MAX - 1);
    }
    let (d, data) = c.record(100);
    match node.append(d.clone(), data.clone()) {
        Err(e @ OooNodeError::DiskLow { min_free, .. }) => {
            assert_eq!(min_free, u64::MAX - 1);
            assert!(e.to_string().contains("nothing appended"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let f = (l + 1) % 3;
    match c.nodes[f].as_ref().unwrap().append(d.clone(), data.clone()) {
        Err(OooNodeError::Refused(e)) => assert!(e.to_string().contains("leader"), "{e}"),
        other => panic!("a follower should answer NotLeader: {other:?}"),
    }
    assert!(c.disks[l].refused() >= 1);
    let st = node.status().expect("the group keeps running");
    assert_eq!(st.role, chorus_runtime::Role::Leader);
    for d in &c.disks {
        d.set_min_free(0);
    }
    assert_eq!(node.append(d, data).unwrap(), Outcome::Committed);
    c.converge();
}

/// A follower whose disk is below the guard's floor takes no new entries (the messages
/// carrying them go as if lost) while the leader and the other follower commit; once
/// space is back it catches up by itself and holds the same state.
#[test]
fn a_follower_on_a_low_disk_takes_no_entries_and_catches_up() {
    let c = Cluster::new(Mode::Parallel { span: 2 });
    let l = c.leader();
    c.append_many(0, 5);
    c.converge();
    let f = (l + 1) % 3;
    c.disks[f].set_min_free(u64::MAX - 1);
    c.append_many(100, 50);
    assert!(
        c.disks[f].declined() >= 1,
        "the low follower took every message"
    );
    let lead = c.nodes[l].as_ref().unwrap().status().unwrap();
    let low = c.nodes[f]
        .as_ref()
        .unwrap()
        .status()
        .expect("it keeps running");
    assert!(
        low.applied_head < lead.applied_head,
        "a follower on a low disk applied {:?}, the leader {:?}",
        low.applied_head,
        lead.applied_head
    );
    c.disks[f].set_min_free(0);
    c.converge();
}

/// Waits until the serving leader holds `voters` with no change in its joint stage and
/// is one of them; returns its index. (A leader removing itself enters the final stage
/// with the new voters and serves on until a quorum of them accepts it, a moment later.)
fn voters_become(c: &Cluster, voters: &[u64]) -> usize {
    let t0 = Instant::now();
    loop {
        let l = c.leader();
        let m = c.nodes[l].as_ref().and_then(|n| n.membership());
        if let Some(m) = &m {
            if m.voters == voters && m.prev.is_none() && voters.contains(&(l as u64 + 1)) {
                return l;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "voters never became {voters:?} (leader {} holds {m:?})",
            l + 1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Membership changes over TCP: a spare (node 4, not a voter at creation) replaces the
/// serving leader; the leader steps down once the change is accepted, one of the
/// remaining voters leads, and the spare catches up (by image: the log was compacted)
/// and applies the same state. The change is then undone: the spare is removed, the old
/// leader (restarted from its directory) added back. Every node saves the membership, so
/// a restart keeps it.
fn changes(mode: Mode) {
    use chorus_core::ooo::replica::{OooChangeError, OooMembershipChange as C};
    let mut c = Cluster::with_spare(mode);
    c.append_many(0, 150);
    let old = c.leader();
    let node = c.nodes[old].as_ref().unwrap();
    // A follower cannot change the voters; the leader can, once at a time.
    let f = (old + 1) % 3;
    assert!(matches!(
        c.nodes[f]
            .as_ref()
            .unwrap()
            .change_membership(C::AddVoter(4)),
        Some(Err(OooChangeError::NotLeader { .. }))
    ));
    let add = C::Replace {
        remove: old as u64 + 1,
        add: 4,
    };
    node.change_membership(add).unwrap().unwrap();
    let want: Vec<u64> = (1..=4).filter(|&n| n != old as u64 + 1).collect();
    let l = voters_become(&c, &want);
    assert_ne!(l, old, "the removed leader still serves");
    c.append_many(150, 100);
    // The removed node hears nothing more: stop it, then every voter converges.
    c.stop(old);
    c.converge();
    let st = c.nodes[3].as_ref().unwrap().status().unwrap();
    assert!(
        st.counters.installs >= 1,
        "the spare installed no image: {st:?}"
    );
    // Restart the removed node; it is not a voter and stays out.
    c.restart(old);
    let leader = c.nodes[l].as_ref().unwrap();
    assert!(matches!(
        leader.change_membership(C::Remove(9)),
        Some(Err(OooChangeError::Invalid { .. }))
    ));
    leader
        .change_membership(C::Replace {
            remove: 4,
            add: old as u64 + 1,
        })
        .unwrap()
        .unwrap();
    voters_become(&c, &[1, 2, 3]);
    c.append_many(250, 50);
    c.stop(3);
    c.converge();
    for i in 0..3 {
        let m = c.nodes[i].as_ref().unwrap().membership().unwrap();
        assert_eq!(m.voters, vec![1, 2, 3], "node {}", i + 1);
    }
}

#[test]
fn parallel_mode_changes_voters_over_tcp() {
    changes(Mode::Parallel { span: 2 });
}

#[test]
fn dependent_mode_changes_voters_over_tcp() {
    changes(Mode::Dependent);
}

/// One node hosts groups of every mode: an ordered group and out-of-order groups of both
/// modes run on the same three environments (one transport, one listener each) and all
/// commit; a group id in use on a node, in any mode, is refused for another group, and is
/// free again once its out-of-order group is dropped.
#[test]
fn groups_of_every_mode_share_a_node() {
    let mut c = Cluster::new(Mode::Parallel { span: 2 });
    let envs: Vec<Env> = c.envs.iter().flatten().cloned().collect();
    let logs: Vec<_> = envs
        .iter()
        .map(|e| e.create_group(1, &[1, 2, 3], &[]).unwrap())
        .collect();
    let dependent: Vec<Arc<OooNode>> = envs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut cfg = dependent_cfg(i as u64 + 1, &c.dirs[i]);
            cfg.group = 8;
            e.start_ooo_group(cfg, Arc::new(Sm::default())).unwrap()
        })
        .collect();
    // The ordered group commits.
    let t0 = Instant::now();
    let committed = loop {
        let r = logs.iter().find_map(|l| l.append(b"ordered", 0).ok());
        if let Some(a) = r {
            break a.result.wait().unwrap().outcome;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no ordered leader");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(committed, Outcome::Committed);
    // The parallel group (7) commits.
    c.append_many(0, 20);
    // The dependent group (8) commits.
    let t0 = Instant::now();
    loop {
        let d = Declared::Txn {
            read_set: vec![1],
            write_set: vec![2],
        };
        match dependent
            .iter()
            .find(|n| n.status().is_some_and(|s| s.serving))
        {
            Some(n) => {
                let v = 7u64.to_le_bytes().to_vec();
                assert_eq!(n.append(d, v).unwrap(), Outcome::Committed);
                break;
            }
            None => {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "no dependent leader"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    assert_eq!(envs[0].ooo_groups(), vec![7, 8]);
    assert_eq!(envs[0].ordered_groups(), vec![1]);
    // Ids in use are refused across modes.
    let taken = envs[0].start_ooo_group(dependent_cfg(1, &c.dirs[0]), Arc::new(Sm::default()));
    assert!(
        matches!(taken, Err(OooNodeError::Exists(7))),
        "{:?}",
        taken.err()
    );
    let mut on_ordered = dependent_cfg(1, &c.dirs[0]);
    on_ordered.group = 1;
    let taken = envs[0].start_ooo_group(on_ordered, Arc::new(Sm::default()));
    assert!(
        matches!(taken, Err(OooNodeError::Exists(1))),
        "{:?}",
        taken.err()
    );
    assert!(matches!(
        envs[0].create_group(8, &[1, 2, 3], &[]),
        Err(chorus_runtime::Error::GroupExists(8))
    ));
    // Dropping an out-of-order group frees its id on that node (once the last handle is
    // gone: a transport thread handing it a message holds one for that long).
    drop(dependent);
    let t0 = Instant::now();
    while envs[0].ooo_groups() != vec![7] {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{:?}",
            envs[0].ooo_groups()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..3 {
        c.stop(i);
    }
}

/// A dependent-mode group's settings for node `id` (voters 1 to 3), in `dir/ooo-dep`.
fn dependent_cfg(id: u64, dir: &tempfile::TempDir) -> OooNodeConfig {
    OooNodeConfig {
        id,
        group: 7,
        voters: vec![1, 2, 3],
        others: Vec::new(),
        mode: Mode::Dependent,
        dir: dir.path().join("ooo-dep"),
        election_timeout: Duration::from_millis(300),
        apply_threads: 0,
        catchup_rate: 0,
        conflict_order: false,
        compact_bytes: 0,
        hole_resend: chorus_core::ooo::replica::HOLE_RESEND,
        timed_resend: chorus_core::ooo::replica::TIMED_RESEND,
        freeze_interval: Duration::ZERO,
        preallocate: 0,
        direct_io: true,
        disk: None,
        fs: None,
    }
}
