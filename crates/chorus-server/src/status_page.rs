//! The node's status page, served on its metrics listener next to `GET /metrics`
//! ([`crate::metrics_http`]):
//!
//! - `GET /` (or `GET /status`): a small self-contained HTML page ([`PAGE`]: inline CSS
//!   and JavaScript, nothing fetched from elsewhere) that polls `GET /status.json` every
//!   two seconds and shows the node's groups, the replication lag of the groups it leads
//!   and its append and fsync rates over the last ten minutes;
//! - `GET /status.json`: what the page shows, as [`NodeStatus`] (every field is listed
//!   there).
//!
//! The groups come from the runtime as the `Status` RPC sees them: an ordered group's
//! [`chorus_runtime::GroupStatus`], an out-of-order group's
//! [`chorus_runtime::ooo::OooStatus`]. The rates come from the node's own counters as
//! `/metrics` renders them: every [`SAMPLE_EVERY`] a sampler sums the samples of
//! `chorus_appends_total` and `chorus_log_fsyncs_total` over the node's groups, and keeps
//! the last [`SAMPLES`] sums in a ring.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chorus_runtime::env::GroupMode;
use chorus_runtime::{Env, Role};
use serde::Serialize;

use crate::metrics_http::Render;

/// How often the sampler reads the counters.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples kept: ten minutes' worth, and the one before them.
pub const SAMPLES: usize = 121;

/// The counter family whose sum over the node's groups is the append rate.
pub const APPENDS_FAMILY: &str = "chorus_appends_total";

/// The counter family whose sum over the node's groups is the fsync rate.
pub const FSYNCS_FAMILY: &str = "chorus_log_fsyncs_total";

/// What `GET /status.json` answers: one node and its groups.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    /// This node's id.
    pub node: u64,
    /// Its replication listen address.
    pub replication_addr: String,
    /// When this answer was made, in milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// Bytes available on the file system of the data directory (last measured), if
    /// known.
    pub disk_free_bytes: Option<u64>,
    /// Whether that is below `[log] min_free_bytes` (the groups it leads then refuse
    /// appends).
    pub disk_low: bool,
    /// Every group of the node, of every mode, ascending by id.
    pub groups: Vec<GroupInfo>,
    /// Appends and fsyncs per second over the last minutes.
    pub rates: Rates,
}

/// One group of the node in [`NodeStatus`]. Fields that do not apply to the group's mode
/// (or that a group that did not start has not) are `null`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GroupInfo {
    /// The group's id.
    pub id: u64,
    /// `ordered`, `parallel`, `dependent`, or `out-of-order` when the spec of an
    /// out-of-order group that did not start is unreadable.
    pub mode: String,
    /// `leader`, `follower`, `candidate` or `pending_follower`; `null` when the group did
    /// not start, stopped, or (out-of-order) its driver did not answer in time.
    pub role: Option<String>,
    /// The ordered group's proposal id, the out-of-order group's term.
    pub term: Option<u64>,
    /// The leader this replica knows of (itself when leading).
    pub leader: Option<u64>,
    /// Out-of-order groups: whether this replica leads and serves appends (its merge
    /// done).
    pub serving: Option<bool>,
    /// The voters this replica holds.
    pub voters: Vec<u64>,
    /// The learners this replica holds (ordered groups).
    pub learners: Vec<u64>,
    /// Ordered groups: the first LSN still in the log.
    pub start_lsn: Option<u64>,
    /// Ordered groups: the end of the written log.
    pub end_lsn: Option<u64>,
    /// Ordered groups: the end of the durable log.
    pub flushed_lsn: Option<u64>,
    /// Ordered groups: the committed end known to this replica.
    pub committed_lsn: Option<u64>,
    /// Out-of-order groups: the first slot not known committed here.
    pub committed_seq: Option<u64>,
    /// Out-of-order groups: the first slot not applied here.
    pub applied_seq: Option<u64>,
    /// Out-of-order groups: every slot below it is compacted into the state machine's
    /// image.
    pub base_seq: Option<u64>,
    /// Ordered groups: appends waiting for a result.
    pub pending_appends: Option<u64>,
    /// Where this node leads: each other replica's progress and lag; empty otherwise.
    pub replicas: Vec<ReplicaLag>,
    /// Why the group stopped, if it did.
    pub stopped: Option<String>,
    /// Why the group did not start here, if it did not.
    pub not_started: Option<String>,
}

