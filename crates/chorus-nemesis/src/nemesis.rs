//! The faults, and a seeded choice among them.
//!
//! Each fault is injected and later healed; the schedule in [`crate::run`] injects one at
//! a time, holds it for a few seconds (a pause always outlasts the lease), heals it and
//! rests. Which fault, which node and for how long follow from the run's seed; what the
//! cluster does in between does not (real processes), so a seed names a schedule, not a
//! trajectory.

use std::fmt;

use crate::cluster::Cluster;
use crate::{Error, Rng};

/// A kind of fault the nemesis may choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Network partitions: a node isolated, a minority split off, one link one-way, a
    /// bridge (two halves that share one node), the clients cut from a node.
    Partition,
    /// Packet loss on every node (10–40 %).
    Loss,
    /// `kill -9` of a node (the leader half the time), restarted at the heal.
    Kill,
    /// SIGSTOP of a node (the leader half the time) for longer than a lease, then SIGCONT.
    Pause,
    /// A node killed, one to three bits flipped at rest in its meta files and any block
    /// of its log (the tail's damage found by recovery at open, the older blocks' by the
    /// scrubber, and either repaired from peers) or its out-of-order entries, restarted.
    Flip,
    /// As `Flip`, in any file, a chunk's data and a state machine's files included. Not
    /// in `all`: those are not repaired from peers (a known gap, `docs/reliability.md`).
    Rot,
    /// A follower cut off long enough to fall behind, then the leader killed as the cut
    /// heals: the follower that fell behind may win the next election, and must learn
    /// the longest log of a majority before it serves (PALF's reconfirmation).
    Lag,
    /// A node's disk filled (a tmpfs of its own) until 0 to 96 MiB are left: below
    /// `min_free_bytes` its leaders refuse appends; at 0 its writes fail with ENOSPC and
    /// its groups stop, to restart by themselves once the filler is gone.
    Disk,
    /// A node's wall clock (CLOCK_REALTIME, through libfaketime) jumped forward or back,
    /// by a few milliseconds (within `max_clock_drift_ppm` over a lease) or by seconds
    /// (far beyond it), and back to real time at the heal. Leases run on the monotonic
    /// clock, which is not jumped here (the simulator jumps and skews it).
    Clock,
    /// Power loss: a node (or, one time in three, every node at once) killed with
    /// SIGKILL and every write it had not synced dropped, through the power-loss file
    /// system its data directory is mounted on ([`crate::lazyfs`]); restarted at the
    /// heal.
    Power,
    /// As `Power`, every node at once, every time (a whole site's power). Not in `all`.
    PowerAll,
}

impl Kind {
    /// Every kind `all` names.
    pub const ALL: [Kind; 9] = [
        Kind::Partition,
        Kind::Loss,
        Kind::Kill,
        Kind::Pause,
        Kind::Flip,
        Kind::Lag,
        Kind::Disk,
        Kind::Clock,
        Kind::Power,
    ];

    /// Parses a comma-separated list (`all` for every kind, `none` for no faults).
    pub fn parse_list(s: &str) -> Result<Vec<Kind>, String> {
        let mut out = Vec::new();
        for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "all" => out.extend(Kind::ALL),
                "none" => {}
                "partition" => out.push(Kind::Partition),
                "loss" => out.push(Kind::Loss),
                "kill" => out.push(Kind::Kill),
                "pause" => out.push(Kind::Pause),
                "flip" => out.push(Kind::Flip),
                "rot" => out.push(Kind::Rot),
                "lag" => out.push(Kind::Lag),
                "disk" => out.push(Kind::Disk),
                "clock" => out.push(Kind::Clock),
                "power" => out.push(Kind::Power),
                "power-all" => out.push(Kind::PowerAll),
                _ => {
                    return Err(format!(
                        "nemesis `{w}` is not one of partition, loss, kill, pause, flip, rot, lag, disk, clock, power, power-all, all, none"
                    ))
                }
            }
        }
        out.dedup();
        Ok(out)
    }
}

