//! Dependent transactions (DP-Raft): the workload and its checker.
//!
//! Writers append transactions to a dependent group through the Rust client. Each reads
//! up to two keys and writes one or two of a small key space (so that most transactions
//! conflict with a recent one), and sets every key it writes to its value, unique in the
//! run (the demo key-value store's rule). Readers read keys at a node chosen at random,
//! as that replica has applied them, with its first unapplied slot.
//!
//! After the faults heal, a barrier transaction must commit; then every replica must
//! have committed and applied past it. The checker ([`check`]) reads every replica's
//! committed entries and key-value state, and judges:
//! - every replica holds the same committed entries (one order of transactions);
//! - every transaction reported committed is there once, at its slot and index, with its
//!   keys; none reported failed is; nothing is there that nobody appended;
//! - serial equivalence: every replica's state is what applying the committed entries
//!   one by one, in (slot, index) order, gives;
//! - of two conflicting transactions (one writes a key the other reads or writes), one
//!   that completed before the other was invoked is ordered first (strict
//!   serializability);
//! - every read saw, for each key, the last write ordered before the replica's applied
//!   slot, or a later one: never a value that did not commit, never an older one.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};

use crate::blocks::placement;
use crate::history::{Entry, History, Op, Placement};
use crate::ordered::{client, Stats, Verdict, GROUP};
use crate::Rng;

/// Keys the transactions use (from key 0).
pub const KEYS: u64 = 24;
/// The key the final barrier writes.
const BARRIER_KEY: u64 = KEYS;
/// The process the barrier is recorded under.
const FINAL: u64 = u64::MAX;

/// The `[[groups]]` fragment of a node's configuration for this workload.
pub fn groups_toml(nodes: usize) -> String {
    let voters: Vec<String> = (1..=nodes).map(|i| i.to_string()).collect();
    format!(
        "[[groups]]\nid = {GROUP}\nvoters = [{}]\nmode = \"dependent\"\n",
        voters.join(", ")
    )
}

/// `n` distinct keys below `KEYS`, sorted.
fn keys(rng: &mut Rng, n: u64) -> Vec<u64> {
    let mut s = BTreeSet::new();
    while (s.len() as u64) < n {
        s.insert(rng.range(0, KEYS));
    }
    s.into_iter().collect()
}

async fn append(c: &mut Client, reads: &[u64], writes: &[u64], value: u64) -> Placement {
    let rec = pb::OutOfOrderRecord {
        data: value.to_le_bytes().to_vec(),
        blocks: Vec::new(),
        read_set: reads.to_vec(),
        write_set: writes.to_vec(),
    };
    placement(c.append_out_of_order(GROUP, vec![rec]).await)
}

/// One writer: appends transactions until `stop`. `process` seeds its choices; its
/// values are `(process % 1000) << 40 | n`.
pub async fn writer(process: u64, eps: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(process);
    let mut c = client(eps, Duration::from_secs(5), Duration::from_secs(3));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let value = ((process % 1000) << 40) | n;
        let nr = rng.range(0, 3);
        let reads = keys(&mut rng, nr);
        let nw = rng.range(1, 3);
        let writes = keys(&mut rng, nw);
        let t0 = hist.now_us();
        let outcome = append(&mut c, &reads, &writes, value).await;
        let settled = matches!(outcome, Placement::Committed { .. });
        hist.record(
            process,
            t0,
            Op::Txn {
                reads,
                writes,
                value,
                outcome,
            },
        );
        if !settled {
            tokio::time::sleep(Duration::from_millis(rng.range(10, 50))).await;
        }
    }
}

/// A key's value as the store returns it: 0 if not found.
fn value_of(kv: &pb::KeyValue) -> Result<u64, String> {
    if !kv.found {
        return Ok(0);
    }
    let b: [u8; 8] = kv.value.as_slice().try_into().map_err(|_| {
        format!(
            "key {} holds {} bytes, not a transaction's 8",
            kv.key,
            kv.value.len()
        )
    })?;
    Ok(u64::from_le_bytes(b))
}

async fn get(c: &mut Client, keys: Vec<u64>) -> Result<(Vec<u64>, u64), String> {
    let r = c
        .get_keys_at(0, GROUP, keys)
        .await
        .map_err(|e| e.to_string())?;
    let values = r.values.iter().map(value_of).collect::<Result<_, _>>()?;
    Ok((values, r.applied_seq))
}

