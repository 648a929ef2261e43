//! Parallel block writes (ParallelRaft, PolarFS section 5): the workload and its checker.
//!
//! Writers write one or two blocks of a parallel group's block volume through the Rust
//! client, each write a value unique in the run; every block a write covers holds bytes
//! that name the value and the block ([`encode`]). Readers read ranges of blocks at the
//! leader (`ReadBlocks` with `at_leader`, which PolarFS section 4 promises sees every
//! write acknowledged before it began), hopping to another node when one is not leading.
//!
//! After the faults heal, a barrier write must commit, the leader's whole volume is read
//! (into the history, as the last read of every block), and every replica must come to
//! hold exactly those blocks. The checker ([`check`]) then judges:
//! - every block a read returned holds bytes some write wrote, to that block;
//! - no read returned a value whose write was reported failed, or one nobody wrote;
//! - the reads and writes of each block are linearizable, as a read/write register that
//!   starts at zero: checked by porcupine ([`crate::porcupine`]), with writes of unknown
//!   outcome open to the end of the history and failed writes left out. Acknowledged
//!   writes lost or rolled back show here, as the final read of their block;
//! - every replica's volume equals the leader's after the heal.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client, ClientError};

use crate::history::{Entry, History, Op, Placement};
use crate::ordered::{client, Stats, Verdict, GROUP};
use crate::Rng;

/// Blocks the writers and readers use (from block 0).
pub const BLOCKS: u64 = 48;
/// The block the final barrier writes (beyond the workload's).
const BARRIER_BLOCK: u64 = BLOCKS;
/// Bytes per block (the demo volume's).
const BLOCK: usize = 4096;
/// The process the barrier and the final read are recorded under.
const FINAL: u64 = u64::MAX;

/// The `[[groups]]` fragment of a node's configuration for this workload.
pub fn groups_toml(nodes: usize) -> String {
    let voters: Vec<String> = (1..=nodes).map(|i| i.to_string()).collect();
    format!(
        "[[groups]]\nid = {GROUP}\nvoters = [{}]\nmode = \"parallel\"\n",
        voters.join(", ")
    )
}

fn word(value: u64, block: u64, i: u64) -> u64 {
    (value ^ block.rotate_left(32))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(i)
}

/// The 4096 bytes a write of `value` puts in `block`: the value and the block number
/// (8 bytes each, little-endian), then 510 words derived from both, so that bytes torn
/// between writes, or written to the wrong block, are recognised.
pub fn encode(value: u64, block: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK);
    b.extend_from_slice(&value.to_le_bytes());
    b.extend_from_slice(&block.to_le_bytes());
    for i in 2..(BLOCK / 8) as u64 {
        b.extend_from_slice(&word(value, block, i).to_le_bytes());
    }
    b
}

/// The value `bytes` (one block) hold: 0 if all zeros (never written), an error naming
/// what is wrong if no write of [`encode`] to `block` wrote them.
pub fn decode(bytes: &[u8], block: u64) -> Result<u64, String> {
    if bytes.len() != BLOCK {
        return Err(format!("block {block}: {} bytes, not {BLOCK}", bytes.len()));
    }
    if bytes.iter().all(|b| *b == 0) {
        return Ok(0);
    }
    let w = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let value = w(0);
    if w(1) != block {
        return Err(format!(
            "block {block} holds value {value:#x} written for block {}",
            w(1)
        ));
    }
    if let Some(i) = (2..BLOCK / 8).find(|&i| w(i) != word(value, block, i as u64)) {
        return Err(format!(
            "block {block} holds value {value:#x} with word {i} of 512 not its own (torn or damaged)"
        ));
    }
    Ok(value)
}

/// Decodes `count` blocks from `start`: their values, and the first block whose bytes
/// no write wrote.
pub(crate) fn decode_all(data: &[u8], start: u64) -> (Vec<u64>, Option<String>) {
    let mut bad = None;
    let values = data
        .chunks(BLOCK)
        .enumerate()
        .map(|(i, b)| match decode(b, start + i as u64) {
            Ok(v) => v,
            Err(e) => {
                bad.get_or_insert(e);
                u64::MAX
            }
        })
        .collect();
    (values, bad)
}

