//! `chorus trim`: deletes each node's log below an LSN, and reports what every node
//! kept.

use super::*;

/// What `chorus trim` found at one endpoint.
struct TrimRow {
    endpoint: String,
    /// Why the trim failed there, if it did.
    error: Option<ClientError>,
    /// The node's log start before the call, from its status.
    before: Option<u64>,
    /// The node's log start and committed end after the call, from its status (the Trim
    /// answer carries neither); `None` if it did not answer that.
    after: Option<(u64, u64)>,
}

/// The log start and committed end of `group` at endpoint `i`, from its status; `None`
/// if it does not answer within 5 s or does not hold the group.
async fn log_range(c: &mut Client, i: usize, group: u64) -> Option<(u64, u64)> {
    let mut s = c.conn(i).await.ok()?;
    let st = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.status(pb::StatusRequest { group }),
    )
    .await
    .ok()?
    .ok()?;
    st.into_inner()
        .groups
        .into_iter()
        .find(|g| g.group == group)
        .map(|g| match g.mode.as_str() {
            // Slots: the first not compacted, the first not known committed.
            "parallel" | "dependent" => (g.base_seq, g.committed_seq),
            _ => (g.start_lsn, g.committed_lsn),
        })
}

/// A failed trim at one node, named: its connection could not be made ("unreachable"),
/// it answered UNAVAILABLE (the group stopped there, or the node is shutting down:
/// "unavailable"), or it refused the request ("refused": OUT_OF_RANGE past its committed
/// end, NOT_FOUND without the group). The detail
/// leaves out the endpoint, which the row names.
fn trim_failure(e: &ClientError) -> (&'static str, Option<Code>, String) {
    match e {
        ClientError::Unreachable { detail, .. } => ("unreachable", None, detail.clone()),
        ClientError::Status { code, message, .. } => (
            if *code == Code::Unavailable {
                "unavailable"
            } else {
                "refused"
            },
            Some(*code),
            message.clone(),
        ),
        ClientError::BadEndpoint { .. } | ClientError::NoEndpoints => {
            ("bad endpoint", None, e.to_string())
        }
        ClientError::NoLeader { .. } | ClientError::Indeterminate { .. } => {
            ("unknown", None, e.to_string())
        }
    }
}

/// `chorus trim`: sends Trim to every endpoint in turn, each node trimming only itself, so
/// that a node that cannot be reached or refuses is reported by name and the others are
/// trimmed all the same. Exit 0 when every node trimmed; otherwise the highest exit code
/// among the nodes that failed (4 one refused, 3 one could not be reached, 2 a bad
/// endpoint).
pub(super) async fn trim(a: TrimArgs) -> Result<ExitCode, ClientError> {
    if a.ep.endpoints.is_empty() {
        return Err(ClientError::NoEndpoints);
    }
    let (group, lsn) = (a.ep.group, a.lsn);
    let mut c = a.ep.client();
    let mut rows = Vec::new();
    for i in 0..c.endpoints().len() {
        let endpoint = c.endpoints()[i].clone();
        let mut s = match c.conn(i).await {
            Ok(s) => s,
            Err(e) => {
                rows.push(TrimRow {
                    endpoint,
                    error: Some(e),
                    before: None,
                    after: None,
                });
                continue;
            }
        };
        let before = log_range(&mut c, i, group).await.map(|r| r.0);
        let error = s
            .trim(pb::TrimRequest { group, lsn })
            .await
            .err()
            .map(|st| ClientError::Status {
                endpoint: endpoint.clone(),
                code: st.code(),
                message: st.message().into(),
            });
        rows.push(TrimRow {
            endpoint,
            error,
            before,
            after: log_range(&mut c, i, group).await,
        });
    }
    match a.ep.output {
        Output::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|r| {
                    let mut o = json!({
                        "endpoint": r.endpoint, "group": group, "lsn": lsn,
                        "start_lsn_before": r.before,
                        "start_lsn": r.after.map(|a| a.0),
                        "committed_lsn": r.after.map(|a| a.1),
                    });
                    match &r.error {
                        None => o["result"] = json!("trimmed"),
                        Some(e) => {
                            let (what, code, detail) = trim_failure(e);
                            o["result"] = json!(what);
                            o["code"] = json!(code.map(|c| format!("{c:?}")));
                            o["error"] = json!(detail);
                        }
                    }
                    o
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Table => {
            println!("{:<24} RESULT", "ENDPOINT");
            for r in &rows {
                let ep = r.endpoint.trim_start_matches("http://");
                let said = match (&r.error, r.after) {
                    (None, Some((start, committed))) => format!(
                        "trimmed: log starts at {start} ({}), committed end {committed}",
                        match r.before {
                            Some(b) if b != start => format!("was {b}"),
                            _ if start > lsn => format!("unchanged: already past LSN {lsn}"),
                            Some(_) => format!("unchanged: no whole block left below LSN {lsn}"),
                            None => "before: unknown".into(),
                        }
                    ),
                    (None, None) => "trimmed (its status did not answer)".into(),
                    (Some(e), _) => {
                        let (what, code, detail) = trim_failure(e);
                        match code {
                            Some(c) => format!("{what} ({c:?}): {detail}"),
                            None => format!("{what}: {detail}"),
                        }
                    }
                };
                println!("{ep:<24} {said}");
            }
        }
    }
    let failed: Vec<&ClientError> = rows.iter().filter_map(|r| r.error.as_ref()).collect();
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "chorus: group {group} was not trimmed below LSN {lsn} on {} of {} nodes",
        failed.len(),
        rows.len()
    );
    let code = failed
        .iter()
        .map(|e| exit_code(e))
        .max()
        .unwrap_or(EXIT_PROBLEM);
    Ok(ExitCode::from(code))
}
