//! Every metric of a node in one exposition: the groups of every mode it hosts, labelled
//! `node`, `group` and `mode` (`ordered`, `parallel` or `dependent`), and the node's own
//! (disk, transport, workers). A concept both kinds of group have is one family — appends,
//! results, log writes and fsyncs, hard-state saves, leadership, stops, timed resends,
//! append latency — and what only one mode has keeps a family of its own, still labelled
//! by mode. `docs/operations.md` lists them all.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use chorus_core::ooo::replica::Mode;

use super::Env;
use crate::group::{Group, GroupId, GroupStatus};
use crate::metrics::{Exposition, Kind};
use crate::ooo::{OooLatency, OooNode, OooStatus};

/// The `mode` label of an out-of-order group.
pub fn mode_label(mode: Mode) -> &'static str {
    match mode {
        Mode::Parallel { .. } => "parallel",
        Mode::Dependent => "dependent",
    }
}

type OrderedCounter = fn(&Group) -> u64;
type OrderedGauge = fn(&GroupStatus) -> u64;
type OooValue = fn(&OooStatus) -> u64;

/// Families both kinds of group report: (name, kind, help, ordered, out-of-order).
#[allow(clippy::type_complexity)]
const SHARED: [(&str, Kind, &str, Option<OrderedCounter>, OooValue); 7] = [
    (
        "chorus_appends_total",
        Kind::Counter,
        "Appends (records) accepted by this replica as leader.",
        Some(|g| g.counters.appends.load(Ordering::Relaxed)),
        |s| s.counters.appends,
    ),
    (
        "chorus_commits_total",
        Kind::Counter,
        "Appends reported committed.",
        Some(|g| g.counters.committed.load(Ordering::Relaxed)),
        |s| s.counters.committed,
    ),
    (
        "chorus_failures_total",
        Kind::Counter,
        "Appends reported failed.",
        Some(|g| g.counters.failed.load(Ordering::Relaxed)),
        |s| s.counters.failed,
    ),
    (
        "chorus_log_writes_total",
        Kind::Counter,
        "Log writes: ordered, write calls (each a batch of groups); out-of-order, entries written.",
        Some(|g| g.counters.log_writes.load(Ordering::Relaxed)),
        |s| s.counters.writes,
    ),
    (
        "chorus_log_fsyncs_total",
        Kind::Counter,
        "Log fdatasync calls that wrote something.",
        Some(|g| g.counters.fsyncs.load(Ordering::Relaxed)),
        |s| s.counters.syncs,
    ),
    (
        "chorus_meta_saves_total",
        Kind::Counter,
        "Durable saves of the replica's hard state (ordered: meta records; out-of-order: term, vote and base).",
        Some(|g| g.counters.meta_saves.load(Ordering::Relaxed)),
        |s| s.counters.hard_saves,
    ),
    (
        "chorus_timed_resends_total",
        Kind::Counter,
        "Times this replica, as a leader, sent a follower what it had not acknowledged again because it went unacknowledged for a few of its round trips.",
        None,
        |s| s.stats.timed_resends,
    ),
];

/// Families of ordered groups only, read from their counters.
const ORDERED_COUNTERS: [(&str, &str, OrderedCounter); 4] = [
    (
        "chorus_append_bytes_total",
        "Payload bytes accepted (ordered groups).",
        |g| g.counters.append_bytes.load(Ordering::Relaxed),
    ),
    (
        "chorus_log_bytes_written_total",
        "Bytes written to the log (ordered groups: groups, headers included).",
        |g| g.counters.log_bytes.load(Ordering::Relaxed),
    ),
    (
        "chorus_inputs_dropped_total",
        "Inputs the replica dropped (bad or stale; ordered groups).",
        |g| g.counters.drops.load(Ordering::Relaxed),
    ),
    (
        "chorus_slow_rounds_total",
        "Rounds of this replica (its actions run: writes, reads for peers, sends) that ran longer than a heartbeat interval; meanwhile it sent no heartbeat, vote or acknowledgement, so its peers may take it for gone (ordered groups).",
        |g| g.counters.slow_rounds.load(Ordering::Relaxed),
    ),
];

