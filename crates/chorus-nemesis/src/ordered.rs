//! Ordered appends: the workload and its checker.
//!
//! Writers append small batches of unique text records to ordered group 1 through the
//! Rust client, each recording what it was told of every record: committed at an LSN and
//! CSN, failed (or refused before it was appended), or unknown. Readers tail the log
//! from LSN 0, each hopping between nodes at random, and record what every read returned.
//!
//! After the faults heal, the checker reads every node's whole log and judges the
//! history ([`check`]):
//! - every node holds the same log, record for record (one order, nothing missing);
//! - every record reported committed is in it once, at its LSN and CSN;
//! - no record reported failed is in it, and nothing is in it that nobody appended;
//! - an append that completed before another was invoked has the lower LSNs (the log
//!   is linearizable), and CSNs never decrease along the log;
//! - what each reader saw, in order, is a prefix of that log (committed reads are final
//!   and monotonic, whichever nodes served them).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chorus_client::{pb, Client, ClientError};
use serde::Serialize;

use crate::history::{Entry, History, Op, Outcome, Seen};
use crate::Rng;

/// The ordered group the workload uses.
pub const GROUP: u64 = 1;

/// The `[[groups]]` fragment of a node's configuration for this workload.
pub fn groups_toml(nodes: usize) -> String {
    let voters: Vec<String> = (1..=nodes).map(|i| i.to_string()).collect();
    format!(
        "[[groups]]\nid = {GROUP}\nvoters = [{}]\n",
        voters.join(", ")
    )
}

pub(crate) fn client(eps: Vec<String>, call: Duration, leader: Duration) -> Client {
    let mut c = Client::new(eps);
    c.call_timeout = call;
    c.leader_timeout = leader;
    c
}

/// One writer: appends batches of 1–3 records until `stop`.
pub async fn writer(process: u64, eps: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(process);
    let mut c = client(eps, Duration::from_secs(5), Duration::from_secs(3));
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let n = rng.range(1, 4);
        let values: Vec<String> = (0..n)
            .map(|_| {
                seq += 1;
                format!("w{process}-{seq}")
            })
            .collect();
        let t0 = hist.now_us();
        let r = c
            .append(
                GROUP,
                values.iter().map(|v| v.as_bytes().to_vec()).collect(),
                0,
            )
            .await;
        let outcomes = outcomes(values.len(), r);
        let settled = outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Committed { .. }));
        hist.record(process, t0, Op::Append { values, outcomes });
        if !settled {
            // As a client would: a moment before trying again.
            tokio::time::sleep(Duration::from_millis(rng.range(10, 50))).await;
        }
    }
}

/// What each record of an append call came to.
pub fn outcomes(n: usize, r: Result<Vec<pb::AppendResult>, ClientError>) -> Vec<Outcome> {
    match r {
        Ok(results) => (0..n)
            .map(|i| match results.get(i) {
                None => Outcome::Failed {
                    why: "refused: an earlier record of the call was refused".into(),
                },
                Some(r) if !r.unknown.is_empty() => Outcome::Unknown {
                    why: r.unknown.clone(),
                },
                Some(r) if r.outcome == pb::Outcome::Committed as i32 => Outcome::Committed {
                    lsn: r.lsn,
                    csn: r.csn,
                },
                Some(r) if r.outcome == pb::Outcome::Failed as i32 => Outcome::Failed {
                    why: format!("reported failed at LSN {}", r.lsn),
                },
                Some(r) => Outcome::Unknown {
                    why: format!("outcome {} with no reason", r.outcome),
                },
            })
            .collect(),
        Err(e @ ClientError::Indeterminate { .. }) => {
            vec![Outcome::Unknown { why: e.to_string() }; n]
        }
        // Refused whole: not appended (NoLeader means every node refused it).
        Err(e) => vec![Outcome::Failed { why: e.to_string() }; n],
    }
}

/// One reader: tails the log from LSN 0, each read at a node chosen at random.
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
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let node = rng.range(0, clients.len() as u64) as usize;
        let t0 = hist.now_us();
        let r = clients[node].read(GROUP, next, 500).await;
        let op = match r {
            Ok(r) => {
                let records = seen(&r.records);
                let from = next;
                if !records.is_empty() {
                    next = r.next_lsn;
                }
                Op::Read {
                    node: node + 1,
                    from,
                    records,
                    next,
                    error: None,
                }
            }
            Err(e) => Op::Read {
                node: node + 1,
                from: next,
                records: vec![],
                next,
                error: Some(e.to_string()),
            },
        };
        hist.record(process, t0, op);
        tokio::time::sleep(Duration::from_millis(rng.range(20, 200))).await;
    }
}

