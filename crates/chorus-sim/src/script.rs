//! Scenario scripts with golden output (in the style of etcd-raft's `testdata/*.txt`).
//!
//! A script is a sequence of commands, each followed by `----` and its expected output up
//! to a blank line. [`run_script`] executes the commands on a fault-free [`Cluster`] and
//! returns the script with the actual output filled in; a test compares it with the file.
//!
//! Commands:
//!
//! | command | effect |
//! |---|---|
//! | `cluster voters=3 [spares=N] [prio=ID:P,...] [mode=piggyback\|sync\|async] [gap-resend=N] [timed-resend=N]` | new cluster (gap and timed resends off unless set) |
//! | `run MS` | advance time |
//! | `wait-leader [MS]` | run until a leader serves, its config accepted (at most MS, default 5000) |
//! | `status` | role, proposal id, leader, log end, flushed, committed, config per node |
//! | `append NODE TEXT` | append through NODE |
//! | `results NODE` | results delivered at NODE since the last `results` |
//! | `log NODE` | NODE's groups: LSN, proposal id, entries, piggybacked committed end |
//! | `progress NODE` | the leader's view of followers' flushed ends and the commit point |
//! | `partition A B \| C` · `block A B` · `heal` | network |
//! | `hold A B MS` | the next append carrying log from A to B arrives MS late (overtaken) |
//! | `gap-asks NODE` | gap resends NODE asked for ([`chorus_core::replica::ReplicaConfig::gap_resend_after`]) |
//! | `timed-resends NODE` | timed resends NODE made as leader ([`chorus_core::replica::ReplicaConfig::timed_resend`]) |
//! | `resend-due NODE` | how long until NODE's next timed resend is due as leader ([`chorus_core::replica::Replica::resend_due`]), or `none` |
//! | `crash NODE` · `restart NODE` | process crash (unsynced data lost) and recovery |
//! | `corrupt NODE [INDEX...]` | flip a bit in each of these synced groups (random if none; never the last) of a crashed node's last block |
//! | `priority NODE P` · `transfer NODE TO` | election |
//! | `member NODE add-learner\|add-voter\|promote\|remove X` · `member NODE replace OLD NEW` | membership |
//! | `strict member …` · `strict transfer …` | the same after the operator's strict check ([`chorus_core::replica::Replica::check_change`], [`chorus_core::replica::Replica::check_transfer_to`]) |
//! | `append-many NODE COUNT BYTES` | COUNT appends of BYTES bytes through NODE, 1 ms apart |
//! | `outcomes NODE` | counts of the results delivered at NODE since the last `results` or `outcomes`, and of the appends whose outcome became unknown |
//! | `trim NODE LSN` | NODE trims its log below LSN (capped at its committed end); prints its log start |
//! | `start NODE` | NODE's log start (the first LSN its storage holds) |
//! | `rebases NODE` | how often NODE's log was rebased, and how many rebases it sent |
//! | `trace on\|off` | print role changes and crashes during `run` |
//! | `check` | invariant violations so far (none expected) |

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chorus_core::format::entry::EntryIter;
use chorus_core::format::meta::NodeId;
use chorus_core::replica::{MembershipChange, Outcome, Role};
use chorus_storage::fs::CrashMode;

use crate::run::parse_commit_mode;
use crate::{Cluster, ClusterOptions, MS};

struct State {
    cluster: Option<Cluster>,
    seen_results: BTreeMap<NodeId, usize>,
    tags: BTreeMap<u64, String>,
}

/// Runs `script` and returns it with each command's actual output.
pub fn run_script(script: &str) -> String {
    let mut st = State {
        cluster: None,
        seen_results: BTreeMap::new(),
        tags: BTreeMap::new(),
    };
    run_commands(script, |command| exec(&mut st, command))
}

