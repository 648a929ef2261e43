//! `chorus archive status` and `chorus restore`: what the archive holds, and writing it
//! back into a group (PALF section 5.2: a mirror fed from the archive instead of a live
//! primary).
//!
//! A restore writes the archive's log groups into a mirror group (an ordered group in
//! access mode raw-write) at their LSNs and CSNs, as `chorus mirror` does from a live
//! primary; `--promote` then makes it a primary. It resumes from the mirror's end, so a
//! restore cut off is finished by running it again. A log group is the unit: a restore to
//! an LSN or CSN ends with the whole log group holding it.

use std::process::ExitCode;
use std::time::Duration;

use chorus_client::{pb, Client, ClientError};
use clap::{Args, Subcommand};
use serde_json::json;
use tonic::Code;

use super::{Archive, ArchiveView, Target};
use crate::{AnyResult, Endpoints, Output};

/// Where the archive is (the S3 keys come from `AWS_ACCESS_KEY_ID` and
/// `AWS_SECRET_ACCESS_KEY`).
#[derive(Args, Debug, Clone)]
pub struct ArchiveFlags {
    /// The archive: `s3://bucket/prefix` or `file:///dir`.
    #[arg(long = "archive", env = "CHORUS_ARCHIVE")]
    pub url: String,
    /// An S3-compatible server's endpoint (unset: AWS).
    #[arg(long = "archive-endpoint", env = "CHORUS_ARCHIVE_ENDPOINT")]
    pub endpoint: Option<String>,
    /// The S3 region.
    #[arg(long = "archive-region", env = "CHORUS_ARCHIVE_REGION")]
    pub region: Option<String>,
    /// Allow a plain-HTTP endpoint.
    #[arg(long = "archive-allow-http")]
    pub allow_http: bool,
}

impl ArchiveFlags {
    fn open(&self) -> Result<Archive, super::ArchiveError> {
        Archive::open(&Target {
            url: self.url.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            ..Default::default()
        })
    }
}

/// `chorus archive`.
#[derive(Args, Debug)]
pub struct ArchiveArgs {
    #[command(subcommand)]
    op: ArchiveOp,
}

