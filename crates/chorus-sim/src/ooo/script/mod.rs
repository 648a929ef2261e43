//! Scenario scripts for out-of-order replicas (`OooReplica`, parallel or dependent mode),
//! with golden output, in the style of `chorus-sim`'s scripts for the ordered replica and
//! etcd-raft's `testdata/*.txt`.
//!
//! A script is a sequence of commands, each followed by `----` and its expected output up
//! to a blank line; `#` lines are comments, copied through. [`run_script`] executes the
//! commands and returns the script with the actual output filled in; a test compares it
//! with the file. The replicas are driven directly at the message level (see
//! `world`): nothing moves unless a command moves it, so a script decides which message
//! reaches whom, when a disk syncs and when a node crashes. A command prints what the
//! replicas did in consequence (`render` describes the notation); an `error:` line
//! means the script itself is wrong (the test fails on it), while a refused append or
//! transfer is an outcome and prints as such.
//!
//! Commands (`N` a node, `A->B` a link where either side may be `*`):
//!
//! | command | effect |
//! |---|---|
//! | `create nodes=N mode=parallel[:SPAN]\|dependent [voters=1,2,..] [hole-resend=K] [timed-resend=K] [max-batch=K] [partial-images=K] [piece-bytes=K] [catchup-rate=B] [conflict-order] [no-prevote]` | new group (hole and timed resends off unless set) |
//! | `tick [MS]` | advance the clock (default 10 ms) and tick every node; nothing is delivered |
//! | `run MS` | advance the clock 10 ms at a time, ticking every node and delivering what is not held, until MS passed; heartbeats and empty acknowledgements are left out of the trace |
//! | `campaign N` | two election timeouts pass for N only: it starts a (pre-)campaign |
//! | `append N [blocks=S+LEN,..] [read=K,..] [write=K,..]` | an append through N: blocks in parallel mode, read and write sets in dependent mode |
//! | `stabilize` | deliver every message not held, and what they cause, until none is left |
//! | `deliver A->B [FILTER]` · `drop A->B [FILTER]` | deliver (held or not; a cut link or a crashed receiver still loses them) or lose the queued messages of a link, in queue order, and run what the receivers do (their own messages stay queued); FILTER: `slot=S,..` (messages about these slots), `kind=K` (`Append`, `Ack`, `Vote`, ...), `n=K` (the first K that match) |
//! | `hold A->B` · `release A->B` | messages of the link wait for an explicit `deliver` |
//! | `partition 1 2 \| 3` · `isolate N` · `heal` | links between the groups (or N and everyone) lose every message, until `heal` |
//! | `sync N manual\|auto` · `persist [N]` | N's disk syncs only on `persist` (and what follows its writes waits) |
//! | `crash N` · `restart N` | process crash (unsynced writes and queued messages lost) and recovery from disk |
//! | `compact N [UPTO]` | N checkpoints its state machine and compacts below UPTO (default: its applied head) |
//! | `transfer N TO` | leader N hands leadership to TO |
//! | `member N add\|remove X` | leader N changes the membership |
//! | `status [N]` · `log N` · `messages [A->B]` · `state N` · `stats N` | print: roles, terms, holes, committed and applied slots; a node's slots; the queue; a state machine; counters |
//! | `merge-table N` | what N merged in its latest campaign: each voter's versions, the merge rules' decision (DP-Raft Fig. 4's cases, `chorus_core::ooo::merge`) and what N wrote |

mod merges;
mod render;
mod world;

use std::fmt::Write as _;

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode, OooConfig, OooMembershipChange};

use world::World;

const MS: u64 = 1_000_000;

/// Runs `script` and returns it with each command's actual output.
pub fn run_script(script: &str) -> String {
    let mut world: Option<World> = None;
    crate::script::run_commands(script, |command| match exec(&mut world, command) {
        Ok(s) if s.trim().is_empty() => "ok".to_string(),
        Ok(s) => s.trim_end().to_string(),
        Err(e) => {
            // What the command printed before it failed, then the error.
            let trace = world.as_mut().map(World::take_trace).unwrap_or_default();
            format!("{trace}error: {e}").trim_end().to_string()
        }
    })
}

