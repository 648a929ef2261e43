//! Follower reads and role changes on the command line: `--min-csn`/`--wait` of
//! `chorus read` and `chorus tail` (PALF section 4.2), and `chorus watch-role` (PALF's
//! monitor_role, section 3.3).

use std::time::Duration;

use chorus_client::AtCsn;
use tokio_stream::StreamExt;

use super::*;

/// `--min-csn` and `--wait` of `chorus read` and `chorus tail`.
#[derive(Args, Debug, Clone, Copy)]
pub(super) struct CsnArgs {
    /// A follower read: answer only once the replica serving it (the first endpoint that
    /// answers: list a follower first) holds every record with a CSN up to this one, e.g.
    /// the CSN an append returned (PALF section 4.2). 0: at once.
    #[arg(long, default_value_t = 0)]
    pub min_csn: u64,
    /// How long the replica may wait for --min-csn, e.g. `5s`, `250ms` or `2` (seconds);
    /// at most 60 s. Past it the command fails (exit 4) naming the CSN asked for and the
    /// one reached.
    #[arg(long, default_value = "5s", value_parser = parse_wait, requires = "min_csn")]
    pub wait: Duration,
}

impl CsnArgs {
    /// As the client takes it.
    pub fn at(&self) -> AtCsn {
        AtCsn::new(
            self.min_csn,
            if self.min_csn == 0 {
                Duration::ZERO
            } else {
                self.wait
            },
        )
    }
}

/// `--wait`: `N`, `Ns` or `Nms` (N may have a fraction), at most 60 s.
pub(crate) fn parse_wait(s: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v * scale <= 60.0 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!(
            "`{s}` is not a wait: expected e.g. 5s, 250ms or 2 (seconds), at most 60 s"
        )),
    }
}

/// `chorus watch-role`.
#[derive(Args, Debug)]
pub struct WatchRoleArgs {
    #[command(flatten)]
    ep: Endpoints,
}

/// One role event as a line: the node, its role, proposal id (term), the leader it
/// follows and its readable CSN (ordered) or first unapplied slot (out-of-order).
fn print_event(out: Output, e: &pb::RoleEvent) {
    let leader = e.has_leader.then_some(e.leader);
    let ordered = e.mode == "ordered";
    let line = match out {
        Output::Json => json!({
            "group": e.group,
            "node": e.node,
            "role": e.role,
            "proposal_id": e.proposal_id,
            "leader": leader,
            "mode": e.mode,
            "readable_csn": ordered.then_some(e.readable_csn),
            "applied_seq": (!ordered).then_some(e.applied_seq),
            "serving": e.serving,
            "stopped": (!e.stopped.is_empty()).then_some(&e.stopped),
        })
        .to_string(),
        Output::Table => {
            let leader = leader.map_or("none".to_string(), |l| l.to_string());
            let at = if ordered {
                format!("readable CSN {}", e.readable_csn)
            } else {
                format!("applied slot {}", e.applied_seq)
            };
            let mut line = format!(
                "group {} node {} {} pid {} leader {} {}",
                e.group, e.node, e.role, e.proposal_id, leader, at
            );
            if !e.stopped.is_empty() {
                line.push_str(&format!(" stopped: {}", e.stopped));
            }
            line
        }
    };
    println!("{line}");
}

/// `chorus watch-role`: follows the group's replica at every endpoint at once, one line
/// per event (each replica's state first, then each change), until every stream ends (the
/// group deleted there: NOT_FOUND) or the command is interrupted. Endpoints that cannot
/// be reached at the start are named on standard error and left out; none reachable is
/// an error.
pub(super) async fn watch_role(a: WatchRoleArgs) -> Result<ExitCode, ClientError> {
    let group = a.ep.group;
    let out = a.ep.output;
    let mut streams = tokio_stream::StreamMap::new();
    let mut last_err = None;
    for (i, ep) in a.ep.endpoints.iter().enumerate() {
        let mut c = a.ep.client_for(vec![ep.clone()]);
        match c.watch_role(group).await {
            Ok(s) => {
                streams.insert(i, s);
            }
            Err(e) => {
                eprintln!("chorus watch-role: {e}");
                last_err = Some(e);
            }
        }
    }
    if streams.is_empty() {
        return Err(last_err.unwrap_or(ClientError::NoEndpoints));
    }
    let mut failed = None;
    while let Some((i, item)) = streams.next().await {
        match item {
            Ok(e) => print_event(out, &e),
            Err(st) => {
                // The stream ends with its status: the group deleted there, or the node
                // going away.
                eprintln!(
                    "chorus watch-role: {}: {:?}: {}",
                    a.ep.endpoints[i],
                    st.code(),
                    st.message()
                );
                if st.code() != Code::NotFound {
                    failed = Some(ClientError::Status {
                        endpoint: a.ep.endpoints[i].clone(),
                        code: st.code(),
                        message: st.message().into(),
                    });
                }
                streams.remove(&i);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_in_seconds_and_milliseconds() {
        assert_eq!(parse_wait("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_wait("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_wait("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_wait("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        assert!(parse_wait("61s").unwrap_err().contains("at most 60 s"));
        assert!(parse_wait("-1").is_err());
        assert!(parse_wait("soon").is_err());
    }
}