/// Families of ordered groups only, read from their status.
const ORDERED_STATUS: [(&str, Kind, &str, OrderedGauge); 10] = [
    (
        "chorus_end_lsn",
        Kind::Gauge,
        "End of the written log.",
        |s| s.end_lsn,
    ),
    (
        "chorus_flushed_lsn",
        Kind::Gauge,
        "End of the durable log.",
        |s| s.flushed_end,
    ),
    (
        "chorus_committed_lsn",
        Kind::Gauge,
        "Committed end known to this replica.",
        |s| s.committed_end,
    ),
    (
        "chorus_pending_appends",
        Kind::Gauge,
        "Appends waiting for a result.",
        |s| s.pending_appends as u64,
    ),
    (
        "chorus_gap_resend_requests_total",
        Kind::Counter,
        "Times this replica, as a follower, asked its leader to resend past a gap at once (it held later appends).",
        |s| s.gap_resend_requests,
    ),
    (
        "chorus_log_rebased_total",
        Kind::Counter,
        "Times this replica's log was started again, empty, at its leader's log start because it had fallen behind it (the leader had trimmed what it needed); readers of this replica find nothing below the new start.",
        |s| s.rebased,
    ),
    (
        "chorus_log_repaired_total",
        Kind::Counter,
        "Damaged log ranges of this replica (found at open, or in sealed blocks by the scrubber) replaced with a peer's copy.",
        |s| s.repaired,
    ),
    (
        "chorus_rebases_sent_total",
        Kind::Counter,
        "Times this replica told a follower or candidate behind its log start to start its log again there.",
        |s| s.rebases_sent,
    ),
    (
        "chorus_append_outcome_unknown_total",
        Kind::Counter,
        "Appends whose outcome became unknown because this replica fell behind the leader's log start (trimmed) before learning it.",
        |s| s.outcomes_unknown,
    ),
    (
        "chorus_timed_resends_total",
        Kind::Counter,
        "",
        |s| s.timed_resends,
    ),
];