/// One reader: reads one to four keys at a node chosen at random until `stop`. Only
/// reads that returned are recorded.
pub async fn reader(process: u64, eps: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(process);
    let mut clients: Vec<Client> = eps
        .iter()
        .map(|e| {
            client(
                vec![e.clone()],
                Duration::from_secs(2),
                Duration::from_secs(1),
            )
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let node = rng.range(0, clients.len() as u64) as usize;
        let n = rng.range(1, 5);
        let keys = keys(&mut rng, n);
        let t0 = hist.now_us();
        match get(&mut clients[node], keys.clone()).await {
            Ok((values, applied)) => hist.record(
                process,
                t0,
                Op::KeyRead {
                    node: node + 1,
                    keys,
                    values,
                    applied,
                },
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A committed record, as a replica's entries hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// Its slot.
    pub seq: u64,
    /// Its index in the slot's entry.
    pub index: u32,
    /// Its value.
    pub value: u64,
    /// The keys it declared it read.
    pub reads: Vec<u64>,
    /// The keys it wrote.
    pub writes: Vec<u64>,
}

/// A replica, read after the faults healed.
#[derive(Clone, Debug)]
pub struct Final {
    /// The node.
    pub node: usize,
    /// Its committed records, in (slot, index) order.
    pub records: Vec<Committed>,
    /// Its state: each key's value, keys 0 to `KEYS` (the barrier's) inclusive.
    pub state: Vec<u64>,
}

/// Node `ep`'s committed records and the first slot it does not know committed.
async fn read_entries(c: &mut Client) -> Result<(Vec<Committed>, u64), String> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let r = c
            .read_out_of_order(GROUP, from, 5_000)
            .await
            .map_err(|e| format!("at slot {from}: {e}"))?;
        for e in &r.entries {
            for (i, rec) in e.records.iter().enumerate() {
                let b: [u8; 8] = rec.data.as_slice().try_into().map_err(|_| {
                    format!("slot {} record {i} holds {} bytes", e.seq, rec.data.len())
                })?;
                out.push(Committed {
                    seq: e.seq,
                    index: i as u32,
                    value: u64::from_le_bytes(b),
                    reads: rec.read_set.clone(),
                    writes: rec.write_set.clone(),
                });
            }
        }
        if r.entries.is_empty() || r.next_seq >= r.committed_seq {
            return Ok((out, r.committed_seq));
        }
        from = r.next_seq;
    }
}

/// After every fault healed: a barrier transaction that must commit, then every replica
/// read once it has committed and applied past it. Returns the replicas and the run's
/// own findings.
pub async fn settle(
    eps: &[String],
    hist: &History,
    deadline: Duration,
) -> (Vec<Final>, Vec<String>) {
    let mut found = Vec::new();
    let mut c = client(eps.to_vec(), Duration::from_secs(5), Duration::from_secs(3));
    let end = Instant::now() + deadline;
    let mut n = 0;
    let mut last = String::new();
    let barrier = loop {
        n += 1;
        let t0 = hist.now_us();
        let value = (999 << 40) | n;
        let outcome = append(&mut c, &[], &[BARRIER_KEY], value).await;
        let seq = match &outcome {
            Placement::Committed { seq, .. } => Some(*seq),
            Placement::Failed { why } | Placement::Unknown { why } => {
                last = why.clone();
                None
            }
        };
        hist.record(
            FINAL,
            t0,
            Op::Txn {
                reads: Vec::new(),
                writes: vec![BARRIER_KEY],
                value,
                outcome,
            },
        );
        if seq.is_some() || Instant::now() >= end {
            break seq;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if barrier.is_none() {
        found.push(format!(
            "no transaction committed within {deadline:?} after every fault healed (last: {last}) [{}]",
            crate::blocks::group_states(eps, GROUP).await
        ));
    }
    let past = barrier.map_or(0, |s| s + 1);
    let mut finals = Vec::new();
    for (i, ep) in eps.iter().enumerate() {
        let mut c = client(
            vec![ep.clone()],
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        let until = Instant::now() + Duration::from_secs(60);
        let mut why;
        let mut last = None;
        loop {
            match read_entries(&mut c).await {
                Ok((records, committed)) if committed >= past => {
                    match get(&mut c, (0..=KEYS).collect()).await {
                        Ok((state, applied)) if applied >= past => {
                            last = Some(Final {
                                node: i + 1,
                                records,
                                state,
                            });
                            break;
                        }
                        Ok((state, applied)) => {
                            why = format!("it has applied up to slot {applied}, not {past}");
                            last = Some(Final {
                                node: i + 1,
                                records,
                                state,
                            });
                        }
                        Err(e) => why = format!("reading its keys failed: {e}"),
                    }
                }
                Ok((records, committed)) => {
                    why = format!(
                        "it knows slots below {committed} committed, not the barrier's ({past})"
                    );
                    last = Some(Final {
                        node: i + 1,
                        records,
                        state: Vec::new(),
                    });
                }
                Err(e) => why = format!("reading its entries failed: {e}"),
            }
            if Instant::now() >= until {
                found.push(format!(
                    "node {} did not apply the barrier within 60 s: {why}",
                    i + 1
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        finals.extend(last);
    }
    (finals, found)
}

/// Judges `history` against the replicas `finals` (see the module docs).
pub fn check(history: &[Entry], finals: &[Final]) -> Verdict {
    let mut st = Stats::default();
    let nodes: Vec<(usize, &[Committed])> =
        finals.iter().map(|f| (f.node, &f.records[..])).collect();
    let (reference, mut bad) =
        crate::history::compare_nodes(&nodes, |r: &Committed| format!("slot {}", r.seq));
    st.log_records = reference.len() as u64;
    let mut at: HashMap<u64, &Committed> = HashMap::new();
    for r in &reference {
        if let Some(o) = at.insert(r.value, r) {
            bad.push(format!(
                "transaction {:#x} committed twice: slot {} index {} and slot {} index {}",
                r.value, o.seq, o.index, r.seq, r.index
            ));
        }
    }
    // Outcomes against the entries.
    let mut invoked = HashMap::new();
    // (invoke, complete, place, reads, writes) of transactions reported committed.
    type Acked<'a> = (u64, u64, (u64, u32), &'a [u64], &'a [u64]);
    let mut acked: Vec<Acked> = Vec::new();
    let mut acked_times = Vec::new();
    for e in history {
        match &e.op {
            Op::Txn {
                reads,
                writes,
                value,
                outcome,
            } => {
                st.appends += 1;
                st.records += 1;
                invoked.insert(*value, ());
                let found = at.get(value);
                match (outcome, found) {
                    (Placement::Committed { seq, index }, Some(r)) => {
                        st.committed += 1;
                        if (r.seq, r.index) != (*seq, *index) || r.writes != *writes {
                            bad.push(format!(
                                "transaction {value:#x} was reported committed at slot {seq} index {index} writing {writes:?}, but is at slot {} index {} writing {:?}",
                                r.seq, r.index, r.writes
                            ));
                        }
                        acked.push((e.invoke_us, e.complete_us, (*seq, *index), reads, writes));
                        acked_times.push((e.complete_us, e.invoke_us));
                    }
                    (Placement::Committed { seq, .. }, None) => {
                        st.committed += 1;
                        bad.push(format!(
                            "acknowledged transaction {value:#x} (committed at slot {seq}, process {}, completed at {} µs) is lost",
                            e.process, e.complete_us
                        ));
                    }
                    (Placement::Failed { why }, Some(r)) => {
                        st.failed += 1;
                        bad.push(format!(
                            "transaction {value:#x} was reported failed ({why}) but committed at slot {}",
                            r.seq
                        ));
                    }
                    (Placement::Failed { .. }, None) => st.failed += 1,
                    (Placement::Unknown { .. }, f) => {
                        st.unknown += 1;
                        st.unknown_found += u64::from(f.is_some());
                    }
                }
            }
            Op::Nemesis { heal: false, .. } => st.faults += 1,
            _ => {}
        }
    }
    for r in &reference {
        if !invoked.contains_key(&r.value) {
            bad.push(format!(
                "transaction {:#x} at slot {} was never appended by anyone",
                r.value, r.seq
            ));
        }
    }
    // Serial equivalence: the committed records applied one by one, in order.
    let mut want = vec![0u64; KEYS as usize + 1];
    for r in &reference {
        for k in &r.writes {
            if let Some(s) = want.get_mut(*k as usize) {
                *s = r.value;
            }
        }
    }
    for f in finals.iter().filter(|f| !f.state.is_empty()) {
        for (k, (got, w)) in f.state.iter().zip(&want).enumerate() {
            if got != w {
                bad.push(format!(
                    "node {}'s key {k} holds {got:#x}, where applying the committed transactions in order gives {w:#x}",
                    f.node
                ));
            }
        }
    }
    // Strict serializability of conflicting transactions. Per key, the transactions that
    // touch it and those that write it, by completion time, each with the greatest place
    // among those completed so far: a transaction must be placed after the greatest of
    // those it conflicts with (every toucher of a key it writes, every writer of a key it
    // reads) that completed before it was invoked.
    acked.sort_by_key(|a| a.1);
    // key -> (completions, running max place) for touchers and for writers.
    type Prefix = (Vec<u64>, Vec<(u64, u32)>);
    let mut touch: HashMap<u64, Prefix> = HashMap::new();
    let mut wrote: HashMap<u64, Prefix> = HashMap::new();
    let push = |m: &mut HashMap<u64, Prefix>, k: u64, at: u64, place: (u64, u32)| {
        let e = m.entry(k).or_default();
        let max = e.1.last().map_or(place, |m| (*m).max(place));
        if e.0.last() == Some(&at) {
            *e.1.last_mut().expect("same length") = max;
        } else {
            e.0.push(at);
            e.1.push(max);
        }
    };
    for a in &acked {
        let keys: BTreeSet<u64> = a.3.iter().chain(a.4.iter()).copied().collect();
        for k in keys {
            push(&mut touch, k, a.1, a.2);
        }
        for k in a.4 {
            push(&mut wrote, *k, a.1, a.2);
        }
    }
    let before = |m: &HashMap<u64, Prefix>, k: u64, inv: u64| {
        m.get(&k).and_then(|(at, max)| {
            let n = at.partition_point(|c| *c < inv);
            (n > 0).then(|| max[n - 1])
        })
    };
    let mut reported = 0;
    for &(inv, _, place, reads, writes) in &acked {
        let latest = writes
            .iter()
            .filter_map(|k| before(&touch, *k, inv))
            .chain(reads.iter().filter_map(|k| before(&wrote, *k, inv)))
            .max();
        if let Some(l) = latest {
            if l > place && reported < 100 {
                reported += 1;
                bad.push(format!(
                    "a transaction at slot {} index {} completed before a conflicting one was invoked, yet is ordered after it (slot {} index {})",
                    l.0, l.1, place.0, place.1
                ));
            }
        }
    }
    // Reads: for each key, the last write ordered before the replica's applied slot, or
    // a later one.
    let mut writers: HashMap<u64, Vec<(u64, u32, u64)>> = HashMap::new();
    for r in &reference {
        for k in &r.writes {
            writers
                .entry(*k)
                .or_default()
                .push((r.seq, r.index, r.value));
        }
    }
    for e in history {
        let Op::KeyRead {
            node,
            keys,
            values,
            applied,
        } = &e.op
        else {
            continue;
        };
        st.reads += 1;
        st.read_records += keys.len() as u64;
        for (k, v) in keys.iter().zip(values) {
            let ws = writers.get(k).map_or(&[][..], Vec::as_slice);
            let required = ws.iter().rposition(|w| w.0 < *applied);
            let got = if *v == 0 {
                None
            } else {
                match ws.iter().position(|w| w.2 == *v) {
                    Some(i) => Some(i),
                    None => {
                        bad.push(format!(
                            "a read at node {node} found key {k} = {v:#x}, which no committed transaction wrote"
                        ));
                        continue;
                    }
                }
            };
            if required > got {
                bad.push(format!(
                    "a read at node {node} (applied below slot {applied}) found key {k} = {v:#x}, older than slot {}'s write",
                    ws[required.expect("greater than something")].0
                ));
            }
        }
    }
    let u = crate::history::longest_unavailable(history, &acked_times);
    (st.longest_unavailable_ms, st.longest_unavailable_after) = (u.ms, u.after);
    st.longest_unavailable_alone_ms = u.alone_ms;
    Verdict {
        anomalies: bad,
        stats: st,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(p: u64, t: (u64, u64), r: &[u64], w: &[u64], v: u64, o: Placement) -> Entry {
        Entry {
            process: p,
            invoke_us: t.0,
            complete_us: t.1,
            op: Op::Txn {
                reads: r.to_vec(),
                writes: w.to_vec(),
                value: v,
                outcome: o,
            },
        }
    }

    fn rec(seq: u64, r: &[u64], w: &[u64], v: u64) -> Committed {
        Committed {
            seq,
            index: 0,
            value: v,
            reads: r.to_vec(),
            writes: w.to_vec(),
        }
    }

    fn done(seq: u64) -> Placement {
        Placement::Committed { seq, index: 0 }
    }

    fn state(pairs: &[(u64, u64)]) -> Vec<u64> {
        let mut s = vec![0; KEYS as usize + 1];
        for (k, v) in pairs {
            s[*k as usize] = *v;
        }
        s
    }

    fn read(node: usize, keys: &[u64], values: &[u64], applied: u64) -> Entry {
        Entry {
            process: 9,
            invoke_us: 50,
            complete_us: 51,
            op: Op::KeyRead {
                node,
                keys: keys.to_vec(),
                values: values.to_vec(),
                applied,
            },
        }
    }

    fn good() -> (Vec<Entry>, Vec<Committed>) {
        let h = vec![
            txn(1, (0, 10), &[], &[1], 11, done(0)),
            txn(2, (11, 20), &[1], &[2], 12, done(1)),
            txn(1, (12, 30), &[], &[1, 3], 13, done(2)),
            txn(
                2,
                (21, 40),
                &[],
                &[4],
                14,
                Placement::Failed { why: "x".into() },
            ),
            txn(
                3,
                (22, 60),
                &[],
                &[5],
                15,
                Placement::Unknown { why: "y".into() },
            ),
            read(2, &[1, 2], &[11, 12], 2),
            read(3, &[1, 3], &[13, 13], 2),
        ];
        let log = vec![
            rec(0, &[], &[1], 11),
            rec(1, &[1], &[2], 12),
            rec(2, &[], &[1, 3], 13),
        ];
        (h, log)
    }

    fn finals(log: &[Committed], st: Vec<u64>) -> Vec<Final> {
        (1..=3)
            .map(|node| Final {
                node,
                records: log.to_vec(),
                state: st.clone(),
            })
            .collect()
    }

    #[test]
    fn a_serial_history_passes() {
        let (h, log) = good();
        let v = check(&h, &finals(&log, state(&[(1, 13), (2, 12), (3, 13)])));
        assert!(v.anomalies.is_empty(), "{:?}", v.anomalies);
        assert_eq!(v.stats.committed, 3);
        assert_eq!(v.stats.failed, 1);
        assert_eq!(v.stats.unknown, 1);
    }

    #[test]
    fn lost_failed_diverged_reordered_and_stale_reads_are_caught() {
        let (h, log) = good();
        let st = state(&[(1, 13), (2, 12), (3, 13)]);
        // Lost: the log lacks slot 2.
        let v = check(&h, &finals(&log[..2], state(&[(1, 11), (2, 12)])));
        assert!(v.anomalies.iter().any(|a| a.contains("is lost")), "{v:?}");
        // A failed transaction present.
        let mut with_failed = log.clone();
        with_failed.push(rec(3, &[], &[4], 14));
        let v = check(
            &h,
            &finals(&with_failed, state(&[(1, 13), (2, 12), (3, 13), (4, 14)])),
        );
        assert!(
            v.anomalies.iter().any(|a| a.contains("reported failed")),
            "{v:?}"
        );
        // A replica's state that no serial order gives.
        let mut f = finals(&log, st.clone());
        f[2].state[3] = 11;
        let v = check(&h, &f);
        assert!(
            v.anomalies.iter().any(|a| a.contains("node 3's key 3")),
            "{v:?}"
        );
        // Real-time order broken: the first transaction (completed at 10) ordered after
        // the second (invoked at 11), which reads its key.
        let mut h2 = h.clone();
        h2[0] = txn(1, (0, 10), &[], &[1], 11, done(1));
        h2[1] = txn(2, (11, 20), &[1], &[2], 12, done(0));
        let log2 = vec![
            rec(0, &[1], &[2], 12),
            rec(1, &[], &[1], 11),
            rec(2, &[], &[1, 3], 13),
        ];
        let v = check(&h2, &finals(&log2, st.clone()));
        assert!(
            v.anomalies.iter().any(|a| a.contains("ordered after")),
            "{v:?}"
        );
        // A stale read: applied below slot 3, key 1 read as slot 0's value.
        let mut h3 = h.clone();
        h3.push(read(1, &[1], &[11], 3));
        let v = check(&h3, &finals(&log, st.clone()));
        assert!(
            v.anomalies.iter().any(|a| a.contains("older than")),
            "{v:?}"
        );
        // Replicas that disagree.
        let mut f = finals(&log, st);
        f[1].records[1].value = 99;
        let v = check(&h, &f);
        assert!(v.anomalies.iter().any(|a| a.contains("disagree")), "{v:?}");
    }
}
