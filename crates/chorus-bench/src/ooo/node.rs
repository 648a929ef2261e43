//! One replica of a benchmarked system, started the same way in the benchmark process
//! (node 1, the leader) and in a `chorus-bench replica` child process (nodes 2 and 3):
//! bind first (so every node's address is known before any starts), then start with the
//! peers' addresses.
//!
//! When asked to, a node records `(record id, CLOCK_MONOTONIC ns)` for every record it
//! applies — the first 8 bytes of every benchmark record are its id:
//! - out-of-order systems: the node's apply callback (the replica released the entry to
//!   the state machine: committed, and its dependencies applied);
//! - ordered: a replay thread following the committed tail ([`LogHandle::replay`]), i.e.
//!   the record is committed *as this replica knows it* and read back in log order — what
//!   an ordered state machine does to apply.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chorus_core::ooo::replica::Mode;
use chorus_runtime::ooo::{OooNode, OooNodeConfig};
use chorus_runtime::{Env, EnvConfig, LogHandle, Replayer};

use super::gap::mono_ns;
use super::System;

/// The group every benchmark cluster uses.
pub const GROUP: u64 = 1;

/// Records applies (or does nothing when off), and makes each apply cost what
/// `--apply-us` says.
#[derive(Debug, Default)]
pub struct Recorder {
    on: bool,
    /// Time each record's apply takes (asleep: a state machine waiting on its own IO or
    /// locks, which more apply threads overlap; the machine's 2 cores are not spent).
    cost: Duration,
    applies: Mutex<Vec<(u64, u64)>>,
}

/// The benchmark's state machine only notes when each record applied; it keeps no state.
/// A checkpoint therefore has nothing to write and succeeds, so that out-of-order nodes
/// compact their entries as a server does (`--ooo-compact-bytes`): without it a node keeps
/// every entry it was sent in memory for the whole run. An image is refused: a replica
/// that needed one (never a live follower: compaction waits for them) fails its point
/// loudly instead of skipping records' apply times.
impl chorus_runtime::ooo::OooStateMachine for Recorder {
    fn apply(
        &self,
        _slot: u64,
        records: &[(u32, chorus_core::ooo::group::Record)],
    ) -> std::io::Result<()> {
        for (_, r) in records {
            self.note(&r.data);
        }
        Ok(())
    }

    fn checkpoint(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn image(&self) -> std::io::Result<Vec<u8>> {
        Err(no_state())
    }

    fn restore(&self, _: &[u8]) -> std::io::Result<()> {
        Err(no_state())
    }
}

/// Makes this thread's sleeps end within a microsecond of their deadline: Linux lets a
/// normal thread's timers fire up to 50 µs late by default (its timer slack), which
/// would make a 50 µs apply cost ~100 µs. Once per thread.
fn fine_timer_slack() {
    thread_local! {
        static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    SET.with(|s| {
        if !s.get() {
            // SAFETY: PR_SET_TIMERSLACK takes a value in ns and changes only the
            // calling thread's timer slack; failure leaves the default, which is safe.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
            }
            s.set(true);
        }
    });
}

fn no_state() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the benchmark's apply recorder keeps no state to copy",
    )
}

impl Recorder {
    /// A recorder; `on = false` with no `cost` makes [`Recorder::note`] free.
    pub fn new(on: bool, cost: Duration) -> Self {
        Self {
            on,
            cost,
            applies: Mutex::new(Vec::new()),
        }
    }

    /// Applies the record with these bytes: takes the apply cost, then notes that it was
    /// applied now.
    pub fn note(&self, data: &[u8]) {
        if !self.cost.is_zero() {
            fine_timer_slack();
            std::thread::sleep(self.cost);
        }
        if !self.on || data.len() < 8 {
            return;
        }
        let id = u64::from_le_bytes(data[..8].try_into().expect("8"));
        let t = mono_ns();
        if let Ok(mut v) = self.applies.lock() {
            v.push((id, t));
        }
    }

    /// Whether applies are noted.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Whether the ordered system must follow its committed tail: to note applies or to
    /// pay their cost.
    fn replays(&self) -> bool {
        self.on || !self.cost.is_zero()
    }