/// What an out-of-order append of one record came to.
pub fn placement(r: Result<Vec<pb::OutOfOrderResult>, ClientError>) -> Placement {
    match r {
        Ok(results) => match results.first() {
            // A reply without a result is not an outcome: it may have been appended.
            None => Placement::Unknown {
                why: "the reply held no result".into(),
            },
            Some(r) if !r.refused.is_empty() => Placement::Failed {
                why: format!("refused: {}", r.refused),
            },
            Some(r) if !r.unknown.is_empty() => Placement::Unknown {
                why: r.unknown.clone(),
            },
            Some(r) if r.outcome == pb::Outcome::Committed as i32 => Placement::Committed {
                seq: r.seq,
                index: r.index,
            },
            Some(r) if r.outcome == pb::Outcome::Failed as i32 => Placement::Failed {
                why: format!("reported failed at slot {}", r.seq),
            },
            Some(r) => Placement::Unknown {
                why: format!("outcome {} with no reason", r.outcome),
            },
        },
        Err(e @ ClientError::Indeterminate { .. }) => Placement::Unknown { why: e.to_string() },
        // Refused whole: not appended.
        Err(e) => Placement::Failed { why: e.to_string() },
    }
}

/// Appends one write of `value` to `count` blocks from `start`.
async fn write(c: &mut Client, start: u64, count: u64, value: u64) -> Placement {
    let data: Vec<u8> = (start..start + count)
        .flat_map(|b| encode(value, b))
        .collect();
    let rec = pb::OutOfOrderRecord {
        data,
        blocks: vec![pb::BlockRange { start, count }],
        read_set: Vec::new(),
        write_set: Vec::new(),
    };
    placement(c.append_out_of_order(GROUP, vec![rec]).await)
}

/// One writer: writes one block, or two adjacent ones, at a time until `stop`. `process`
/// seeds its choices; its values are `(process % 1000) << 40 | n`.
pub async fn writer(process: u64, eps: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(process);
    let mut c = client(eps, Duration::from_secs(5), Duration::from_secs(3));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let value = ((process % 1000) << 40) | n;
        let start = rng.range(0, BLOCKS);
        let count = if start + 1 < BLOCKS && rng.chance(25) {
            2
        } else {
            1
        };
        let t0 = hist.now_us();
        let outcome = write(&mut c, start, count, value).await;
        let settled = matches!(outcome, Placement::Committed { .. });
        hist.record(
            process,
            t0,
            Op::Write {
                start,
                count,
                value,
                outcome,
            },
        );
        if !settled {
            tokio::time::sleep(Duration::from_millis(rng.range(10, 50))).await;
        }
    }
}

/// Reads `count` blocks from `start` at endpoint 0 of `c`, at the leader only.
async fn read_at_leader(c: &mut Client, start: u64, count: u64) -> Result<Vec<u8>, String> {
    let mut conn = c.conn(0).await.map_err(|e| e.to_string())?;
    let call = conn.read_blocks(pb::ReadBlocksRequest {
        group: GROUP,
        start,
        count,
        at_leader: true,
        snapshot: 0,
    });
    match tokio::time::timeout(Duration::from_secs(2), call).await {
        Err(_) => Err("no answer within 2 s".into()),
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Ok(Ok(r)) => Ok(r.into_inner().data),
    }
}

fn node_clients(eps: &[String]) -> Vec<Client> {
    eps.iter()
        .map(|e| {
            client(
                vec![e.clone()],
                Duration::from_secs(2),
                Duration::from_secs(1),
            )
        })
        .collect()
}

