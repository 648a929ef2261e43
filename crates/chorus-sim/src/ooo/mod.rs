//! Seeded simulation of out-of-order groups (parallel and dependent mode).
//!
//! Every node runs the production driver ([`chorus_runtime::ooo::driver::Driver`], the
//! code the runtime runs on its workers) around the real [`OooReplica`], with the real
//! [`OooStore`] on its own fault-injecting [`SimFs`] written by the runtime's own IO
//! routine ([`chorus_runtime::ooo::io::run_io`]), over a seeded network (delay, jitter,
//! loss, duplication, partitions). So the seeds check the code that decides what is
//! synced before it is sent, acknowledged or applied, not a copy of it. Nodes crash at
//! seeded times — right after a round, before its writes reach the disk, or in the middle
//! of the IO — and what was synced survives, unsynced writes are lost and the last one may
//! be torn; they restart from what the store recovers. The driver's state-machine work
//! (applies, checkpoints, images, installs) runs on a seeded job queue in a random order,
//! as the apply workers might, and its IO and jobs complete after seeded delays. Each node
//! drives a demo state machine (`sm`):
//!
//! * **parallel mode**: a block volume; each record writes a token to the blocks of its
//!   ranges (1–4 blocks of a small volume, so that writes conflict often);
//! * **dependent mode**: a key-value store in the WAL model — the leader executes each
//!   transaction (read one key, write another with a value derived from what it read)
//!   against its current state plus its admitted, not yet applied writes, then logs it;
//!   followers replay.
//!
//! Every entry is a **group** of records as the runtime packs concurrent appends
//! (`chorus_core::ooo::group`), half of them 2–3 records: the entry declares the union of
//! its records' declarations and its records apply in their order inside it; a dependent
//! group's transactions are executed in that order too (a later one reads what an earlier
//! one of the same group wrote).
//!
//! An operator **transfers leadership** every 200–700 ms of the fault time: the serving
//! leader is asked to hand over to another voter at random, whatever the faults are doing
//! to it (`OooOptions::transfers`).
//!
//! An operator **changes the voters** every 300–800 ms of the fault time
//! (`OooOptions::changes`): the serving leader is asked to add the spare node, remove a
//! voter (itself included) or replace one with the spare, keeping three or four voters;
//! the spare starts knowing no voters and catches up from the leader. Nodes outside the
//! final membership are left out of the final checks of caught-up state.
//!
//! An operator **trims** the serving leader every 300–900 ms of the fault time
//! (`OooOptions::trims`): it asks its driver to checkpoint and compact below a slot drawn
//! up to just past what every live follower holds (`Ev::Compact`, what the Trim RPC
//! sends), and checks each answer (the base, never past what it applied or was asked).
//! `OooOptions::trim_followers` trims any node up to its applied head instead, which
//! meets an open liveness gap (docs/reliability.md).
//!
//! Applies are run in a random order within each batch the replica releases, as a driver
//! with several apply threads would; an entry may be cut into pieces of independent
//! records applied apart (one seed in four applies inline, one to three pieces on the
//! others).
//!
//! Two seeds in three also **compact**: when a node's entries file passes a few KiB, the
//! driver has the state machine checkpoint (an image kept on its disk, surviving crashes)
//! and compacts the slots below, so a follower that falls behind a leader's base installs
//! the leader's image, streamed in pieces over the same lossy network. A restarted node starts from its
//! image and replays its log from the base. The checks, after every step and at the end:
//!
//! 1. every replica that commits a slot commits the same record there;
//! 2. every append ends at most once, Committed only if the slot committed with it, Failed
//!    only if it did not — and, after healing, every append of a live leader has ended;
//! 3. no replica applies a record after a later record that writes the same block or key
//!    (no two conflicting entries applied out of order);
//! 4. a leader announces serving only when every slot below its first new one is
//!    committed on it (it never serves before its merge completes);
//! 5. after healing, every replica's state equals the serial application of the
//!    committed log in slot order (records in group order), and (dependent mode) every
//!    committed transaction read exactly the value the serial order gives it — no dirty
//!    read of a failed write;
//! 6. (parallel seeds in conflict order) after healing, no committed entry has an earlier
//!    overlapping append of its own term whose slot committed something else — conflict
//!    order holds across leader changes, not only in what one leader reports.

mod checks;
mod host;
pub mod script;
mod sim;
mod sm;
pub mod volume;

use std::collections::BTreeMap;

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Mode, OooStats};
use chorus_core::replica::Nanos;

#[cfg(doc)]
use chorus_core::ooo::replica::{OooConfig, OooReplica};
#[cfg(doc)]
use chorus_storage::{fs::SimFs, ooo::OooStore};

use crate::MS;
use sim::Sim;

