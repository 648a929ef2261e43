//! The storage layer's control plane in `chorus server` (PolarFS section 3.2.3,
//! PolarCtrl): its state lives in an ordered Chorus group (`[control] group`), so the
//! product stores its own control state, replicated and durable like any log.
//!
//! - Every control node replays the group's committed commands into a
//!   [`chorus_ctrl::Meta`] ([`Controller`]), and answers reads (`StatVolume`,
//!   `ListVolumes`, `WatchVolume`) from it.
//! - Its leader makes every change ([`Controller::propose`]): one at a time, it first
//!   applies everything committed before, checks the command against that state,
//!   appends it, waits for it to commit and be applied here, and answers with what the
//!   apply said. A command an earlier one made invalid is refused alike on every node.
//! - Its leader does the duties ([`duties`]): tracking heartbeats, creating and deleting
//!   chunk groups, re-replicating a dead or drained node's chunks.
//! - Every chunk server heartbeats to the control nodes ([`agent`]).
//!
//! The control state is small (nodes, volumes, chunk maps) and is replayed from the start
//! of the group at each start; chunk I/O never goes through it, and goes on through the
//! routing clients' cached maps while no control leader serves (section 3.2.3).

pub mod agent;
pub mod balance;
pub mod duties;
pub mod scrub;
pub mod service;
pub mod snap;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::pb;
use chorus_core::replica::Role;
use chorus_ctrl::{Command, Liveness, Meta, MetaError, Volume};
use chorus_runtime::{Env, LogHandle, Outcome};
use tokio::sync::watch;
use tonic::Status;

use crate::config::ControlSection;

/// How many refused commands' errors are kept for their proposers.
const REJECTED_KEPT: usize = 4096;
/// How long a proposal waits for its command to be applied here after it committed.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// The replayed control state and what the proposals need of it.
#[derive(Debug, Default)]
struct State {
    /// Every committed command below `next_lsn` applied, in LSN order.
    meta: Meta,
    /// Why recent commands were refused at apply, by LSN (the last [`REJECTED_KEPT`]).
    rejected: BTreeMap<u64, MetaError>,
}

/// A control node's replica of the control state (see the module docs).
#[derive(Debug)]
pub struct Controller {
    env: Env,
    log: LogHandle,
    /// The settings.
    pub cfg: ControlSection,
    state: Mutex<State>,
    /// The LSN after the last command applied (every command below it is applied).
    applied: watch::Sender<u64>,
    /// Heartbeats, as this node saw them (meaningful while it leads).
    live: Mutex<Liveness>,
    /// One proposal at a time: a check sees every earlier proposal applied.
    ops: tokio::sync::Mutex<()>,
    /// Bumped whenever the replayed state changes (the pushes of `WatchVolume`).
    changed: watch::Sender<u64>,
    /// Chunk moves this node started and finished while leading (the metrics).
    pub moves_started: std::sync::atomic::AtomicU64,
    /// See `moves_started`.
    pub moves_finished: std::sync::atomic::AtomicU64,
    /// Chunk leaderships handed to their preferred leaders while leading (the metrics).
    pub leader_transfers: std::sync::atomic::AtomicU64,
    /// Where the scrubber goes on from (meaningful while leading).
    pub scrub_cursor: Mutex<scrub::Cursor>,
    /// Makes scrub point ids unique within a millisecond.
    pub scrub_seq: std::sync::atomic::AtomicU64,
    /// Scrub counters while leading: bytes compared (over every replica), chunks
    /// finished, replicas found disagreeing with their majority, repairs started.
    pub scrub_bytes: std::sync::atomic::AtomicU64,
    /// See `scrub_bytes`.
    pub scrub_chunks: std::sync::atomic::AtomicU64,
    /// See `scrub_bytes`.
    pub scrub_mismatches: std::sync::atomic::AtomicU64,
    /// See `scrub_bytes`.
    pub scrub_repairs: std::sync::atomic::AtomicU64,
    /// The replay thread and its stop flag.
    replayer: Mutex<
        Option<(
            Arc<std::sync::atomic::AtomicBool>,
            std::thread::JoinHandle<()>,
        )>,
    >,
}

