//! Out-of-order groups through the real server: three `chorus server` processes, a
//! parallel-mode group from the configuration and a dependent-mode group created over
//! gRPC; concurrent appends with conflicting blocks and keys; every replica's applied
//! state equals the serial application of the committed records in slot order; the
//! leader killed with SIGKILL, a new one serving, the killed node restarted (its groups
//! reopened from disk without the configuration naming the created one) and caught up;
//! wrong-mode requests refused by name. Entries files are compacted every 8 KiB, so the
//! killed node restarts from its state machine's checkpoint and comes back behind the
//! leaders' bases: it installs their images.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};
use tonic::Code;

const PAR: u64 = 2;
const DEP: u64 = 3;
const BLOCKS: u64 = 16;
const KEYS: u64 = 12;

mod common;
use common::{free_port, Server};

struct Cluster {
    nodes: Vec<Server>,
    eps: Vec<String>,
    /// Metrics addresses.
    metrics: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// The request that creates the dependent group on every node.
    fn create_dep(&self) -> pb::CreateGroupRequest {
        pb::CreateGroupRequest {
            group: DEP,
            voters: vec![1, 2, 3],
            mode: "dependent".into(),
            ..Default::default()
        }
    }
}

fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<[u16; 3]> = (0..3)
        .map(|_| [free_port(), free_port(), free_port()])
        .collect();
    let mut nodes = Vec::new();
    let mut eps = Vec::new();
    let mut metrics_addrs = Vec::new();
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
             metrics_listen = \"127.0.0.1:{metrics}\"\n\
             io_workers = 2\nlog_filter = \"info\"\n\n[peers]\n{peers}\n\
             [[groups]]\nid = {PAR}\nvoters = [1, 2, 3]\nmode = \"parallel\"\nlook_behind = 3\ncommit_order = \"conflicts\"\n\n\
             [out_of_order]\nelection_timeout_ms = 300\napply_threads = {}\ncatchup_bytes_per_sec = 1048576\ncompact_bytes = 8192\nfreeze_us = {}\n",
            dir.path().join(format!("n{i}")).display(),
            i - 1,
            // Node 1's leaders let appends gather (adaptive group replication).
            if i == 1 { 1000 } else { 0 }
        )
        .unwrap();
        let mut n = Server::new(cfg, dir.path().join(format!("n{i}.log")));
        n.start();
        nodes.push(n);
        eps.push(format!("http://127.0.0.1:{api}"));
        metrics_addrs.push(format!("127.0.0.1:{metrics}"));
    }
    Cluster {
        nodes,
        eps,
        metrics: metrics_addrs,
        _dir: dir,
    }
}