/// Families of out-of-order groups only.
const OOO: [(&str, Kind, &str, OooValue); 35] = [
    (
        "chorus_committed_slots",
        Kind::Gauge,
        "Out-of-order groups: first slot not known committed here.",
        |s| s.committed_head,
    ),
    (
        "chorus_applied_slots",
        Kind::Gauge,
        "Out-of-order groups: first slot not applied here.",
        |s| s.applied_head,
    ),
    (
        "chorus_group_entries_total",
        Kind::Counter,
        "Out-of-order groups: group entries appended as leader (each packs one or more records).",
        |s| s.counters.groups,
    ),
    (
        "chorus_messages_received_total",
        Kind::Counter,
        "Out-of-order groups: replication messages received.",
        |s| s.counters.msgs_in,
    ),
    (
        "chorus_messages_sent_total",
        Kind::Counter,
        "Out-of-order groups: replication messages sent.",
        |s| s.counters.msgs_out,
    ),
    (
        "chorus_applied_total",
        Kind::Counter,
        "Out-of-order groups: entries applied to the state machine.",
        |s| s.counters.applied,
    ),
    (
        "chorus_campaigns_total",
        Kind::Counter,
        "Out-of-order groups: elections started here.",
        |s| s.stats.campaigns,
    ),
    (
        "chorus_merges_total",
        Kind::Counter,
        "Out-of-order groups: merges run by a new leader.",
        |s| s.stats.merges,
    ),
    (
        "chorus_merge_nulls_total",
        Kind::Counter,
        "Out-of-order groups: slots a merge decided NULL.",
        |s| s.stats.nulls,
    ),
    (
        "chorus_entries_refused_total",
        Kind::Counter,
        "Out-of-order groups: appends refused (not the leader, window full, bad declaration).",
        |s| s.stats.refused,
    ),
    (
        "chorus_catchup_bytes_total",
        Kind::Counter,
        "Out-of-order groups: bytes sent to lagging followers by streaming catch-up.",
        |s| s.stats.catchup_bytes,
    ),
    (
        "chorus_catchup_deferred_total",
        Kind::Counter,
        "Out-of-order groups: catch-up pieces held back by the rate limit.",
        |s| s.stats.catchup_deferred,
    ),
    (
        "chorus_base_slots",
        Kind::Gauge,
        "Out-of-order groups: first slot still in the entries file (below it, compacted into the state machine's image).",
        |s| s.counters.base,
    ),
    (
        "chorus_entries_file_bytes",
        Kind::Gauge,
        "Out-of-order groups: bytes of the entries file.",
        |s| s.counters.log_bytes,
    ),
    (
        "chorus_checkpoints_total",
        Kind::Counter,
        "Out-of-order groups: state machine checkpoints (each followed by a compaction).",
        |s| s.counters.checkpoints,
    ),
    (
        "chorus_images_sent_total",
        Kind::Counter,
        "Out-of-order groups: state machine images built for followers behind the base.",
        |s| s.counters.images,
    ),
    (
        "chorus_partial_images_sent_total",
        Kind::Counter,
        "Out-of-order groups: partial images (what a follower lacks) among them.",
        |s| s.counters.partial_images,
    ),
    (
        "chorus_image_bytes_sent_total",
        Kind::Counter,
        "Out-of-order groups: bytes of the images built.",
        |s| s.counters.image_bytes,
    ),
    (
        "chorus_images_installed_total",
        Kind::Counter,
        "Out-of-order groups: leaders' images installed here.",
        |s| s.counters.installs,
    ),
    (
        "chorus_partial_images_installed_total",
        Kind::Counter,
        "Out-of-order groups: partial images among them.",
        |s| s.counters.partial_installs,
    ),
    (
        "chorus_pre_votes_total",
        Kind::Counter,
        "Out-of-order groups: pre-votes started here.",
        |s| s.stats.pre_votes,
    ),
    (
        "chorus_pre_votes_refused_by_lease_total",
        Kind::Counter,
        "Out-of-order groups: pre-votes this replica refused because it heard a leader within an election timeout.",
        |s| s.stats.pre_votes_refused_by_lease,
    ),
    (
        "chorus_transfers_total",
        Kind::Counter,
        "Out-of-order groups: leader transfers this replica started (TimeoutNow sent).",
        |s| s.stats.transfers,
    ),
    (
        "chorus_membership_changes_total",
        Kind::Counter,
        "Out-of-order groups: membership changes this replica completed as leader.",
        |s| s.stats.membership_changes,
    ),
    (
        "chorus_handoffs_total",
        Kind::Counter,
        "Out-of-order groups: leaderships handed over by a leader a change removed.",
        |s| s.stats.handoffs,
    ),
    (
        "chorus_entries_admitted_after_total",
        Kind::Counter,
        "Out-of-order groups: entries admitted here as leader with an uncommitted predecessor to commit after (RAW in dependent mode, an overlap under conflict order).",
        |s| s.stats.admitted_after,
    ),
    (
        "chorus_entries_held_at_quorum_total",
        Kind::Counter,
        "Out-of-order groups: entries led here that had a majority before such a predecessor committed: held back by the commit rule.",
        |s| s.stats.held_at_quorum,
    ),
    (
        "chorus_hole_resends_total",
        Kind::Counter,
        "Out-of-order groups: entries this node as leader resent at once to a follower that acknowledged later ones (a hole: the first copy lost or stuck behind a slow connection).",
        |s| s.stats.hole_resends,
    ),
    (
        "chorus_recovering_lost",
        Kind::Gauge,
        "Out-of-order groups: 1 while this replica recovers entries it lost on disk (damaged at start): it follows but neither votes nor campaigns.",
        |s| s.recovering_lost as u64,
    ),
    (
        "chorus_inbox_overflows_total",
        Kind::Counter,
        "Out-of-order groups: messages dropped and appends refused (nothing appended) because the group's queue of events was full.",
        |s| s.counters.inbox_overflows,
    ),
    (
        "chorus_damaged_at_start",
        Kind::Gauge,
        "Out-of-order groups: damaged stretches of the entries file skipped when this node started (the file as found is kept as entries.damaged).",
        |s| s.counters.damaged_at_start,
    ),
    (
        "chorus_votes_refused_lost_total",
        Kind::Counter,
        "Out-of-order groups: votes and pre-votes refused here while recovering entries lost on disk.",
        |s| s.stats.votes_refused_lost,
    ),
    (
        "chorus_proposal_id",
        Kind::Gauge,
        "",
        |s| s.term,
    ),
    (
        "chorus_is_leader",
        Kind::Gauge,
        "",
        |s| s.serving as u64,
    ),
    (
        "chorus_group_stopped",
        Kind::Gauge,
        "",
        |_| 0,
    ),
];

/// Out-of-order latency histograms: (name, help, which).
#[allow(clippy::type_complexity)]
const OOO_HISTOGRAMS: [(&str, &str, fn(&OooLatency) -> &crate::metrics::Histogram); 3] = [
    (
        "chorus_append_seconds",
        "",
        |l| &l.append,
    ),
    (
        "chorus_append_queue_seconds",
        "Out-of-order groups, leader: an append's submission to its packing into a group entry, per record.",
        |l| &l.queue,
    ),
    (
        "chorus_log_fsync_seconds",
        "",
        |l| &l.fsync,
    ),
];