/// Milliseconds on this process's monotonic clock (liveness deadlines).
pub fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Controller {
    /// Starts replaying the control group (which must be hosted here) into the state.
    pub fn start(env: Env, cfg: ControlSection) -> Result<Arc<Self>, String> {
        let log = env.group(cfg.group).map_err(|e| {
            format!(
                "[control] group {}: this node hosts no replica of it ({e}); configure it in `groups`",
                cfg.group
            )
        })?;
        let c = Arc::new(Self {
            env,
            log: log.clone(),
            live: Mutex::new(Liveness::new(cfg.down_after_ms)),
            cfg,
            state: Mutex::new(State::default()),
            applied: watch::channel(0).0,
            ops: tokio::sync::Mutex::new(()),
            changed: watch::channel(0).0,
            moves_started: 0.into(),
            moves_finished: 0.into(),
            leader_transfers: 0.into(),
            scrub_cursor: Mutex::new(scrub::Cursor::default()),
            scrub_seq: 0.into(),
            scrub_bytes: 0.into(),
            scrub_chunks: 0.into(),
            scrub_mismatches: 0.into(),
            scrub_repairs: 0.into(),
            replayer: Mutex::new(None),
        });
        // The replay follows the reader's position, not only its records: the committed
        // end also moves past entries that hold no record (a new leader's), and a
        // proposal waits for the state to be applied up to the committed end.
        let weak = Arc::downgrade(&c);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let mut reader = log.reader(0);
        let h = std::thread::Builder::new()
            .name("chorus-control".into())
            .spawn(move || {
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    let next = reader.next_wait(Duration::from_millis(100));
                    let Some(c) = weak.upgrade() else { return };
                    match next {
                        Ok(Some(rec)) => c.apply_record(rec.lsn, &rec.data),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "control group: replay stopped");
                            return;
                        }
                    }
                    c.applied.send_if_modified(|a| {
                        let p = reader.position();
                        let moved = p > *a;
                        *a = (*a).max(p);
                        moved
                    });
                }
            })
            .map_err(|e| format!("start the control replay: {e}"))?;
        *c.replayer.lock().unwrap_or_else(|p| p.into_inner()) = Some((stop, h));
        Ok(c)
    }

    /// Stops the replay.
    pub fn stop(&self) {
        if let Some((stop, h)) = self
            .replayer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = h.join();
        }
    }

    fn apply_record(&self, lsn: u64, data: &[u8]) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let result = match Command::decode(data) {
            Ok(cmd) => st.meta.apply(lsn + 1, &cmd),
            Err(e) => {
                // Not a command (written by hand into the group): refused like an
                // invalid one, on every node alike.
                tracing::warn!(lsn, error = %e, "control group: a record that is not a command");
                Err(MetaError::BadChunks {
                    detail: format!("not a control command: {e}"),
                })
            }
        };
        if let Err(e) = result {
            st.rejected.insert(lsn, e);
            while st.rejected.len() > REJECTED_KEPT {
                st.rejected.pop_first();
            }
        }
        drop(st);
        self.applied.send_if_modified(|a| {
            let moved = lsn + 1 > *a;
            *a = (*a).max(lsn + 1);
            moved
        });
        self.changed.send_modify(|v| *v += 1);
    }

    /// A copy of the replayed state.
    pub fn meta(&self) -> Meta {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .meta
            .clone()
    }

    /// Reads the replayed state.
    pub fn with_meta<T>(&self, f: impl FnOnce(&Meta) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|p| p.into_inner()).meta)
    }

    /// Subscribes to changes of the replayed state.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The control group's leader as this node knows it.
    pub fn leader(&self) -> Option<u64> {
        self.log.role().leader
    }

    /// Whether this node leads the control group.
    pub fn is_leader(&self) -> bool {
        self.log.role().role == Role::Leader
    }

    /// The node's environment.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// Notes a heartbeat from `node`.
    pub fn heartbeat(&self, node: u64) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .heartbeat(node, now_ms());
    }

    /// Whether `node` was heard from within `down_after_ms`.
    pub fn is_live(&self, node: u64) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_live(node, now_ms())
    }

    /// How long `node` has not been heard from, if ever.
    pub fn down_for_ms(&self, node: u64) -> Option<u64> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .down_for_ms(node, now_ms())
    }

    /// The live nodes.
    pub fn live_set(&self) -> std::collections::BTreeSet<u64> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live_set(now_ms())
    }

    fn not_leader(&self) -> Status {
        let mut s = Status::failed_precondition(format!(
            "not the control plane's leader (control group {})",
            self.cfg.group
        ));
        if let Some(v) = self.leader().and_then(|l| l.to_string().parse().ok()) {
            s.metadata_mut().insert("chorus-leader", v);
        }
        s
    }

    /// Waits until every command committed when called is applied here.
    async fn catch_up(&self) -> Result<(), Status> {
        let want = self.log.committed_end();
        self.wait_applied(want).await
    }

    async fn wait_applied(&self, want: u64) -> Result<(), Status> {
        let mut rx = self.applied.subscribe();
        let r = tokio::time::timeout(APPLY_WAIT, rx.wait_for(|a| *a >= want)).await;
        match r {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Status::unavailable(format!(
                "the control state here is not applied up to LSN {want} within {APPLY_WAIT:?}"
            ))),
        }
    }

    /// Makes a change (leader only; see the module docs). `check` runs on the state that
    /// includes every earlier change, before the command is appended, and builds it (so
    /// that placements are computed against the state they apply to).
    pub async fn propose_with(
        &self,
        build: impl FnOnce(&Meta) -> Result<Command, Status>,
    ) -> Result<(), Status> {
        let _one = self.ops.lock().await;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        self.catch_up().await?;
        let cmd = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let cmd = build(&st.meta)?;
            st.meta.check(&cmd).map_err(meta_status)?;
            cmd
        };
        let appended = self
            .log
            .append(&cmd.encode(), 0)
            .map_err(crate::service::status)?;
        let lsn = appended.lsn;
        match appended.result.await {
            Ok(r) if r.outcome == Outcome::Committed => {}
            Ok(_) => {
                return Err(Status::aborted(
                    "the control group's leader changed and the change was not committed; nothing changed",
                ))
            }
            Err(e) => {
                return Err(Status::unknown(format!(
                    "the control change's outcome is unknown: {e}"
                )))
            }
        }
        self.wait_applied(lsn + 1).await?;
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.rejected.get(&lsn) {
            Some(e) => Err(meta_status(e.clone())),
            None => Ok(()),
        }
    }

    /// [`Controller::propose_with`] of a command built beforehand.
    pub async fn propose(&self, cmd: Command) -> Result<(), Status> {
        self.propose_with(move |_| Ok(cmd)).await
    }

    /// The volume's info for clients, with the addresses of the nodes it names.
    pub fn volume_info(&self, name: &str) -> Option<pb::VolumeInfo> {
        self.with_meta(|m| m.volume(name).map(|v| volume_info(m, v)))
    }
}