/// A fault in force.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Directed cuts `(from, to)`: `to` drops what `from` sends (0 is the clients).
    Cuts {
        /// The cuts.
        cuts: Vec<(usize, usize)>,
        /// What they make.
        shape: String,
    },
    /// Every node drops this percentage of the packets it receives.
    Loss(u8),
    /// The node is killed.
    Kill(usize),
    /// The node is stopped.
    Pause(usize),
    /// The node is killed and bits in its files flipped (`true`: only in files its
    /// replicas repair from peers, `Kind::Flip`; `false`: anywhere, `Kind::Rot`).
    Flip(usize, bool),
    /// `lagging` is cut off from every other node; at the heal, `leader` is killed as
    /// the cut heals, and restarted a little later.
    Lag {
        /// The follower that falls behind.
        lagging: usize,
        /// The leader killed at the heal.
        leader: usize,
    },
    /// The node's disk filled until `leave` bytes are left.
    Disk {
        /// The node.
        node: usize,
        /// Bytes left free.
        leave: u64,
    },
    /// These nodes lose power: killed, their unsynced writes dropped.
    Power(Vec<usize>),
    /// The node's clocks offset by `secs`.
    Clock {
        /// The node.
        node: usize,
        /// The offset from real time, in seconds.
        secs: f64,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Cuts { cuts, shape } => write!(f, "partition {shape} {cuts:?}"),
            Fault::Loss(p) => write!(f, "loss {p}%"),
            Fault::Kill(n) => write!(f, "kill -9 node {n}"),
            Fault::Pause(n) => write!(f, "SIGSTOP node {n}"),
            Fault::Flip(n, true) => write!(f, "flip bits at rest on node {n}"),
            Fault::Flip(n, false) => write!(f, "rot bits at rest anywhere on node {n}"),
            Fault::Lag { lagging, leader } => write!(
                f,
                "node {lagging} cut off to fall behind, then leader {leader} killed as it heals"
            ),
            Fault::Disk { node, leave } => {
                write!(f, "disk of node {node} filled, {} MiB left", leave >> 20)
            }
            Fault::Clock { node, secs } => write!(f, "clock of node {node} jumped {secs:+.3} s"),
            Fault::Power(nodes) => write!(f, "power lost on nodes {nodes:?}"),
        }
    }
}

fn both_ways(a: &[usize], b: &[usize]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for &x in a {
        for &y in b {
            v.push((x, y));
            v.push((y, x));
        }
    }
    v
}

/// Chooses the next fault among `kinds` for a cluster of `n` nodes whose leader (if
/// known) is `leader`.
pub fn choose(rng: &mut Rng, kinds: &[Kind], n: usize, leader: Option<usize>) -> Option<Fault> {
    if kinds.is_empty() {
        return None;
    }
    let kind = kinds[rng.range(0, kinds.len() as u64) as usize];
    let target = |rng: &mut Rng| match leader {
        Some(l) if rng.chance(50) => l,
        _ => rng.range(1, n as u64 + 1) as usize,
    };
    let all: Vec<usize> = (1..=n).collect();
    Some(match kind {
        Kind::Partition => {
            let shape = rng.range(0, 5);
            match shape {
                0 => {
                    let x = target(rng);
                    let rest: Vec<usize> = all.iter().copied().filter(|&y| y != x).collect();
                    Fault::Cuts {
                        cuts: both_ways(&[x], &rest),
                        shape: format!("isolating node {x}"),
                    }
                }
                1 => {
                    let mut nodes = all.clone();
                    for i in (1..nodes.len()).rev() {
                        let j = rng.range(0, i as u64 + 1) as usize;
                        nodes.swap(i, j);
                    }
                    let k = rng.range(1, (n / 2) as u64 + 1) as usize;
                    let (minority, majority) = nodes.split_at(k);
                    Fault::Cuts {
                        cuts: both_ways(minority, majority),
                        shape: format!("splitting {minority:?} from {majority:?}"),
                    }
                }
                2 if n >= 2 => {
                    let x = target(rng);
                    let mut y = rng.range(1, n as u64 + 1) as usize;
                    if y == x {
                        y = x % n + 1;
                    }
                    Fault::Cuts {
                        cuts: vec![(y, x)],
                        shape: format!("one way: node {x} cannot hear node {y}"),
                    }
                }
                3 if n >= 3 => {
                    let m = target(rng);
                    let rest: Vec<usize> = all.iter().copied().filter(|&y| y != m).collect();
                    let (a, b) = rest.split_at(rest.len() / 2);
                    Fault::Cuts {
                        cuts: both_ways(a, b),
                        shape: format!("bridge: {a:?} and {b:?} each reach only node {m}"),
                    }
                }
                _ => {
                    let x = target(rng);
                    Fault::Cuts {
                        cuts: both_ways(&[0], &[x]),
                        shape: format!("the clients cut from node {x}"),
                    }
                }
            }
        }
        Kind::Loss => Fault::Loss(rng.range(10, 41) as u8),
        Kind::Kill => Fault::Kill(target(rng)),
        Kind::Pause => Fault::Pause(target(rng)),
        Kind::Flip => Fault::Flip(rng.range(1, n as u64 + 1) as usize, true),
        Kind::Rot => Fault::Flip(rng.range(1, n as u64 + 1) as usize, false),
        Kind::Lag => {
            let leader = leader.unwrap_or(1);
            let others: Vec<usize> = all.iter().copied().filter(|&x| x != leader).collect();
            if others.is_empty() {
                return None;
            }
            let lagging = others[rng.range(0, others.len() as u64) as usize];
            Fault::Lag { lagging, leader }
        }
        Kind::Power if rng.chance(33) => Fault::Power(all.clone()),
        Kind::PowerAll => Fault::Power(all.clone()),
        Kind::Power => Fault::Power(vec![target(rng)]),
        Kind::Disk => Fault::Disk {
            node: target(rng),
            leave: [0u64, 1, 32, 96][rng.range(0, 4) as usize] << 20,
        },
        Kind::Clock => {
            let magnitude = if rng.chance(50) {
                rng.range(1, 6) as f64 / 1e3
            } else {
                rng.range(500, 5001) as f64 / 1e3
            };
            Fault::Clock {
                node: target(rng),
                secs: if rng.chance(50) {
                    magnitude
                } else {
                    -magnitude
                },
            }
        }
    })
}

