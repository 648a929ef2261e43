//! Client commands: they talk to a running cluster over the gRPC API.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use chorus_client::{pb, Client, ClientError};
use clap::{Args, Subcommand};
use serde_json::json;
use tonic::Code;

use crate::{AnyResult, Endpoints, Output, EXIT_PROBLEM, EXIT_REFUSED, EXIT_UNREACHABLE};

/// `chorus append`.
#[derive(Args, Debug)]
pub struct AppendArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// Records to append (each argument is one record). Without any, one record per line
    /// of standard input.
    records: Vec<String>,
    /// Reference CSN: each record's CSN will be at least this.
    #[arg(long, default_value_t = 0)]
    ref_csn: u64,
}

/// `chorus read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// First LSN (a record's LSN, or 0 for the start).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Most records to print.
    #[arg(long, default_value_t = 100)]
    max: u32,
}

/// `chorus tail`.
#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// First LSN.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Keep following the committed tail (until interrupted).
    #[arg(short, long)]
    follow: bool,
}

/// `chorus locate`.
#[derive(Args, Debug)]
pub struct LocateArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// The CSN to find.
    #[arg(long)]
    csn: u64,
}

/// `chorus status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    ep: Endpoints,
}

/// `chorus member`.
#[derive(Args, Debug)]
pub struct MemberArgs {
    #[command(subcommand)]
    op: MemberOp,
}

#[derive(Subcommand, Debug)]
enum MemberOp {
    /// Add a voter.
    Add(MemberNode),
    /// Remove a voter or learner.
    Remove(MemberNode),
    /// Add a non-voting learner.
    Learner(MemberNode),
    /// Promote a caught-up learner to voter.
    Promote(MemberNode),
    /// Replace voter --old with --node.
    Replace {
        #[command(flatten)]
        m: MemberNode,
        /// The voter leaving.
        #[arg(long)]
        old: u64,
    },
}

#[derive(Args, Debug)]
struct MemberNode {
    #[command(flatten)]
    ep: Endpoints,
    /// The node.
    #[arg(long)]
    node: u64,
    /// Replication address of a joining node (HOST:PORT).
    #[arg(long)]
    addr: Option<String>,
}

/// `chorus leader`.
#[derive(Args, Debug)]
pub struct LeaderArgs {
    #[command(subcommand)]
    op: LeaderOp,
}

#[derive(Subcommand, Debug)]
enum LeaderOp {
    /// Hand leadership to a voter.
    Transfer {
        #[command(flatten)]
        ep: Endpoints,
        /// The voter to lead.
        #[arg(long)]
        to: u64,
    },
    /// Set the election priority of the replica at one endpoint.
    Priority {
        #[command(flatten)]
        ep: Endpoints,
        /// Index of the endpoint in --endpoints (0-based).
        #[arg(long)]
        at: usize,
        /// Priority (higher wins, after config version).
        #[arg(long)]
        priority: u32,
    },
}

/// `chorus group`.
#[derive(Args, Debug)]
pub struct GroupArgs {
    #[command(subcommand)]
    op: GroupOp,
}

#[derive(Subcommand, Debug)]
enum GroupOp {
    /// Create a group on every endpoint with the initial voters.
    Create {
        #[command(flatten)]
        ep: Endpoints,
        /// Initial voters (node ids), comma-separated.
        #[arg(long, value_delimiter = ',')]
        voters: Vec<u64>,
    },
}

/// A client command.
pub enum Remote {
    /// append
    Append(AppendArgs),
    /// read
    Read(ReadArgs),
    /// tail
    Tail(TailArgs),
    /// locate
    Locate(LocateArgs),
    /// status
    Status(StatusArgs),
    /// member
    Member(MemberArgs),
    /// leader
    Leader(LeaderArgs),
    /// group
    Group(GroupArgs),
}

/// Runs a client command on a small async runtime, mapping errors to exit codes.
pub fn run(cmd: Remote) -> AnyResult<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(async move {
        match cmd {
            Remote::Append(a) => append(a).await,
            Remote::Read(a) => read(a).await,
            Remote::Tail(a) => tail(a).await,
            Remote::Locate(a) => locate(a).await,
            Remote::Status(a) => status(a).await,
            Remote::Member(a) => member(a).await,
            Remote::Leader(a) => leader(a).await,
            Remote::Group(a) => group(a).await,
        }
    });
    match r {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("chorus: {e}");
            Ok(ExitCode::from(exit_code(&e)))
        }
    }
}

pub(crate) fn exit_code(e: &ClientError) -> u8 {
    match e {
        ClientError::NoLeader { .. }
        | ClientError::Unreachable { .. }
        | ClientError::Indeterminate { .. } => EXIT_UNREACHABLE,
        ClientError::Status { code, .. } if *code == Code::Unavailable => EXIT_UNREACHABLE,
        ClientError::BadEndpoint { .. } | ClientError::NoEndpoints => crate::EXIT_USAGE,
        ClientError::Status { .. } => EXIT_REFUSED,
    }
}

fn outcome(o: i32) -> &'static str {
    match pb::Outcome::try_from(o) {
        Ok(pb::Outcome::Committed) => "committed",
        Ok(pb::Outcome::Failed) => "failed",
        _ => "unknown",
    }
}