#[derive(Subcommand, Debug)]
enum ArchiveOp {
    /// What the archive holds of each group: its segments, the LSNs and the last CSN.
    Status {
        #[command(flatten)]
        archive: ArchiveFlags,
        /// Only these groups (default: every group in the archive).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u64>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// `chorus restore`.
#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The group to write (an ordered group in access mode raw-write) and its cluster.
    #[command(flatten)]
    ep: Endpoints,
    #[command(flatten)]
    archive: ArchiveFlags,
    /// The archived group to restore from.
    #[arg(long)]
    from_group: u64,
    /// Restore through the log group holding this LSN.
    #[arg(long, conflicts_with_all = ["to_csn", "follow"])]
    to_lsn: Option<u64>,
    /// Restore through the first log group whose records reach this CSN: every record at
    /// or below it is restored.
    #[arg(long, conflicts_with = "follow")]
    to_csn: Option<u64>,
    /// Then make the group a primary (access mode append).
    #[arg(long, conflicts_with = "follow")]
    promote: bool,
    /// Keep going as the archive grows (until interrupted): a mirror fed from the archive.
    #[arg(short, long)]
    follow: bool,
    /// Give up after this many seconds without progress (no leader, refusals).
    #[arg(long, default_value_t = 30)]
    stall_secs: u64,
}

/// Runs `chorus archive`.
pub fn archive(a: ArchiveArgs) -> AnyResult<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let ArchiveOp::Status {
            archive,
            groups,
            output,
        } = a.op;
        let ar = archive.open()?;
        let groups = if groups.is_empty() {
            ar.groups().await?
        } else {
            groups
        };
        let mut rows = Vec::new();
        for g in groups {
            rows.push((g, ar.view(g).await?));
        }
        match output {
            Output::Json => {
                let v: Vec<_> = rows
                    .iter()
                    .map(|(g, v)| {
                        json!({"group": g, "segments": v.chain.len(), "start_lsn": v.start_lsn,
                               "end_lsn": v.end_lsn, "max_csn": v.max_csn,
                               "beyond_gap": v.beyond_gap, "strays": v.strays})
                    })
                    .collect();
                println!("{}", json!({"archive": ar.url(), "groups": v}));
            }
            Output::Table => {
                println!("archive {}", ar.url());
                println!(
                    "{:>6} {:>9} {:>14} {:>14} {:>12}  notes",
                    "group", "segments", "start_lsn", "end_lsn", "max_csn"
                );
                for (g, v) in &rows {
                    let mut notes = Vec::new();
                    if v.beyond_gap > 0 {
                        notes.push(format!("{} segments past a gap", v.beyond_gap));
                    }
                    if v.strays > 0 {
                        notes.push(format!("{} other objects", v.strays));
                    }
                    println!(
                        "{g:>6} {:>9} {:>14} {:>14} {:>12}  {}",
                        v.chain.len(),
                        v.start_lsn,
                        v.end_lsn,
                        v.max_csn,
                        notes.join(", ")
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The mirror's leader's log end and committed end, if a leader answers.
async fn position(c: &mut Client, group: u64) -> Option<(u64, u64)> {
    for (_, r) in c.status_all(group).await {
        if let Ok(s) = r {
            if let Some(g) = s
                .groups
                .iter()
                .find(|g| g.group == group && g.role == "leader")
            {
                return Some((g.end_lsn, g.committed_lsn));
            }
        }
    }
    None
}

/// Why a restore stopped.
fn refused(ep: &Endpoints, message: String) -> ClientError {
    ClientError::Status {
        endpoint: ep.endpoints.join(","),
        code: Code::FailedPrecondition,
        message,
    }
}

/// Runs `chorus restore`.
pub fn restore(a: RestoreArgs) -> AnyResult<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match rt.block_on(feed(&a)) {
        Ok(c) => Ok(c),
        Err(FeedError::Client(e)) => {
            eprintln!("chorus: {e}");
            Ok(ExitCode::from(crate::remote::exit_code(&e)))
        }
        Err(FeedError::Archive(e)) => Err(e.into()),
    }
}

enum FeedError {
    Client(ClientError),
    Archive(super::ArchiveError),
}

impl From<ClientError> for FeedError {
    fn from(e: ClientError) -> Self {
        FeedError::Client(e)
    }
}

impl From<super::ArchiveError> for FeedError {
    fn from(e: super::ArchiveError) -> Self {
        FeedError::Archive(e)
    }
}

/// Writes the archive into the mirror group from its leader's end until the target (or
/// for ever with `--follow`), resuming from the leader's end after any refusal.
async fn feed(a: &RestoreArgs) -> Result<ExitCode, FeedError> {
    let (group, from) = (a.ep.group, a.from_group);
    let ar = a.archive.open()?;
    let mut dst = a.ep.client();
    let stall = Duration::from_secs(a.stall_secs);
    let mut view = ar.view(from).await?;
    if view.chain.is_empty() && !a.follow {
        return Err(refused(
            &a.ep,
            format!("the archive {} holds nothing of group {from}", ar.url()),
        )
        .into());
    }
    // Asked for more than the archive holds: refused before anything is written.
    match (a.to_lsn, a.to_csn) {
        (Some(l), _) if l >= view.end_lsn => {
            return Err(refused(
                &a.ep,
                format!(
                    "the archive of group {from} ends at LSN {}: LSN {l} is not archived (yet)",
                    view.end_lsn
                ),
            )
            .into())
        }
        (_, Some(c)) if c > view.max_csn => {
            return Err(refused(
                &a.ep,
                format!(
                "the archive of group {from} holds CSNs up to {}: CSN {c} is not archived (yet)",
                view.max_csn
            ),
            )
            .into())
        }
        _ => {}
    }
    // The LSN the restore ends at, once the log group holding the target is known; with
    // neither target, the archive's end.
    let mut target: Option<u64> =
        (a.to_lsn.is_none() && a.to_csn.is_none() && !a.follow).then_some(view.end_lsn);
    let (mut groups_written, mut bytes) = (0u64, 0u64);
    // The end LSN and max CSN of the last log group this run wrote.
    let mut last: Option<(u64, u64)> = None;
    let mut last_progress = tokio::time::Instant::now();
    let (end, max_csn) = loop {
        let Some((end, committed)) = position(&mut dst, group).await else {
            if last_progress.elapsed() > stall {
                return Err(ClientError::NoLeader {
                    group,
                    waited: last_progress.elapsed(),
                    last: "no replica of the group answered as its leader".into(),
                }
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if let Some(t) = target {
            if end >= t {
                if committed >= t {
                    let csn = match last {
                        Some((l, c)) if l == end => c,
                        _ => view.max_csn_at(end),
                    };
                    break (end, csn);
                }
                if last_progress.elapsed() > stall {
                    return Err(refused(&a.ep, format!(
                        "group {group} holds the archive through LSN {end} but committed only up to {committed} for {:?}",
                        last_progress.elapsed()
                    ))
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        if !view.chain.is_empty() && end < view.start_lsn {
            return Err(refused(&a.ep, format!(
                "the archive of group {from} starts at LSN {}, but group {group}'s log ends at {end}: a restore must begin where the group's log ends",
                view.start_lsn
            ))
            .into());
        }
        let Some(seg) = view.segment_at(end).cloned() else {
            // At the archive's end: with --follow, wait for more.
            tokio::time::sleep(Duration::from_millis(200)).await;
            view = ar.view(from).await?;
            continue;
        };
        let s = ar.get(from, &seg).await?;
        let Some(first) = s.groups.iter().position(|(h, _)| h.lsn == end) else {
            return Err(refused(&a.ep, format!(
                "group {group}'s log ends at LSN {end}, which is not a log-group boundary of the archive of group {from}: it is not a copy of that log"
            ))
            .into());
        };
        // Log groups from the mirror's end, through the target's, in requests of ~1 MiB.
        let mut batch = Vec::new();
        let mut n = 0usize;
        let mut batch_last = (0, 0);
        for (h, bytes_of) in &s.groups[first..] {
            n += bytes_of.len();
            batch.push(bytes_of.clone());
            batch_last = (h.end_lsn(), h.max_csn);
            let holds_target = a.to_lsn.is_some_and(|l| h.end_lsn() > l)
                || a.to_csn.is_some_and(|c| h.max_csn >= c && !h.is_padding());
            if holds_target {
                target = Some(h.end_lsn());
                break;
            }
            if n >= 1 << 20 {
                break;
            }
        }
        let len = n as u64;
        match dst.mirror(group, batch).await {
            Ok(results) => {
                groups_written += results
                    .iter()
                    .filter(|r| r.outcome == pb::Outcome::Committed as i32)
                    .count() as u64;
                bytes += len;
                last = Some(batch_last);
                last_progress = tokio::time::Instant::now();
            }
            // The group's end moved (another leader, or a write already taken): resume
            // from its leader's end. A refusal by access mode is final.
            Err(ClientError::Status {
                code: Code::OutOfRange,
                ..
            }) => {}
            Err(ClientError::Status {
                message,
                code,
                endpoint,
            }) if message.contains("access mode") => {
                return Err(ClientError::Status {
                    message,
                    code,
                    endpoint,
                }
                .into());
            }
            Err(e) => {
                if last_progress.elapsed() > stall {
                    return Err(e.into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    if a.promote {
        dst.set_access_mode(group, "append").await?;
    }
    let what = format!(
        "group {group} restored from the archive of group {from} ({}) through LSN {end} (max CSN {max_csn}): {groups_written} log groups ({bytes} bytes) written by this run{}",
        ar.url(),
        if a.promote { "; promoted to access mode append" } else { "" }
    );
    match a.ep.output {
        Output::Json => println!(
            "{}",
            json!({"ok": true, "group": group, "from_group": from, "end_lsn": end,
                   "max_csn": max_csn, "groups": groups_written, "bytes": bytes,
                   "promoted": a.promote})
        ),
        Output::Table => println!("{what}"),
    }
    Ok(ExitCode::SUCCESS)
}

impl ArchiveView {
    /// The max CSN of the log up to `lsn`, when a segment of the chain ends exactly there
    /// (otherwise the max CSN of the last segment ending below it; 0 if none).
    fn max_csn_at(&self, lsn: u64) -> u64 {
        self.chain
            .iter()
            .filter(|s| s.end_lsn <= lsn)
            .map(|s| s.max_csn)
            .max()
            .unwrap_or(0)
    }
}
