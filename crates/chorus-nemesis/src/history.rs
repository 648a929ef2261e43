//! The history of a run: every operation's invocation and completion times and its
//! outcome, and every fault the nemesis injected or healed, as JSON lines (one
//! [`Entry`] per line, in completion order).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::Error;

/// What one record of an append came to, as the client was told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Reported committed at this LSN and CSN: it must be in every node's log there.
    Committed {
        /// Its LSN.
        lsn: u64,
        /// Its CSN.
        csn: u64,
    },
    /// Reported failed, or refused before it was appended: it must never appear.
    Failed {
        /// What the client was told.
        why: String,
    },
    /// The outcome was never learned (the call was cut off, or the replica stopped
    /// first): it may or may not appear, but at most once.
    Unknown {
        /// What the client was told.
        why: String,
    },
}

/// What one record appended to an out-of-order group came to, as the client was told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Placement {
    /// Reported committed at this place (slot and index in its entry): it must be in
    /// every replica's committed entries there, and applied.
    Committed {
        /// Its slot.
        seq: u64,
        /// Its index among the records of the slot's entry.
        index: u32,
    },
    /// Reported failed, or refused before it was appended: it must never take effect.
    Failed {
        /// What the client was told.
        why: String,
    },
    /// The outcome was never learned: it may or may not take effect, but at most once.
    Unknown {
        /// What the client was told.
        why: String,
    },
}

/// A record a read returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// Its LSN.
    pub lsn: u64,
    /// Its CSN.
    pub csn: u64,
    /// Its bytes, as text (the workload writes text).
    pub value: String,
}

/// An operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// An append of `values` (one call, consecutive records), each with its outcome.
    Append {
        /// The records, in order.
        values: Vec<String>,
        /// One outcome per value.
        outcomes: Vec<Outcome>,
    },
    /// A read at node `node` from `from`; `error` set when it failed (nothing checked).
    Read {
        /// The node asked.
        node: usize,
        /// The LSN asked from.
        from: u64,
        /// What it returned.
        records: Vec<Seen>,
        /// Where the reader continues.
        next: u64,
        /// The failure, if it failed.
        error: Option<String>,
    },
    /// A write of `count` blocks from `start` to a parallel group, every block holding
    /// the write's `value` (each block's bytes say which value and block they are).
    Write {
        /// The first block.
        start: u64,
        /// How many blocks.
        count: u64,
        /// The value, unique in the run (never 0: 0 is a block never written).
        value: u64,
        /// What it came to.
        outcome: Placement,
    },
    /// A read of blocks at the leader (linearizable), from `start`: the value each block
    /// held (0: never written). `bad` names a block whose bytes no write wrote.
    BlockRead {
        /// The node that answered.
        node: usize,
        /// The first block.
        start: u64,
        /// One value per block.
        values: Vec<u64>,
        /// Bytes no write wrote, if any block held such.
        bad: Option<String>,
    },
    /// A transaction appended to a dependent group: it declares the keys it read and
    /// wrote, and sets every written key to `value`.
    Txn {
        /// The keys it read.
        reads: Vec<u64>,
        /// The keys it wrote.
        writes: Vec<u64>,
        /// The value, unique in the run (never 0).
        value: u64,
        /// What it came to.
        outcome: Placement,
    },
    /// A read of keys at node `node`, as that replica had applied them: each key's value
    /// (0: not found), with the replica's first unapplied slot.
    KeyRead {
        /// The node asked.
        node: usize,
        /// The keys.
        keys: Vec<u64>,
        /// One value per key.
        values: Vec<u64>,
        /// The replica's first unapplied slot when it answered.
        applied: u64,
    },
    /// A file created holding `value`'s block and synced (`value` not 0), or unlinked
    /// and synced (`value` 0), on the file system's writing host.
    FileOp {
        /// The file's path.
        name: String,
        /// What it holds after the operation (0: it is gone).
        value: u64,
        /// What it came to (committed: the sync returned).
        outcome: Placement,
    },
    /// A fault injected (`heal` false) or healed (`heal` true).
    Nemesis {
        /// What.
        fault: String,
        /// Whether this is the heal.
        heal: bool,
    },
}

