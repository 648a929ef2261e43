//! One seeded run: a workload, a fault schedule drawn from the seed, a healing phase and the
//! liveness check.

use std::collections::BTreeMap;

use chorus_core::format::meta::AccessMode;
use chorus_core::format::meta::NodeId;
use chorus_core::replica::{CommitMode, MembershipChange, Nanos};
use chorus_core::rng::Rng;
use chorus_core::Lsn;
use chorus_storage::fs::CrashMode;

use crate::{Cluster, ClusterOptions, NetFaults, MS};

/// Settings of a batch of seeded runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Base cluster settings (voters, commit mode, broken variant).
    pub cluster: ClusterOptions,
    /// Vary cluster size (3 or 5), spares and priorities by seed.
    pub vary_shape: bool,
    /// Inject faults (otherwise only the workload runs).
    pub faults: bool,
    /// Length of the faulty phase.
    pub fault_time: Nanos,
    /// Length of the healed phase.
    pub settle_time: Nanos,
    /// After healing, an append must commit within this long.
    pub liveness_bound: Nanos,
    /// Normal disk sync latency bounds.
    pub disk: (Nanos, Nanos),
    /// Trim logs during the faulty phase, as a database does after its checkpoints, at a
    /// rate drawn per seed (none in a quarter of the seeds), so followers fall behind
    /// their leader's log start and are rebased. Drawn from a generator of its own: the
    /// other draws of a seed are the same with it on or off.
    pub trims: bool,
    /// The group is a mirror (PALF section 5.2): it starts in raw-write access mode and
    /// the workload mirrors a simulated primary's groups. In two seeds of three the
    /// faulty phase also switches the access mode (failover to append, switchover back to
    /// raw-write at a new primary); in the third no switch happens, and every committed
    /// group must be the primary's.
    pub mirror: bool,
    /// Each injected corruption damages two replicas at once, in disjoint ranges, with
    /// their draws from a generator of their own (the other draws of a seed stay the
    /// same): each replica under repair must serve the other a copy of its range.
    pub double_damage: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            cluster: ClusterOptions::default(),
            vary_shape: true,
            faults: true,
            fault_time: 3_000 * MS,
            settle_time: 4_000 * MS,
            liveness_bound: 3_000 * MS,
            disk: (50_000, 300_000),
            trims: true,
            mirror: false,
            double_damage: false,
        }
    }
}

/// What one seed did.
#[derive(Clone, Debug, Default)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Invariant violations (empty when the run is clean).
    pub violations: Vec<String>,
    /// Counters from the run.
    pub stats: BTreeMap<&'static str, u64>,
    /// End of the committed history.
    pub committed_end: u64,
}

/// Per-seed fault probabilities, in chances per 1000 steps of about a millisecond.
#[derive(Clone, Copy, Debug)]
struct Mix {
    crash: u64,
    outage: u64,
    corrupt: u64,
    partition: u64,
    clock: u64,
    slow_disk: u64,
    fsync: u64,
    membership: u64,
    transfer: u64,
    priority: u64,
}

impl Mix {
    fn draw(rng: &mut Rng) -> Self {
        let mut p = |max: u64| {
            if rng.chance(1, 4) {
                0
            } else {
                rng.below(max + 1)
            }
        };
        Self {
            crash: p(3),
            outage: p(1),
            corrupt: p(2),
            partition: p(3),
            clock: p(2),
            slow_disk: p(2),
            fsync: p(1),
            membership: p(3),
            transfer: p(2),
            priority: p(1),
        }
    }
}