fn num(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("not a number: {s:?}"))
}

fn nums(s: &str) -> Result<Vec<u64>, String> {
    if s.is_empty() || s == "-" {
        return Ok(Vec::new());
    }
    s.split(',').map(num).collect()
}

fn node(w: &World, s: Option<&str>) -> Result<NodeId, String> {
    let id = num(s.ok_or("missing node")?)?;
    if !w.nodes.contains_key(&id) {
        return Err(format!("no node {id}"));
    }
    Ok(id)
}

/// `A->B` with `*` for any node.
fn link(s: Option<&str>) -> Result<(Option<NodeId>, Option<NodeId>), String> {
    let s = s.ok_or("missing link A->B")?;
    let (a, b) = s.split_once("->").ok_or(format!("bad link {s}"))?;
    let side = |x: &str| -> Result<Option<NodeId>, String> {
        if x == "*" {
            Ok(None)
        } else {
            num(x).map(Some)
        }
    };
    Ok((side(a)?, side(b)?))
}

fn create(words: std::str::SplitWhitespace) -> Result<World, String> {
    let mut n = 3;
    let mut mode = Mode::Parallel { span: 2 };
    let mut voters: Option<Vec<NodeId>> = None;
    let mut tweaks: Vec<(String, String)> = Vec::new();
    for w in words {
        let (k, v) = w.split_once('=').unwrap_or((w, ""));
        match k {
            "nodes" => n = num(v)?,
            "voters" => voters = Some(nums(v)?),
            "mode" => {
                mode = match v.split_once(':') {
                    Some(("parallel", span)) => Mode::Parallel {
                        span: num(span)? as usize,
                    },
                    None if v == "parallel" => Mode::Parallel { span: 2 },
                    None if v == "dependent" => Mode::Dependent,
                    _ => return Err(format!("bad mode {v}")),
                }
            }
            _ => tweaks.push((k.to_string(), v.to_string())),
        }
    }
    let ids: Vec<NodeId> = (1..=n).collect();
    let voters = voters.unwrap_or_else(|| ids.clone());
    let mut cfgs = Vec::new();
    for &id in &ids {
        let mine = if voters.contains(&id) {
            voters.clone()
        } else {
            Vec::new()
        };
        let mut c = OooConfig::new(id, mine, mode);
        c.hole_resend = 0;
        c.timed_resend = 0;
        for (k, v) in &tweaks {
            match k.as_str() {
                "hole-resend" => c.hole_resend = num(v)?,
                "timed-resend" => c.timed_resend = num(v)? as u32,
                "max-batch" => c.max_batch = num(v)? as usize,
                "partial-images" => c.partial_image_items = num(v)?,
                "piece-bytes" => c.max_batch_bytes = num(v)? as usize,
                "catchup-rate" => c.catchup_rate = num(v)?,
                "conflict-order" => c.conflict_order = true,
                "no-prevote" => c.pre_vote = false,
                _ => return Err(format!("unknown option {k}")),
            }
        }
        cfgs.push(c);
    }
    Ok(World::new(cfgs))
}