/// One completed operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The workload process (client task) that ran it; the nemesis is process 0.
    pub process: u64,
    /// When it was invoked, in microseconds since the run started.
    pub invoke_us: u64,
    /// When it completed.
    pub complete_us: u64,
    /// What it was.
    #[serde(flatten)]
    pub op: Op,
}

/// A history being recorded, shared by the workload's tasks.
#[derive(Clone, Debug)]
pub struct History {
    start: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Default for History {
    fn default() -> Self {
        History {
            start: Instant::now(),
            entries: Arc::default(),
        }
    }
}

impl History {
    /// Microseconds since the run started.
    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Records an operation invoked at `invoke_us` that completes now.
    pub fn record(&self, process: u64, invoke_us: u64, op: Op) {
        let e = Entry {
            process,
            invoke_us,
            complete_us: self.now_us(),
            op,
        };
        self.entries.lock().expect("history lock").push(e);
    }

    /// A fault injected or healed, now.
    pub fn nemesis(&self, fault: impl Into<String>, heal: bool) {
        let now = self.now_us();
        self.record(
            0,
            now,
            Op::Nemesis {
                fault: fault.into(),
                heal,
            },
        );
    }

    /// A copy of the entries so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().expect("history lock").clone()
    }

    /// Writes the entries as JSON lines.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        write_entries(&self.entries(), path)
    }
}

/// Writes `entries` as JSON lines.
pub fn write_entries(entries: &[Entry], path: &Path) -> Result<(), Error> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).map_err(|e| Error::io(path.display(), e))?,
    );
    for e in entries {
        serde_json::to_writer(&mut f, e).map_err(|e| Error::io(path.display(), e.into()))?;
        f.write_all(b"\n")
            .map_err(|e| Error::io(path.display(), e))?;
    }
    f.flush().map_err(|e| Error::io(path.display(), e))
}

/// Reads a history written by [`History::write`]; a line that is not an entry is an
/// error naming its line number.
pub fn read_entries(path: &Path) -> Result<Vec<Entry>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display(), e))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e = serde_json::from_str(line).map_err(|e| {
            Error::io(
                format!("{} line {}", path.display(), n + 1),
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        out.push(e);
    }
    Ok(out)
}

/// How long the workload went without an acknowledged write after the faults healed
/// ([`longest_unavailable`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unavailability {
    /// The longest time, in milliseconds, from a heal to the completion of the first
    /// acknowledged write invoked at or after it.
    pub ms: u64,
    /// Where that was: the heal it followed, when (seconds into the run), and the faults
    /// injected before that write came. Empty when no heal was followed by a write.
    pub after: String,
    /// The same, over the heals after which no fault was injected before that write: what
    /// a heal alone cost, the figure the target (two election timeouts plus the lease)
    /// speaks of. A fault injected meanwhile lengthens the wait, so `ms` bounds it above.
    pub alone_ms: u64,
}