fn printable(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(s) if !s.chars().any(|c| c.is_control() && c != '\t') => s.to_string(),
        _ => {
            let hex: String = data.iter().take(32).map(|b| format!("{b:02x}")).collect();
            if data.len() > 32 {
                format!("0x{hex}… ({} bytes)", data.len())
            } else {
                format!("0x{hex}")
            }
        }
    }
}

async fn append(a: AppendArgs) -> Result<ExitCode, ClientError> {
    let records: Vec<Vec<u8>> = if a.records.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .map_while(Result::ok)
            .map(|l| l.into_bytes())
            .collect()
    } else {
        a.records.iter().map(|r| r.as_bytes().to_vec()).collect()
    };
    let mut c = Client::new(a.ep.endpoints.clone());
    let mut failed = false;
    let mut rows = Vec::new();
    for chunk in records.chunks(crate::service::MAX_APPEND_BATCH) {
        let res = c.append(a.ep.group, chunk.to_vec(), a.ref_csn).await?;
        if res.len() < chunk.len() {
            eprintln!(
                "chorus: only {} of {} records were accepted",
                res.len(),
                chunk.len()
            );
            failed = true;
        }
        for r in res {
            failed |= r.outcome != pb::Outcome::Committed as i32;
            rows.push(r);
        }
    }
    match a.ep.output {
        Output::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|r| json!({"lsn": r.lsn, "csn": r.csn, "outcome": outcome(r.outcome)}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Table => {
            println!("{:>14} {:>10}  OUTCOME", "LSN", "CSN");
            for r in &rows {
                println!("{:>14} {:>10}  {}", r.lsn, r.csn, outcome(r.outcome));
            }
        }
    }
    Ok(if failed {
        ExitCode::from(EXIT_PROBLEM)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_records(out: Output, recs: &[pb::Record]) {
    let mut so = std::io::stdout().lock();
    for r in recs {
        let _ = match out {
            Output::Json => writeln!(
                so,
                "{}",
                json!({"lsn": r.lsn, "csn": r.csn, "data": printable(&r.data)})
            ),
            Output::Table => writeln!(so, "{:>14} {:>10}  {}", r.lsn, r.csn, printable(&r.data)),
        };
    }
}

async fn read(a: ReadArgs) -> Result<ExitCode, ClientError> {
    let mut c = Client::new(a.ep.endpoints.clone());
    let r = c.read(a.ep.group, a.from, a.max).await?;
    if a.ep.output == Output::Table {
        println!("{:>14} {:>10}  DATA", "LSN", "CSN");
    }
    print_records(a.ep.output, &r.records);
    if a.ep.output == Output::Table {
        println!(
            "({} records; next LSN {}; committed end {})",
            r.records.len(),
            r.next_lsn,
            r.committed_end
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn tail(a: TailArgs) -> Result<ExitCode, ClientError> {
    let mut c = Client::new(a.ep.endpoints.clone());
    if !a.follow {
        let mut from = a.from;
        loop {
            let r = c.read(a.ep.group, from, 1000).await?;
            print_records(a.ep.output, &r.records);
            if r.records.is_empty() || r.next_lsn >= r.committed_end {
                return Ok(ExitCode::SUCCESS);
            }
            from = r.next_lsn;
        }
    }
    let mut s = c.tail(a.ep.group, a.from).await?;
    loop {
        match s.message().await {
            Ok(Some(r)) => print_records(a.ep.output, &r.records),
            Ok(None) => return Ok(ExitCode::SUCCESS),
            Err(st) => {
                return Err(ClientError::Status {
                    endpoint: "tail".into(),
                    code: st.code(),
                    message: st.message().into(),
                })
            }
        }
    }
}

async fn locate(a: LocateArgs) -> Result<ExitCode, ClientError> {
    let mut c = Client::new(a.ep.endpoints.clone());
    let r = c.locate(a.ep.group, a.csn).await?;
    match a.ep.output {
        Output::Json => println!("{}", json!({"csn": a.csn, "lsn": r})),
        Output::Table => match r {
            Some(l) => println!("CSN {} -> LSN {l}", a.csn),
            None => println!("no committed record with CSN >= {}", a.csn),
        },
    }
    Ok(if r.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEM)
    })
}

async fn status(a: StatusArgs) -> Result<ExitCode, ClientError> {
    let mut c = Client::new(a.ep.endpoints.clone());
    let all = c.status_all(a.ep.group).await;
    let mut reachable = 0;
    let mut rows = Vec::new();
    for (ep, r) in &all {
        match r {
            Ok(s) => {
                reachable += 1;
                for g in &s.groups {
                    rows.push((ep.clone(), Some(g.clone()), None));
                }
            }
            Err(e) => rows.push((ep.clone(), None, Some(e.to_string()))),
        }
    }
    // Lag: the leader's end minus each replica's durable end.
    let leader_end = rows
        .iter()
        .filter_map(|(_, g, _)| g.as_ref())
        .filter(|g| g.role == "leader")
        .map(|g| g.end_lsn)
        .max();
    match a.ep.output {
        Output::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|(ep, g, e)| match g {
                    Some(g) => json!({
                        "endpoint": ep, "group": g.group, "node": g.node, "role": g.role,
                        "proposal_id": g.proposal_id,
                        "leader": if g.has_leader { Some(g.leader) } else { None },
                        "start_lsn": g.start_lsn, "end_lsn": g.end_lsn,
                        "flushed_lsn": g.flushed_lsn, "committed_lsn": g.committed_lsn,
                        "lag_bytes": leader_end.map(|l| l.saturating_sub(g.flushed_lsn)),
                        "voters": g.voters, "learners": g.learners,
                        "config_version": [g.config_proposal_id, g.config_seq],
                        "pending_appends": g.pending_appends,
                        "stopped": if g.stopped.is_empty() { None } else { Some(&g.stopped) },
                    }),
                    None => json!({"endpoint": ep, "error": e}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Table => {
            println!(
                "{:<24} {:>5} {:>4} {:<16} {:>6} {:>6} {:>12} {:>12} {:>12} {:>10}  MEMBERS",
                "ENDPOINT",
                "GROUP",
                "NODE",
                "ROLE",
                "PID",
                "LEADER",
                "END",
                "FLUSHED",
                "COMMITTED",
                "LAG"
            );
            for (ep, g, e) in &rows {
                match g {
                    Some(g) => println!(
                        "{:<24} {:>5} {:>4} {:<16} {:>6} {:>6} {:>12} {:>12} {:>12} {:>10}  voters {:?} learners {:?}{}",
                        ep.trim_start_matches("http://"),
                        g.group,
                        g.node,
                        g.role,
                        g.proposal_id,
                        if g.has_leader { g.leader.to_string() } else { "-".into() },
                        g.end_lsn,
                        g.flushed_lsn,
                        g.committed_lsn,
                        leader_end.map_or("-".into(), |l| l.saturating_sub(g.flushed_lsn).to_string()),
                        g.voters,
                        g.learners,
                        if g.stopped.is_empty() { String::new() } else { format!("  STOPPED: {}", g.stopped) }
                    ),
                    None => println!(
                        "{:<24} unreachable: {}",
                        ep.trim_start_matches("http://"),
                        e.as_deref().unwrap_or("")
                    ),
                }
            }
        }
    }
    Ok(if reachable == 0 {
        ExitCode::from(EXIT_UNREACHABLE)
    } else {
        ExitCode::SUCCESS
    })
}

fn done(out: Output, what: &str) -> ExitCode {
    match out {
        Output::Json => println!("{}", json!({"ok": true, "what": what})),
        Output::Table => println!("{what}"),
    }
    ExitCode::SUCCESS
}

async fn member(a: MemberArgs) -> Result<ExitCode, ClientError> {
    let (kind, m, old) = match a.op {
        MemberOp::Add(m) => (pb::ChangeKind::AddVoter, m, 0),
        MemberOp::Remove(m) => (pb::ChangeKind::Remove, m, 0),
        MemberOp::Learner(m) => (pb::ChangeKind::AddLearner, m, 0),
        MemberOp::Promote(m) => (pb::ChangeKind::Promote, m, 0),
        MemberOp::Replace { m, old } => (pb::ChangeKind::Replace, m, old),
    };
    let mut c = Client::new(m.ep.endpoints.clone());
    c.change_membership(pb::ChangeMembershipRequest {
        group: m.ep.group,
        kind: kind as i32,
        node: m.node,
        old_node: old,
        node_addr: m.addr.clone().unwrap_or_default(),
    })
    .await?;
    Ok(done(
        m.ep.output,
        &format!(
            "membership change {:?} of node {} started; `chorus status` shows when it is accepted",
            kind, m.node
        ),
    ))
}

async fn leader(a: LeaderArgs) -> Result<ExitCode, ClientError> {
    match a.op {
        LeaderOp::Transfer { ep, to } => {
            let mut c = Client::new(ep.endpoints.clone());
            c.transfer_leader(ep.group, to).await?;
            Ok(done(
                ep.output,
                &format!("leadership of group {} is moving to node {to}", ep.group),
            ))
        }
        LeaderOp::Priority { ep, at, priority } => {
            if at >= ep.endpoints.len() {
                return Err(ClientError::BadEndpoint {
                    endpoint: at.to_string(),
                    detail: format!(
                        "--at must be below the number of endpoints ({})",
                        ep.endpoints.len()
                    ),
                });
            }
            let mut c = Client::new(ep.endpoints.clone());
            c.set_priority(at, ep.group, priority).await?;
            Ok(done(
                ep.output,
                &format!("priority of {} set to {priority}", ep.endpoints[at]),
            ))
        }
    }
}

async fn group(a: GroupArgs) -> Result<ExitCode, ClientError> {
    match a.op {
        GroupOp::Create { ep, voters } => {
            let mut c = Client::new(ep.endpoints.clone());
            c.create_group(ep.group, voters.clone(), vec![]).await?;
            Ok(done(
                ep.output,
                &format!("group {} created with voters {voters:?}", ep.group),
            ))
        }
    }
}