impl Env {
    /// Every metric of this node (see the module docs), for its host to add its own to
    /// and render.
    /// Reading an out-of-order group's status asks its driver, so this may wait on a busy
    /// group (at most a few seconds): call it off an async runtime's threads.
    pub fn metrics(&self) -> Exposition {
        let mut e = Exposition::default();
        let node = self.node();
        let groups: Vec<(GroupId, Arc<Group>)> = {
            let g = self.inner.router.groups.read().expect("groups");
            let mut v: Vec<_> = g.iter().map(|(k, v)| (*k, v.clone())).collect();
            v.sort_by_key(|x| x.0);
            v
        };
        let ooo: Vec<(GroupId, Arc<OooNode>)> = {
            let o = self.inner.router.ooo.read().expect("ooo groups");
            let mut v: Vec<_> = o
                .iter()
                .filter_map(|(&id, (_, n, _))| n.upgrade().map(|n| (id, n)))
                .collect();
            v.sort_by_key(|x| x.0);
            v
        };
        let ordered: Vec<(String, &Arc<Group>, GroupStatus)> = groups
            .iter()
            .map(|(id, g)| {
                (
                    format!("node=\"{node}\",group=\"{id}\",mode=\"ordered\""),
                    g,
                    g.status(),
                )
            })
            .collect();
        // A group whose driver does not answer (stopped, or too busy within the status
        // timeout) has no status; only a recorded failure counts as stopped.
        let mut stopped = Vec::new();
        let ooo: Vec<(String, &Arc<OooNode>, OooStatus)> = ooo
            .iter()
            .filter_map(|(id, n)| match n.status() {
                Some(s) => Some((
                    format!(
                        "node=\"{node}\",group=\"{id}\",mode=\"{}\"",
                        mode_label(s.mode)
                    ),
                    n,
                    s,
                )),
                None => {
                    if n.stopped_reason().is_some() {
                        stopped.push(format!(
                            "node=\"{node}\",group=\"{id}\",mode=\"{}\"",
                            mode_label(n.mode())
                        ));
                    }
                    None
                }
            })
            .collect();
        for (name, kind, help, of_ordered, of_ooo) in SHARED {
            e.declare(name, kind, help);
            if let Some(get) = of_ordered {
                for (labels, g, _) in &ordered {
                    e.sample(name, kind, help, labels, get(g));
                }
            }
            for (labels, _, s) in &ooo {
                e.sample(name, kind, help, labels, of_ooo(s));
            }
        }
        for (name, help, get) in ORDERED_COUNTERS {
            e.declare(name, Kind::Counter, help);
            for (labels, g, _) in &ordered {
                e.sample(name, Kind::Counter, help, labels, get(g));
            }
        }
        e.declare(
            "chorus_proposal_id",
            Kind::Gauge,
            "Proposal id (ordered groups) or term (out-of-order groups) of the current role.",
        );
        e.declare(
            "chorus_is_leader",
            Kind::Gauge,
            "1 when this replica leads the group (out-of-order groups: leads and serves appends, its merge done).",
        );
        e.declare(
            "chorus_group_stopped",
            Kind::Gauge,
            "1 when the group stopped on this node while running (its storage failed, e.g. a full disk, its replica halted or its state machine failed); once the cause is fixed, restart the group (`chorus group restart`) or the node.",
        );
        for (labels, _, s) in &ordered {
            let role = &s.role;
            e.sample(
                "chorus_proposal_id",
                Kind::Gauge,
                "",
                labels,
                role.proposal_id,
            );
            let leads = role.role == chorus_core::replica::Role::Leader;
            e.sample("chorus_is_leader", Kind::Gauge, "", labels, leads as u64);
            let down = s.stopped.is_some() as u64;
            e.sample("chorus_group_stopped", Kind::Gauge, "", labels, down);
        }
        for (name, kind, help, get) in ORDERED_STATUS {
            e.declare(name, kind, help);
            for (labels, _, s) in &ordered {
                e.sample(name, kind, help, labels, get(s));
            }
        }
        for (name, kind, help, get) in OOO {
            e.declare(name, kind, help);
            for (labels, _, s) in &ooo {
                e.sample(name, kind, help, labels, get(s));
            }
        }
        for labels in &stopped {
            e.sample("chorus_group_stopped", Kind::Gauge, "", labels, 1);
        }
        e.declare(
            "chorus_follower_lag_bytes",
            Kind::Gauge,
            "Leader of an ordered group: log bytes a follower has not yet made durable.",
        );
        for (labels, _, s) in &ordered {
            for (f, matched) in &s.followers {
                e.sample(
                    "chorus_follower_lag_bytes",
                    Kind::Gauge,
                    "",
                    &format!("{labels},follower=\"{f}\""),
                    s.end_lsn.saturating_sub(*matched),
                );
            }
        }
        e.declare(
            "chorus_group_not_started",
            Kind::Gauge,
            "1 for a group whose files were found damaged when this node started (or that did not start again when restarted), so it does not run here.",
        );
        let not_started: Vec<_> = {
            let d = self.inner.damaged.lock().expect("damaged");
            d.iter().map(|(&id, n)| (id, n.mode_label())).collect()
        };
        for (id, mode) in not_started {
            e.sample(
                "chorus_group_not_started",
                Kind::Gauge,
                "",
                &format!("node=\"{node}\",group=\"{id}\",mode=\"{mode}\""),
                1,
            );
        }
        let append_help =
            "Leader: an append's acceptance to its result (committed or failed), per record.";
        e.declare("chorus_append_seconds", Kind::Histogram, append_help);
        for (labels, g, _) in &ordered {
            e.histogram(
                "chorus_append_seconds",
                append_help,
                labels,
                &g.counters.append_latency,
            );
        }
        let fsync_help = "Latency of log fdatasync (ordered groups: per node; out-of-order groups: per group, the write and fdatasync of the entries file).";
        e.declare("chorus_log_fsync_seconds", Kind::Histogram, fsync_help);
        e.histogram(
            "chorus_log_fsync_seconds",
            fsync_help,
            &format!("node=\"{node}\""),
            &self.inner.shared.fsync_hist,
        );
        for (name, help, get) in OOO_HISTOGRAMS {
            for (labels, n, _) in &ooo {
                e.histogram(name, help, labels, get(n.latency()));
            }
        }
        let ack_help = "Out-of-order groups, leader: an entry's first send to a peer to that peer's acknowledgement, per entry.";
        e.declare("chorus_peer_ack_seconds", Kind::Histogram, ack_help);
        for (labels, n, _) in &ooo {
            for (peer, h) in &n.latency().peer_ack {
                let labels = format!("{labels},peer=\"{peer}\"");
                e.histogram("chorus_peer_ack_seconds", ack_help, &labels, h);
            }
        }
        self.node_metrics(&mut e);
        e
    }