/// Runs one seed and checks everything.
pub fn run_seed(seed: u64, base: &RunOptions) -> SeedReport {
    let mut rng = Rng::new(seed ^ 0x5EED_FA17_0000_0001);
    let mut opts = base.cluster.clone();
    if base.vary_shape {
        opts.voters = if rng.chance(1, 4) { 5 } else { 3 };
        opts.spares = rng.below(3) as usize;
        if rng.chance(1, 2) {
            for id in 1..=(opts.voters + opts.spares) as NodeId {
                opts.priorities.insert(id, rng.below(3) as u32);
            }
        }
    }
    if base.mirror {
        opts.access_mode = AccessMode::RawWrite;
    }
    // Drawn from a generator of its own, so that the other draws of a seed are the same
    // in mirror runs.
    let mut mrng = Rng::new(seed ^ 0x3141_5926_0000_0003);
    let mut drng = Rng::new(seed ^ 0x2718_2818_0000_0004);
    let switch_rate = if base.mirror && base.faults {
        [0, 2, 8][mrng.below(3) as usize]
    } else {
        0
    };
    let mut c = Cluster::new(seed, opts.clone());
    c.checker.strict_mirror = base.mirror && switch_rate == 0;
    let mut switch_tries = 0u32;
    if std::env::var_os("CHORUS_SIM_TRACE").is_some() {
        c.trace = Some(Vec::new());
    }
    let ids: Vec<NodeId> = c.nodes.keys().copied().collect();
    for &id in &ids {
        c.nodes.get_mut(&id).expect("node").disk = base.disk;
    }
    let mix = Mix::draw(&mut rng);
    if base.faults {
        c.net = NetFaults {
            loss_ppm: rng.below(30_000) as u32,
            dup_ppm: rng.below(10_000) as u32,
            jitter: rng.range(10_000, 2 * MS),
            long_delay_ppm: rng.below(5_000) as u32,
        };
        for &id in &ids {
            // Clock rates within the lease assumption (max drift 1%, so +-0.5% each).
            let ppm = rng.range(0, 10_000) as i64 - 5_000;
            c.set_clock_skew(id, ppm);
        }
    }
    let mut heal_at: Option<Nanos> = None;
    let mut last_corruption: Nanos = 0;
    let mut slow: BTreeMap<NodeId, Nanos> = BTreeMap::new();
    let append_gap = rng.range(200_000, 3 * MS);
    let mut t: Nanos = 0;
    let rec_max = rng.range(16, 3000);
    let mut trng = Rng::new(seed ^ 0x7819_3A5E_0000_0002);
    let trim_rate = if base.trims && base.faults {
        [0, 5, 20, 60][trng.below(4) as usize]
    } else {
        0
    };
    while t < base.fault_time {
        t += rng.range(append_gap / 2, append_gap * 3 / 2);
        c.run_until(t);
        if base.mirror {
            mirror_step(&mut c, &mut mrng);
        }
        workload_step(&mut c, &mut rng, rec_max);
        if !base.faults {
            continue;
        }
        if switch_rate > 0 && switch_tries == 0 && mrng.chance(switch_rate, 1000) {
            // An operator's switch, retried for a while (a switch to raw-write waits for
            // the log to be committed to its end).
            switch_tries = 200;
        }
        if switch_tries > 0 {
            switch_tries -= 1;
            if let Some(l) = c.leader() {
                let mode = match c.nodes[&l].replica().map(|r| r.access_mode()) {
                    Some(AccessMode::RawWrite) => AccessMode::Append,
                    _ => AccessMode::RawWrite,
                };
                if c.switch_mode(l, mode).is_ok() {
                    switch_tries = 0;
                }
            }
        }
        if trim_rate > 0 && trng.chance(trim_rate, 1000) {
            // The leader, or any replica, trims below a committed point of its own.
            let n = match c.leader() {
                Some(l) if trng.chance(1, 2) => l,
                _ => ids[trng.below(ids.len() as u64) as usize],
            };
            let span = c.nodes[&n]
                .replica()
                .zip(c.nodes[&n].log())
                .map(|(r, l)| (l.start_lsn(), r.committed_end()));
            if let Some((start, committed)) = span {
                if committed > start {
                    let lsn = start + trng.below(committed - start + 1);
                    c.trim(n, lsn);
                }
            }
        }
        if heal_at.is_some_and(|h| t >= h) {
            c.blocked.clear();
            heal_at = None;
        }
        let due: Vec<NodeId> = slow
            .iter()
            .filter(|(_, until)| **until <= t)
            .map(|(n, _)| *n)
            .collect();
        for n in due {
            slow.remove(&n);
            c.nodes.get_mut(&n).expect("node").disk = base.disk;
        }
        let pick = |rng: &mut Rng| ids[rng.below(ids.len() as u64) as usize];
        if rng.chance(mix.crash, 1000) {
            let n = pick(&mut rng);
            // In-order write-back: unsynced writes are lost from some point on and the last
            // surviving one may be torn. (Out-of-order write-back, `CrashMode::Arbitrary`,
            // can leave several holes in a block, more than the one damaged range repair
            // handles; see docs/architecture.md.) The draw that chose between the two modes
            // stays so that every seed, including the regression seeds, replays unchanged.
            let mode = CrashMode::Prefix;
            let _ = rng.chance(1, 2);
            let down = rng.range(10 * MS, 1_500 * MS);
            c.crash_for(n, mode, down);
        }
        if rng.chance(mix.corrupt, 1000) && t >= last_corruption + 1_000 * MS {
            // Synced data goes bad on one replica (a minority): it must repair from a peer,
            // never truncate committed log.
            let n = pick(&mut rng);
            if c.nodes[&n].is_up() {
                let down = rng.range(10 * MS, 500 * MS);
                c.crash_for(n, CrashMode::Prefix, down);
                if c.corrupt_synced_group(n) {
                    last_corruption = t;
                    if base.double_damage {
                        let others: Vec<NodeId> = ids.iter().copied().filter(|m| *m != n).collect();
                        let m = others[drng.below(others.len() as u64) as usize];
                        if c.nodes[&m].is_up() {
                            c.crash_for(m, CrashMode::Prefix, drng.range(10 * MS, 500 * MS));
                            c.corrupt_synced_group(m);
                        }
                    }
                }
            }
        }
        if rng.chance(mix.outage, 1000) {
            // A power outage: every node loses what it had not synced, at once.
            for &n in &ids {
                let down = rng.range(5 * MS, 300 * MS);
                c.crash_for(n, CrashMode::Prefix, down);
            }
        }
        if rng.chance(mix.partition, 1000) {
            match rng.below(3) {
                0 => {
                    let mut a = Vec::new();
                    let mut b = Vec::new();
                    for &id in &ids {
                        if rng.chance(1, 2) {
                            a.push(id)
                        } else {
                            b.push(id)
                        }
                    }
                    c.partition(&[a, b]);
                }
                1 => {
                    let n = pick(&mut rng);
                    let rest: Vec<NodeId> = ids.iter().copied().filter(|x| *x != n).collect();
                    c.partition(&[vec![n], rest]);
                }
                _ => {
                    let a = pick(&mut rng);
                    let b = pick(&mut rng);
                    if a != b {
                        c.block(a, b);
                    }
                }
            }
            heal_at = Some(t + rng.range(20 * MS, 1_500 * MS));
        }
        if rng.chance(mix.clock, 1000) {
            // Forward jumps small enough for the lease margin (2% of 400 ms).
            let n = pick(&mut rng);
            let by = rng.below(4 * MS);
            c.jump_clock(n, by);
        }
        if rng.chance(mix.slow_disk, 1000) {
            let n = pick(&mut rng);
            c.nodes.get_mut(&n).expect("node").disk = (2 * MS, 120 * MS);
            slow.insert(n, t + rng.range(50 * MS, 1_000 * MS));
        }
        if rng.chance(mix.fsync, 1000) {
            let n = pick(&mut rng);
            c.nodes[&n].fs.fail_next_sync(None);
        }
        if rng.chance(mix.membership, 1000) {
            membership_step(&mut c, &mut rng);
        }
        if rng.chance(mix.transfer, 1000) {
            if let Some(l) = c.leader() {
                let to = pick(&mut rng);
                let _ = c.transfer(l, to);
            }
        }
        if rng.chance(mix.priority, 1000) {
            let n = pick(&mut rng);
            let p = rng.below(3) as u32;
            c.set_priority(n, p);
        }
    }
    // Heal: no more faults, every node up, and a majority healthy.
    c.heal();
    for &id in &ids {
        c.nodes.get_mut(&id).expect("node").disk = base.disk;
        c.nodes[&id].fs.set_fault_rates(0, 0);
        c.restart(id);
    }
    let healed = t;
    let mut first_commit: Option<Nanos> = None;
    let mut probes: Vec<(Nanos, u64)> = Vec::new();
    let mut mirror_probes: Vec<Lsn> = Vec::new();
    let probe_until = healed + base.settle_time.saturating_sub(1_000 * MS);
    while t < healed + base.settle_time {
        t += 20 * MS;
        c.run_until(t);
        if t < probe_until {
            if let Some(l) = c.leader() {
                let mirror = c.nodes[&l].replica().map(|r| r.access_mode());
                if mirror == Some(AccessMode::RawWrite) {
                    if let Ok(ticket) = c.mirror(l) {
                        mirror_probes.push(ticket.lsn);
                    }
                } else if let Ok((_, tag)) = c.append(l, b"probe", 0) {
                    probes.push((t, tag));
                }
            }
        }
        if first_commit.is_none()
            && (probes
                .iter()
                .any(|(_, tag)| c.checker.committed_at(*tag).is_some())
                || mirror_probes.iter().any(|lsn| c.checker.ref_end > *lsn))
        {
            first_commit = Some(t);
        }
    }
    let now = c.now;
    match first_commit {
        Some(at) if at - healed <= base.liveness_bound => {}
        Some(at) => c.checker.report(
            now,
            format!(
                "liveness: first append after healing committed {:.3}s after healing (bound {:.3}s)",
                (at - healed) as f64 / 1e9,
                base.liveness_bound as f64 / 1e9
            ),
        ),
        None => c.checker.report(
            now,
            "liveness: no append committed after healing".to_string(),
        ),
    }
    // Every append accepted by a live member got exactly one result; nothing committed
    // was lost.
    if let Some(l) = c.leader() {
        let r = c.nodes[&l].replica().expect("up");
        let members: Vec<NodeId> = r
            .membership()
            .voters
            .iter()
            .chain(r.membership().learners.iter())
            .copied()
            .collect();
        if r.committed_end() < c.checker.ref_end {
            let ce = r.committed_end();
            let re = c.checker.ref_end;
            c.checker.report(
                now,
                format!("leader {l} committed end {ce} is below the committed history end {re}"),
            );
        }
        for id in members {
            let inc = c.nodes[&id].inc;
            if !c.nodes[&id].is_up() {
                continue;
            }
            let n = c.checker.unresolved(id, inc);
            if n > 0 {
                let role = c.nodes[&id].replica().map(|r| r.role());
                c.checker.report(
                    now,
                    format!("node {id} ({role:?}): {n} appends never got a result"),
                );
            }
        }
    }
    if let Some(t) = &c.trace {
        for l in t {
            eprintln!("{l}");
        }
        for n in c.nodes.values() {
            if let Some(r) = n.replica() {
                eprintln!(
                    "node {}: {:?} pid={} promised={} end={} flushed={} committed={} members={:?} progress={:?} drops={:?}",
                    n.id,
                    r.role(),
                    r.proposal_id(),
                    r.promised(),
                    r.end_lsn(),
                    r.flushed_end(),
                    r.committed_end(),
                    r.membership(),
                    r.follower_progress(),
                    r.drops()
                );
            }
        }
    }
    let mut stats = c.stats.clone();
    stats.insert("gap_resend_requests", c.gap_resend_requests());
    stats.insert("timed_resends", c.timed_resends());
    for (k, v) in &c.checker.outcomes {
        stats.insert(k, *v);
    }
    if base.mirror {
        stats.insert("mirrored_groups_committed", c.checker.mirrored_committed);
    }
    SeedReport {
        seed,
        violations: c.checker.violations.clone(),
        stats,
        committed_end: c.checker.ref_end,
    }
}