fn exec(world: &mut Option<World>, line: &str) -> Result<String, String> {
    let mut words = line.split_whitespace();
    let cmd = words.next().unwrap_or_default();
    if cmd == "create" {
        *world = Some(create(words)?);
        return Ok("ok".into());
    }
    let w = world.as_mut().ok_or("no group: create one first")?;
    w.quiet = false;
    w.stamp = false;
    let mut out = String::new();
    match cmd {
        "tick" => {
            let ms = words.next().map_or(Ok(10), num)?;
            w.tick_all(ms * MS);
        }
        "run" => {
            let ms = num(words.next().ok_or("missing MS")?)?;
            w.quiet = true;
            w.stamp = true;
            for _ in 0..ms.div_ceil(10) {
                w.tick_all(10 * MS);
                w.stabilize()?;
            }
        }
        "campaign" => {
            let id = node(w, words.next())?;
            let timeout = w.nodes[&id].cfg.election_timeout;
            if w.nodes[&id].r.is_none() {
                return Err(format!("n{id} is down"));
            }
            // Past any election deadline (they are drawn below twice the timeout); only
            // this node is ticked, so only it acts on it.
            w.now += 2 * timeout;
            let now = w.now;
            w.nodes.get_mut(&id).unwrap().r.as_mut().unwrap().tick(now);
            w.drain(id);
        }
        "append" => {
            let id = node(w, words.next())?;
            let mut blocks = Vec::new();
            let (mut read, mut write) = (Vec::new(), Vec::new());
            for a in words {
                let (k, v) = a.split_once('=').ok_or(format!("bad argument {a}"))?;
                match k {
                    "blocks" => {
                        for r in v.split(',') {
                            let (s, l) = r.split_once('+').unwrap_or((r, "1"));
                            blocks.push(BlockRange::new(num(s)?, num(l)?).ok_or("empty range")?);
                        }
                    }
                    "read" => read = nums(v)?,
                    "write" => write = nums(v)?,
                    _ => return Err(format!("unknown argument {k}")),
                }
            }
            let n = w.nodes.get_mut(&id).unwrap();
            let r = n.r.as_mut().ok_or(format!("n{id} is down"))?;
            let declared = match r.mode() {
                Mode::Parallel { .. } => Declared::Blocks(blocks),
                Mode::Dependent => Declared::Txn {
                    read_set: read,
                    write_set: write,
                },
            };
            let now = w.now;
            match r.append(now, declared, Vec::new()) {
                Ok(t) => {
                    w.line(format!(
                        "n{id}: appended {} at slot {}",
                        render::eid(t.eid),
                        t.seq
                    ));
                    w.drain(id);
                }
                Err(e) => w.line(format!("n{id}: append refused: {e}")),
            }
        }
        "stabilize" => w.stabilize()?,
        "deliver" | "drop" => {
            let (a, b) = link(words.next())?;
            let mut slots: Option<Vec<u64>> = None;
            let mut kind: Option<String> = None;
            let mut count = usize::MAX;
            for f in words {
                let (k, v) = f.split_once('=').ok_or(format!("bad filter {f}"))?;
                match k {
                    "slot" => slots = Some(nums(v)?),
                    "kind" => kind = Some(v.to_string()),
                    "n" => count = num(v)? as usize,
                    _ => return Err(format!("unknown filter {k}")),
                }
            }
            let picks: Vec<usize> = w
                .queue
                .iter()
                .enumerate()
                .filter(|(_, q)| {
                    a.is_none_or(|a| a == q.from)
                        && b.is_none_or(|b| b == q.to)
                        && kind.as_ref().is_none_or(|k| k == render::kind(&q.msg))
                        && slots
                            .as_ref()
                            .is_none_or(|s| s.iter().any(|&s| render::touches(&q.msg, s)))
                })
                .map(|(i, _)| i)
                .take(count)
                .collect();
            if picks.is_empty() {
                return Err("no such message".into());
            }
            if cmd == "deliver" {
                w.deliver(&picks, true);
            } else {
                let mut gone = Vec::new();
                for &i in picks.iter().rev() {
                    gone.push(w.queue.remove(i));
                }
                gone.reverse();
                if gone.len() <= 4 {
                    for q in &gone {
                        let _ =
                            writeln!(out, "dropped n{}>n{} {}", q.from, q.to, render::msg(&q.msg));
                    }
                } else {
                    // Summarised by link and kind.
                    let mut by: std::collections::BTreeMap<(NodeId, NodeId, &str), usize> =
                        Default::default();
                    for q in &gone {
                        *by.entry((q.from, q.to, render::kind(&q.msg))).or_default() += 1;
                    }
                    let parts: Vec<String> = by
                        .iter()
                        .map(|((f, t, k), c)| format!("n{f}>n{t} {k} x{c}"))
                        .collect();
                    let _ = write!(out, "dropped {} messages: {}", gone.len(), parts.join(", "));
                }
            }
        }
        "hold" | "release" => {
            let (a, b) = link(words.next())?;
            let ids: Vec<NodeId> = w.nodes.keys().copied().collect();
            for &x in &ids {
                for &y in &ids {
                    if x != y && a.is_none_or(|a| a == x) && b.is_none_or(|b| b == y) {
                        if cmd == "hold" {
                            w.held.insert((x, y));
                        } else {
                            w.held.remove(&(x, y));
                        }
                    }
                }
            }
        }
        "partition" | "isolate" => {
            let rest: Vec<&str> = words.collect();
            let (left, right): (Vec<NodeId>, Vec<NodeId>) = if cmd == "isolate" {
                let id = node(w, rest.first().copied())?;
                (
                    vec![id],
                    w.nodes.keys().copied().filter(|&x| x != id).collect(),
                )
            } else {
                let bar = rest.iter().position(|&x| x == "|").ok_or("missing |")?;
                let side = |s: &[&str]| s.iter().map(|x| num(x)).collect::<Result<Vec<_>, _>>();
                (side(&rest[..bar])?, side(&rest[bar + 1..])?)
            };
            for &x in &left {
                for &y in &right {
                    w.cut.insert((x, y));
                    w.cut.insert((y, x));
                }
            }
        }
        "heal" => w.cut.clear(),
        "sync" => {
            let id = node(w, words.next())?;
            let manual = match words.next() {
                Some("manual") => true,
                Some("auto") => false,
                _ => return Err("sync N manual|auto".into()),
            };
            w.nodes.get_mut(&id).unwrap().manual = manual;
            if !manual {
                w.persist(id);
            }
        }
        "persist" => {
            let ids = match words.next() {
                Some(s) => vec![node(w, Some(s))?],
                None => w.up(),
            };
            for id in ids {
                w.persist(id);
            }
        }
        "crash" => {
            let id = node(w, words.next())?;
            let lost = w.crash(id);
            w.line(format!(
                "n{id} crashed; {lost} queued messages to or from it lost"
            ));
        }
        "restart" => {
            let id = node(w, words.next())?;
            if w.nodes[&id].r.is_some() {
                return Err(format!("n{id} is up"));
            }
            w.restart(id);
        }
        "compact" => {
            let id = node(w, words.next())?;
            let now = w.now;
            let n = w.nodes.get_mut(&id).unwrap();
            let r = n.r.as_mut().ok_or(format!("n{id} is down"))?;
            let upto = match words.next() {
                Some(s) => num(s)?,
                None => r.applied_head(),
            };
            r.compact(now, upto);
            w.drain(id);
        }
        "transfer" => {
            let id = node(w, words.next())?;
            let to = node(w, words.next())?;
            let now = w.now;
            let r = w.nodes.get_mut(&id).unwrap().r.as_mut().ok_or("down")?;
            if let Err(e) = r.transfer_leader(now, to) {
                w.line(format!("n{id}: transfer refused: {e}"));
            }
            w.drain(id);
        }
        "member" => {
            let id = node(w, words.next())?;
            let op = words.next().ok_or("add|remove")?;
            let x = num(words.next().ok_or("missing node")?)?;
            let change = match op {
                "add" => OooMembershipChange::AddVoter(x),
                "remove" => OooMembershipChange::Remove(x),
                _ => return Err(format!("bad change {op}")),
            };
            let now = w.now;
            let r = w.nodes.get_mut(&id).unwrap().r.as_mut().ok_or("down")?;
            if let Err(e) = r.change_membership(now, change) {
                w.line(format!("n{id}: change refused: {e}"));
            }
            w.drain(id);
        }
        "status" => {
            let ids = match words.next() {
                Some(s) => vec![node(w, Some(s))?],
                None => w.nodes.keys().copied().collect(),
            };
            for id in ids {
                out.push_str(&status(w, id));
                out.push('\n');
            }
        }
        "log" => {
            let id = node(w, words.next())?;
            out.push_str(&log(w, id));
        }
        "messages" => {
            let (a, b) = match words.next() {
                Some(l) => link(Some(l))?,
                None => (None, None),
            };
            let shown: Vec<&world::Queued> = w
                .queue
                .iter()
                .filter(|q| a.is_none_or(|a| a == q.from) && b.is_none_or(|b| b == q.to))
                .collect();
            if shown.is_empty() {
                out.push_str("no messages");
            }
            for q in shown {
                let mark = if w.cut.contains(&(q.from, q.to)) {
                    " (link cut)"
                } else if w.held.contains(&(q.from, q.to)) {
                    " (held)"
                } else {
                    ""
                };
                let _ = writeln!(out, "n{}>n{} {}{mark}", q.from, q.to, render::msg(&q.msg));
            }
        }
        "merge-table" => {
            let id = node(w, words.next())?;
            out.push_str(&merges::table(w, id)?);
        }
        "state" => {
            let id = node(w, words.next())?;
            let st = &w.nodes[&id].state;
            let v: Vec<String> = st
                .iter()
                .map(|(k, v)| format!("{k}={}", render::eid(*v)))
                .collect();
            let _ = write!(
                out,
                "n{id}: {}",
                if v.is_empty() {
                    "empty".into()
                } else {
                    v.join(" ")
                }
            );
        }
        "stats" => {
            let id = node(w, words.next())?;
            let r = w.nodes[&id].r.as_ref().ok_or("down")?;
            let s = r.stats();
            let _ = write!(
                out,
                "n{id}: campaigns={} pre-votes={} merges={} nulls={} superseded={} refused={} \
                 hole-resends={} timed-resends={} compactions={} snapshots-sent={} \
                 partial-images={} snapshots-installed={} transfers={}",
                s.campaigns,
                s.pre_votes,
                s.merges,
                s.nulls,
                s.superseded,
                s.refused,
                s.hole_resends,
                s.timed_resends,
                s.compactions,
                s.snapshots_sent,
                s.partial_images,
                s.snapshots_installed,
                s.transfers
            );
        }
        _ => return Err(format!("unknown command {cmd}")),
    }
    let trace = w.take_trace();
    Ok(format!("{trace}{out}"))
}