/// Injects `f`. Returns what was done (for a flip, which bits).
pub fn inject(c: &mut Cluster, f: &Fault, rng: &mut Rng) -> Result<String, Error> {
    match f {
        Fault::Cuts { cuts, .. } => {
            for &(from, to) in cuts {
                if to > 0 {
                    c.net.cut(from, to)?;
                } else {
                    // The clients are in the harness's namespace: cut what reaches them
                    // by cutting the other direction too (the node then hears nothing
                    // from them, and its answers are lost with the requests).
                    c.net.cut(0, from)?;
                }
            }
            Ok(f.to_string())
        }
        Fault::Loss(p) => {
            for i in 1..=c.nodes.len() {
                c.net.set_loss(i, *p)?;
            }
            Ok(f.to_string())
        }
        Fault::Kill(n) => {
            c.kill(*n);
            Ok(f.to_string())
        }
        Fault::Pause(n) => {
            c.pause(*n);
            Ok(f.to_string())
        }
        Fault::Lag { lagging, .. } => {
            let rest: Vec<usize> = (1..=c.nodes.len()).filter(|x| x != lagging).collect();
            for (from, to) in both_ways(&[*lagging], &rest) {
                c.net.cut(from, to)?;
            }
            Ok(f.to_string())
        }
        Fault::Disk { node, leave } => {
            let took = c.fill_disk(*node, *leave)?;
            Ok(format!("{f} ({} MiB written)", took >> 20))
        }
        Fault::Clock { node, secs } => {
            c.set_clock(*node, *secs)?;
            Ok(f.to_string())
        }
        Fault::Power(nodes) => {
            let lost: Vec<String> = nodes
                .iter()
                .zip(c.lose_power(nodes)?)
                .map(|(n, b)| format!("node {n}: {b} bytes"))
                .collect();
            Ok(format!("{f}: unsynced writes dropped, {}", lost.join(", ")))
        }
        Fault::Flip(n, repairable) => {
            c.kill(*n);
            let count = rng.range(1, 4) as usize;
            let flipped = c.flip_bytes(*n, rng, count, *repairable);
            Ok(format!("{f}: {}", flipped.join(", ")))
        }
    }
}

/// Heals `f`.
pub fn heal(c: &mut Cluster, f: &Fault) -> Result<(), Error> {
    match f {
        Fault::Cuts { .. } | Fault::Loss(_) => c.net.heal(),
        Fault::Kill(n) | Fault::Flip(n, _) => c.start_node(*n),
        Fault::Power(nodes) => {
            for &n in nodes {
                c.start_node(n)?;
            }
            Ok(())
        }
        // The leader's restart is the run's, a little later (see `crate::run`).
        Fault::Lag { leader, .. } => {
            c.kill(*leader);
            c.net.heal()
        }
        Fault::Pause(n) => {
            c.resume(*n);
            Ok(())
        }
        Fault::Disk { node, .. } => c.free_disk(*node),
        Fault::Clock { node, .. } => c.set_clock(*node, 0.0),
    }
}

/// Heals everything: the network, every paused node, every node down, every disk filled
/// and every clock offset.
pub fn heal_all(c: &mut Cluster) -> Result<(), Error> {
    c.net.heal()?;
    for i in 1..=c.nodes.len() {
        c.resume(i);
        c.start_node(i)?;
        c.free_disk(i)?;
        if c.faketime() {
            c.set_clock(i, 0.0)?;
        }
    }
    Ok(())
}