/// Mirror writes at the leader (or, now and then, at another node, which must refuse),
/// while the group is a mirror.
fn mirror_step(c: &mut Cluster, rng: &mut Rng) {
    let ids: Vec<NodeId> = c.nodes.keys().copied().collect();
    let target = match c.leader() {
        Some(l) if !rng.chance(1, 20) => l,
        _ => ids[rng.below(ids.len() as u64) as usize],
    };
    let raw = c.nodes[&target].replica().map(|r| r.access_mode()) == Some(AccessMode::RawWrite);
    // Against an append-mode leader too, now and then: it must refuse.
    if !raw && !rng.chance(1, 10) {
        return;
    }
    for _ in 0..rng.range(1, 4) {
        if c.mirror(target).is_err() {
            break;
        }
    }
}

fn workload_step(c: &mut Cluster, rng: &mut Rng, rec_max: u64) {
    let ids: Vec<NodeId> = c.nodes.keys().copied().collect();
    let target = match c.leader() {
        Some(l) if !rng.chance(1, 20) => l,
        _ => ids[rng.below(ids.len() as u64) as usize],
    };
    let n = rng.range(1, 4);
    for _ in 0..n {
        let len = rng.below(rec_max) as usize;
        let mut extra = vec![0u8; len];
        rng.fill(&mut extra);
        let ref_csn = if rng.chance(1, 10) {
            rng.below(1 << 20)
        } else {
            0
        };
        if c.append(target, &extra, ref_csn).is_err() {
            break;
        }
    }
}