/// `nN: ROLE tT leader=L log=A..B holes=[..] committed<H+.. applied<H+.. pending=K`.
fn status(w: &World, id: NodeId) -> String {
    let n = &w.nodes[&id];
    let Some(r) = n.r.as_ref() else {
        return format!("n{id}: down");
    };
    let held: Vec<u64> = n.mem.keys().copied().collect();
    let (lo, hi) = (r.base(), held.last().map_or(r.base(), |&s| s + 1));
    let holes: Vec<u64> = (lo..hi).filter(|s| !n.mem.contains_key(s)).collect();
    let c_head = r.committed_head();
    let above: Vec<u64> = n
        .mem
        .range(c_head..)
        .filter(|(_, h)| h.committed)
        .map(|(&s, _)| s)
        .collect();
    let a_head = r.applied_head();
    let a_above: Vec<u64> = n.applied.range(a_head..).copied().collect();
    let plus = |v: &[u64]| {
        if v.is_empty() {
            String::new()
        } else {
            format!("+{}", render::list(v))
        }
    };
    let mut s = format!(
        "n{id}: {:?} t{} leader={} log={lo}..{hi} holes=[{}] committed<{c_head}{} applied<{a_head}{}",
        r.role(),
        r.term(),
        r.leader().map_or("-".into(), |l| l.to_string()),
        holes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
        plus(&above),
        plus(&a_above),
    );
    if r.pending() > 0 {
        s.push_str(&format!(" pending={}", r.pending()));
    }
    if r.base() > 0 {
        s.push_str(&format!(" base={}", r.base()));
    }
    if n.manual && !n.pending.is_empty() {
        s.push_str(&format!(" unsynced={}", n.pending.len()));
    }
    s
}

/// One line per slot held: `SLOT@TERM BODY [committed] [applied] [unsynced]`.
fn log(w: &World, id: NodeId) -> String {
    let n = &w.nodes[&id];
    let Some(r) = n.r.as_ref() else {
        return format!("n{id}: down\n");
    };
    let mut out = String::new();
    if r.base() > 0 {
        let _ = writeln!(out, "below {}: compacted", r.base());
    }
    if n.mem.is_empty() {
        out.push_str("empty\n");
    }
    for (s, h) in &n.mem {
        let _ = writeln!(
            out,
            "{}@{} {}{}{}{}",
            h.entry.seq,
            h.entry.term,
            render::body(&h.entry),
            if h.committed { " committed" } else { "" },
            if n.applied.contains(s) || (*s < r.applied_head()) {
                " applied"
            } else {
                ""
            },
            if h.durable { "" } else { " unsynced" }
        );
    }
    out
}
