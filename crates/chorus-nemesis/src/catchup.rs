//! How long a replica cut off from its peers takes to catch up once the cut heals: the
//! recovery time of a follower that rejoins far behind (PALF section 4.3's catch-up of a
//! lagging replica; ParallelRaft's catch-up by entries or by image, PolarFS section 5.4;
//! over real sockets and real files).
//!
//! A three-node cluster serves one group of the chosen mode. Once it has a leader, one
//! follower is cut off from both peers (nftables drops both ways; the clients still reach
//! it) and writers write records of [`CatchUpOptions::record_bytes`] at the leader until
//! the follower is [`CatchUpOptions::behind_bytes`] or more behind:
//! - ordered: until its log ends that far before the leader's committed end;
//! - parallel: block writes, each writer's to blocks of its own, each write to the next
//!   blocks after its last (the chunk's state grows with every byte written), until that
//!   many bytes of writes are acknowledged;
//! - dependent: transactions writing one key each of [`OOO_KEYS`] (the key-value state
//!   stays below `OOO_KEYS × record_bytes` while the log grows), until that many bytes of
//!   transactions are acknowledged.
//!
//! The writers stop, the leader's committed end `E` is noted, the cut heals, and the clock
//! runs until the follower holds everything up to `E` — ordered: its log flushed to `E`;
//! out of order: every slot below `E` applied — its recovery time. A second figure is the
//! time until it also knows `E` committed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};
use serde::Serialize;

use crate::cluster::{Cluster, NodeOptions};
use crate::net::Net;
use crate::ordered::{self, client, GROUP};
use crate::run::Workload;
use crate::Error;

/// Keys the dependent mode's transactions write (one each).
pub const OOO_KEYS: u64 = 1024;
/// Bytes per block of a parallel group.
const BLOCK: usize = 4096;

/// What to measure.
#[derive(Clone, Debug)]
pub struct CatchUpOptions {
    /// The group's mode: ordered, parallel or dependent.
    pub workload: Workload,
    /// The `chorus` binary.
    pub chorus: PathBuf,
    /// Where the nodes' data and logs go.
    pub dir: PathBuf,
    /// How far behind the follower falls before the cut heals, in log bytes.
    pub behind_bytes: u64,
    /// Bytes per record the writers append (parallel: rounded up to whole 4096-byte
    /// blocks).
    pub record_bytes: usize,
    /// Writer tasks, each one append of one record in flight.
    pub writers: usize,
    /// How the nodes are set up.
    pub node: NodeOptions,
    /// The longest the catch-up may take before the run gives up.
    pub timeout: Duration,
}

/// What was measured.
#[derive(Clone, Debug, Serialize)]
pub struct CatchUpReport {
    /// The group's mode.
    pub mode: String,
    /// The follower that was cut off.
    pub follower: usize,
    /// The leader while it was.
    pub leader: usize,
    /// Bytes the follower lacked when the cut healed: ordered, the leader's committed end
    /// minus the follower's flushed end; out of order, the bytes of records acknowledged
    /// while it was cut off.
    pub behind_bytes: u64,
    /// Records acknowledged while it was cut off.
    pub records: u64,
    /// Out of order: slots the follower lacked (the leader's committed slot minus the
    /// follower's applied one). Ordered: 0.
    pub behind_slots: u64,
    /// Seconds the writers took to put it that far behind.
    pub write_secs: f64,
    /// Seconds from the heal until it held everything up to the leader's committed end:
    /// ordered, its log flushed there; out of order, every slot below it applied.
    pub flushed_secs: f64,
    /// Seconds from the heal until it also knew that end committed.
    pub committed_secs: f64,
    /// Out of order: whether it caught up by an image (its compaction base moved past the
    /// slot it had applied when the cut healed: the leader had compacted the entries it
    /// lacked) rather than by entries alone.
    pub by_image: bool,
    /// `behind_bytes` over `flushed_secs`, in MB/s (10^6 bytes).
    pub mb_per_sec: f64,
}

/// The group's status at endpoint `ep`, if it answers.
async fn status(ep: &str) -> Option<pb::GroupStatus> {
    let mut one = Client::new(vec![ep.to_string()]);
    one.call_timeout = Duration::from_secs(2);
    let r = one.status_all(GROUP).await.into_iter().next()?.1.ok()?;
    r.groups.into_iter().find(|g| g.group == GROUP)
}

/// Runs the measurement (module docs).
pub fn catch_up(o: &CatchUpOptions) -> Result<CatchUpReport, Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("tokio runtime", e))?;
    rt.block_on(run(o))
}

/// Where a group stands on one replica, in the mode's own terms.
#[derive(Clone, Copy, Debug, Default)]
struct Point {
    /// Ordered: the committed LSN; out of order: the first slot not known committed.
    committed: u64,
    /// Ordered: the flushed LSN; out of order: the first slot not applied.
    held: u64,
    /// Out of order: the compaction base.
    base: u64,
}

async fn point(ep: &str, ordered: bool) -> Option<Point> {
    let g = status(ep).await?;
    Some(if ordered {
        Point {
            committed: g.committed_lsn,
            held: g.flushed_lsn,
            base: 0,
        }
    } else {
        Point {
            committed: g.committed_seq,
            held: g.applied_seq,
            base: g.base_seq,
        }
    })
}