fn membership_step(c: &mut Cluster, rng: &mut Rng) {
    let Some(l) = c.leader() else { return };
    let r = c.nodes[&l].replica().expect("up");
    let m = r.membership().clone();
    let all: Vec<NodeId> = c.nodes.keys().copied().collect();
    let outside: Vec<NodeId> = all
        .iter()
        .copied()
        .filter(|n| !m.voters.contains(n) && !m.learners.contains(n))
        .collect();
    let pick = |v: &[NodeId], rng: &mut Rng| v[rng.below(v.len() as u64) as usize];
    let change = match rng.below(5) {
        0 if !outside.is_empty() => MembershipChange::AddLearner(pick(&outside, rng)),
        1 if !m.learners.is_empty() => MembershipChange::Promote(pick(&m.learners, rng)),
        2 if m.voters.len() > 3 => MembershipChange::Remove(pick(&m.voters, rng)),
        3 if !outside.is_empty() => MembershipChange::Replace {
            old: pick(&m.voters, rng),
            new: pick(&outside, rng),
        },
        4 if !m.learners.is_empty() => MembershipChange::Remove(pick(&m.learners, rng)),
        _ => return,
    };
    let _ = c.change(l, change);
}

/// Runs seeds `start..start + count` (stopping early when `deadline` passes, if given) on
/// `threads` threads; returns the reports in seed order.
pub fn run_batch(
    start: u64,
    count: u64,
    opts: &RunOptions,
    threads: usize,
    deadline: Option<std::time::Instant>,
) -> Vec<SeedReport> {
    crate::batch::run_seeds(
        start..start + count,
        threads,
        deadline,
        |seed| run_seed(seed, opts),
        |seed, msg| SeedReport {
            seed,
            violations: vec![format!("panicked: {msg}")],
            stats: BTreeMap::new(),
            committed_end: 0,
        },
    )
}

/// Parses a commit mode name.
pub fn parse_commit_mode(s: &str) -> Option<CommitMode> {
    match s {
        "piggyback" | "piggy" => Some(CommitMode::Piggyback),
        "sync" => Some(CommitMode::Sync),
        "async" => Some(CommitMode::Async { interval: 10 * MS }),
        _ => None,
    }
}
