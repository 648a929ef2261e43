//! How long a replica cut off from its peers takes to catch up once the cut heals: the
//! recovery time of a follower that rejoins far behind (PALF section 4.3's catch-up of a
//! lagging replica, over real sockets and real files).
//!
//! A three-node cluster serves one ordered group. Once it has a leader, one follower is
//! cut off from both peers (nftables drops both ways; the clients still reach it) and
//! writers append records of [`CatchUpOptions::record_bytes`] at the leader until the
//! follower's log ends [`CatchUpOptions::behind_bytes`] or more before the leader's.
//! The writers stop, the committed end `E` is noted, the cut heals, and the clock runs
//! until the follower's log has been flushed up to `E`: its recovery time. A second
//! figure is the time until it also knows `E` committed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::{pb, Client};
use serde::Serialize;

use crate::cluster::{Cluster, NodeOptions};
use crate::net::Net;
use crate::ordered::{self, client, GROUP};
use crate::Error;

/// What to measure.
#[derive(Clone, Debug)]
pub struct CatchUpOptions {
    /// The `chorus` binary.
    pub chorus: PathBuf,
    /// Where the nodes' data and logs go.
    pub dir: PathBuf,
    /// How far behind the follower falls before the cut heals, in log bytes.
    pub behind_bytes: u64,
    /// Bytes per record the writers append.
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
    /// The follower that was cut off.
    pub follower: usize,
    /// The leader while it was.
    pub leader: usize,
    /// Log bytes the follower lacked when the cut healed (the leader's committed end
    /// minus the follower's flushed end).
    pub behind_bytes: u64,
    /// Records appended while it was cut off.
    pub records: u64,
    /// Seconds the writers took to put it that far behind.
    pub write_secs: f64,
    /// Seconds from the heal until its log was flushed up to the leader's committed end.
    pub flushed_secs: f64,
    /// Seconds from the heal until it also knew that end committed.
    pub committed_secs: f64,
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

async fn run(o: &CatchUpOptions) -> Result<CatchUpReport, Error> {
    if o.record_bytes == 0 || o.writers == 0 {
        return Err(Error::Cluster(
            "record bytes and writers must be at least 1".into(),
        ));
    }
    std::fs::create_dir_all(&o.dir).map_err(|e| Error::io(o.dir.display(), e))?;
    let net = Net::create(3)?;
    let mut c = Cluster::start(net, &o.chorus, &o.dir, &ordered::groups_toml(3), &o.node)?;
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
    let mut tasks = Vec::new();
    let t_write = Instant::now();
    for w in 0..o.writers {
        let (stop, records) = (stop.clone(), records.clone());
        let mut cl = client(eps.clone(), Duration::from_secs(5), Duration::from_secs(3));
        let rec = vec![w as u8; o.record_bytes];
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if cl.append(GROUP, vec![rec.clone()], 0).await.is_ok() {
                    records.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Until the leader's committed end is far enough past the follower's flushed end.
    let (mut lead_end, mut behind) = (0, 0);
    while behind < o.behind_bytes {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if t_write.elapsed() > o.timeout {
            return Err(Error::Cluster(format!(
                "the follower fell only {behind} bytes behind within {:?}",
                o.timeout
            )));
        }
        let (Some(l), Some(f)) = (
            status(&eps[leader - 1]).await,
            status(&eps[follower - 1]).await,
        ) else {
            continue;
        };
        lead_end = l.committed_lsn;
        behind = lead_end.saturating_sub(f.flushed_lsn);
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let write_secs = t_write.elapsed().as_secs_f64();
    // What committed while the writers wound down counts too.
    if let Some(l) = status(&eps[leader - 1]).await {
        lead_end = lead_end.max(l.committed_lsn);
    }
    let f0 = status(&eps[follower - 1])
        .await
        .map_or(0, |f| f.flushed_lsn);
    let behind = lead_end.saturating_sub(f0);
    c.net.heal()?;
    let healed = Instant::now();
    let mut flushed_secs = None;
    loop {
        if let Some(f) = status(&eps[follower - 1]).await {
            if flushed_secs.is_none() && f.flushed_lsn >= lead_end {
                flushed_secs = Some(healed.elapsed().as_secs_f64());
            }
            if flushed_secs.is_some() && f.committed_lsn >= lead_end {
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
        follower,
        leader,
        behind_bytes: behind,
        records: records.load(Ordering::Relaxed),
        write_secs,
        flushed_secs,
        committed_secs: healed.elapsed().as_secs_f64(),
        mb_per_sec: behind as f64 / 1e6 / flushed_secs.max(1e-9),
    })
}