/// Waits until `group` has a serving leader; returns its node id.
async fn serving(eps: &[String], group: u64, timeout: Duration) -> u64 {
    let end = Instant::now() + timeout;
    loop {
        let mut c = Client::new(eps.to_vec());
        for (_, r) in c.status_all(group).await {
            if let Ok(s) = r {
                if s.groups.iter().any(|g| g.role == "leader" && g.serving) {
                    return s.node;
                }
            }
        }
        assert!(Instant::now() < end, "group {group}: no serving leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every endpoint in `eps` applied the same prefix of `group`, at least
/// `at_least` slots; returns it.
async fn settled(eps: &[String], group: u64, at_least: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = Client::new(eps.to_vec());
        let mut heads = Vec::new();
        for (_, r) in c.status_all(group).await {
            if let Ok(s) = r {
                if let Some(g) = s.groups.first() {
                    heads.push((g.committed_seq, g.applied_seq));
                }
            }
        }
        if heads.len() == eps.len()
            && heads.iter().all(|h| h.0 == h.1 && h.1 >= at_least)
            && heads.windows(2).all(|w| w[0] == w[1])
        {
            return heads[0].1;
        }
        assert!(
            Instant::now() < end,
            "group {group}: replicas did not settle: {heads:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node's metrics text, from its metrics endpoint.
fn metrics_text(metrics: &[String], node: u64) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(&metrics[(node - 1) as usize]).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// The sum of a node's series `name` of one group (every peer's, for a per-peer one).
fn metric_sum(metrics: &[String], node: u64, name: &str, group: u64, mode: &str) -> u64 {
    metrics_text(metrics, node)
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{name}{{"))
                && l.contains(&format!("group=\"{group}\",mode=\"{mode}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A node's metric of one group (the line's value), from its metrics endpoint.
fn metric_of(metrics: &[String], node: u64, name: &str, group: u64, mode: &str) -> u64 {
    let text = metrics_text(metrics, node);
    text.lines()
        .find(|l| {
            l.starts_with(&format!("{name}{{"))
                && l.contains(&format!("group=\"{group}\",mode=\"{mode}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {name} for group {group} in:\n{text}"))
}

/// Waits until the serving leader of `group` reports `voters` with no change under way.
async fn voters_become(eps: &[String], group: u64, voters: &[u64]) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = Client::new(eps.to_vec());
        let mut seen = Vec::new();
        for (_, r) in c.status_all(group).await {
            if let Ok(s) = r {
                for g in s.groups.iter().filter(|g| g.role == "leader" && g.serving) {
                    if g.voters == voters && g.prev_voters.is_empty() {
                        return;
                    }
                    seen.push((g.voters.clone(), g.prev_voters.clone()));
                }
            }
        }
        assert!(
            Instant::now() < end,
            "group {group}: voters never became {voters:?} (leaders report {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn block_record(lba: u64, tag: u32) -> pb::OutOfOrderRecord {
    let mut data = vec![0u8; 4096];
    data[..4].copy_from_slice(&tag.to_le_bytes());
    pb::OutOfOrderRecord {
        data,
        blocks: vec![pb::BlockRange {
            start: lba,
            count: 1,
        }],
        ..Default::default()
    }
}

fn txn_record(read: u64, write: u64, tag: u32) -> pb::OutOfOrderRecord {
    pb::OutOfOrderRecord {
        data: tag.to_le_bytes().to_vec(),
        read_set: vec![read],
        write_set: vec![write],
        ..Default::default()
    }
}

/// Runs `writers` concurrent writers of `per` records each on `group`; returns every
/// committed record's place (slot, index in the slot's group) and the record, in place
/// order. Any other result fails the test (no faults here).
async fn write_concurrently(
    eps: &[String],
    group: u64,
    writers: u32,
    per: u32,
    make: fn(u32, u32) -> pb::OutOfOrderRecord,
) -> Vec<((u64, u32), pb::OutOfOrderRecord)> {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let eps = eps.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::new(eps);
            let mut got = Vec::new();
            for i in 0..per {
                let r = make(w, i);
                let res = c.append_out_of_order(group, vec![r.clone()]).await.unwrap();
                assert_eq!(res.len(), 1);
                assert_eq!(res[0].outcome, pb::Outcome::Committed as i32, "{res:?}");
                got.push(((res[0].seq, res[0].index), r));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by_key(|(s, _)| *s);
    let mut places: Vec<(u64, u32)> = all.iter().map(|(s, _)| *s).collect();
    places.dedup();
    assert_eq!(
        places.len(),
        all.len(),
        "two appends reported the same place"
    );
    all
}

/// `chorus tail -f -o json` running as a child.
struct TailF(std::process::Child);

impl TailF {
    fn start(group: u64, from: u64, endpoints: &str) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["tail", "-f", "-o", "json", "-g", &group.to_string()])
            .args(["--from", &from.to_string(), "--endpoints", endpoints])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Self(child)
    }

    /// Whether it prints slot `slot` within `wait`; then stops it. Returns that and what
    /// it wrote to stderr.
    async fn prints(mut self, slot: u64, wait: Duration) -> (bool, String) {
        let out = self.0.stdout.take().unwrap();
        let seen = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            std::io::BufReader::new(out).lines().any(|l| {
                serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap()["seq"].as_u64()
                    == Some(slot)
            })
        });
        let seen = tokio::time::timeout(wait, seen).await;
        // Killing the child ends its output, which ends the reader if it still waits.
        let _ = self.0.kill();
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut self.0.stderr.take().unwrap(), &mut err);
        let _ = self.0.wait();
        (matches!(seen, Ok(Ok(true))), err)
    }
}

/// Runs the `chorus` CLI with `args`, which must succeed; the JSON lines it printed.
fn chorus_json(args: &[&str]) -> Vec<serde_json::Value> {
    chorus_json_result(args).unwrap_or_else(|e| panic!("chorus {args:?}: {e}"))
}

/// Runs the `chorus` CLI with `args`: the JSON lines it printed, or what it said on
/// standard error when it failed.
fn chorus_json_result(args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

/// The base a compacted-slot refusal names ("every slot below N is held only by the
/// state machine's image"), if `message` is one.
fn compacted_below(message: &str) -> Option<u64> {
    let at = message.find("is compacted (every slot below ")? + 31;
    message[at..]
        .split(|ch: char| !ch.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Every replica reads the group's log (`ReadOutOfOrder`) from the highest base among
/// them as the committed records in (slot, index) order, with what each declared; a read
/// below a replica's base is OUT_OF_RANGE naming the base. `chorus read` prints the same
/// places. Returns how many records it compared.
async fn log_reads_match(
    eps: &[String],
    group: u64,
    committed: &[((u64, u32), pb::OutOfOrderRecord)],
) -> usize {
    // Nothing appends meanwhile, but replicas go on compacting as followers catch up (a
    // leader compacts no further than its followers' heads): a read that finds its start
    // compacted since the bases were taken starts again from the new base.
    for _ in 0..20 {
        if let Some(n) = log_reads_match_from_bases(eps, group, committed).await {
            return n;
        }
    }
    panic!("group {group}: the replicas' bases kept moving past every read");
}

/// One try of [`log_reads_match`]: `None` when a replica compacted past the start in
/// the middle.
async fn log_reads_match_from_bases(
    eps: &[String],
    group: u64,
    committed: &[((u64, u32), pb::OutOfOrderRecord)],
) -> Option<usize> {
    let mut bases = Vec::new();
    for ep in eps {
        let mut c = Client::new(vec![ep.clone()]);
        bases.push(match c.read_out_of_order(group, 0, 1).await {
            Ok(_) => 0,
            Err(chorus_client::ClientError::Status { code, message, .. }) => {
                assert_eq!(code, Code::OutOfRange, "{message}");
                compacted_below(&message).expect("names the base")
            }
            Err(e) => panic!("{e}"),
        });
    }
    let from = *bases.iter().max().unwrap();
    let want: Vec<_> = committed.iter().filter(|(s, _)| s.0 >= from).collect();
    let mut first: Option<Vec<pb::OutOfOrderEntry>> = None;
    for ep in eps {
        let mut c = Client::new(vec![ep.clone()]);
        let r = match c.read_out_of_order(group, from, 10_000).await {
            Ok(r) => r,
            Err(chorus_client::ClientError::Status { code, message, .. })
                if code == Code::OutOfRange && compacted_below(&message).is_some() =>
            {
                return None
            }
            Err(e) => panic!("{e}"),
        };
        let es: Vec<_> = r.entries.into_iter().filter(|e| !e.null).collect();
        let recs: Vec<_> = es
            .iter()
            .flat_map(|e| {
                e.records
                    .iter()
                    .enumerate()
                    .map(move |(i, r)| ((e.seq, i as u32), r))
            })
            .collect();
        assert_eq!(
            recs.len(),
            want.len(),
            "group {group} from slot {from} on {ep}"
        );
        for ((place, got), (want_place, rec)) in recs.iter().zip(&want) {
            assert_eq!(place, want_place);
            assert_eq!(*got, rec);
        }
        // An entry declares the union of its records' declarations.
        for e in &es {
            for r in &e.records {
                assert!(r.write_set.iter().all(|k| e.write_set.contains(k)), "{e:?}");
                for b in &r.blocks {
                    assert!(
                        e.blocks
                            .iter()
                            .any(|u| u.start <= b.start && b.start + b.count <= u.start + u.count),
                        "{e:?}"
                    );
                }
            }
        }
        match &first {
            None => first = Some(es),
            Some(f) => assert_eq!(*f, es, "replicas read different logs"),
        }
    }
    let printed = match chorus_json_result(&[
        "read",
        "-o",
        "json",
        "--max",
        "10000",
        "-g",
        &group.to_string(),
        "--from",
        &from.to_string(),
        "--endpoints",
        &eps[0],
    ]) {
        Ok(p) => p,
        Err(e) if compacted_below(&e).is_some() => return None,
        Err(e) => panic!("chorus read: {e}"),
    };
    let places: Vec<(u64, u32)> = printed
        .into_iter()
        .filter(|v| !v["null"].as_bool().unwrap())
        .map(|v| {
            (
                v["seq"].as_u64().unwrap(),
                v["index"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    assert_eq!(places, want.iter().map(|(s, _)| *s).collect::<Vec<_>>());
    Some(want.len())
}

/// Reading an out-of-order group as it grows: `TailOutOfOrder` on a follower, started at
/// its committed head, and `chorus tail -f` both carry a record appended afterwards (the
/// stream waits on the replica's committed head; nothing else is appending), and
/// `chorus tail` without `-f` prints up to the committed head and exits.
async fn tails_follow(eps: &[String], group: u64, rec: pb::OutOfOrderRecord) {
    let mut c = Client::new(eps.to_vec());
    let leader = serving(eps, group, Duration::from_secs(20)).await;
    let f = (leader as usize) % eps.len(); // the node after the leader (index = id - 1)
    let head = c.status_all(group).await[f]
        .1
        .as_ref()
        .unwrap()
        .groups
        .iter()
        .find(|g| g.group == group)
        .unwrap()
        .committed_seq;
    let mut stream = Client::new(vec![eps[f].clone()])
        .tail_out_of_order(group, head)
        .await
        .unwrap();
    let cli = TailF::start(group, head, &eps[f]);
    // Let both subscribe and find nothing new before the append.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c
        .append_out_of_order(group, vec![rec.clone()])
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    let slot = r[0].seq;
    assert!(slot >= head, "appended at {slot}, below the head {head}");
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let m = stream.message().await.unwrap().expect("the stream ended");
            for e in m.entries {
                if e.seq == slot {
                    return e;
                }
            }
        }
    })
    .await
    .expect("TailOutOfOrder did not carry the record within 10 s");
    assert_eq!(got.records, vec![rec]);
    let (seen, err) = cli.prints(slot, Duration::from_secs(10)).await;
    assert!(
        seen,
        "`chorus tail -f` did not print slot {slot} within 10 s; stderr: {err}"
    );
    // From the head on, or from the leader's base if it compacted past the head since
    // (it compacts as its followers catch up); the slot itself stays readable unless the
    // base passed it too, and then the tail is refused by name.
    let mut from = head;
    let seqs: Vec<u64> = loop {
        match chorus_json_result(&[
            "tail",
            "-o",
            "json",
            "-g",
            &group.to_string(),
            "--from",
            &from.to_string(),
            "--endpoints",
            &eps[leader as usize - 1],
        ]) {
            Ok(p) => break p.iter().map(|v| v["seq"].as_u64().unwrap()).collect(),
            Err(e) => match compacted_below(&e) {
                Some(base) if base > from => from = base,
                _ => panic!("chorus tail: {e}"),
            },
        }
    };
    if from <= slot {
        assert_eq!(seqs.last(), Some(&slot), "from {from}: {seqs:?}");
    }
    // Below a replica's base the tail ends as the read does: OUT_OF_RANGE.
    let mut one = Client::new(vec![eps[f].clone()]);
    if let Err(chorus_client::ClientError::Status {
        code: Code::OutOfRange,
        ..
    }) = one.read_out_of_order(group, 0, 1).await
    {
        let mut s = one.tail_out_of_order(group, 0).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .expect("the tail below the base neither sent nor ended");
        assert!(
            matches!(&end, Err(st) if st.code() == Code::OutOfRange),
            "{end:?}"
        );
    }
}

async fn volume(eps: &[String], i: usize) -> Vec<u8> {
    let mut c = Client::new(eps.to_vec());
    c.read_blocks_at(i, PAR, 0, BLOCKS).await.unwrap().data
}

async fn kv(eps: &[String], i: usize) -> Vec<Option<Vec<u8>>> {
    let mut c = Client::new(eps.to_vec());
    c.get_keys_at(i, DEP, (0..KEYS).collect())
        .await
        .unwrap()
        .values
        .into_iter()
        .map(|v| v.found.then_some(v.value))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_groups_through_the_server() {
    let mut cl = cluster();
    let eps = cl.eps.clone();
    let mut c = Client::new(eps.clone());
    let end = Instant::now() + Duration::from_secs(30);
    while !c.status_all(0).await.iter().all(|(_, r)| r.is_ok()) {
        assert!(Instant::now() < end, "the nodes did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The dependent group is created over gRPC on every node; creating it again with the
    // same spec is accepted, with another mode refused.
    let create = cl.create_dep();
    c.create_group_with(create.clone()).await.unwrap();
    c.create_group_with(create.clone()).await.unwrap();
    let err = c
        .create_group_with(pb::CreateGroupRequest {
            mode: "parallel".into(),
            ..create
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("already exists (with a different spec)"),
        "{err}"
    );
    let err = c
        .create_group(DEP, vec![1, 2, 3], vec![])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("already exists as an out-of-order group"),
        "{err}"
    );
    serving(&eps, PAR, Duration::from_secs(30)).await;
    serving(&eps, DEP, Duration::from_secs(30)).await;

    // Conflicting writers: 4 × 40 block writes over 16 blocks, 4 × 40 transactions over
    // 12 keys, both groups at once.
    fn blk(w: u32, i: u32) -> pb::OutOfOrderRecord {
        block_record(((w * 7 + i * 3) as u64) % BLOCKS, w << 16 | i)
    }
    fn txn(w: u32, i: u32) -> pb::OutOfOrderRecord {
        txn_record(
            ((w + i) as u64) % KEYS,
            ((w * 5 + i * 7) as u64) % KEYS,
            w << 16 | i,
        )
    }
    let (par, dep) = tokio::join!(
        write_concurrently(&eps, PAR, 4, 40, blk),
        write_concurrently(&eps, DEP, 4, 40, txn),
    );
    let mut want_vol = vec![0u8; (BLOCKS * 4096) as usize];
    for (_, r) in &par {
        let b = r.blocks[0].start as usize * 4096;
        want_vol[b..b + 4096].copy_from_slice(&r.data);
    }
    let mut want_kv: Vec<Option<Vec<u8>>> = vec![None; KEYS as usize];
    for (_, r) in &dep {
        want_kv[r.write_set[0] as usize] = Some(r.data.clone());
    }
    let par_head = settled(&eps, PAR, par.last().unwrap().0 .0 + 1).await;
    let dep_head = settled(&eps, DEP, dep.last().unwrap().0 .0 + 1).await;
    for i in 0..3 {
        assert!(volume(&eps, i).await == want_vol, "node {} volume", i + 1);
        assert_eq!(kv(&eps, i).await, want_kv, "node {} keys", i + 1);
    }
    // The latency histograms: a leader times every append answered after replication
    // and its wait to be packed, and each peer's acknowledgements; every node its syncs
    // (summed over the nodes: a leader may have changed while they wrote).
    for (g, mode, n) in [(PAR, "parallel", par.len()), (DEP, "dependent", dep.len())] {
        let sum = |name: &str| -> u64 {
            (1..=3)
                .map(|node| metric_sum(&cl.metrics, node, name, g, mode))
                .sum()
        };
        for name in [
            "chorus_append_seconds_count",
            "chorus_append_queue_seconds_count",
        ] {
            let count = sum(name);
            assert!(count >= n as u64, "group {g}: {name} {count} < {n} appends");
        }
        let acks = sum("chorus_peer_ack_seconds_count");
        assert!(acks > 0, "group {g}: no acknowledgement timed");
        for node in 1..=3 {
            let syncs = metric_of(&cl.metrics, node, "chorus_log_fsync_seconds_count", g, mode);
            assert!(syncs > 0, "group {g}: node {node} timed no sync");
        }
    }
    // Compaction (8 KiB here) may have taken a group's whole log into its image; the
    // small transaction records leave the dependent group's tail in the log.
    let compared = log_reads_match(&eps, PAR, &par).await + log_reads_match(&eps, DEP, &dep).await;
    assert!(
        compared > 0,
        "every record compacted: the log reads compared nothing"
    );
    tails_follow(&eps, PAR, block_record(3, 0xfeed)).await;
    tails_follow(&eps, DEP, txn_record(1, 2, 0xfeed)).await;
    want_vol[3 * 4096..4 * 4096].copy_from_slice(&block_record(3, 0xfeed).data);
    want_kv[2] = Some(txn_record(1, 2, 0xfeed).data);

    // Wrong-mode and malformed requests are refused by name.
    let err = c
        .append(PAR, vec![b"x".to_vec()], 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("parallel-mode group"), "{err}");
    let err = c
        .append_out_of_order(PAR, vec![txn_record(1, 2, 0)])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("declare block ranges"), "{err}");
    let mut short = block_record(0, 0);
    short.data.truncate(100);
    let err = c
        .append_out_of_order(PAR, vec![short])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("declares 1 blocks"), "{err}");
    let err = c
        .append_out_of_order(DEP, vec![block_record(0, 0)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            chorus_client::ClientError::Status {
                code: Code::InvalidArgument,
                ..
            }
        ),
        "{err}"
    );
    let err = c
        .read_blocks_at(0, DEP, 0, 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a parallel-mode group"), "{err}");

    // Leader transfer on the dependent group: the named voter leads within a few round
    // trips and takes appends; a node outside the group is refused by name.
    let from = serving(&eps, DEP, Duration::from_secs(5)).await;
    let to = if from == 3 { 1 } else { from + 1 };
    let err = c.transfer_leader(DEP, 9).await.unwrap_err().to_string();
    assert!(err.contains("node 9 is not a voter"), "{err}");
    c.transfer_leader(DEP, to).await.unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let now = serving(&eps, DEP, Duration::from_secs(20)).await;
        if now == to {
            break;
        }
        assert!(
            Instant::now() < end,
            "group {DEP}: node {to} never led after the transfer (node {now} does)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let res = c
        .append_out_of_order(DEP, vec![txn_record(1, 2, 0xE000_0000)])
        .await
        .unwrap();
    assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
    want_kv[2] = Some(0xE000_0000u32.to_le_bytes().to_vec());

    let metric = |node: u64, name: &str, group: u64, mode: &str| -> u64 {
        metric_of(&cl.metrics, node, name, group, mode)
    };
    // Membership of the dependent group: a follower is removed, appends go on without it,
    // it is added back and catches up (every node's keys are compared below). These
    // groups have no learners, and a node without a replication address is refused.
    let leader = serving(&eps, DEP, Duration::from_secs(5)).await;
    let gone = if leader == 3 { 1 } else { 3 };
    let change = |kind: pb::ChangeKind, node: u64| pb::ChangeMembershipRequest {
        group: DEP,
        kind: kind as i32,
        node,
        ..Default::default()
    };
    let err = c
        .change_membership(change(pb::ChangeKind::AddLearner, gone))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no learners"), "{err}");
    let err = c
        .change_membership(change(pb::ChangeKind::AddVoter, 9))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node 9 is not one of the group's voters or `replicas`"),
        "{err}"
    );
    c.change_membership(change(pb::ChangeKind::Remove, gone))
        .await
        .unwrap();
    let without: Vec<u64> = (1..=3).filter(|n| *n != gone).collect();
    voters_become(&eps, DEP, &without).await;
    // A leader reports the final voters as soon as it enters the final stage, and counts
    // the change once a quorum has accepted that stage, a moment later (until then a
    // second change is refused as under way): wait, bounded, for the count.
    let changes_counted = |want: u64| {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let changes: u64 = (1..=3)
                .map(|n| metric(n, "chorus_membership_changes_total", DEP, "dependent"))
                .sum();
            if changes >= want {
                return;
            }
            assert!(Instant::now() < end, "{changes} membership changes counted");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    changes_counted(1);
    // A voter's replica cannot be deleted; the removed one can (with force: it may still
    // hold the joint stage, which names it), and is then gone from its node; deleting it
    // again is NOT_FOUND.
    let at = |n: u64| (n - 1) as usize;
    let err = c
        .delete_group(at(leader), DEP, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is one of its voters"), "{err}");
    c.delete_group(at(gone), DEP, true).await.unwrap();
    let st = c.status_all(DEP).await.remove(at(gone)).1;
    assert!(st.is_err(), "group {DEP} still at node {gone}: {st:?}");
    let err = c
        .delete_group(at(gone), DEP, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("NotFound") && err.contains("no log group 3"),
        "{err}"
    );
    for (i, key) in [(1u32, 5u64), (2, 6)] {
        let res = c
            .append_out_of_order(DEP, vec![txn_record(0, key, 0xE100_0000 | i)])
            .await
            .unwrap();
        assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
        want_kv[key as usize] = Some((0xE100_0000u32 | i).to_le_bytes().to_vec());
    }
    // Created again (empty) on that node, it learns the group's membership, is added back
    // and catches up from nothing (every node's keys are compared below).
    c.create_group_with(pb::CreateGroupRequest {
        group: DEP,
        voters: vec![1, 2, 3],
        mode: "dependent".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.change_membership(change(pb::ChangeKind::AddVoter, gone))
        .await
        .unwrap();
    voters_become(&eps, DEP, &[1, 2, 3]).await;
    // Both changes were completed by the leaders of the time, and counted there.
    changes_counted(2);
    let res = c
        .append_out_of_order(DEP, vec![txn_record(0, 7, 0xE200_0000)])
        .await
        .unwrap();
    assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
    want_kv[7] = Some(0xE200_0000u32.to_le_bytes().to_vec());

    // Kill the parallel group's leader; a new one serves; appends go on; the killed node
    // restarts, reopens both groups and catches up.
    let old = serving(&eps, PAR, Duration::from_secs(5)).await;
    // `chorus tail -f` following the group on that node (named first) goes on at another
    // replica, from where it got to, once the node is gone.
    let head = c.status_all(PAR).await[(old - 1) as usize]
        .1
        .as_ref()
        .unwrap()
        .groups
        .iter()
        .find(|g| g.group == PAR)
        .unwrap()
        .committed_seq;
    let first = eps[(old - 1) as usize].clone();
    let mut order = vec![first.clone()];
    order.extend(eps.iter().filter(|e| **e != first).cloned());
    let tail = TailF::start(PAR, head, &order.join(","));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The old node's heads when it stops: both leaders' bases must pass them, so that it
    // installs their images when it comes back.
    let mut old_heads = [0u64; 2];
    for (k, g) in [PAR, DEP].into_iter().enumerate() {
        old_heads[k] = c.status_all(g).await[(old - 1) as usize]
            .1
            .as_ref()
            .unwrap()
            .groups
            .iter()
            .find(|x| x.group == g)
            .unwrap()
            .committed_seq;
    }
    cl.nodes[(old - 1) as usize].kill9();
    let live: Vec<String> = (1..=3u64)
        .filter(|n| *n != old)
        .map(|n| eps[(n - 1) as usize].clone())
        .collect();
    let new = serving(&live, PAR, Duration::from_secs(30)).await;
    assert_ne!(new, old);
    let dep_leader = serving(&live, DEP, Duration::from_secs(30)).await;
    let mut c = Client::new(live.clone());
    let mut after = Vec::new();
    let mut last_par = 0;
    for i in 0..100u32 {
        let r = block_record(i as u64 % BLOCKS, 0xF000_0000 | i);
        let res = c.append_out_of_order(PAR, vec![r.clone()]).await.unwrap();
        assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
        assert!(res[0].seq >= par_head, "a slot reused after the new leader");
        last_par = res[0].seq;
        after.push(r);
        let t = txn_record(0, i as u64 % KEYS, 0xF000_0000 | i);
        let res = c.append_out_of_order(DEP, vec![t.clone()]).await.unwrap();
        assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
        assert!(res[0].seq >= dep_head);
        want_kv[t.write_set[0] as usize] = Some(t.data);
    }
    // The tail went on at another replica past the killed node. Checked before the
    // compactions below: a tail still behind when every live replica has compacted past
    // its position is refused (the slots are only in the images), which on a loaded
    // machine a tail process can be.
    let (seen, err) = tail.prints(last_par, Duration::from_secs(40)).await;
    assert!(
        seen,
        "`chorus tail -f` did not go on past the killed node to slot {last_par}; stderr: {err}"
    );
    assert!(err.contains("resuming from"), "{err}");
    // The strict check: with the killed node silent for more than an election timeout
    // (300 ms), removing the other live voter would leave the group without a majority,
    // and is refused by name; nothing changes.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let other = (1..=3u64).find(|n| *n != old && *n != new).unwrap();
    // Every endpoint, in node order: leader hints name nodes by id.
    let err = Client::new(eps.clone())
        .change_membership(pb::ChangeMembershipRequest {
            group: PAR,
            kind: pb::ChangeKind::Remove as i32,
            node: other,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            chorus_client::ClientError::Status {
                code: Code::FailedPrecondition,
                message,
                ..
            } if message.contains("strict check") && message.contains(&format!("without node {other}"))
        ),
        "{err}"
    );
    voters_become(&live, PAR, &[1, 2, 3]).await;
    // A transfer to the killed node is refused the same way (it would refuse appends for
    // an election timeout, then give up).
    let err = Client::new(eps.clone())
        .transfer_leader(PAR, old)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("strict check") && err.contains(&format!("node {old} has not been heard")),
        "{err}"
    );
    // Leaders compact by bytes of entries (and the key-value store by its image's size),
    // not by appends: go on until both bases have passed the old node's heads (bounded).
    let mut i = 100u32;
    while metric(new, "chorus_base_slots", PAR, "parallel") <= old_heads[0] {
        assert!(
            i < 2_000,
            "the parallel leader's base never passed slot {}",
            old_heads[0]
        );
        let r = block_record(i as u64 % BLOCKS, 0xF000_0000 | i);
        let res = c.append_out_of_order(PAR, vec![r.clone()]).await.unwrap();
        assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
        after.push(r);
        i += 1;
    }
    while metric(dep_leader, "chorus_base_slots", DEP, "dependent") <= old_heads[1] {
        assert!(
            i < 4_000,
            "the dependent leader's base never passed slot {}",
            old_heads[1]
        );
        let t = txn_record(0, i as u64 % KEYS, 0xF000_0000 | i);
        let res = c.append_out_of_order(DEP, vec![t.clone()]).await.unwrap();
        assert_eq!(res[0].outcome, pb::Outcome::Committed as i32);
        want_kv[t.write_set[0] as usize] = Some(t.data);
        i += 1;
    }
    for r in &after {
        let b = r.blocks[0].start as usize * 4096;
        want_vol[b..b + 4096].copy_from_slice(&r.data);
    }
    cl.nodes[(old - 1) as usize].start();
    settled(&eps, PAR, par_head + 100).await;
    settled(&eps, DEP, dep_head + 100).await;
    for i in 0..3 {
        assert!(volume(&eps, i).await == want_vol, "node {} volume", i + 1);
        assert_eq!(kv(&eps, i).await, want_kv, "node {} keys", i + 1);
    }
    // The leaders' metrics count their commits and compactions, per group and mode; the
    // restarted node installed both leaders' images. Under load the leadership may have
    // moved between the two live nodes during the appends, so commits are summed and the
    // packing is checked on the node that committed most.
    let commits: Vec<u64> = (1..=3)
        .map(|n| metric(n, "chorus_commits_total", PAR, "parallel"))
        .collect();
    assert!(commits.iter().sum::<u64>() >= 100, "{commits:?}");
    // The parallel group's new leader merged before it served (the NULLs it decided, if
    // any, are counted next to it).
    assert!(metric(new, "chorus_merges_total", PAR, "parallel") >= 1);
    metric(new, "chorus_merge_nulls_total", PAR, "parallel");
    // Every accepted append was packed into some group entry, never more entries than
    // appends.
    let most = (1..=3u64)
        .max_by_key(|&n| commits[(n - 1) as usize])
        .unwrap();
    let appends = metric(most, "chorus_appends_total", PAR, "parallel");
    let entries = metric(most, "chorus_group_entries_total", PAR, "parallel");
    assert!(
        (1..=appends).contains(&entries),
        "node {most}: {entries} entries for {appends} appends"
    );
    // What the commit rules held back (conflict order in the parallel group, RAW in the
    // dependent one): at most the entries that had a predecessor to commit after.
    for (g, mode) in [(PAR, "parallel"), (DEP, "dependent")] {
        for n in 1..=3 {
            let after = metric(n, "chorus_entries_admitted_after_total", g, mode);
            let held = metric(n, "chorus_entries_held_at_quorum_total", g, mode);
            assert!(held <= after, "node {n}, group {g}: {held} held of {after}");
        }
        // Hole resends are exported (on loopback, without reordering, few or none).
        metric(new, "chorus_hole_resends_total", g, mode);
        metric(new, "chorus_timed_resends_total", g, mode);
    }
    // Each group's base passed the killed node's head on the node the loops above watched
    // (the dependent group's leader need not be the parallel one's); a base moves by a
    // checkpoint there or by an image from another live node that checkpointed.
    for (g, mode, watched) in [(PAR, "parallel", new), (DEP, "dependent", dep_leader)] {
        let checkpoints: u64 = (1..=3u64)
            .filter(|&n| n != old)
            .map(|n| metric(n, "chorus_checkpoints_total", g, mode))
            .sum();
        assert!(checkpoints >= 1, "group {g}: no live node checkpointed");
        assert!(metric(watched, "chorus_base_slots", g, mode) > 0);
        assert!(metric(watched, "chorus_entries_file_bytes", g, mode) < 1 << 20);
        let installed = metric(old, "chorus_images_installed_total", g, mode);
        assert!(installed >= 1, "node {old} installed no image of group {g}");
        // No node refused an entry it was sent.
        for n in 1..=3 {
            let refused = metric(n, "chorus_entries_refused_total", g, mode);
            assert_eq!(refused, 0, "node {n} refused entries of group {g}");
        }
    }
    // `chorus status` shows both modes.
    let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["status", "-o", "json", "-g", "0", "--endpoints"])
        .arg(eps.join(","))
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let modes: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["mode"].as_str())
        .collect();
    assert_eq!(modes.iter().filter(|m| **m == "parallel").count(), 3);
    assert_eq!(modes.iter().filter(|m| **m == "dependent").count(), 3);
    // `chorus bench` against the running cluster reads each group's mode from its status
    // and appends records of that mode: random block writes, or transactions. Two
    // seconds: on a 2-core machine loaded by other test runs, a one-second run once held
    // no append that both started and ended inside it (and no error).
    let eps_arg = eps.join(",");
    for (g, mode) in [(PAR, "parallel"), (DEP, "dependent")] {
        // A group still electing (the restarted node may have called an election) would
        // leave the one-second run without a leader.
        serving(&eps, g, Duration::from_secs(30)).await;
        let gs = g.to_string();
        let v = &chorus_json(&[
            "bench",
            "--endpoints",
            &eps_arg,
            "-g",
            &gs,
            "--clients",
            "4",
            "--size",
            "100",
            "--keys",
            "1000",
            "--warmup",
            "0.5",
            "--duration",
            "2",
            "-o",
            "json",
        ])[0];
        assert_eq!(v["group_mode"], mode, "{v}");
        assert!(v["appends"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["errors"], 0, "{v}");
        // A parallel record is whole blocks; a dependent one its size.
        let size = if mode == "parallel" { 4096 } else { 100 };
        assert_eq!(v["size"], size, "{v}");
    }
    // `chorus trim` on an out-of-order group: every node checkpoints its state machine and
    // compacts its entries below the slot asked (at most what it applied), and its status
    // then shows the new base.
    for g in [PAR, DEP] {
        let gs = g.to_string();
        let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args([
                "trim",
                "--endpoints",
                &eps_arg,
                "-g",
                &gs,
                "--lsn",
                "5",
                "-o",
                "json",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(rows.len(), eps.len(), "{text}");
        for r in &rows {
            assert_eq!(r["result"], "trimmed", "{r}");
            assert!(
                r["start_lsn"].as_u64().unwrap() >= 5,
                "base below the slot asked: {r}"
            );
        }
    }
}

/// Appends eight records to `group` one at a time (each committed), waits until every
/// replica applied them, and kills a follower: the leader, the follower, the applied head
/// and the follower's directory of the group.
async fn eight_committed_then_a_follower_killed(
    cl: &mut Cluster,
    group: u64,
    record: impl Fn(u32) -> pb::OutOfOrderRecord,
) -> (u64, u64, u64, std::path::PathBuf) {
    let eps = cl.eps.clone();
    let mut c = Client::new(eps.clone());
    let leader = serving(&eps, group, Duration::from_secs(30)).await;
    let gone = if leader == 3 { 1 } else { 3 };
    for i in 0..8u32 {
        let r = c.append_out_of_order(group, vec![record(i)]).await.unwrap();
        assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    }
    let head = settled(&eps, group, 8).await;
    cl.nodes[(gone - 1) as usize].kill9();
    let dir = cl
        ._dir
        .path()
        .join(format!("n{gone}"))
        .join("groups")
        .join(format!("{group:020}"));
    (leader, gone, head, dir)
}

/// A replica whose hard state is damaged does not start, and only its group stops: the
/// node starts and serves its other groups, `Status` shows the group stopped with the
/// error (naming the file and what was wrong), and the file is left as it was (nothing
/// is "repaired" by guessing). The way back in docs/operations.md — remove the node from
/// the group, delete the group on that node, restart it (its configuration creates the
/// group again, empty), add it back — catches it up from the others, and its volume then
/// equals theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_replica_stops_only_its_group_and_is_replaced() {
    let mut cl = cluster();
    let eps = cl.eps.clone();
    let mut c = Client::new(eps.clone());
    serving(&eps, PAR, Duration::from_secs(30)).await;
    c.create_group_with(cl.create_dep()).await.unwrap();
    serving(&eps, DEP, Duration::from_secs(30)).await;
    let at = |n: u64| (n - 1) as usize;
    let (leader, gone, head, group_dir) =
        eight_committed_then_a_follower_killed(&mut cl, PAR, |i| {
            block_record(u64::from(i), 0xD000_0000 | i)
        })
        .await;
    let hard = group_dir.join("hard");
    let mut b = std::fs::read(&hard).unwrap();
    // Both copies (a slot file: one damaged copy alone is repaired from the other).
    b[40] ^= 0x10;
    b[4096 + 40] ^= 0x10;
    std::fs::write(&hard, &b).unwrap();
    // Started on it, the node serves; the damaged group is reported stopped.
    cl.nodes[at(gone)].start();
    let end = Instant::now() + Duration::from_secs(20);
    let st = loop {
        if let Ok(s) = &c.status_all(PAR).await[at(gone)].1 {
            break s.groups[0].clone();
        }
        assert!(Instant::now() < end, "node {gone} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        st.stopped.contains("damaged")
            && st.stopped.contains("checksum")
            && st.stopped.contains(&hard.display().to_string()),
        "{st:?}"
    );
    assert_eq!(st.mode, "parallel");
    assert_eq!(
        metric_of(
            &cl.metrics,
            gone,
            "chorus_group_not_started",
            PAR,
            "parallel"
        ),
        1
    );
    assert_eq!(
        std::fs::read(&hard).unwrap(),
        b,
        "the damaged file was changed"
    );
    // Its other group goes on, on this node too.
    let dep_head = c.status_all(DEP).await[at(leader)]
        .1
        .as_ref()
        .unwrap()
        .groups[0]
        .committed_seq;
    let r = c
        .append_out_of_order(DEP, vec![txn_record(1, 2, 0xD200_0000)])
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    settled(&eps, DEP, dep_head + 1).await;
    // `chorus status` says it.
    let out = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args([
            "status",
            "-g",
            &PAR.to_string(),
            "--endpoints",
            &eps[at(gone)],
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("STOPPED: not started, its replica is damaged"),
        "{text}"
    );
    // The way back: out of the membership, deleted here (force: this node is one of the
    // configured voters), the node restarted (its configuration creates the group again,
    // empty), added back.
    let change = |kind: pb::ChangeKind| pb::ChangeMembershipRequest {
        group: PAR,
        kind: kind as i32,
        node: gone,
        ..Default::default()
    };
    // Sent first to the damaged node itself: its refusal is marked as nothing done, so
    // the client goes on to the leader instead of calling the change indeterminate.
    let mut damaged_first = Client::new(
        (0..eps.len())
            .map(|k| eps[(at(gone) + k) % eps.len()].clone())
            .collect(),
    );
    damaged_first
        .change_membership(change(pb::ChangeKind::Remove))
        .await
        .unwrap();
    let without: Vec<u64> = (1..=3).filter(|n| *n != gone).collect();
    voters_become(&eps, PAR, &without).await;
    let err = c.delete_group(at(gone), PAR, false).await.unwrap_err();
    assert!(err.to_string().contains("one of its voters"), "{err}");
    c.delete_group(at(gone), PAR, true).await.unwrap();
    assert!(!group_dir.exists());
    cl.nodes[at(gone)].kill9();
    cl.nodes[at(gone)].start();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let all = c.status_all(PAR).await;
        if all[at(gone)]
            .1
            .as_ref()
            .is_ok_and(|s| s.groups.first().is_some_and(|g| g.stopped.is_empty()))
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "node {gone} did not start the group again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A change may be refused while the previous one completes; retry, bounded.
    let end = Instant::now() + Duration::from_secs(20);
    while let Err(e) = c.change_membership(change(pb::ChangeKind::AddVoter)).await {
        assert!(Instant::now() < end, "adding node {gone} back: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    voters_become(&eps, PAR, &[1, 2, 3]).await;
    let r = c
        .append_out_of_order(PAR, vec![block_record(9, 0xD100_0000)])
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    settled(&eps, PAR, head + 1).await;
    let want = volume(&eps, at(leader)).await;
    assert_eq!(volume(&eps, at(gone)).await, want, "node {gone} volume");
}

/// Synced entries that went bad on a follower's disk (a flipped bit in the first record
/// of its entries file, valid records after it) no longer stop the node: it starts, keeps
/// the file as found in `entries.damaged`, says it is recovering what it lost (status and
/// metrics) and takes no part in elections until it holds it again; it then votes as
/// before, and its keys equal the others'. (The dependent group: its small records are not
/// compacted away between appends, so the file holds several.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_entries_are_recovered_from_the_peers() {
    let mut cl = cluster();
    let eps = cl.eps.clone();
    let mut c = Client::new(eps.clone());
    serving(&eps, PAR, Duration::from_secs(30)).await;
    c.create_group_with(cl.create_dep()).await.unwrap();
    let at = |n: u64| (n - 1) as usize;
    let (_, gone, head, group_dir) = eight_committed_then_a_follower_killed(&mut cl, DEP, |i| {
        txn_record(u64::from(i), u64::from(i) + 1, 0xE000_0000 | i)
    })
    .await;
    let entries = group_dir.join("entries.log");
    let mut b = std::fs::read(&entries).unwrap();
    // The first record damaged, at least one valid one after it.
    let first_len = chorus_core::format::ooo::entry_len(&b).unwrap();
    assert!(b.len() > first_len, "one record only ({} bytes)", b.len());
    b[first_len / 2] ^= 0x08;
    std::fs::write(&entries, &b).unwrap();
    cl.nodes[at(gone)].start();
    let end = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Ok(s) = &c.status_all(DEP).await[at(gone)].1 {
            break s.groups[0].clone();
        }
        assert!(
            Instant::now() < end,
            "node {gone} did not start on damaged entries"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        std::fs::read(group_dir.join("entries.damaged")).unwrap(),
        b,
        "the file as found is kept"
    );
    let metric = |name: &str| metric_of(&cl.metrics, gone, name, DEP, "dependent");
    assert_eq!(metric("chorus_damaged_at_start"), 1);
    // It recovers without help: a leader elected after the loss, every slot below its
    // merge start committed here.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let all = c.status_all(DEP).await;
        let g = all[at(gone)].1.as_ref().map(|s| s.groups[0].clone());
        if g.as_ref()
            .is_ok_and(|g| !g.recovering_lost && g.applied_seq >= head)
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "node {gone} still recovering: {g:?} (first status {first:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric("chorus_recovering_lost"), 0);
    let r = c
        .append_out_of_order(DEP, vec![txn_record(1, 9, 0xE100_0000)])
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    settled(&eps, DEP, head + 1).await;
    let now_leader = serving(&eps, DEP, Duration::from_secs(30)).await;
    let want = kv(&eps, at(now_leader)).await;
    assert_eq!(kv(&eps, at(gone)).await, want, "node {gone} keys");
}

/// A follower whose out-of-order storage fails while it runs (its group directory is gone
/// when the store next replaces a file: the compaction every 8 KiB, as a write fails on a
/// full disk) stops that group on that node: `Status` says why, the gauge
/// `chorus_group_stopped` is 1, and a client whose first endpoint is that node is
/// told the append was not taken and goes on, so it commits instead of ending unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_storage_failed_sends_clients_on() {
    let mut cl = cluster();
    let eps = cl.eps.clone();
    let at = |n: u64| (n - 1) as usize;
    let leader = serving(&eps, PAR, Duration::from_secs(30)).await;
    let f = if leader == 3 { 1 } else { 3 };
    let dir = cl
        ._dir
        .path()
        .join(format!("n{f}"))
        .join("groups")
        .join(format!("{PAR:020}"));
    // The directory goes away (its open files stay writable) and comes back later.
    let away = cl._dir.path().join(format!("n{f}-ooo-away"));
    std::fs::rename(&dir, &away).unwrap();
    let mut c = Client::new(eps.clone());
    let mut fc = Client::new(vec![eps[at(f)].clone()]);
    let end = Instant::now() + Duration::from_secs(30);
    let mut stopped = String::new();
    for i in 0..400u32 {
        let r = c
            .append_out_of_order(
                PAR,
                vec![block_record(u64::from(i) % BLOCKS, 0xE000_0000 | i)],
            )
            .await
            .unwrap();
        assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
        if let Ok(s) = &fc.status_all(PAR).await[0].1 {
            stopped = s.groups[0].stopped.clone();
        }
        if !stopped.is_empty() || Instant::now() > end {
            break;
        }
    }
    assert!(
        stopped.contains("stopped: storage") && stopped.contains(&dir.display().to_string()),
        "node {f} did not stop on its storage: {stopped:?}"
    );
    assert_eq!(
        metric_of(&cl.metrics, f, "chorus_group_stopped", PAR, "parallel"),
        1
    );
    let mut order = vec![eps[at(f)].clone()];
    order.extend(eps.iter().filter(|e| **e != eps[at(f)]).cloned());
    let mut c = Client::new(order);
    let r = c
        .append_out_of_order(PAR, vec![block_record(1, 0xE100_0000)])
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    let err = fc
        .append_out_of_order(PAR, vec![block_record(2, 0xE200_0000)])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not taken"), "{err}");

    // The cause fixed, `RestartGroup` starts the replica again on that node: it recovers
    // its store and applies the same blocks as the others.
    std::fs::rename(&away, &dir).unwrap();
    fc.restart_group(0, PAR).await.unwrap();
    let text = metrics_text(&cl.metrics, f);
    assert!(
        text.contains(&format!(
            "chorus_group_stopped{{node=\"{f}\",group=\"{PAR}\",mode=\"parallel\"}} 0"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("chorus_group_restarts_total{{node=\"{f}\"}} 1")),
        "{text}"
    );
    let r = c
        .append_out_of_order(PAR, vec![block_record(3, 0xE300_0000)])
        .await
        .unwrap();
    assert_eq!(r[0].outcome, pb::Outcome::Committed as i32);
    settled(&eps, PAR, r[0].seq + 1).await;
    let want = volume(&eps, at(leader)).await;
    assert_eq!(volume(&eps, at(f)).await, want, "node {f}'s volume");
    // Running again: a second restart is refused by name.
    let err = fc.restart_group(0, PAR).await.unwrap_err();
    assert!(
        matches!(
            &err,
            chorus_client::ClientError::Status {
                code: tonic::Code::FailedPrecondition,
                ..
            }
        ),
        "{err}"
    );
    for n in &mut cl.nodes {
        n.kill9();
    }
}