    /// [`Env::metrics`], rendered.
    pub fn render_metrics(&self) -> String {
        self.metrics().render()
    }

    /// The node's own metrics: restarts, disk, transport.
    fn node_metrics(&self, e: &mut Exposition) {
        let node = self.node();
        let labels = format!("node=\"{node}\"");
        e.sample(
            "chorus_group_restarts_total",
            Kind::Counter,
            "Groups restarted in place on this node (`chorus group restart`) after they stopped or did not start.",
            &labels,
            self.inner.shared.restarts.load(Ordering::Relaxed),
        );
        let disk = &self.inner.shared.disk;
        for (name, kind, help, v) in [
            (
                "chorus_disk_free_bytes",
                Kind::Gauge,
                "Bytes available on the file system of the data directory, at the last measurement (every 100 ms).",
                disk.free_bytes().unwrap_or(0),
            ),
            (
                "chorus_disk_low",
                Kind::Gauge,
                "1 while the free space is below min_free_bytes: leaders refuse appends and followers take no new log.",
                disk.is_low() as u64,
            ),
            (
                "chorus_appends_refused_disk_low_total",
                Kind::Counter,
                "Appends a leader refused because the free space was below min_free_bytes.",
                disk.refused(),
            ),
            (
                "chorus_replication_declined_disk_low_total",
                Kind::Counter,
                "Replication messages carrying log that a follower left untaken (as if lost; its leader sends them again) because the free space was below min_free_bytes.",
                disk.declined(),
            ),
        ] {
            e.sample(name, kind, help, &labels, v);
        }
        let t = self.transport_stats();
        for (name, help, v) in [
            (
                "chorus_frames_sent_total",
                "Replication frames queued to peers.",
                t.frames_sent,
            ),
            (
                "chorus_frames_received_total",
                "Replication frames received.",
                t.frames_received,
            ),
            (
                "chorus_frames_dropped_total",
                "Replication frames dropped (peer unreachable or too slow).",
                t.frames_dropped,
            ),
            (
                "chorus_bytes_sent_total",
                "Replication bytes written to sockets.",
                t.bytes_sent,
            ),
            (
                "chorus_bad_connections_total",
                "Inbound connections closed for bad input.",
                t.bad_connections,
            ),
            (
                "chorus_unknown_group_messages_total",
                "Messages for groups this node does not host.",
                self.inner.router.unknown_group.load(Ordering::Relaxed),
            ),
        ] {
            e.sample(name, Kind::Counter, help, &labels, v);
        }
    }
}