    /// Everything noted so far.
    pub fn take(&self) -> Vec<(u64, u64)> {
        self.applies
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// How to run one node.
#[derive(Clone, Debug)]
pub struct NodeOpts {
    /// The system.
    pub system: System,
    /// Node id (1 leads).
    pub id: u64,
    /// Its own data directory.
    pub dir: PathBuf,
    /// Out-of-order nodes: threads applying committed entries (0: the driver thread).
    pub apply_threads: usize,
    /// Microseconds each record's apply takes ([`Recorder`]'s cost; the bench process
    /// passes it to the replica processes).
    pub apply_us: u64,
    /// Out-of-order nodes: this node's election timeout (the driver derives its
    /// heartbeat and resend intervals from it: a sixth of it each).
    pub election: Duration,
    /// Out-of-order nodes: [`chorus_core::ooo::replica::OooConfig::hole_resend`]; ordered
    /// nodes: [`chorus_core::replica::ReplicaConfig::gap_resend_after`], the same number.
    pub hole_resend: u64,
    /// Out-of-order leaders: [`chorus_core::ooo::replica::OooConfig::timed_resend`];
    /// ordered leaders: [`chorus_core::replica::ReplicaConfig::timed_resend`], the same
    /// number.
    pub timed_resend: u32,
    /// Out-of-order leaders: [`chorus_runtime::ooo::OooNodeConfig::freeze_interval`].
    pub freeze: Duration,
    /// Bytes of zeros every system's log keeps written past its end
    /// ([`chorus_storage::LogOptions::preallocate`],
    /// [`chorus_runtime::ooo::OooNodeConfig::preallocate`]).
    pub preallocate: u64,
    /// Out-of-order nodes: append with direct IO
    /// ([`chorus_runtime::ooo::OooNodeConfig::direct_io`]).
    pub direct_io: bool,
    /// Out-of-order nodes: compact the entries past this many bytes
    /// ([`chorus_runtime::ooo::OooNodeConfig::compact_bytes`]; 0: never).
    pub compact_bytes: u64,
}

/// A node that holds its replication port but has not started replicating: its opened
/// environment (it listens already; the group is created at start). Every system's
/// node is an environment: out-of-order groups share its transport as ordered ones do.
pub struct Bound(Env);

/// A running node.
pub enum Running {
    /// An out-of-order replica, with the environment hosting it.
    Ooo(Env, Arc<OooNode>),
    /// An ordered (PALF) replica.
    Ordered {
        /// Its environment.
        env: Env,
        /// The group.
        log: LogHandle,
        /// The tail follower applying (recording, or paying the apply cost), if any.
        replay: Option<Replayer>,
    },
}

/// The environment of an ordered node (`o.system` is [`System::Ordered`] or
/// [`System::OrderedNoRepair`]).
fn ordered_config(o: &NodeOpts) -> EnvConfig {
    let mut cfg = EnvConfig::new(o.id, o.dir.clone(), "127.0.0.1:0".parse().expect("address"));
    // Node 1 leads: the clients are co-located with it (as `chorus bench --local`).
    if o.id == 1 {
        cfg.replica.priority = 100;
    }
    // The ordered counterpart of the out-of-order leaders' hole resends, set alike; both
    // repairs off for the system standing for the Raft PolarFS measured.
    let repairs = o.system == System::Ordered;
    cfg.replica.gap_resend_after = if repairs { o.hole_resend as usize } else { 0 };
    cfg.replica.timed_resend = if repairs { o.timed_resend } else { 0 };
    cfg.log.preallocate = o.preallocate;
    cfg
}

/// Binds node `o.id`'s replication port on loopback; returns it with the address.
pub fn bind(o: &NodeOpts) -> Result<(Bound, SocketAddr), String> {
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("create {}: {e}", o.dir.display()))?;
    // The ordered settings are the replica's; an out-of-order node's environment only
    // hosts its group and carries its messages.
    let cfg = ordered_config(o);
    let env = Env::open(cfg).map_err(|e| format!("node {}: open env: {e}", o.id))?;
    let a = env.replication_addr();
    Ok((Bound(env), a))
}

/// Starts a bound node; `peers` names every voter's address as *this* node should dial
/// it (this node included).
pub fn start(
    b: Bound,
    o: &NodeOpts,
    peers: &[(u64, SocketAddr)],
    rec: Arc<Recorder>,
) -> Result<Running, String> {
    let Bound(env) = b;
    for &(id, a) in peers {
        if id != o.id {
            env.set_peer_addr(id, a.to_string());
        }
    }
    let ids: Vec<u64> = peers.iter().map(|p| p.0).collect();
    match o.system.is_ordered() {
        false => {
            let mode = match o.system {
                System::Parallel | System::ParallelTxn => Mode::Parallel { span: 2 },
                _ => Mode::Dependent,
            };
            let cfg = OooNodeConfig {
                others: Vec::new(),
                id: o.id,
                group: GROUP,
                voters: ids,
                mode,
                dir: o.dir.join("ooo"),
                election_timeout: o.election,
                apply_threads: o.apply_threads,
                catchup_rate: 0,
                conflict_order: o.system == System::ParallelTxn,
                compact_bytes: o.compact_bytes,
                hole_resend: o.hole_resend,
                timed_resend: o.timed_resend,
                freeze_interval: o.freeze,
                preallocate: o.preallocate,
                direct_io: o.direct_io,
                // The ordered nodes' environments measure their disk (and check it on
                // each append); these check nothing: the benchmark's disk has room.
                disk: None,
                fs: None,
            };
            let node = env
                .start_ooo_group(cfg, rec)
                .map_err(|e| format!("node {}: start: {e}", o.id))?;
            Ok(Running::Ooo(env, node))
        }
        true => {
            let log = env
                .create_group(GROUP, &ids, &[])
                .map_err(|e| format!("node {}: create group: {e}", o.id))?;
            let replay = if rec.replays() {
                Some(
                    log.replay(0, move |r| rec.note(&r.data))
                        .map_err(|e| format!("node {}: replay: {e}", o.id))?,
                )
            } else {
                None
            };
            Ok(Running::Ordered { env, log, replay })
        }
    }
}

impl Running {
    /// Stops the node.
    pub fn shutdown(self) {
        match self {
            Running::Ooo(env, n) => {
                drop(n);
                env.shutdown();
            }
            Running::Ordered { env, replay, .. } => {
                if let Some(r) = replay {
                    let _ = r.stop();
                }
                env.shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64) -> Vec<u8> {
        let mut d = id.to_le_bytes().to_vec();
        d.extend_from_slice(&[0; 16]);
        d
    }

    #[test]
    fn an_apply_takes_its_cost_and_is_noted_only_when_recording() {
        let cost = Duration::from_millis(2);
        let off = Recorder::new(false, cost);
        let t = std::time::Instant::now();
        off.note(&record(7));
        assert!(t.elapsed() >= cost, "{:?}", t.elapsed());
        assert!(off.take().is_empty());
        assert!(off.replays(), "an apply cost needs the ordered replay");

        let on = Recorder::new(true, Duration::ZERO);
        on.note(&record(9));
        on.note(b"short");
        let v = on.take();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, 9);
        assert!(on.take().is_empty(), "taken once");
        assert!(!Recorder::new(false, Duration::ZERO).replays());
    }

    #[test]
    fn the_ordered_system_without_repairs_turns_off_both_whatever_the_flags() {
        let o = |system| NodeOpts {
            system,
            id: 1,
            dir: PathBuf::from("/nonexistent"),
            apply_threads: 0,
            apply_us: 0,
            election: Duration::from_secs(1),
            hole_resend: 3,
            timed_resend: 2,
            freeze: Duration::ZERO,
            preallocate: 1 << 20,
            direct_io: true,
            compact_bytes: 0,
        };
        let with = ordered_config(&o(System::Ordered));
        assert_eq!(with.replica.gap_resend_after, 3);
        assert_eq!(with.replica.timed_resend, 2);
        let without = ordered_config(&o(System::OrderedNoRepair));
        assert_eq!(without.replica.gap_resend_after, 0);
        assert_eq!(without.replica.timed_resend, 0);
        // Everything else alike: only the repairs differ.
        assert_eq!(without.replica.priority, with.replica.priority);
        assert_eq!(without.log.preallocate, with.log.preallocate);
        assert!(System::OrderedNoRepair.is_ordered() && System::Ordered.is_ordered());
        assert!(!System::InOrder.is_ordered());
        assert_eq!(
            System::parse("ordered-no-repair"),
            Ok(System::OrderedNoRepair)
        );
    }
}