impl Controller {
    /// The control plane's metrics in the Prometheus text format (docs/operations.md,
    /// "Metrics"): from the replayed state on every control node; liveness only on the
    /// leader, which hears the heartbeats.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write;
        let leader = self.is_leader();
        let mut o = String::new();
        let family = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            &mut o,
            "chorus_control_leader",
            "gauge",
            "1 on the node leading the control group",
        );
        let _ = writeln!(o, "chorus_control_leader {}", leader as u8);
        family(
            &mut o,
            "chorus_control_applied_lsn",
            "gauge",
            "The control log applied here, up to this LSN",
        );
        let _ = writeln!(o, "chorus_control_applied_lsn {}", *self.applied.borrow());
        self.with_meta(|m| {
            family(
                &mut o,
                "chorus_control_volumes",
                "gauge",
                "Volumes by state",
            );
            for st in ["creating", "ready", "deleting"] {
                let n = m
                    .volumes()
                    .values()
                    .filter(|v| v.state.to_string() == st)
                    .count();
                let _ = writeln!(o, "chorus_control_volumes{{state=\"{st}\"}} {n}");
            }
            family(
                &mut o,
                "chorus_control_chunks",
                "gauge",
                "Chunks of every volume, and those being moved",
            );
            let total = m.chunks().count();
            let moving = m.chunks().filter(|(_, c)| c.moving.is_some()).count();
            let _ = writeln!(
                o,
                "chorus_control_chunks{{moving=\"false\"}} {}",
                total - moving
            );
            let _ = writeln!(o, "chorus_control_chunks{{moving=\"true\"}} {moving}");
            family(
                &mut o,
                "chorus_control_node_chunks",
                "gauge",
                "Chunk replicas on each node (a move's target counted)",
            );
            for n in m.nodes().values() {
                let _ = writeln!(
                    o,
                    "chorus_control_node_chunks{{node=\"{}\",rack=\"{}\",state=\"{}\"}} {}",
                    n.id,
                    n.rack,
                    n.state,
                    m.load(n.id)
                );
            }
            family(
                &mut o,
                "chorus_control_node_leaders",
                "gauge",
                "Chunks each node is the preferred leader of",
            );
            for n in m.nodes().values() {
                let _ = writeln!(
                    o,
                    "chorus_control_node_leaders{{node=\"{}\"}} {}",
                    n.id,
                    m.leader_load(n.id)
                );
            }
            if leader {
                family(
                    &mut o,
                    "chorus_control_node_live",
                    "gauge",
                    "1 if the node was heard from within down_after_ms (the leader's view)",
                );
                for n in m.nodes().values() {
                    let _ = writeln!(
                        o,
                        "chorus_control_node_live{{node=\"{}\"}} {}",
                        n.id,
                        self.is_live(n.id) as u8
                    );
                }
            }
        });
        family(&mut o, "chorus_control_moves_total", "counter", "Chunk moves (re-replication, draining, rebalancing) this node started and finished while leading");
        let _ = writeln!(
            o,
            "chorus_control_moves_total{{event=\"started\"}} {}",
            self.moves_started
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "chorus_control_moves_total{{event=\"finished\"}} {}",
            self.moves_finished
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        family(&mut o, "chorus_control_scrub_bytes_total", "counter", "Chunk bytes compared across replicas by the scrubber (each replica's copy counted) while this node led");
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            o,
            "chorus_control_scrub_bytes_total {}",
            ld(&self.scrub_bytes)
        );
        family(
            &mut o,
            "chorus_control_scrub_chunks_total",
            "counter",
            "Chunks the scrubber finished a pass over",
        );
        let _ = writeln!(
            o,
            "chorus_control_scrub_chunks_total {}",
            ld(&self.scrub_chunks)
        );
        family(
            &mut o,
            "chorus_control_scrub_mismatches_total",
            "counter",
            "Chunk replicas the scrubber found disagreeing with their majority",
        );
        let _ = writeln!(
            o,
            "chorus_control_scrub_mismatches_total {}",
            ld(&self.scrub_mismatches)
        );
        family(
            &mut o,
            "chorus_control_scrub_repairs_total",
            "counter",
            "Damaged chunk replicas the scrubber started rebuilding elsewhere",
        );
        let _ = writeln!(
            o,
            "chorus_control_scrub_repairs_total {}",
            ld(&self.scrub_repairs)
        );
        family(&mut o, "chorus_control_leader_transfers_total", "counter", "Chunk leaderships this node handed to their preferred leaders while leading (leader balancing)");
        let _ = writeln!(
            o,
            "chorus_control_leader_transfers_total {}",
            self.leader_transfers
                .load(std::sync::atomic::Ordering::Relaxed)
        );
        o
    }
}

