//! `chorus mirror`: copies a primary's committed log into a mirror group (PALF section
//! 5.2), group by group, at the same LSNs and CSNs.

use super::*;

/// `chorus mirror`.
#[derive(Args, Debug)]
pub struct MirrorArgs {
    /// The mirror: endpoints and group (an ordered group in access mode raw-write).
    #[command(flatten)]
    ep: Endpoints,
    /// gRPC endpoints of the primary's nodes, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    from: Vec<String>,
    /// The primary's group.
    #[arg(long)]
    from_group: u64,
    /// Keep mirroring as the primary commits more (until interrupted); without it, stop
    /// once the mirror holds, committed, everything the primary had committed.
    #[arg(short, long)]
    follow: bool,
    /// Bytes of groups per read from the primary and per Mirror request.
    #[arg(long, default_value_t = 1 << 20)]
    batch_bytes: u32,
    /// Give up after this many seconds without progress (no leader, refusals).
    #[arg(long, default_value_t = 30)]
    stall_secs: u64,
}

/// The mirror's leader's log end and committed end, if a leader answers.
async fn mirror_position(c: &mut Client, group: u64) -> Option<(u64, u64)> {
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

/// The restorer of PALF section 5.2: reads the primary's committed groups from the
/// mirror's end and mirrors them, resuming from the mirror leader's end after any
/// refusal or leader change (a mirror write's result is about its own copy only).
pub(super) async fn mirror(a: MirrorArgs) -> Result<ExitCode, ClientError> {
    let (group, from_group) = (a.ep.group, a.from_group);
    let mut dst = a.ep.client();
    let mut src = a.ep.client_for(a.from.clone());
    let stall = std::time::Duration::from_secs(a.stall_secs);
    let mut last_progress = tokio::time::Instant::now();
    let (mut groups, mut bytes, mut failed) = (0u64, 0u64, 0u64);
    let mut target: Option<u64> = None;
    let (end, committed) = loop {
        let Some((end, committed)) = mirror_position(&mut dst, group).await else {
            if last_progress.elapsed() > stall {
                return Err(ClientError::NoLeader {
                    group,
                    waited: last_progress.elapsed(),
                    last: "no replica of the mirror answered as its leader".into(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        if !a.follow && target.is_some_and(|t| committed >= t) {
            break (end, committed);
        }
        let read = match src.read_groups(from_group, end, a.batch_bytes).await {
            Ok(r) => r,
            // Nothing committed past the mirror's end yet.
            Err(ClientError::Status {
                code, ref message, ..
            }) if code == Code::OutOfRange && message.contains("beyond the committed end") => {
                if !a.follow {
                    // Caught up: wait for the mirror to commit what it holds.
                    target.get_or_insert(end);
                    if committed >= end {
                        break (end, committed);
                    }
                }
                if last_progress.elapsed() > stall && !a.follow {
                    return Err(ClientError::Status {
                        endpoint: a.ep.endpoints.join(","),
                        code: Code::DeadlineExceeded,
                        message: format!(
                            "the mirror's committed end stayed at {committed}, below its end {end}, for {:?}: its last groups commit with the next group mirrored",
                            last_progress.elapsed()
                        ),
                    });
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if read.groups.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        }
        let n: u64 = read.groups.iter().map(|g| g.len() as u64).sum();
        match dst.mirror(group, read.groups).await {
            Ok(results) => {
                for r in &results {
                    if r.outcome == pb::Outcome::Committed as i32 {
                        groups += 1;
                    } else {
                        failed += 1;
                    }
                }
                bytes += n;
                last_progress = tokio::time::Instant::now();
                if !a.follow && read.next_lsn >= read.committed_lsn {
                    target = Some(read.next_lsn);
                }
            }
            // The mirror's end moved (another leader, or a write already taken): resume
            // from its leader's end. A refusal by access mode is final.
            Err(ClientError::Status {
                code: Code::OutOfRange,
                ..
            }) => {}
            Err(e @ ClientError::Status { .. }) if matches!(&e, ClientError::Status { message, .. } if message.contains("access mode")) =>
            {
                return Err(e);
            }
            Err(e) => {
                if last_progress.elapsed() > stall {
                    return Err(e);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    let what = format!(
        "group {group} mirrors group {from_group} up to LSN {end} (committed {committed}): {groups} groups ({bytes} bytes) committed by this run, {failed} not"
    );
    match a.ep.output {
        Output::Json => println!(
            "{}",
            json!({"ok": true, "group": group, "from_group": from_group, "end_lsn": end,
                   "committed_lsn": committed, "groups": groups, "bytes": bytes,
                   "failed": failed})
        ),
        Output::Table => println!("{what}"),
    }
    Ok(ExitCode::SUCCESS)
}