/// Settings of an out-of-order simulation.
#[derive(Clone, Debug)]
pub struct OooOptions {
    /// The mode under test.
    pub mode: Mode,
    /// Voters.
    pub voters: usize,
    /// Simulated time with faults.
    pub fault_time: Nanos,
    /// Simulated time to heal and settle afterwards.
    pub settle_time: Nanos,
    /// Inject faults at all.
    pub faults: bool,
    /// Blocks of the volume (parallel) or keys of the store (dependent).
    pub space: u64,
    /// Appends kept in flight by the clients.
    pub inflight: usize,
    /// Ghost guard on. Turning it off takes effect only in the test-only `broken` build.
    pub ghost_guard: bool,
    /// Checkpoint and compact (on the seeds not divisible by 3).
    pub compact: bool,
    /// An operator asks the serving leader to hand leadership to another voter every
    /// 200–700 ms of the fault time ([`OooReplica::transfer_leader`]), drawn from a
    /// random stream of its own; off, the trajectories of the seeds found before
    /// transfers existed replay exactly.
    pub transfers: bool,
    /// An operator changes the voters every 300–800 ms of the fault time
    /// ([`OooReplica::change_membership`]) among the voters and one spare node, drawn
    /// from a random stream of its own; off, there is no spare node and the trajectories
    /// of the seeds found before membership changes existed replay exactly.
    pub changes: bool,
    /// An operator asks a node at random to checkpoint and compact below a slot every
    /// 300–900 ms of the fault time (the Trim RPC of an out-of-order group,
    /// [`chorus_runtime::ooo::OooNode::compact`]), drawn from a random stream of its own;
    /// off, the trajectories of the seeds found before operator trims existed replay
    /// exactly.
    pub trims: bool,
    /// Operators' trims go to any node, up to its applied head; off (the default), only
    /// to the serving leader, up to what every live follower holds
    /// ([`chorus_core::ooo::replica::OooReplica::compactable`]). On, seed 50045 (parallel,
    /// no zeros ahead, no timed resends) ends with no leader: a follower that compacted
    /// past another's first uncommitted slot refuses it its vote (`grants_vote` rule 1),
    /// the three live voters' refusals form a cycle and the fourth abstains while it
    /// recovers entries it lost — a liveness gap of the vote rule under compaction, open.
    pub trim_followers: bool,
    /// Replicas pre-vote before campaigning ([`OooConfig::pre_vote`]); off, the
    /// trajectories of the seeds found before pre-vote existed replay exactly.
    pub pre_vote: bool,
    /// A follower behind the leader's base may be sent a partial image (what it lacks,
    /// [`OooReplica::image_scope`]) on three seeds of four, a quarter of those under a
    /// bound of 8 items; off, only whole images, and the trajectories of the seeds found
    /// before partial images existed replay exactly.
    pub partial_images: bool,
    /// Parallel mode: replicas commit in conflict order ([`OooConfig::conflict_order`])
    /// on the seeds ≡ 2 mod 3, and every result a serving leader reports is checked
    /// against it; off, the trajectories of the seeds found before it replay exactly.
    pub conflict_order: bool,
    /// With faults, a message is now and then held up for one to three election
    /// timeouts (one in a thousand; answers to campaigns one in ten): a message that sat
    /// in a paused process's socket buffer, or on a link retransmitting. A candidate has
    /// timed out and asks for pre-votes by the time such a vote arrives. Off, the
    /// trajectories of the seeds found before it replay exactly.
    pub late_messages: bool,
    /// The replicas commit without conflict order while the checker expects it (takes
    /// effect only in the test-only `broken` build: the check must bite).
    pub broken_conflict_order: bool,
    /// The merge keeps entries whose listed predecessors it made NULL (takes effect only
    /// in the test-only `broken` build: the end-of-seed conflict-order check must bite).
    pub broken_cascade: bool,
    /// The production driver runs every action before the writes of its batch are
    /// durable (takes effect only in the test-only `broken` build: the checks must bite
    /// on the driver, not only on the replica).
    pub broken_ack_before_sync: bool,
    /// The production driver tells a committed outcome before its slot is applied on the
    /// node that tells it (takes effect only in the test-only `broken` build: the
    /// applied-before-told check must bite).
    pub broken_ack_before_apply: bool,
    /// Dependent leaders list only uncommitted WAW writers below a trailing base (takes
    /// effect only in the test-only `broken` build: the apply-order checks must bite).
    pub broken_trail: bool,
    /// Storage faults at rest: an eighth of the restarts during the fault time first flip
    /// a bit in a synced entry record that valid records follow (one node at a time
    /// recovering what it lost), drawn from a random stream of their own; the node
    /// recovers from its peers
    /// ([`chorus_core::ooo::replica::Hard::after_loss`]). Off, the trajectories of the seeds
    /// found before it replay exactly.
    pub corrupt: bool,
    /// A replica recovering lost entries votes as if it had lost nothing (takes effect
    /// only in the test-only `broken` build: the committed-log checks must bite).
    pub broken_lost_guard: bool,
    /// Bytes of zeros every store keeps written past its end
    /// ([`OooStore::set_preallocate`]); `None` picks them by seed
    /// ([`crate::preallocate_by_seed`]); `Some(0)` gives the trajectories of the seeds
    /// found before stores wrote zeros ahead.
    pub preallocate: Option<u64>,
    /// [`OooConfig::timed_resend`] on every replica; `None` picks it by seed (`(seed / 32)
    /// % 3`: off, 2 or 4 median round trips); `Some(0)` gives the trajectories of the
    /// seeds found before timed resends existed.
    pub timed_resend: Option<u32>,
    /// The simulation's own clients append groups of records to the serving leader;
    /// off, only whoever drives the simulation appends (the volume simulation).
    pub client: bool,
}

