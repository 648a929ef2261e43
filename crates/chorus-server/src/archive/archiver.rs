//! The archiver: a node copies the committed log of each ordered group it leads to the
//! archive, in order, one segment at a time (PALF section 5.2; OceanBase's archive is
//! likewise driven from each log stream's leader).
//!
//! Only a leader archives, so a healthy cluster writes each segment once; an old leader
//! not yet told it lost writes segments holding the same committed bytes, which the
//! archive's chain absorbs ([`super::ArchiveView`]). A node that takes over lists the
//! archive first and continues from its end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::replica::Role;
use chorus_runtime::{Env, LogHandle};

use super::{Archive, ArchiveSection};

/// One group's archiving on this node, while it leads the group.
///
/// Invariant: `end` is at or below the archive's end for the group (everything in the
/// archive's `start..end` is there), and is a log-group boundary.
#[derive(Clone, Debug, Default)]
pub struct GroupProgress {
    /// Where the archive ends, as this node last wrote or listed it.
    pub end_lsn: u64,
    /// The max CSN there.
    pub max_csn: u64,
    /// Segments this node wrote since it began leading.
    pub segments: u64,
    /// Bytes of log they held.
    pub bytes: u64,
    /// The last failure, until the next success.
    pub last_error: Option<String>,
    /// When this node last wrote a segment (or began leading).
    since: Option<Instant>,
}

/// What the archiver does, shared with the metrics exposition.
#[derive(Debug, Default)]
pub struct ArchiverStats {
    /// Per group this node leads and archives.
    pub groups: Mutex<BTreeMap<u64, GroupProgress>>,
    /// Segments written since the node started.
    pub segments_total: std::sync::atomic::AtomicU64,
    /// Bytes archived since the node started.
    pub bytes_total: std::sync::atomic::AtomicU64,
    /// Failed listings, reads or writes since the node started.
    pub errors_total: std::sync::atomic::AtomicU64,
}

impl ArchiverStats {
    /// The Prometheus exposition of the archiver.
    pub fn render_metrics(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let mut b = String::new();
        let _ = writeln!(
            b,
            "# HELP chorus_archive_segments_total Archive segments this node wrote.\n\
             # TYPE chorus_archive_segments_total counter\n\
             chorus_archive_segments_total {}\n\
             # HELP chorus_archive_bytes_total Bytes of log this node archived.\n\
             # TYPE chorus_archive_bytes_total counter\n\
             chorus_archive_bytes_total {}\n\
             # HELP chorus_archive_errors_total Failed archive listings, reads and writes.\n\
             # TYPE chorus_archive_errors_total counter\n\
             chorus_archive_errors_total {}\n\
             # HELP chorus_archive_end_lsn Where the archive of a group this node leads ends.\n\
             # TYPE chorus_archive_end_lsn gauge",
            self.segments_total.load(Relaxed),
            self.bytes_total.load(Relaxed),
            self.errors_total.load(Relaxed),
        );
        for (g, p) in self.groups.lock().expect("archiver stats").iter() {
            let _ = writeln!(b, "chorus_archive_end_lsn{{group=\"{g}\"}} {}", p.end_lsn);
        }
        b
    }
}

/// How often the archiver looks at its groups.
const TICK: Duration = Duration::from_millis(100);

/// Runs the archiver for `env` until the process ends.
pub async fn run(env: Env, archive: Archive, cfg: ArchiveSection, stats: Arc<ArchiverStats>) {
    let flush = Duration::from_millis(cfg.flush_ms.max(10));
    let seg_bytes = cfg.segment_bytes.clamp(64 << 10, 256 << 20) as usize;
    loop {
        tokio::time::sleep(TICK).await;
        for id in env.ordered_groups() {
            if !cfg.covers(id) {
                continue;
            }
            let Ok(log) = env.group(id) else { continue };
            if log.role().role != Role::Leader {
                stats.groups.lock().expect("archiver stats").remove(&id);
                continue;
            }
            if let Err(e) = step(&archive, &log, id, flush, seg_bytes, &stats).await {
                stats
                    .errors_total
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut g = stats.groups.lock().expect("archiver stats");
                let p = g.entry(id).or_default();
                if p.last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(group = id, archive = archive.url(), "archive: {e}");
                }
                p.last_error = Some(e);
                // Listed again at the next step: another node may have moved it.
                p.since = None;
            }
        }
    }
}

/// One step for group `id`, which this node leads: learn where the archive ends (once
/// per leadership), then write a segment if enough is committed past it or it waited
/// long enough.
async fn step(
    archive: &Archive,
    log: &LogHandle,
    id: u64,
    flush: Duration,
    seg_bytes: usize,
    stats: &ArchiverStats,
) -> Result<(), String> {
    let known = stats
        .groups
        .lock()
        .expect("archiver stats")
        .get(&id)
        .and_then(|p| p.since.map(|s| (p.end_lsn, s)));
    let (end, since) = match known {
        Some(k) => k,
        None => {
            let v = archive.view(id).await.map_err(|e| e.to_string())?;
            let start = log.status().start_lsn;
            // Nothing archived yet: from where the log starts (a group boundary).
            let (end, csn) = if v.chain.is_empty() {
                (start, 0)
            } else {
                (v.end_lsn, v.max_csn)
            };
            if end < start {
                return Err(format!(
                    "the archive ends at LSN {end} but the log starts at {start}: LSNs {end}..{start} were trimmed before they were archived (archive into a new prefix to start again)"
                ));
            }
            let now = Instant::now();
            let mut g = stats.groups.lock().expect("archiver stats");
            let p = g.entry(id).or_default();
            (p.end_lsn, p.max_csn, p.since) = (end, csn, Some(now));
            (end, now)
        }
    };
    let committed = log.committed_end();
    if committed <= end || ((committed - end) < seg_bytes as u64 && since.elapsed() < flush) {
        return Ok(());
    }
    // Whole committed log groups from the archive's end, up to about a segment.
    let l = log.clone();
    let (groups, next) = tokio::task::spawn_blocking(move || {
        let (mut out, mut pos, mut n) = (Vec::new(), end, 0usize);
        while pos < committed && n < seg_bytes {
            let (gs, next) = l.read_groups(pos, seg_bytes - n)?;
            if gs.is_empty() || next <= pos {
                break;
            }
            n += gs.iter().map(Vec::len).sum::<usize>();
            out.extend(gs);
            pos = next;
        }
        Ok::<_, chorus_runtime::Error>((out, pos))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("reading committed log from LSN {end}: {e}"))?;
    if groups.is_empty() {
        return Ok(());
    }
    let s = archive.put(id, &groups).await.map_err(|e| e.to_string())?;
    debug_assert_eq!(s.end_lsn, next);
    let bytes = s.end_lsn - s.start_lsn;
    stats
        .segments_total
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    stats
        .bytes_total
        .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    let mut g = stats.groups.lock().expect("archiver stats");
    let p = g.entry(id).or_default();
    p.end_lsn = s.end_lsn;
    p.max_csn = s.max_csn;
    p.segments += 1;
    p.bytes += bytes;
    p.last_error = None;
    p.since = Some(Instant::now());
    Ok(())
}