fn seen(records: &[pb::Record]) -> Vec<Seen> {
    records
        .iter()
        .map(|r| Seen {
            lsn: r.lsn,
            csn: r.csn,
            value: String::from_utf8_lossy(&r.data).into_owned(),
        })
        .collect()
}

/// Node `ep`'s whole committed log.
pub async fn read_log(ep: &str) -> Result<Vec<Seen>, String> {
    let mut c = client(
        vec![ep.to_string()],
        Duration::from_secs(10),
        Duration::from_secs(2),
    );
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let r = c
            .read(GROUP, from, 5_000)
            .await
            .map_err(|e| format!("at LSN {from}, after {} records: {e}", out.len()))?;
        if r.records.is_empty() {
            return Ok(out);
        }
        from = r.next_lsn;
        out.extend(seen(&r.records));
    }
}

/// Appends `value` until it is reported committed (after the faults heal: everything
/// before it is then committed too). Returns its LSN, or the last error at `deadline`.
pub async fn barrier(
    eps: Vec<String>,
    value: &str,
    hist: &History,
    deadline: Duration,
) -> Result<u64, String> {
    let mut c = client(eps, Duration::from_secs(5), Duration::from_secs(3));
    let end = tokio::time::Instant::now() + deadline;
    let mut last = String::new();
    let mut attempt = 0;
    while tokio::time::Instant::now() < end {
        attempt += 1;
        let v = format!("{value}-{attempt}");
        let t0 = hist.now_us();
        let r = c.append(GROUP, vec![v.as_bytes().to_vec()], 0).await;
        let outcomes = outcomes(1, r);
        hist.record(
            u64::MAX,
            t0,
            Op::Append {
                values: vec![v],
                outcomes: outcomes.clone(),
            },
        );
        match &outcomes[0] {
            Outcome::Committed { lsn, .. } => return Ok(*lsn),
            Outcome::Failed { why } | Outcome::Unknown { why } => last = why.clone(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

/// What a run did, for the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Append calls.
    pub appends: u64,
    /// Records appended (all outcomes).
    pub records: u64,
    /// Records reported committed.
    pub committed: u64,
    /// Records reported failed or refused.
    pub failed: u64,
    /// Records whose outcome was unknown.
    pub unknown: u64,
    /// Of those, found in the log.
    pub unknown_found: u64,
    /// Reads that returned.
    pub reads: u64,
    /// Records those reads returned.
    pub read_records: u64,
    /// Faults injected.
    pub faults: u64,
    /// Records in the final log.
    pub log_records: u64,
    /// The longest time from a heal to the first commit of an append invoked after it.
    pub longest_unavailable_ms: u64,
    /// Where that was: the heal it followed, when, and the faults injected meanwhile.
    pub longest_unavailable_after: String,
    /// The longest time from a heal to the first commit of an append invoked after it,
    /// over the heals after which no other fault came first: what a heal alone cost.
    pub longest_unavailable_alone_ms: u64,
    /// Messages and appends the nodes' out-of-order groups shed because their inbox
    /// was full (`chorus_inbox_overflows_total`, summed over the nodes at the end).
    pub inbox_overflows: u64,
}

/// A node's whole log, read after the faults healed.
#[derive(Clone, Debug)]
pub struct Final {
    /// The node.
    pub node: usize,
    /// Its committed records, in LSN order.
    pub records: Vec<Seen>,
}

/// The checker's judgement.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdict {
    /// Every anomaly found (empty: the history is valid).
    pub anomalies: Vec<String>,
    /// What the run did.
    pub stats: Stats,
}

/// Judges `history` against the logs `finals` the nodes hold afterwards (see the module
/// docs for what is checked).
pub fn check(history: &[Entry], finals: &[Final]) -> Verdict {
    let mut st = Stats::default();
    // One log on every node.
    let nodes: Vec<(usize, &[Seen])> = finals.iter().map(|f| (f.node, &f.records[..])).collect();
    let (reference, mut bad) =
        crate::history::compare_nodes(&nodes, |r: &Seen| format!("LSN {}", r.lsn));
    st.log_records = reference.len() as u64;
    let mut at: HashMap<&str, (usize, &Seen)> = HashMap::new();
    for (i, r) in reference.iter().enumerate() {
        if let Some((j, _)) = at.insert(r.value.as_str(), (i, r)) {
            bad.push(format!(
                "record {:?} is in the log twice: at LSN {} and at LSN {}",
                r.value, reference[j].lsn, r.lsn
            ));
        }
        if i > 0 {
            let p = &reference[i - 1];
            if r.lsn <= p.lsn || r.csn < p.csn {
                bad.push(format!(
                    "the log goes backwards at record {i}: LSN {} CSN {} after LSN {} CSN {}",
                    r.lsn, r.csn, p.lsn, p.csn
                ));
            }
        }
    }
    // Every append's outcomes.
    let mut invoked: HashMap<&str, ()> = HashMap::new();
    // (complete, invoke, first LSN, last LSN) of appends reported committed.
    let mut acked: Vec<(u64, u64, u64, u64)> = Vec::new();
    for e in history {
        match &e.op {
            Op::Append { values, outcomes } => {
                st.appends += 1;
                let mut lsns = Vec::new();
                for (v, o) in values.iter().zip(outcomes) {
                    st.records += 1;
                    invoked.insert(v.as_str(), ());
                    let found = at.get(v.as_str()).map(|(_, r)| *r);
                    match (o, found) {
                        (Outcome::Committed { lsn, csn }, Some(r)) => {
                            st.committed += 1;
                            if r.lsn != *lsn || r.csn != *csn {
                                bad.push(format!(
                                    "record {v:?} was reported committed at LSN {lsn} CSN {csn} but is at LSN {} CSN {}",
                                    r.lsn, r.csn
                                ));
                            }
                            lsns.push(*lsn);
                        }
                        (Outcome::Committed { lsn, .. }, None) => {
                            st.committed += 1;
                            bad.push(format!(
                                "acknowledged record {v:?} (committed at LSN {lsn}, process {}, completed at {} µs) is lost",
                                e.process, e.complete_us
                            ));
                        }
                        (Outcome::Failed { why }, Some(r)) => {
                            st.failed += 1;
                            bad.push(format!(
                                "record {v:?} was reported failed ({why}) but is in the log at LSN {}",
                                r.lsn
                            ));
                        }
                        (Outcome::Failed { .. }, None) => st.failed += 1,
                        (Outcome::Unknown { .. }, found) => {
                            st.unknown += 1;
                            st.unknown_found += u64::from(found.is_some());
                        }
                    }
                }
                if lsns.windows(2).any(|w| w[1] <= w[0]) {
                    bad.push(format!(
                        "one append's records committed out of order: {values:?} at {lsns:?}"
                    ));
                }
                if let (Some(f), Some(l)) = (lsns.iter().min(), lsns.iter().max()) {
                    acked.push((e.complete_us, e.invoke_us, *f, *l));
                }
            }
            Op::Nemesis { heal: false, .. } => st.faults += 1,
            _ => {}
        }
    }
    for r in &reference {
        if !invoked.contains_key(r.value.as_str()) {
            bad.push(format!(
                "record {:?} at LSN {} was never appended by anyone",
                r.value, r.lsn
            ));
        }
    }
    // Real-time order: an append completed before another was invoked has lower LSNs.
    acked.sort_unstable();
    let mut prefix_max = Vec::with_capacity(acked.len());
    let mut m = (0u64, 0usize);
    for (i, a) in acked.iter().enumerate() {
        if a.3 >= m.0 {
            m = (a.3, i);
        }
        prefix_max.push(m);
    }
    for b in &acked {
        let before = acked.partition_point(|a| a.0 < b.1);
        if before > 0 {
            let (max_lsn, i) = prefix_max[before - 1];
            if max_lsn >= b.2 {
                let a = acked[i];
                bad.push(format!(
                    "an append completed at {} µs committed at LSN {max_lsn}, yet one invoked later, at {} µs, committed before it at LSN {} (completed at {} µs before that invocation: {})",
                    a.0, b.1, b.2, a.0, a.0 < b.1
                ));
            }
        }
    }
    // Readers: what each saw, in order, is a prefix of the log.
    let mut pos: BTreeMap<u64, usize> = BTreeMap::new();
    for e in history {
        let Op::Read {
            node,
            records,
            error: None,
            ..
        } = &e.op
        else {
            continue;
        };
        st.reads += 1;
        st.read_records += records.len() as u64;
        let p = pos.entry(e.process).or_default();
        for r in records {
            match reference.get(*p) {
                Some(x) if x == r => *p += 1,
                x => {
                    bad.push(format!(
                        "reader {} read {r:?} at node {node} where the log's record {} is {x:?}",
                        e.process, *p
                    ));
                    break;
                }
            }
        }
    }
    // Unavailability after each heal.
    let times: Vec<(u64, u64)> = acked.iter().map(|a| (a.0, a.1)).collect();
    let u = crate::history::longest_unavailable(history, &times);
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

    fn seen(lsn: u64, v: &str) -> Seen {
        Seen {
            lsn,
            csn: lsn,
            value: v.into(),
        }
    }

    fn append(p: u64, t: (u64, u64), v: &[&str], o: Vec<Outcome>) -> Entry {
        Entry {
            process: p,
            invoke_us: t.0,
            complete_us: t.1,
            op: Op::Append {
                values: v.iter().map(|s| s.to_string()).collect(),
                outcomes: o,
            },
        }
    }

    fn ok(lsn: u64) -> Outcome {
        Outcome::Committed { lsn, csn: lsn }
    }

    fn valid() -> (Vec<Entry>, Vec<Final>) {
        let log = vec![seen(10, "a"), seen(20, "b"), seen(30, "c")];
        let h = vec![
            append(1, (0, 5), &["a", "b"], vec![ok(10), ok(20)]),
            append(2, (6, 9), &["c"], vec![ok(30)]),
            append(
                3,
                (1, 20),
                &["d"],
                vec![Outcome::Failed {
                    why: "refused".into(),
                }],
            ),
            Entry {
                process: 4,
                invoke_us: 3,
                complete_us: 4,
                op: Op::Read {
                    node: 2,
                    from: 0,
                    records: vec![seen(10, "a")],
                    next: 11,
                    error: None,
                },
            },
        ];
        let finals = (1..=3)
            .map(|node| Final {
                node,
                records: log.clone(),
            })
            .collect();
        (h, finals)
    }

    #[test]
    fn a_valid_history_passes() {
        let (h, f) = valid();
        let v = check(&h, &f);
        assert!(v.anomalies.is_empty(), "{:?}", v.anomalies);
        assert_eq!(v.stats.committed, 3);
        assert_eq!(v.stats.failed, 1);
    }

    #[test]
    fn a_lost_acknowledged_record_is_caught() {
        let (h, mut f) = valid();
        for x in &mut f {
            x.records.pop();
        }
        let v = check(&h, &f);
        assert!(v
            .anomalies
            .iter()
            .any(|a| a.contains("\"c\"") && a.contains("lost")));
    }

    #[test]
    fn a_failed_record_in_the_log_is_caught() {
        let (h, mut f) = valid();
        for x in &mut f {
            x.records.push(seen(40, "d"));
        }
        let v = check(&h, &f);
        assert!(v.anomalies.iter().any(|a| a.contains("reported failed")));
    }

    #[test]
    fn nodes_that_disagree_or_lag_are_caught() {
        let (h, mut f) = valid();
        f[1].records[1].value = "x".into();
        f[2].records.pop();
        let v = check(&h, &f);
        assert!(v.anomalies.iter().any(|a| a.contains("disagree")));
        assert!(v.anomalies.iter().any(|a| a.contains("node 3 lacks")));
    }

    #[test]
    fn a_stale_order_is_caught() {
        // c completed at 9 µs; e was invoked after that but sits before c.
        let (mut h, mut f) = valid();
        h.push(append(5, (10, 12), &["e"], vec![ok(25)]));
        for x in &mut f {
            x.records.insert(2, seen(25, "e"));
        }
        let v = check(&h, &f);
        assert!(
            v.anomalies
                .iter()
                .any(|a| a.contains("committed before it")),
            "{:?}",
            v.anomalies
        );
    }

    #[test]
    fn a_read_that_is_not_the_log_is_caught() {
        let (mut h, f) = valid();
        h.push(Entry {
            process: 4,
            invoke_us: 7,
            complete_us: 8,
            op: Op::Read {
                node: 1,
                from: 11,
                records: vec![seen(30, "c")],
                next: 31,
                error: None,
            },
        });
        let v = check(&h, &f);
        assert!(v.anomalies.iter().any(|a| a.contains("reader 4")));
    }

    #[test]
    fn a_duplicate_and_an_unknown_record_are_caught() {
        let (h, mut f) = valid();
        for x in &mut f {
            x.records.push(seen(40, "a"));
            x.records.push(seen(50, "zz"));
        }
        let v = check(&h, &f);
        assert!(v.anomalies.iter().any(|a| a.contains("twice")));
        assert!(v.anomalies.iter().any(|a| a.contains("never appended")));
    }
}