/// One follower of a group this node leads, in [`GroupInfo::replicas`].
#[derive(Clone, Debug, Serialize)]
pub struct ReplicaLag {
    /// The follower's node id.
    pub node: u64,
    /// Ordered groups: the end LSN it matched (durable and agreeing with the leader's
    /// log). Out-of-order groups: the first slot it had not known committed, as it last
    /// acknowledged.
    pub matched: u64,
    /// Out-of-order groups: the first slot it had not applied, as it last acknowledged.
    pub applied: Option<u64>,
    /// How far it is behind: ordered groups, the leader's end LSN minus `matched`
    /// (bytes, as `chorus_follower_lag_bytes`); out-of-order groups, the leader's
    /// committed head minus `matched` (slots).
    pub lag: u64,
    /// `bytes` or `slots`: the unit of `lag`.
    pub lag_unit: &'static str,
}

/// The node's append and fsync rates, in [`NodeStatus::rates`].
#[derive(Clone, Debug, Serialize)]
pub struct Rates {
    /// Seconds between samples ([`SAMPLE_EVERY`]).
    pub interval_secs: u64,
    /// Seconds the samples cover at most.
    pub window_secs: u64,
    /// The sums of the counters at the last sample: appends accepted by the node's groups
    /// as leader (`chorus_appends_total`) and log fsyncs (`chorus_log_fsyncs_total`),
    /// since each group opened.
    pub appends_total: u64,
    /// See `appends_total`.
    pub fsyncs_total: u64,
    /// The rate over each interval, oldest first (none until the second sample).
    pub samples: Vec<RateSample>,
}

/// The rates over one interval between two samples, in [`Rates::samples`].
#[derive(Clone, Debug, Serialize)]
pub struct RateSample {
    /// The end of the interval, in milliseconds since the Unix epoch.
    pub t_ms: u64,
    /// Appends accepted as leader per second over the interval.
    pub appends_per_sec: f64,
    /// Log fsyncs per second over the interval.
    pub fsyncs_per_sec: f64,
}

/// One reading of the counters.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t_ms: u64,
    appends: u64,
    fsyncs: u64,
}

/// The status page of one node: its environment, and the ring of counter samples its
/// sampler fills.
pub struct StatusPage {
    env: Env,
    ring: Mutex<VecDeque<Sample>>,
}

impl StatusPage {
    /// The page of `env`, its sampler started on the current Tokio runtime: it reads the
    /// counters from `render` (the node's `/metrics` exposition) now and every
    /// [`SAMPLE_EVERY`], until the process ends.
    pub fn start(env: Env, render: Render) -> Arc<Self> {
        let page = Arc::new(Self {
            env,
            ring: Mutex::new(VecDeque::with_capacity(SAMPLES)),
        });
        let weak = Arc::downgrade(&page);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let render = render.clone();
                let Ok(text) = tokio::task::spawn_blocking(move || render()).await else {
                    continue;
                };
                let Some(page) = weak.upgrade() else {
                    return;
                };
                page.record(&text);
            }
        });
        page
    }

    /// Adds a sample read from exposition `text`, dropping the oldest past [`SAMPLES`].
    fn record(&self, text: &str) {
        let s = Sample {
            t_ms: unix_ms(),
            appends: family_sum(text, APPENDS_FAMILY),
            fsyncs: family_sum(text, FSYNCS_FAMILY),
        };
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == SAMPLES {
            ring.pop_front();
        }
        ring.push_back(s);
    }

    /// The rates from the samples so far.
    fn rates(&self) -> Rates {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let last = ring.back().copied();
        let samples = ring
            .iter()
            .zip(ring.iter().skip(1))
            .map(|(a, b)| {
                let secs = (b.t_ms.saturating_sub(a.t_ms) as f64 / 1000.0).max(0.001);
                // A counter that went down (a group removed or restarted) counts as 0.
                let per = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
                RateSample {
                    t_ms: b.t_ms,
                    appends_per_sec: round2(per(a.appends, b.appends)),
                    fsyncs_per_sec: round2(per(a.fsyncs, b.fsyncs)),
                }
            })
            .collect();
        Rates {
            interval_secs: SAMPLE_EVERY.as_secs(),
            window_secs: SAMPLE_EVERY.as_secs() * (SAMPLES as u64 - 1),
            appends_total: last.map_or(0, |s| s.appends),
            fsyncs_total: last.map_or(0, |s| s.fsyncs),
            samples,
        }
    }

    /// The node's status now. Asks the out-of-order groups' drivers (each answers within
    /// a few seconds at most): call it off an async runtime's threads.
    pub fn status(&self) -> NodeStatus {
        let env = &self.env;
        let disk = env.disk_space();
        NodeStatus {
            node: env.node(),
            replication_addr: env.replication_addr().to_string(),
            now_ms: unix_ms(),
            disk_free_bytes: disk.free_bytes(),
            disk_low: disk.is_low(),
            groups: env
                .list_groups()
                .into_iter()
                .map(|g| self.group(g))
                .collect(),
            rates: self.rates(),
        }
    }

    /// [`StatusPage::status`] as JSON.
    pub fn status_json(&self) -> String {
        serde_json::to_string(&self.status()).unwrap_or_else(|_| "{}".into())
    }

    /// One group as [`GroupInfo`].
    fn group(&self, g: chorus_runtime::env::ListedGroup) -> GroupInfo {
        let mut info = GroupInfo {
            id: g.id,
            mode: g.mode.map_or("out-of-order", GroupMode::label).to_string(),
            not_started: g.not_started.clone(),
            ..GroupInfo::default()
        };
        if g.not_started.is_some() {
            return info;
        }
        match g.mode {
            Some(GroupMode::Ordered) => {
                if let Ok(h) = self.env.group(g.id) {
                    ordered(&mut info, h.status());
                }
            }
            Some(GroupMode::OutOfOrder(_)) => {
                if let Ok(h) = self.env.ooo_group(g.id) {
                    let node = h.node();
                    info.stopped = node.stopped_reason();
                    if let Some(m) = node.membership() {
                        info.voters = m.voters;
                    }
                    if let Some(s) = node.status() {
                        out_of_order(&mut info, s);
                    }
                }
            }
            None => {}
        }
        info
    }
}