/// Writer `w`'s `n`-th record (`writers` of them in all) of `o.workload`.
fn record(o: &CatchUpOptions, w: usize, n: u64) -> pb::OutOfOrderRecord {
    let fill = (w as u8).wrapping_add(n as u8) | 1;
    match o.workload {
        Workload::Parallel => {
            let blocks = o.record_bytes.div_ceil(BLOCK) as u64;
            // Writer w owns every writers-th stretch of `blocks` blocks: no two writes
            // overlap and each lands on blocks never written before in the run.
            let start = (n * o.writers as u64 + w as u64) * blocks;
            pb::OutOfOrderRecord {
                data: vec![fill; blocks as usize * BLOCK],
                blocks: vec![pb::BlockRange {
                    start,
                    count: blocks,
                }],
                read_set: Vec::new(),
                write_set: Vec::new(),
            }
        }
        _ => {
            let key = (n * o.writers as u64 + w as u64) % OOO_KEYS;
            pb::OutOfOrderRecord {
                data: vec![fill; o.record_bytes],
                blocks: Vec::new(),
                read_set: vec![key],
                write_set: vec![key],
            }
        }
    }
}

async fn run(o: &CatchUpOptions) -> Result<CatchUpReport, Error> {
    if o.record_bytes == 0 || o.writers == 0 {
        return Err(Error::Cluster(
            "record bytes and writers must be at least 1".into(),
        ));
    }
    let (groups, ordered) = match o.workload {
        Workload::Ordered => (ordered::groups_toml(3), true),
        Workload::Parallel => (crate::blocks::groups_toml(3), false),
        Workload::Dependent => (crate::txn::groups_toml(3), false),
        Workload::Volume | Workload::Fs => {
            return Err(Error::Cluster(
                "catch-up is measured for one group: ordered, parallel or dependent".into(),
            ))
        }
    };
    std::fs::create_dir_all(&o.dir).map_err(|e| Error::io(o.dir.display(), e))?;
    let net = Net::create(3)?;
    let mut c = Cluster::start(net, &o.chorus, &o.dir, &groups, &o.node)?;
    let eps = c.apis();
    let mut leader = None;
    for _ in 0..300 {
        leader = crate::run::leader(&eps, Duration::from_millis(500)).await;
        if leader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = leader.ok_or_else(|| Error::Cluster("no leader within 30 s".into()))?;
    let follower = if leader == 3 { 2 } else { 3 };
    for j in (1..=3).filter(|&j| j != follower) {
        c.net.cut(follower, j)?;
        c.net.cut(j, follower)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let records = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let t_write = Instant::now();
    for w in 0..o.writers {
        let (stop, records, acked) = (stop.clone(), records.clone(), acked.clone());
        let mut cl = client(eps.clone(), Duration::from_secs(5), Duration::from_secs(3));
        let rec = vec![w as u8; o.record_bytes];
        let o = o.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let bytes = if ordered {
                    cl.append(GROUP, vec![rec.clone()], 0)
                        .await
                        .ok()
                        .map(|_| rec.len())
                } else {
                    let r = record(&o, w, n);
                    let len = r.data.len();
                    match cl.append_out_of_order(GROUP, vec![r]).await {
                        Ok(res)
                            if res
                                .iter()
                                .all(|x| x.outcome == pb::Outcome::Committed as i32) =>
                        {
                            n += 1;
                            Some(len)
                        }
                        _ => None,
                    }
                };
                if let Some(b) = bytes {
                    records.fetch_add(1, Ordering::Relaxed);
                    acked.fetch_add(b as u64, Ordering::Relaxed);
                }
            }
        }));
    }
    // Until the follower is far enough behind.
    let (mut lead, mut behind) = (Point::default(), 0);
    while behind < o.behind_bytes {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if t_write.elapsed() > o.timeout {
            return Err(Error::Cluster(format!(
                "the follower fell only {behind} bytes behind within {:?}",
                o.timeout
            )));
        }
        if !ordered {
            behind = acked.load(Ordering::Relaxed);
            continue;
        }
        let (Some(l), Some(f)) = (
            point(&eps[leader - 1], true).await,
            point(&eps[follower - 1], true).await,
        ) else {
            continue;
        };
        lead = l;
        behind = lead.committed.saturating_sub(f.held);
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let write_secs = t_write.elapsed().as_secs_f64();
    // What committed while the writers wound down counts too.
    if let Some(l) = point(&eps[leader - 1], ordered).await {
        lead.committed = lead.committed.max(l.committed);
    }
    let f0 = point(&eps[follower - 1], ordered).await.unwrap_or_default();
    let (behind, behind_slots) = if ordered {
        (lead.committed.saturating_sub(f0.held), 0)
    } else {
        (
            acked.load(Ordering::Relaxed),
            lead.committed.saturating_sub(f0.held),
        )
    };
    c.net.heal()?;
    let healed = Instant::now();
    let mut flushed_secs = None;
    let mut by_image = false;
    loop {
        if let Some(f) = point(&eps[follower - 1], ordered).await {
            by_image |= !ordered && f.base > f0.held;
            if flushed_secs.is_none() && f.held >= lead.committed {
                flushed_secs = Some(healed.elapsed().as_secs_f64());
            }
            if flushed_secs.is_some() && f.committed >= lead.committed {
                break;
            }
        }
        if healed.elapsed() > o.timeout {
            return Err(Error::Cluster(format!(
                "node {follower} did not catch up {behind} bytes within {:?}; its log ends:\n{}",
                o.timeout,
                c.log_tail(follower, 20)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let flushed_secs = flushed_secs.unwrap_or_default();
    Ok(CatchUpReport {
        mode: match o.workload {
            Workload::Ordered => "ordered",
            Workload::Parallel => "parallel",
            _ => "dependent",
        }
        .into(),
        follower,
        leader,
        behind_bytes: behind,
        records: records.load(Ordering::Relaxed),
        behind_slots,
        write_secs,
        flushed_secs,
        committed_secs: healed.elapsed().as_secs_f64(),
        by_image,
        mb_per_sec: behind as f64 / 1e6 / flushed_secs.max(1e-9),
    })
}