/// The longest wait after a heal in `history` for an acknowledged write; `acked` holds
/// each acknowledged write's (completion, invocation) times in microseconds. A heal that
/// no acknowledged write followed counts nothing (the run's final barrier judges that
/// case).
pub fn longest_unavailable(history: &[Entry], acked: &[(u64, u64)]) -> Unavailability {
    let mut sorted: Vec<(u64, u64)> = acked.iter().map(|a| (a.1, a.0)).collect();
    sorted.sort_unstable();
    // The earliest completion among writes invoked at or after each point: a suffix
    // minimum, so each heal costs a binary search rather than a pass over every write.
    let mut suffix_min = vec![u64::MAX; sorted.len() + 1];
    for i in (0..sorted.len()).rev() {
        suffix_min[i] = suffix_min[i + 1].min(sorted[i].1);
    }
    let injected: Vec<(u64, &str)> = history
        .iter()
        .filter_map(|f| match &f.op {
            Op::Nemesis { fault, heal: false } => Some((f.invoke_us, fault.as_str())),
            _ => None,
        })
        .collect();
    let mut out = Unavailability::default();
    for e in history {
        if let Op::Nemesis { heal: true, fault } = &e.op {
            let t = e.complete_us;
            let i = sorted.partition_point(|a| a.0 < t);
            let c = suffix_min[i];
            if c == u64::MAX || c < t {
                continue;
            }
            let ms = (c - t) / 1000;
            let during: Vec<&str> = injected
                .iter()
                .filter(|(at, _)| *at >= t && *at < c)
                .map(|(_, f)| *f)
                .collect();
            if during.is_empty() {
                out.alone_ms = out.alone_ms.max(ms);
            }
            if ms > out.ms || out.after.is_empty() {
                out.ms = ms;
                out.after = format!(
                    "after the heal of {fault} at {:.1} s; faults before the first acknowledged write: {during:?}",
                    t as f64 / 1e6
                );
            }
        }
    }
    out
}

/// The records every node holds, compared: the reference is the longest list (the lowest
/// node id among equals), and each node whose records differ from it, or stop short of
/// it, is an anomaly (`place` names where a record lies, e.g. "LSN 5"). Returns the
/// reference and the anomalies.
pub fn compare_nodes<T: PartialEq + Clone + std::fmt::Debug>(
    nodes: &[(usize, &[T])],
    place: impl Fn(&T) -> String,
) -> (Vec<T>, Vec<String>) {
    let mut bad = Vec::new();
    let longest = nodes
        .iter()
        .max_by_key(|(node, records)| (records.len(), std::cmp::Reverse(*node)));
    let reference = longest.map(|l| l.1.to_vec()).unwrap_or_default();
    let ref_node = longest.map_or(0, |l| l.0);
    for (node, records) in nodes {
        let common = records.len().min(reference.len());
        if let Some(i) = (0..common).find(|&i| records[i] != reference[i]) {
            bad.push(format!(
                "nodes {node} and {ref_node} disagree at record {i}: {:?} vs {:?}",
                records[i], reference[i]
            ));
        } else if records.len() < reference.len() {
            bad.push(format!(
                "node {node} lacks the records from {} on ({} of {})",
                place(&reference[common]),
                records.len(),
                reference.len()
            ));
        }
    }
    (reference, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nemesis(at_us: u64, fault: &str, heal: bool) -> Entry {
        Entry {
            process: 0,
            invoke_us: at_us,
            complete_us: at_us,
            op: Op::Nemesis {
                fault: fault.into(),
                heal,
            },
        }
    }

    #[test]
    fn the_longest_wait_after_a_heal_names_the_heal_and_the_faults_during_it() {
        let history = vec![
            nemesis(1_000_000, "kill node 1", false),
            nemesis(2_000_000, "kill node 1", true),
            nemesis(5_000_000, "partition 2|1,3", false),
            nemesis(6_000_000, "partition 2|1,3", true),
            nemesis(6_500_000, "pause node 3", false),
        ];
        // (completion, invocation): a write from before the first heal completing after
        // it does not count; the first heal waits 0.5 s, the second 3 s (a pause began
        // meanwhile).
        let acked = [
            (2_100_000, 1_500_000),
            (2_500_000, 2_000_000),
            (9_000_000, 6_000_000),
            (9_500_000, 7_000_000),
        ];
        let u = longest_unavailable(&history, &acked);
        assert_eq!(u.ms, 3_000);
        assert!(
            u.after.contains("heal of partition 2|1,3 at 6.0 s"),
            "{}",
            u.after
        );
        assert!(u.after.contains("[\"pause node 3\"]"), "{}", u.after);
        // Alone: the first heal's 0.5 s (a pause began during the second's wait).
        assert_eq!(u.alone_ms, 500);
        assert_eq!(
            longest_unavailable(&history[..2], &[]),
            Unavailability::default()
        );
    }
}