/// Fills `info` from an ordered group's status.
fn ordered(info: &mut GroupInfo, s: chorus_runtime::GroupStatus) {
    info.stopped = s.stopped.clone();
    if s.stopped.is_none() {
        info.role = Some(role_name(s.role.role).into());
    }
    info.term = Some(s.role.proposal_id);
    info.leader = s.role.leader;
    info.voters = s.membership.voters.clone();
    info.learners = s.membership.learners.clone();
    info.start_lsn = Some(s.start_lsn);
    info.end_lsn = Some(s.end_lsn);
    info.flushed_lsn = Some(s.flushed_end);
    info.committed_lsn = Some(s.committed_end);
    info.pending_appends = Some(s.pending_appends as u64);
    info.replicas = s
        .followers
        .iter()
        .map(|&(node, matched)| ReplicaLag {
            node,
            matched,
            applied: None,
            lag: s.end_lsn.saturating_sub(matched),
            lag_unit: "bytes",
        })
        .collect();
}

/// Fills `info` from an out-of-order group's status.
fn out_of_order(info: &mut GroupInfo, s: chorus_runtime::ooo::OooStatus) {
    if info.stopped.is_none() {
        info.role = Some(role_name(s.role).into());
    }
    info.term = Some(s.term);
    info.leader = s.leader;
    info.serving = Some(s.serving);
    info.committed_seq = Some(s.committed_head);
    info.applied_seq = Some(s.applied_head);
    info.base_seq = Some(s.base);
    info.replicas = s
        .followers
        .iter()
        .map(|&(node, head, applied)| ReplicaLag {
            node,
            matched: head,
            applied: Some(applied),
            lag: s.committed_head.saturating_sub(head),
            lag_unit: "slots",
        })
        .collect();
}

/// The Status RPC's name of a role.
fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PendingFollower => "pending_follower",
    }
}

/// The sum of every sample of counter family `name` in exposition `text` (0 without
/// any).
pub fn family_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .map(|v| v as u64)
        .sum()
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The page `GET /` serves: self-contained (inline CSS and JavaScript, no external
/// assets); it polls `/status.json` every two seconds.
pub const PAGE: &str = include_str!("status_page.html");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_a_family_and_only_it() {
        let text = "# HELP chorus_appends_total x\n# TYPE chorus_appends_total counter\n\
                    chorus_appends_total{node=\"1\",group=\"1\",mode=\"ordered\"} 5\n\
                    chorus_appends_total{node=\"1\",group=\"2\",mode=\"parallel\"} 7\n\
                    chorus_appends_total_other 100\n\
                    chorus_log_fsyncs_total{node=\"1\",group=\"1\",mode=\"ordered\"} 3\n";
        assert_eq!(family_sum(text, APPENDS_FAMILY), 12);
        assert_eq!(family_sum(text, FSYNCS_FAMILY), 3);
        assert_eq!(family_sum(text, "chorus_nothing_total"), 0);
    }
}