/// A refused change as a gRPC status.
pub fn meta_status(e: MetaError) -> Status {
    let msg = e.to_string();
    match e {
        MetaError::NoSuchVolume { .. }
        | MetaError::NoSuchNode { .. }
        | MetaError::NoSuchChunk { .. }
        | MetaError::NoSuchSnapshot { .. } => Status::not_found(msg),
        MetaError::VolumeExists { .. } | MetaError::SnapshotExists { .. } => {
            Status::already_exists(msg)
        }
        MetaError::SnapshotInProgress { .. }
        | MetaError::SnapshotWrongState { .. }
        | MetaError::SnapshotInUse { .. }
        | MetaError::WrongState { .. }
        | MetaError::Moving { .. }
        | MetaError::NotMoving { .. }
        | MetaError::NodeRemoved { .. } => Status::failed_precondition(msg),
        _ => Status::invalid_argument(msg),
    }
}

/// A volume as the Control service answers it.
pub fn volume_info(m: &Meta, v: &Volume) -> pb::VolumeInfo {
    let mut named = std::collections::BTreeSet::new();
    let chunks = v
        .chunks
        .iter()
        .map(|c| {
            named.extend(c.replicas.iter().copied());
            if let Some(mv) = c.moving {
                named.insert(mv.to);
            }
            pb::ChunkInfo {
                group: c.group,
                replicas: c.replicas.clone(),
                moving_from: c.moving.map_or(0, |mv| mv.from),
                moving_to: c.moving.map_or(0, |mv| mv.to),
            }
        })
        .collect();
    pb::VolumeInfo {
        name: v.name.clone(),
        size_bytes: v.size_bytes,
        chunk_bytes: v.chunk_bytes,
        block_bytes: v.block_bytes,
        state: v.state.to_string(),
        version: v.version,
        chunks,
        nodes: named
            .into_iter()
            .filter_map(|id| m.node(id))
            .map(node_info)
            .collect(),
        snapshots: v.snapshots.iter().map(snapshot_info).collect(),
        snapshot_tag: m.snapshot_tag(&v.name),
        source_volume: v.source.as_ref().map(|s| s.0.clone()).unwrap_or_default(),
        source_snapshot: v
            .source
            .as_ref()
            .and_then(|(sv, id)| m.volume(sv).and_then(|x| x.snapshot(*id)))
            .map(|s| s.name.clone())
            .unwrap_or_default(),
    }
}

/// A snapshot as the Control service answers it.
pub fn snapshot_info(s: &chorus_ctrl::Snapshot) -> pb::SnapshotInfo {
    pb::SnapshotInfo {
        id: s.id,
        name: s.name.clone(),
        state: s.state.to_string(),
    }
}

/// A node's registered facts (liveness and load left for the caller to fill).
pub fn node_info(n: &chorus_ctrl::Node) -> pb::NodeInfo {
    pb::NodeInfo {
        id: n.id,
        repl_addr: n.repl_addr.clone(),
        client_addr: n.client_addr.clone(),
        rack: n.rack.clone(),
        state: n.state.to_string(),
        ..Default::default()
    }
}