/// One reader: reads one to four blocks at a time at the leader until `stop`, moving to
/// another node whenever one does not answer as leader. Only reads that returned are
/// recorded (one that failed changed nothing).
pub async fn reader(process: u64, eps: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(process);
    let mut clients = node_clients(&eps);
    let mut at = rng.range(0, eps.len() as u64) as usize;
    while !stop.load(Ordering::Relaxed) {
        let start = rng.range(0, BLOCKS);
        let count = rng.range(1, 5).min(BLOCKS - start);
        let t0 = hist.now_us();
        match read_at_leader(&mut clients[at], start, count).await {
            Ok(data) => {
                let (values, bad) = decode_all(&data, start);
                hist.record(
                    process,
                    t0,
                    Op::BlockRead {
                        node: at + 1,
                        start,
                        values,
                        bad,
                    },
                );
            }
            Err(_) => {
                at = (at + 1) % clients.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// After every fault healed: a barrier write that must commit, then the leader's whole
/// volume read into the history, then every replica must hold the same blocks. Returns
/// the run's own findings (a barrier that never committed, a replica that differs).
pub async fn settle(eps: &[String], hist: &History, deadline: Duration) -> Vec<String> {
    let mut found = Vec::new();
    let mut c = client(eps.to_vec(), Duration::from_secs(5), Duration::from_secs(3));
    let end = Instant::now() + deadline;
    let mut n = 0;
    let mut last = String::new();
    let committed = loop {
        n += 1;
        let t0 = hist.now_us();
        let outcome = write(&mut c, BARRIER_BLOCK, 1, (999 << 40) | n).await;
        let ok = matches!(outcome, Placement::Committed { .. });
        if let Placement::Failed { why } | Placement::Unknown { why } = &outcome {
            last = why.clone();
        }
        hist.record(
            FINAL,
            t0,
            Op::Write {
                start: BARRIER_BLOCK,
                count: 1,
                value: (999 << 40) | n,
                outcome,
            },
        );
        if ok || Instant::now() >= end {
            break ok;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !committed {
        found.push(format!(
            "no write committed within {deadline:?} after every fault healed (last: {last}) [{}]",
            group_states(eps, GROUP).await
        ));
    }
    // The leader's volume, as the last read of every block.
    let mut clients = node_clients(eps);
    let mut leader_values = None;
    'read: while Instant::now() < end + Duration::from_secs(30) {
        for (i, c) in clients.iter_mut().enumerate() {
            let t0 = hist.now_us();
            if let Ok(data) = read_at_leader(c, 0, BLOCKS + 1).await {
                let (values, bad) = decode_all(&data, 0);
                hist.record(
                    FINAL,
                    t0,
                    Op::BlockRead {
                        node: i + 1,
                        start: 0,
                        values: values.clone(),
                        bad,
                    },
                );
                leader_values = Some(values);
                break 'read;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(want) = leader_values else {
        found.push("no node answered a read as leader after every fault healed".into());
        return found;
    };
    // Every replica converges on the leader's blocks.
    for (i, c) in clients.iter_mut().enumerate() {
        let until = Instant::now() + Duration::from_secs(60);
        let mut why;
        loop {
            match c.read_blocks_at(0, GROUP, 0, BLOCKS + 1).await {
                Ok(r) => {
                    let (values, bad) = decode_all(&r.data, 0);
                    if let Some(b) = bad {
                        why = b;
                    } else if let Some(b) = (0..values.len()).find(|&b| values[b] != want[b]) {
                        why = format!(
                            "block {b} holds {:#x} where the leader's holds {:#x} (applied up to slot {})",
                            values[b], want[b], r.applied_seq
                        );
                    } else {
                        break;
                    }
                }
                Err(e) => why = format!("reading its blocks failed: {e}"),
            }
            if Instant::now() >= until {
                found.push(format!(
                    "node {}'s volume does not match the leader's 60 s after the heal: {why} [{}]",
                    i + 1,
                    group_states(eps, GROUP).await
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    found
}

/// One line per node on `group` as it reports itself (role, term, first slots not
/// committed and not applied, compaction base, voters), for the message of a replica that
/// does not converge: whether it is behind the leader or holds what it should not.
pub async fn group_states(eps: &[String], group: u64) -> String {
    let mut c = client(eps.to_vec(), Duration::from_secs(2), Duration::from_secs(1));
    let mut out = Vec::new();
    for (i, (_, r)) in c.status_all(group).await.into_iter().enumerate() {
        out.push(match r {
            Ok(s) => match s.groups.iter().find(|g| g.group == group) {
                Some(g) => format!(
                    "node {}: {} term {} leader {} committed {} applied {} base {} voters {:?}{}{}{}",
                    i + 1,
                    g.role,
                    g.proposal_id,
                    g.leader,
                    g.committed_seq,
                    g.applied_seq,
                    g.base_seq,
                    g.voters,
                    if g.serving { " serving" } else { "" },
                    if g.recovering_lost { " recovering" } else { "" },
                    if g.stopped.is_empty() {
                        String::new()
                    } else {
                        format!(" stopped: {}", g.stopped)
                    },
                ),
                None => format!("node {}: no such group", i + 1),
            },
            Err(e) => format!("node {}: {e}", i + 1),
        });
    }
    out.join("; ")
}

/// Judges `history` (see the module docs), running porcupine with its files in `dir`.
pub fn check(history: &[Entry], dir: &Path) -> Verdict {
    let mut bad = Vec::new();
    let mut st = Stats::default();
    let mut by_value: HashMap<u64, &Placement> = HashMap::new();
    let mut acked = Vec::new();
    for e in history {
        match &e.op {
            Op::Write { value, outcome, .. } => {
                st.appends += 1;
                st.records += 1;
                by_value.insert(*value, outcome);
                match outcome {
                    Placement::Committed { .. } => {
                        st.committed += 1;
                        acked.push((e.complete_us, e.invoke_us));
                    }
                    Placement::Failed { .. } => st.failed += 1,
                    Placement::Unknown { .. } => st.unknown += 1,
                }
            }
            Op::Nemesis { heal: false, .. } => st.faults += 1,
            _ => {}
        }
    }
    let mut seen_unknown = std::collections::HashSet::new();
    for e in history {
        let Op::BlockRead {
            node,
            start,
            values,
            bad: torn,
        } = &e.op
        else {
            continue;
        };
        st.reads += 1;
        st.read_records += values.len() as u64;
        if let Some(t) = torn {
            bad.push(format!(
                "a read at node {node} (process {}, at {} µs) returned bytes no write wrote: {t}",
                e.process, e.complete_us
            ));
        }
        for (i, v) in values.iter().enumerate() {
            if *v == 0 || *v == u64::MAX {
                continue;
            }
            match by_value.get(v) {
                None => bad.push(format!(
                    "block {} read at node {node} holds value {v:#x}, which nobody wrote",
                    start + i as u64
                )),
                Some(Placement::Failed { why }) => bad.push(format!(
                    "block {} read at node {node} holds value {v:#x}, whose write was reported failed ({why})",
                    start + i as u64
                )),
                Some(Placement::Unknown { .. }) => {
                    seen_unknown.insert(*v);
                }
                Some(Placement::Committed { .. }) => {}
            }
        }
    }
    st.unknown_found = seen_unknown.len() as u64;
    let u = crate::history::longest_unavailable(history, &acked);
    (st.longest_unavailable_ms, st.longest_unavailable_after) = (u.ms, u.after);
    st.longest_unavailable_alone_ms = u.alone_ms;
    match crate::porcupine::check_blocks(history, dir) {
        Ok(found) => bad.extend(found),
        Err(e) => bad.push(format!("the linearizability check could not run: {e}")),
    }
    Verdict {
        anomalies: bad,
        stats: st,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_decode_to_their_value_and_damage_is_named() {
        let b = encode(0x1234, 7);
        assert_eq!(decode(&b, 7), Ok(0x1234));
        assert_eq!(decode(&vec![0; BLOCK], 3), Ok(0));
        assert!(decode(&b, 8).unwrap_err().contains("written for block 7"));
        let mut torn = b.clone();
        torn[2048..].copy_from_slice(&encode(0x99, 7)[2048..]);
        assert!(decode(&torn, 7).unwrap_err().contains("torn"));
        let (values, bad) = decode_all(&[encode(5, 0), encode(6, 1)].concat(), 0);
        assert_eq!(values, vec![5, 6]);
        assert!(bad.is_none());
    }
}