/// The golden-file loop every scenario script shares (ordered here, out-of-order in
/// [`crate::ooo::script`]): `#` lines are copied through; each other non-blank line is a
/// command, followed in the file by `----` and its expected output up to a blank line,
/// which is dropped and replaced by what `exec` returns for the command.
pub fn run_commands(script: &str, mut exec: impl FnMut(&str) -> String) -> String {
    let mut out = String::new();
    let mut lines = script.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if t.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        // Skip the old expected output.
        if lines.peek().is_some_and(|l| l.trim() == "----") {
            lines.next();
            for l in lines.by_ref() {
                if l.trim().is_empty() {
                    break;
                }
            }
        }
        let result = exec(t);
        let _ = writeln!(out, "{line}\n----");
        out.push_str(&result);
        if !result.ends_with('\n') {
            out.push('\n');
        }
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

fn num(s: Option<&str>) -> Result<u64, String> {
    s.ok_or("missing number")?
        .parse()
        .map_err(|_| format!("not a number: {s:?}"))
}

fn exec(st: &mut State, line: &str) -> String {
    match exec_inner(st, line) {
        Ok(s) => s,
        Err(e) => format!("error: {e}"),
    }
}

fn exec_inner(st: &mut State, line: &str) -> Result<String, String> {
    let mut words = line.split_whitespace();
    let mut cmd = words.next().unwrap_or_default();
    // `strict member …` / `strict transfer …`: the operator's strict check first.
    let strict = cmd == "strict";
    if strict {
        cmd = words.next().unwrap_or_default();
        if cmd != "member" && cmd != "transfer" {
            return Err(format!(
                "strict applies to member and transfer, not {cmd:?}"
            ));
        }
    }
    if cmd == "cluster" {
        // Gap and timed resends off unless asked for: the scripts written before they
        // existed keep their trajectories.
        let mut opts = ClusterOptions {
            gap_resend_after: Some(0),
            timed_resend: Some(0),
            ..ClusterOptions::default()
        };
        for w in words {
            let (k, v) = w.split_once('=').ok_or(format!("bad option {w}"))?;
            match k {
                "voters" => opts.voters = num(Some(v))? as usize,
                "spares" => opts.spares = num(Some(v))? as usize,
                "mode" => opts.commit_mode = parse_commit_mode(v).ok_or("bad mode")?,
                "gap-resend" => opts.gap_resend_after = Some(num(Some(v))? as usize),
                "timed-resend" => opts.timed_resend = Some(num(Some(v))? as u32),
                "prio" => {
                    for p in v.split(',') {
                        let (n, p) = p.split_once(':').ok_or("bad prio")?;
                        opts.priorities.insert(num(Some(n))?, num(Some(p))? as u32);
                    }
                }
                _ => return Err(format!("unknown option {k}")),
            }
        }
        st.cluster = Some(Cluster::new(1, opts));
        st.seen_results.clear();
        return Ok("ok".into());
    }
    let c = st.cluster.as_mut().ok_or("no cluster")?;
    let mut out = String::new();
    match cmd {
        "trace" => {
            c.trace = (words.next() == Some("on")).then(Vec::new);
            out.push_str("ok");
        }
        "run" => {
            let ms = num(words.next())?;
            let until = c.now + ms * MS;
            c.run_until(until);
            out.push_str(&take_trace(c));
            if out.is_empty() {
                out.push_str("ok");
            }
        }
        "wait-leader" => {
            let ms = words.next().map_or(Ok(5000), |w| num(Some(w)))?;
            let until = c.now + ms * MS;
            let serving = |c: &Cluster| {
                c.leader()
                    .and_then(|l| c.nodes[&l].replica())
                    .is_some_and(|r| r.takes_writes())
            };
            while c.now < until && !serving(c) {
                let t = c.now + MS;
                c.run_until(t);
            }
            out.push_str(&take_trace(c));
            match c.leader() {
                Some(l) => {
                    let _ = write!(out, "leader {l}");
                }
                None => out.push_str("no leader"),
            }
        }
        "status" => {
            for n in c.nodes.values() {
                let Some(r) = n.replica() else {
                    let _ = writeln!(out, "node {}: down", n.id);
                    continue;
                };
                let m = r.membership();
                let extra = match (r.halted(), r.repairing_range()) {
                    (Some(_), _) => " HALTED".to_string(),
                    (None, Some((f, t))) => format!(" repairing={f}..{t}"),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    "node {}: {:?}{extra} pid={} leader={} end={} flushed={} committed={} config={}.{} voters={:?} learners={:?}",
                    n.id,
                    r.role(),
                    r.proposal_id(),
                    r.leader().map_or("-".into(), |l| l.to_string()),
                    r.end_lsn(),
                    r.flushed_end(),
                    r.committed_end(),
                    m.version.proposal_id,
                    m.version.seq,
                    m.voters,
                    m.learners
                );
            }
        }
        "append" => {
            let n = num(words.next())?;
            let text: Vec<&str> = words.collect();
            let text = text.join(" ");
            match c.append(n, text.as_bytes(), 0) {
                Ok((t, tag)) => {
                    st.tags.insert(tag, text.clone());
                    let _ = write!(out, "ok id={} lsn={} csn={}", t.id, t.lsn, t.csn);
                }
                Err(e) => {
                    let _ = write!(out, "refused: {e}");
                }
            }
        }
        "append-many" => {
            let n = num(words.next())?;
            let count = num(words.next())?;
            let bytes = num(words.next())? as usize;
            let (mut ok, mut refused) = (0, 0);
            for i in 0..count {
                let text = format!("{i:0bytes$}");
                match c.append(n, text.as_bytes(), 0) {
                    Ok((_, tag)) => {
                        st.tags.insert(tag, format!("many-{i}"));
                        ok += 1;
                    }
                    Err(_) => refused += 1,
                }
                let t = c.now + MS;
                c.run_until(t);
            }
            let _ = write!(out, "accepted {ok} refused {refused}");
        }
        "outcomes" => {
            let n = num(words.next())?;
            let seen = st.seen_results.entry(n).or_default();
            let node = &c.nodes[&n];
            let mut committed = 0;
            let mut failed = 0;
            for (_, _, _, o) in &node.results[*seen..] {
                match o {
                    Outcome::Committed => committed += 1,
                    Outcome::Failed => failed += 1,
                }
            }
            *seen = node.results.len();
            let _ = write!(
                out,
                "committed {committed} failed {failed} unknown {}",
                node.unknown.len()
            );
        }
        "trim" => {
            let n = num(words.next())?;
            let lsn = num(words.next())?;
            c.trim(n, lsn);
            let log = c.nodes[&n].log().ok_or("node down")?;
            let _ = write!(out, "start={}", log.start_lsn());
        }
        "start" => {
            let n = num(words.next())?;
            let log = c.nodes[&n].log().ok_or("node down")?;
            let _ = write!(out, "start={}", log.start_lsn());
        }
        "rebases" => {
            let n = num(words.next())?;
            let r = c.nodes[&n].replica().ok_or("node down")?;
            let _ = write!(out, "rebased {} sent {}", r.rebased(), r.rebases_sent());
        }
        "results" => {
            let n = num(words.next())?;
            let seen = st.seen_results.entry(n).or_default();
            let node = &c.nodes[&n];
            for (inc, id, lsn, o) in &node.results[*seen..] {
                let text = node
                    .tags
                    .get(&(*inc, *id))
                    .and_then(|t| st.tags.get(t))
                    .cloned()
                    .unwrap_or_default();
                let o = match o {
                    Outcome::Committed => "Committed",
                    Outcome::Failed => "Failed",
                };
                let _ = writeln!(out, "run={inc} id={id} lsn={lsn} {text:?} {o}");
            }
            *seen = node.results.len();
            if out.is_empty() {
                out.push_str("none");
            }
        }
        "log" => {
            let n = num(words.next())?;
            let log = c.nodes[&n].log().ok_or("node down")?;
            for g in log.iter_from(log.start_lsn()) {
                let (h, body) = g.map_err(|e| e.to_string())?;
                let texts: Vec<String> = EntryIter::new(&body)
                    .filter_map(|e| e.ok())
                    .map(|e| {
                        let tag = u64::from_le_bytes(e.data[..8].try_into().unwrap_or([0; 8]));
                        st.tags.get(&tag).cloned().unwrap_or_else(|| "?".into())
                    })
                    .collect();
                let kind = if h.is_padding() {
                    "padding".to_string()
                } else if h.entry_count == 0 {
                    "empty".to_string()
                } else {
                    format!("{texts:?}")
                };
                let _ = writeln!(
                    out,
                    "lsn={} end={} pid={} committed_end={} {kind}",
                    h.lsn,
                    h.end_lsn(),
                    h.proposal_id,
                    h.committed_end_lsn
                );
            }
            if out.is_empty() {
                out.push_str("empty");
            }
        }
        "progress" => {
            let n = num(words.next())?;
            let r = c.nodes[&n].replica().ok_or("node down")?;
            let _ = writeln!(out, "node {n} (self): flushed={}", r.flushed_end());
            for (f, m) in r.follower_progress() {
                let _ = writeln!(out, "node {f}: matched={m}");
            }
            let _ = write!(out, "committed={}", r.committed_end());
        }
        "partition" => {
            let rest: Vec<&str> = words.collect();
            let mut groups = vec![Vec::new()];
            for w in rest {
                if w == "|" {
                    groups.push(Vec::new());
                } else {
                    groups.last_mut().expect("group").push(num(Some(w))?);
                }
            }
            c.partition(&groups);
            out.push_str("ok");
        }
        "block" => {
            let a = num(words.next())?;
            let b = num(words.next())?;
            c.block(a, b);
            out.push_str("ok");
        }
        "hold" => {
            let a = num(words.next())?;
            let b = num(words.next())?;
            let ms = num(words.next())?;
            c.hold_next_append(a, b, ms * MS);
            out.push_str("ok");
        }
        "gap-asks" => {
            let n = num(words.next())?;
            let r = c.nodes[&n].replica().ok_or("node down")?;
            let _ = write!(out, "asked {}", r.gap_resend_requests());
        }
        "timed-resends" => {
            let n = num(words.next())?;
            let r = c.nodes[&n].replica().ok_or("node down")?;
            let _ = write!(out, "resent {}", r.timed_resends());
        }
        "resend-due" => {
            let n = num(words.next())?;
            let r = c.nodes[&n].replica().ok_or("node down")?;
            match r.resend_due() {
                Some(t) => {
                    let now = c.local_now(n);
                    let _ = write!(out, "due in {} us", t.saturating_sub(now) / 1_000);
                }
                None => out.push_str("none"),
            }
        }
        "heal" => {
            c.heal();
            out.push_str("ok");
        }
        "crash" => {
            let n = num(words.next())?;
            c.crash(n, CrashMode::Prefix);
            out.push_str("ok");
        }
        "corrupt" => {
            let n = num(words.next())?;
            let mut indices = Vec::new();
            for w in words.by_ref() {
                indices.push(num(Some(w))? as usize);
            }
            if c.corrupt_groups(n, &indices) {
                out.push_str("ok");
            } else {
                out.push_str("nothing to corrupt (node up, or too few groups)");
            }
        }
        "restart" => {
            let n = num(words.next())?;
            c.restart(n);
            out.push_str("ok");
        }
        "priority" => {
            let n = num(words.next())?;
            let p = num(words.next())? as u32;
            c.set_priority(n, p);
            out.push_str("ok");
        }
        "transfer" => {
            let n = num(words.next())?;
            let to = num(words.next())?;
            if strict {
                if let Some(Err(e)) = c.nodes[&n].replica().map(|r| r.check_transfer_to(to)) {
                    let _ = write!(out, "refused: {e}");
                    return Ok(out);
                }
            }
            match c.transfer(n, to) {
                Ok(()) => out.push_str("ok"),
                Err(e) => {
                    let _ = write!(out, "refused: {e}");
                }
            }
        }
        "member" => {
            let n = num(words.next())?;
            let op = words.next().ok_or("missing op")?;
            let x = num(words.next())?;
            let change = match op {
                "add-learner" => MembershipChange::AddLearner(x),
                "add-voter" => MembershipChange::AddVoter(x),
                "promote" => MembershipChange::Promote(x),
                "remove" => MembershipChange::Remove(x),
                "replace" => MembershipChange::Replace {
                    old: x,
                    new: num(words.next())?,
                },
                _ => return Err(format!("unknown op {op}")),
            };
            if strict {
                if let Some(Err(e)) = c.nodes[&n].replica().map(|r| r.check_change(&change)) {
                    let _ = write!(out, "refused: {e}");
                    return Ok(out);
                }
            }
            match c.change(n, change) {
                Ok(v) => {
                    let _ = write!(out, "ok version={}.{}", v.proposal_id, v.seq);
                }
                Err(e) => {
                    let _ = write!(out, "refused: {e}");
                }
            }
        }
        "check" => {
            if c.checker.violations.is_empty() {
                out.push_str("no violations");
            } else {
                out.push_str(&c.checker.violations.join("\n"));
            }
        }
        "role" => {
            let n = num(words.next())?;
            let r = c.nodes[&n].replica().map(|r| r.role());
            let _ = write!(
                out,
                "{}",
                r.map_or("down".into(), |r: Role| format!("{r:?}"))
            );
        }
        _ => return Err(format!("unknown command {cmd}")),
    }
    Ok(out)
}

fn take_trace(c: &mut Cluster) -> String {
    match &mut c.trace {
        Some(t) => {
            let s = t.join("\n");
            t.clear();
            s
        }
        None => String::new(),
    }
}