impl Default for OooOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Parallel { span: 2 },
            voters: 3,
            fault_time: 3_000 * MS,
            settle_time: 3_000 * MS,
            faults: true,
            space: 64,
            inflight: 32,
            ghost_guard: true,
            compact: true,
            transfers: true,
            changes: true,
            trims: true,
            trim_followers: false,
            pre_vote: true,
            partial_images: true,
            conflict_order: true,
            late_messages: true,
            broken_conflict_order: false,
            broken_cascade: false,
            broken_trail: false,
            broken_ack_before_sync: false,
            broken_ack_before_apply: false,
            corrupt: true,
            broken_lost_guard: false,
            preallocate: None,
            timed_resend: None,
            client: true,
        }
    }
}

/// Parses `parallel` or `dependent`.
pub fn parse_mode(s: &str) -> Option<Mode> {
    match s {
        "parallel" => Some(Mode::Parallel { span: 2 }),
        "dependent" => Some(Mode::Dependent),
        _ => None,
    }
}

/// What one seed did and found.
#[derive(Clone, Debug, Default)]
pub struct OooReport {
    /// The seed.
    pub seed: u64,
    /// Invariant violations (empty when the run is clean).
    pub violations: Vec<String>,
    /// Counters.
    pub stats: BTreeMap<&'static str, u64>,
}

/// Whether two lists of block ranges share a block.
fn overlap(a: &[BlockRange], b: &[BlockRange]) -> bool {
    a.iter()
        .any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
}

/// A replica counter, read from its [`OooStats`].
type Counter = fn(&OooStats) -> u64;

/// Runs one seed: faults for `fault_time`, then everything heals and restarts, then
/// `settle_time` without faults, then the final checks.
pub fn run_seed(seed: u64, o: &OooOptions) -> OooReport {
    let mut sim = Sim::new(seed, o.clone());
    if o.faults {
        sim.schedule_faults();
    }
    sim.run_until(o.fault_time);
    sim.faults_on = false;
    for n in sim.nodes.values_mut() {
        n.cut = false;
    }
    let ids: Vec<NodeId> = sim.nodes.keys().copied().collect();
    for id in ids {
        sim.restart(id);
    }
    let settle = o.fault_time + o.settle_time;
    sim.run_until(settle);
    if sim.violations.is_empty() {
        sim.final_checks();
    }
    // Counters of the replicas alive at the end, summed over the nodes (a restart
    // starts a replica's counters afresh, hence "live").
    let live: [(&'static str, Counter); 19] = [
        ("superseded_seen_live", |s| s.superseded),
        ("catchup_limited_bytes", |s| s.catchup_bytes),
        ("catchup_deferred", |s| s.catchup_deferred),
        ("transfer_timeouts_sent_live", |s| s.transfers),
        ("membership_changes", |s| s.membership_changes),
        ("transfer_campaigns_live", |s| s.transfer_campaigns),
        ("pre_votes_live", |s| s.pre_votes),
        ("pre_votes_refused_by_lease_live", |s| {
            s.pre_votes_refused_by_lease
        }),
        ("campaigns_live", |s| s.campaigns),
        ("handoffs_live", |s| s.handoffs),
        ("partial_images_refused_live", |s| s.partial_images_refused),
        ("admitted_after_live", |s| s.admitted_after),
        ("held_at_quorum_live", |s| s.held_at_quorum),
        ("hole_resends_live", |s| s.hole_resends),
        ("timed_resends_live", |s| s.timed_resends),
        ("memberships_adopted_live", |s| s.memberships_adopted),
        ("lost_restored_live", |s| s.lost_restored),
        ("votes_refused_lost_live", |s| s.votes_refused_lost),
        ("vote_parts_sent_live", |s| s.vote_parts_sent),
    ];
    for (name, f) in live {
        let sum = sim
            .nodes
            .values()
            .filter_map(|n| n.driver.as_ref().map(|d| d.replica()))
            .map(|r| f(&r.stats()))
            .sum();
        sim.stats.insert(name, sum);
    }
    OooReport {
        seed,
        violations: sim.violations,
        stats: sim.stats,
    }
}

/// Runs seeds `start..start + count` on `threads` threads; a panicking seed is reported as
/// a violation. With a `deadline`, no seed starts after it (those running finish), so the
/// reports may cover fewer than `count` seeds.
pub fn run_batch(
    start: u64,
    count: u64,
    o: &OooOptions,
    threads: usize,
    deadline: Option<std::time::Instant>,
) -> Vec<OooReport> {
    crate::batch::run_seeds(
        start..start + count,
        threads,
        deadline,
        |seed| run_seed(seed, o),
        |seed, msg| OooReport {
            seed,
            violations: vec![format!("panicked: {msg}")],
            stats: BTreeMap::new(),
        },
    )
}
