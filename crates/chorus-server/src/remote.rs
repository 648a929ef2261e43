//! Client commands: they talk to a running cluster over the gRPC API.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use chorus_client::{pb, AtCsn, Client, ClientError};
use clap::{Args, Subcommand};
use serde_json::json;
use tonic::Code;

use crate::{AnyResult, Endpoints, Output, EXIT_PROBLEM, EXIT_REFUSED, EXIT_UNREACHABLE};

mod follower;
mod mirror;
mod trim;

pub use follower::WatchRoleArgs;
pub use mirror::MirrorArgs;

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
    /// Parallel-mode groups: the blocks every record writes, `START` or `START+COUNT`
    /// (repeatable); each record is padded with zeros to 4096 bytes per block.
    #[arg(long = "blocks", value_parser = parse_range, conflicts_with_all = ["reads", "writes", "ref_csn"])]
    blocks: Vec<chorus_core::ooo::parallel::BlockRange>,
    /// Dependent-mode groups: keys every record's transaction read, comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "ref_csn")]
    reads: Vec<u64>,
    /// Dependent-mode groups: keys every record's transaction wrote, comma-separated (the
    /// demo key-value store sets each to the record).
    #[arg(long, value_delimiter = ',', conflicts_with = "ref_csn")]
    writes: Vec<u64>,
}

fn parse_range(s: &str) -> Result<chorus_core::ooo::parallel::BlockRange, String> {
    crate::ooo::parse_blocks(s)
}

/// `chorus state`: the applied state of an out-of-order group's state machine on
/// every endpoint.
#[derive(Args, Debug)]
pub struct StateArgs {
    #[command(subcommand)]
    op: StateOp,
}

#[derive(Subcommand, Debug)]
enum StateOp {
    /// Blocks of a parallel-mode group's volume.
    Blocks {
        #[command(flatten)]
        ep: Endpoints,
        /// First block.
        start: u64,
        /// Blocks to read (at most 4096).
        #[arg(long, default_value_t = 1)]
        count: u64,
    },
    /// Keys of a dependent-mode group's key-value store.
    Keys {
        #[command(flatten)]
        ep: Endpoints,
        /// Keys to look up.
        #[arg(required = true)]
        keys: Vec<u64>,
    },
}

/// `chorus read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// First LSN (a record's LSN, or 0 for the start); for an out-of-order group, the
    /// first slot.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Most records to print.
    #[arg(long, default_value_t = 100)]
    max: u32,
    #[command(flatten)]
    at: follower::CsnArgs,
}

/// `chorus tail`.
#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// First LSN; for an out-of-order group, the first slot.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Keep following the committed tail (until interrupted).
    #[arg(short, long)]
    follow: bool,
    #[command(flatten)]
    at: follower::CsnArgs,
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

/// `chorus trim`.
#[derive(Args, Debug)]
pub struct TrimArgs {
    #[command(flatten)]
    ep: Endpoints,
    /// Ordered groups: trim below this LSN, the first record the database still needs
    /// (after its checkpoint), at most the committed end of every node named (a node
    /// whose committed end is below it refuses, OUT_OF_RANGE, naming its committed end);
    /// records from the start of its block on are kept. Out-of-order groups: the slot
    /// below which each node checkpoints its state machine and compacts its entries (at
    /// most what it applied).
    #[arg(long)]
    lsn: u64,
}

/// `chorus member`.
#[derive(Args, Debug)]
pub struct MemberArgs {
    #[command(subcommand)]
    op: MemberOp,
}

#[derive(Subcommand, Debug)]
enum MemberOp {
    /// Add a voter. Ordered groups: as a learner first, promoted once it has caught up
    /// (within --catch-up seconds; otherwise it is removed again and the command fails);
    /// --force adds it as a voter at once. Out-of-order groups: a voter at once.
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
    /// Skip the strict reconfiguration check: add a voter directly, promote a learner not
    /// heard from, remove a voter although the live voters left are fewer than a
    /// majority.
    #[arg(long)]
    force: bool,
    /// `member add` on an ordered group: seconds the new learner has to catch up before
    /// it is promoted.
    #[arg(long, default_value_t = 60)]
    catch_up: u64,
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
        /// Transfer even to a voter the leader has not heard from within the lease, or
        /// that is more than a window behind the committed end.
        #[arg(long)]
        force: bool,
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
        /// `ordered`, `parallel` or `dependent`.
        #[arg(long, default_value = "ordered", value_parser = ["ordered", "parallel", "dependent"])]
        mode: String,
        /// Out-of-order groups: replicas besides the voters that a membership change may
        /// add later (node ids), comma-separated.
        #[arg(long, value_delimiter = ',')]
        replicas: Vec<u64>,
        /// Parallel groups: the look-behind buffer's length (0: the paper's 2).
        #[arg(long, default_value_t = 0)]
        look_behind: u32,
        /// Parallel groups: `any` (commit once a majority has an entry) or `conflicts`
        /// (commit only after every earlier entry overlapping its blocks).
        #[arg(long, default_value = "any", value_parser = ["any", "conflicts"])]
        commit_order: String,
        /// Ordered groups: `append` (a primary) or `raw-write` (a mirror: it takes only
        /// groups another log committed, `chorus mirror`, until `chorus group access-mode`
        /// switches it; PALF section 5.2).
        #[arg(long, default_value = "append", value_parser = ["append", "raw-write"])]
        access_mode: String,
        /// Parallel groups: the chunk's size in bytes (0: 10 GiB).
        #[arg(long, default_value_t = 0)]
        chunk_bytes: u64,
        /// Parallel groups: the chunk's allocation unit in bytes (0: 64 KiB).
        #[arg(long, default_value_t = 0)]
        block_bytes: u32,
    },
    /// Switch an ordered group's access mode at its leader: `append` (failover: a mirror
    /// becomes a primary) or `raw-write` (switchover: a primary becomes a mirror). In force
    /// once a majority holds it; until then neither appends nor mirror writes are taken.
    AccessMode {
        #[command(flatten)]
        ep: Endpoints,
        /// The mode.
        #[arg(long, value_parser = ["append", "raw-write"])]
        mode: String,
    },
    /// Delete the replica of a group at one endpoint, data included (remove the node from
    /// the group's voters first; take the group out of that node's configuration file).
    Delete {
        #[command(flatten)]
        ep: Endpoints,
        /// Index of the endpoint in --endpoints (0-based).
        #[arg(long)]
        at: usize,
        /// Delete even while the node is a voter (the group loses a replica).
        #[arg(long)]
        force: bool,
    },
    /// Start the replica of a group at one endpoint again from its files, as a node
    /// restart would, without touching the node's other groups: one that stopped (its
    /// storage failed, e.g. a full disk) once the cause is fixed, or one that did not
    /// start (damaged files). Refused while the group runs there.
    Restart {
        #[command(flatten)]
        ep: Endpoints,
        /// Index of the endpoint in --endpoints (0-based).
        #[arg(long)]
        at: usize,
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
    /// state
    State(StateArgs),
    /// trim
    Trim(TrimArgs),
    /// mirror
    Mirror(MirrorArgs),
    /// watch-role
    WatchRole(WatchRoleArgs),
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
            Remote::State(a) => state(a).await,
            Remote::Trim(a) => trim::trim(a).await,
            Remote::Mirror(a) => mirror::mirror(a).await,
            Remote::WatchRole(a) => follower::watch_role(a).await,
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

/// Why a record of an append has no outcome, if it has none (the server sets at most one
/// of the two): never appended, so safe to append again ("refused"), or appended with its
/// outcome unknown to the replica, so it may have committed ("unknown").
fn no_outcome<'a>(refused: &'a str, unknown: &'a str) -> Option<(&'static str, &'a str)> {
    if !refused.is_empty() {
        Some(("refused", refused))
    } else if !unknown.is_empty() {
        Some(("unknown", unknown))
    } else {
        None
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
    if !a.blocks.is_empty() || !a.reads.is_empty() || !a.writes.is_empty() {
        return append_out_of_order(a, records).await;
    }
    let mut c = a.ep.client();
    let mut failed = false;
    let mut rows = Vec::new();
    let mut error = None;
    // Records go in order: once some are not appended (refused, or the call failed),
    // none after them is sent, and what was appended before is still printed.
    for chunk in records.chunks(crate::service::MAX_APPEND_BATCH) {
        let res = match c.append(a.ep.group, chunk.to_vec(), a.ref_csn).await {
            Ok(res) => res,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        let short = res.len() < chunk.len();
        for r in res {
            failed |= r.outcome != pb::Outcome::Committed as i32;
            rows.push(r);
        }
        if short {
            eprintln!(
                "chorus: only {} of {} records were appended; the rest were not sent",
                rows.len(),
                records.len()
            );
            failed = true;
            break;
        }
    }
    match a.ep.output {
        Output::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|r| match no_outcome("", &r.unknown) {
                    Some((what, why)) => {
                        json!({"lsn": r.lsn, "csn": r.csn, "outcome": what, "reason": why})
                    }
                    None => json!({"lsn": r.lsn, "csn": r.csn, "outcome": outcome(r.outcome)}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Table => {
            println!("{:>14} {:>10}  OUTCOME", "LSN", "CSN");
            for r in &rows {
                let said = no_outcome("", &r.unknown).map_or_else(
                    || outcome(r.outcome).into(),
                    |(w, why)| format!("{w}: {why}"),
                );
                println!("{:>14} {:>10}  {said}", r.lsn, r.csn);
            }
        }
    }
    if let Some(e) = error {
        if !rows.is_empty() {
            eprintln!(
                "chorus: {} of {} records were appended before this error; the rest were not sent",
                rows.len(),
                records.len()
            );
        }
        return Err(e);
    }
    Ok(if failed {
        ExitCode::from(EXIT_PROBLEM)
    } else {
        ExitCode::SUCCESS
    })
}

/// `chorus append --blocks` / `--reads --writes`: one out-of-order append per record.
async fn append_out_of_order(
    a: AppendArgs,
    records: Vec<Vec<u8>>,
) -> Result<ExitCode, ClientError> {
    let blocks: u64 = a.blocks.iter().map(|r| r.end - r.start).sum();
    let size = blocks.saturating_mul(crate::ooo::BLOCK);
    let mut recs = Vec::with_capacity(records.len());
    for (i, mut data) in records.into_iter().enumerate() {
        if !a.blocks.is_empty() {
            if data.len() as u64 > size {
                return Err(ClientError::Status {
                    endpoint: "(not sent)".into(),
                    code: Code::InvalidArgument,
                    message: format!(
                        "record {i} has {} bytes, more than its {blocks} blocks hold ({size})",
                        data.len()
                    ),
                });
            }
            data.resize(size as usize, 0);
        }
        recs.push(pb::OutOfOrderRecord {
            data,
            blocks: a
                .blocks
                .iter()
                .map(|r| pb::BlockRange {
                    start: r.start,
                    count: r.end - r.start,
                })
                .collect(),
            read_set: a.reads.clone(),
            write_set: a.writes.clone(),
        });
    }
    let mut c = a.ep.client();
    let mut outcomes = Vec::new();
    let total = recs.len();
    for chunk in recs.chunks(crate::service::MAX_APPEND_BATCH) {
        outcomes.extend(c.append_out_of_order(a.ep.group, chunk.to_vec()).await?);
    }
    let failed = outcomes.len() < total
        || outcomes
            .iter()
            .any(|r| r.outcome != pb::Outcome::Committed as i32);
    if outcomes.len() < total {
        // A server before per-record reporting cut its list at a refusal.
        eprintln!(
            "chorus: only {} of {total} records have a result",
            outcomes.len()
        );
    }
    match a.ep.output {
        Output::Json => {
            let v: Vec<_> = outcomes
                .iter()
                .map(|r| match no_outcome(&r.refused, &r.unknown) {
                    Some((what, why)) => json!({"outcome": what, "reason": why}),
                    None => {
                        json!({"slot": r.seq, "index": r.index, "outcome": outcome(r.outcome)})
                    }
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Table => {
            println!("{:>14} {:>5}  OUTCOME", "SLOT", "INDEX");
            for r in &outcomes {
                match no_outcome(&r.refused, &r.unknown) {
                    Some((w, why)) => println!("{:>14} {:>5}  {w}: {why}", "-", "-"),
                    None => println!("{:>14} {:>5}  {}", r.seq, r.index, outcome(r.outcome)),
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::from(EXIT_PROBLEM)
    } else {
        ExitCode::SUCCESS
    })
}

/// A replica's applied slot head and (what, value) pairs.
type AppliedState = (u64, Vec<(String, String)>);

/// `chorus state blocks|keys`: every endpoint's applied state; exit 1 when replicas that
/// applied the same slots disagree.
async fn state(a: StateArgs) -> Result<ExitCode, ClientError> {
    let ep = match &a.op {
        StateOp::Blocks { ep, .. } | StateOp::Keys { ep, .. } => ep.clone(),
    };
    let mut c = ep.client();
    let mut rows: Vec<(String, Result<AppliedState, ClientError>)> = Vec::new();
    for i in 0..ep.endpoints.len() {
        let r = match &a.op {
            StateOp::Blocks { start, count, .. } => c
                .read_blocks_at(i, ep.group, *start, *count)
                .await
                .map(|r| {
                    let vals = r
                        .data
                        .chunks(crate::ooo::BLOCK as usize)
                        .enumerate()
                        .map(|(k, b)| {
                            let used = b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
                            let shown = if used == 0 {
                                "(zeros)".to_string()
                            } else {
                                printable(&b[..used])
                            };
                            (format!("block {}", start + k as u64), shown)
                        })
                        .collect();
                    (r.applied_seq, vals)
                }),
            StateOp::Keys { keys, .. } => c.get_keys_at(i, ep.group, keys.clone()).await.map(|r| {
                let vals = r
                    .values
                    .iter()
                    .map(|kv| {
                        let v = if kv.found {
                            printable(&kv.value)
                        } else {
                            "(absent)".to_string()
                        };
                        (format!("key {}", kv.key), v)
                    })
                    .collect();
                (r.applied_seq, vals)
            }),
        };
        rows.push((ep.endpoints[i].clone(), r));
    }
    // Replicas that applied exactly the same prefix must hold the same values.
    let mut disagree = false;
    for (i, (_, a)) in rows.iter().enumerate() {
        for (_, b) in &rows[i + 1..] {
            if let (Ok(a), Ok(b)) = (a, b) {
                disagree |= a.0 == b.0 && a.1 != b.1;
            }
        }
    }
    let reachable = rows.iter().filter(|r| r.1.is_ok()).count();
    match ep.output {
        Output::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|(e, r)| match r {
                    Ok((applied, vals)) => json!({
                        "endpoint": e, "applied_seq": applied,
                        "values": vals.iter().map(|(k, v)| json!({"what": k, "value": v})).collect::<Vec<_>>(),
                    }),
                    Err(err) => json!({"endpoint": e, "error": err.to_string()}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Table => {
            for (e, r) in &rows {
                match r {
                    Ok((applied, vals)) => {
                        println!(
                            "{}  (applied below slot {applied})",
                            e.trim_start_matches("http://")
                        );
                        for (k, v) in vals {
                            println!("  {k:<16} {v}");
                        }
                    }
                    Err(err) => println!("{}  error: {err}", e.trim_start_matches("http://")),
                }
            }
        }
    }
    if disagree {
        eprintln!("chorus: replicas that applied the same slots hold different values");
        return Ok(ExitCode::from(EXIT_PROBLEM));
    }
    if reachable == 0 {
        if let Some((_, Err(e))) = rows.into_iter().next() {
            return Err(e);
        }
        return Ok(ExitCode::from(EXIT_UNREACHABLE));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints records, one per line; in JSON each carries the readable CSN of the replica
/// that answered (`ReadResponse.readable_csn`).
fn print_records(out: Output, r: &pb::ReadResponse) {
    let mut so = std::io::stdout().lock();
    let readable = r.readable_csn;
    for r in &r.records {
        let _ = match out {
            Output::Json => writeln!(
                so,
                "{}",
                json!({"lsn": r.lsn, "csn": r.csn, "data": printable(&r.data), "readable_csn": readable})
            ),
            Output::Table => writeln!(so, "{:>14} {:>10}  {}", r.lsn, r.csn, printable(&r.data)),
        };
    }
}

/// Prints out-of-order entries, one row per record of each entry's group: slot, place in
/// the group, term, what the record declared (and the entry's RAW/WAW predecessors), its
/// bytes. A NULL slot is one row without records.
fn print_ooo_entries(out: Output, es: &[pb::OutOfOrderEntry]) {
    let mut so = std::io::stdout().lock();
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    for e in es {
        if e.null {
            let _ = match out {
                Output::Json => writeln!(
                    so,
                    "{}",
                    json!({"seq": e.seq, "term": e.term, "null": true})
                ),
                Output::Table => writeln!(so, "{:>10} {:>5} {:>6}  (null)", e.seq, "-", e.term),
            };
            continue;
        }
        for (i, r) in e.records.iter().enumerate() {
            let blocks: Vec<String> = r
                .blocks
                .iter()
                .map(|b| format!("{}+{}", b.start, b.count))
                .collect();
            let _ = match out {
                Output::Json => writeln!(
                    so,
                    "{}",
                    json!({"seq": e.seq, "index": i, "term": e.term, "null": false,
                           "blocks": blocks, "read_set": r.read_set, "write_set": r.write_set,
                           "raw": e.raw, "waw": e.waw, "data": printable(&r.data)})
                ),
                Output::Table => {
                    let declared = if !blocks.is_empty() {
                        let mut d = format!("blocks {}", blocks.join(","));
                        // Conflict order: the slots the entry committed after.
                        if !e.raw.is_empty() {
                            d += &format!(" after {}", list(&e.raw));
                        }
                        d
                    } else {
                        let mut d = format!("writes {}", list(&r.write_set));
                        if !r.read_set.is_empty() {
                            d += &format!(" reads {}", list(&r.read_set));
                        }
                        if !e.raw.is_empty() {
                            d += &format!(" raw {}", list(&e.raw));
                        }
                        if !e.waw.is_empty() {
                            d += &format!(" waw {}", list(&e.waw));
                        }
                        d
                    };
                    writeln!(
                        so,
                        "{:>10} {:>5} {:>6}  {:<28} {}",
                        e.seq,
                        i,
                        e.term,
                        declared,
                        printable(&r.data)
                    )
                }
            };
        }
    }
}

/// `chorus read` of an out-of-order group: its committed slots in slot order.
async fn read_ooo(a: &ReadArgs, c: &mut Client) -> Result<ExitCode, ClientError> {
    let r = c.read_out_of_order(a.ep.group, a.from, a.max).await?;
    if a.ep.output == Output::Table {
        println!(
            "{:>10} {:>5} {:>6}  {:<28} DATA",
            "SLOT", "INDEX", "TERM", "DECLARED"
        );
    }
    print_ooo_entries(a.ep.output, &r.entries);
    if a.ep.output == Output::Table {
        println!(
            "({} entries; next slot {}; committed up to slot {})",
            r.entries.len(),
            r.next_seq,
            r.committed_seq
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn read(a: ReadArgs) -> Result<ExitCode, ClientError> {
    let mut c = a.ep.client();
    let r = match c.read_at_csn(a.ep.group, a.from, a.max, a.at.at()).await {
        // An out-of-order group: read its slots instead.
        Err(e) if is_ooo_group(&e) => return read_ooo(&a, &mut c).await,
        r => r?,
    };
    if a.ep.output == Output::Table {
        println!("{:>14} {:>10}  DATA", "LSN", "CSN");
    }
    print_records(a.ep.output, &r);
    if a.ep.output == Output::Table {
        println!(
            "({} records; next LSN {}; committed end {}; readable CSN {})",
            r.records.len(),
            r.next_lsn,
            r.committed_end,
            r.readable_csn
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `e` says the group is an out-of-order one (an ordered-group call refused).
fn is_ooo_group(e: &ClientError) -> bool {
    matches!(e, ClientError::Status { code, message, .. }
        if *code == Code::Unimplemented && message.contains("-mode group"))
}

/// A stream's error as the CLI reports it.
fn stream_error(st: tonic::Status) -> ClientError {
    ClientError::Status {
        endpoint: "tail".into(),
        code: st.code(),
        message: st.message().into(),
    }
}

async fn tail(a: TailArgs) -> Result<ExitCode, ClientError> {
    let mut c = a.ep.client();
    let at = a.at.at();
    // With --min-csn, the table says once what the serving replica could read.
    let mut say_readable = at.min_csn > 0 && a.ep.output == Output::Table;
    if !a.follow {
        let mut from = a.from;
        // Only the first read waits for --min-csn: the later ones go on from there.
        let mut at = at;
        loop {
            let r = match c.read_at_csn(a.ep.group, from, 1000, at).await {
                Err(e) if is_ooo_group(&e) => return tail_ooo(&a, &mut c).await,
                r => r?,
            };
            at = AtCsn::default();
            if std::mem::take(&mut say_readable) {
                eprintln!("(readable CSN {})", r.readable_csn);
            }
            print_records(a.ep.output, &r);
            if r.records.is_empty() || r.next_lsn >= r.committed_end {
                return Ok(ExitCode::SUCCESS);
            }
            from = r.next_lsn;
        }
    }
    let s = match c.tail_at_csn(a.ep.group, a.from, at).await {
        Err(e) if is_ooo_group(&e) => return tail_ooo(&a, &mut c).await,
        s => s?,
    };
    let (ep, group, out) = (a.ep.clone(), a.ep.group, a.ep.output);
    follow(
        s,
        a.from,
        // A stream opened again elsewhere waits for --min-csn there too.
        move |from| {
            let mut c = ep.client();
            async move { c.tail_at_csn(group, from, at).await }
        },
        move |r: &pb::ReadResponse| {
            if std::mem::take(&mut say_readable) {
                eprintln!("(readable CSN {})", r.readable_csn);
            }
            print_records(out, r);
            r.next_lsn
        },
    )
    .await
}

/// Whether a tail stream that failed with `code` may go on at another replica: the
/// replica went away or stopped serving the group, as opposed to a refusal (a position
/// below the base, a group that is not there) that any replica would repeat.
fn resumable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted | Code::Internal
    )
}

/// Whether opening a tail again may succeed later (no replica answered, or one that is
/// going away did), as opposed to a refusal.
fn retry(e: &ClientError) -> bool {
    match e {
        ClientError::Status { code, .. } => resumable(*code),
        ClientError::BadEndpoint { .. } | ClientError::NoEndpoints => false,
        _ => true,
    }
}

/// Whether a tail refused `code` at a position some replica has already served (`moved`:
/// it resumed, or went past where it was opened) may go on elsewhere: OUT_OF_RANGE there
/// means the refusing replica has not yet learned the commit point that covers the
/// position (a follower's lags the leader's by a round) or has trimmed it, and another
/// replica, or the same one a little later, serves it. At the position the tail was
/// opened at, the refusal is the answer.
fn lags(code: Code, moved: bool) -> bool {
    moved && code == Code::OutOfRange
}

/// [`lags`] for a stream that failed to open again (so after a resume).
fn lagging(e: &ClientError) -> bool {
    matches!(e, ClientError::Status { code, .. } if lags(*code, true))
}

/// How long `chorus tail -f` tries to reach another replica after losing one.
const TAIL_RESUME: std::time::Duration = std::time::Duration::from_secs(30);

/// Prints what stream `s` carries (`print` returns where the stream has got to) and, if
/// the replica serving it goes away, opens another from there (`open`: the endpoints in
/// order, as at the start), for up to [`TAIL_RESUME`] before giving up.
async fn follow<T, O, Fut, P>(
    mut s: tonic::Streaming<T>,
    mut from: u64,
    mut open: O,
    mut print: P,
) -> Result<ExitCode, ClientError>
where
    O: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Streaming<T>, ClientError>>,
    P: FnMut(&T) -> u64,
{
    let start = from;
    let mut resumed = false;
    // Since when the replicas have refused the position as not (or no longer) theirs
    // (`lags`), with no record in between: bounded by TAIL_RESUME as a lost replica is.
    let mut lagging_since: Option<std::time::Instant> = None;
    loop {
        match s.message().await {
            Ok(Some(r)) => {
                from = print(&r);
                lagging_since = None;
            }
            Ok(None) => return Ok(ExitCode::SUCCESS),
            Err(st) if lags(st.code(), resumed || from != start) => {
                resumed = true;
                if lagging_since.is_none() {
                    eprintln!(
                        "chorus tail: a replica has not caught up with {from} ({}); asking again",
                        st.message()
                    );
                }
                let since = *lagging_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= TAIL_RESUME {
                    return Err(stream_error(st));
                }
                // The replica that took the stream refused it at once: ask again after a
                // pause (the endpoints in order, as at the start).
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                s = reopen(&mut open, from).await?;
            }
            Err(st) if resumable(st.code()) => {
                resumed = true;
                lagging_since = None;
                eprintln!(
                    "chorus tail: lost the stream ({:?}: {}); resuming from {from}",
                    st.code(),
                    st.message()
                );
                s = reopen(&mut open, from).await?;
            }
            Err(st) => return Err(stream_error(st)),
        }
    }
}

/// Opens a tail stream again at `from` with `open`, trying for up to [`TAIL_RESUME`]
/// while no replica can be reached or the ones that answer lag (see [`lags`]).
async fn reopen<T, O, Fut>(open: &mut O, from: u64) -> Result<tonic::Streaming<T>, ClientError>
where
    O: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Streaming<T>, ClientError>>,
{
    let give_up = std::time::Instant::now() + TAIL_RESUME;
    loop {
        match open(from).await {
            Ok(s) => return Ok(s),
            Err(e) if !(retry(&e) || lagging(&e)) || std::time::Instant::now() >= give_up => {
                return Err(e)
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}

/// `chorus tail` of an out-of-order group: its committed slots in slot order from
/// `--from` (a slot) to the committed head, or on and on with `-f`.
async fn tail_ooo(a: &TailArgs, c: &mut Client) -> Result<ExitCode, ClientError> {
    if a.ep.output == Output::Table {
        println!(
            "{:>10} {:>5} {:>6}  {:<28} DATA",
            "SLOT", "INDEX", "TERM", "DECLARED"
        );
    }
    if !a.follow {
        let mut from = a.from;
        loop {
            let r = c.read_out_of_order(a.ep.group, from, 1000).await?;
            print_ooo_entries(a.ep.output, &r.entries);
            if r.entries.is_empty() || r.next_seq >= r.committed_seq {
                return Ok(ExitCode::SUCCESS);
            }
            from = r.next_seq;
        }
    }
    let s = c.tail_out_of_order(a.ep.group, a.from).await?;
    let (ep, group, out) = (a.ep.clone(), a.ep.group, a.ep.output);
    follow(
        s,
        a.from,
        move |from| {
            let mut c = ep.client();
            async move { c.tail_out_of_order(group, from).await }
        },
        move |r: &pb::ReadOutOfOrderResponse| {
            print_ooo_entries(out, &r.entries);
            r.next_seq
        },
    )
    .await
}

async fn locate(a: LocateArgs) -> Result<ExitCode, ClientError> {
    let mut c = a.ep.client();
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
    let mut c = a.ep.client();
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
    // Endpoints whose leaders refuse appends for want of disk space.
    let disk_low: Vec<(String, u64, u64)> = all
        .iter()
        .filter_map(|(ep, r)| match r {
            Ok(s) if s.disk_low => Some((ep.clone(), s.disk_free_bytes, s.min_free_bytes)),
            _ => None,
        })
        .collect();
    let low = |ep: &str| disk_low.iter().find(|d| d.0 == ep).map(|d| (d.1, d.2));
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
                    Some(g) if g.mode != "ordered" && !g.mode.is_empty() => json!({
                        "endpoint": ep, "group": g.group, "node": g.node, "role": g.role,
                        "mode": g.mode, "term": g.proposal_id,
                        "leader": if g.has_leader { Some(g.leader) } else { None },
                        "serving": g.serving, "recovering_lost": g.recovering_lost,
                        "committed_seq": g.committed_seq,
                        "applied_seq": g.applied_seq, "voters": g.voters,
                        "prev_voters": if g.prev_voters.is_empty() { None } else { Some(&g.prev_voters) },
                        "config_version": [g.config_proposal_id, g.config_seq],
                        "stopped": if g.stopped.is_empty() { None } else { Some(&g.stopped) },
                        "disk_low": low(ep).map(|(free, min)| json!({"free_bytes": free, "min_free_bytes": min})),
                    }),
                    Some(g) => json!({
                        "endpoint": ep, "group": g.group, "node": g.node, "role": g.role,
                        "mode": "ordered",
                        "access_mode": g.access_mode,
                        "proposal_id": g.proposal_id,
                        "leader": if g.has_leader { Some(g.leader) } else { None },
                        "start_lsn": g.start_lsn, "end_lsn": g.end_lsn,
                        "flushed_lsn": g.flushed_lsn, "committed_lsn": g.committed_lsn,
                        "lag_bytes": leader_end.map(|l| l.saturating_sub(g.flushed_lsn)),
                        "voters": g.voters, "learners": g.learners,
                        "config_version": [g.config_proposal_id, g.config_seq],
                        "pending_appends": g.pending_appends,
                        "stopped": if g.stopped.is_empty() { None } else { Some(&g.stopped) },
                        "disk_low": low(ep).map(|(free, min)| json!({"free_bytes": free, "min_free_bytes": min})),
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
                    Some(g) if g.mode != "ordered" && !g.mode.is_empty() => println!(
                        "{:<24} {:>5} {:>4} {:<16} {:>6} {:>6}  {} mode: committed below slot {}, applied below slot {}{}  voters {:?}{}{}",
                        ep.trim_start_matches("http://"),
                        g.group,
                        g.node,
                        g.role,
                        g.proposal_id,
                        if g.has_leader { g.leader.to_string() } else { "-".into() },
                        g.mode,
                        g.committed_seq,
                        g.applied_seq,
                        if g.role == "leader" && !g.serving {
                            " (merging)"
                        } else if g.recovering_lost {
                            " (recovering entries lost on disk: not voting)"
                        } else {
                            ""
                        },
                        g.voters,
                        if g.prev_voters.is_empty() { String::new() } else { format!(" (joint with {:?})", g.prev_voters) },
                        if g.stopped.is_empty() { String::new() } else { format!("  STOPPED: {}", g.stopped) }
                    ),
                    Some(g) => println!(
                        "{:<24} {:>5} {:>4} {:<16} {:>6} {:>6} {:>12} {:>12} {:>12} {:>10}  voters {:?} learners {:?}{}{}",
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
                        if g.access_mode == "raw-write" { "  (mirror: access mode raw-write)" } else { "" },
                        if g.stopped.is_empty() { String::new() } else { format!("  STOPPED: {}", g.stopped) }
                    ),
                    None => println!(
                        "{:<24} unreachable: {}",
                        ep.trim_start_matches("http://"),
                        e.as_deref().unwrap_or("")
                    ),
                }
            }
            for (ep, free, min) in &disk_low {
                println!(
                    "{}: DISK LOW: {free} bytes free, below min_free_bytes {min}: the groups it leads refuse appends until space is freed",
                    ep.trim_start_matches("http://")
                );
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
    let mut c = m.ep.client();
    let req = |kind: pb::ChangeKind, force: bool| pb::ChangeMembershipRequest {
        group: m.ep.group,
        kind: kind as i32,
        node: m.node,
        old_node: old,
        node_addr: m.addr.clone().unwrap_or_default(),
        force,
    };
    if kind == pb::ChangeKind::AddVoter
        && !m.force
        && group_mode(&mut c, m.ep.group).await == "ordered"
    {
        return add_through_learner(&mut c, &m, req(pb::ChangeKind::AddLearner, false)).await;
    }
    c.change_membership(req(kind, m.force)).await?;
    Ok(done(
        m.ep.output,
        &format!(
            "membership change {:?} of node {} started; `chorus status` shows when it is accepted",
            kind, m.node
        ),
    ))
}

/// The mode of `group` as the first node that answers reports it (`ordered` if none
/// does: the add then goes the safe way).
async fn group_mode(c: &mut chorus_client::Client, group: u64) -> String {
    for (_, r) in c.status_all(group).await {
        if let Some(g) = r
            .ok()
            .and_then(|s| s.groups.into_iter().find(|g| g.group == group))
        {
            if !g.mode.is_empty() {
                return g.mode;
            }
        }
    }
    "ordered".into()
}

/// `member add` on an ordered group (PALF section 5.3, etcd's learners): the node joins
/// as a learner, is promoted once it holds the committed log, and is removed again if it
/// does not within `--catch-up` seconds (a node that is down, does not exist, or does not
/// host the group), so that a mistyped node id never becomes a voter.
async fn add_through_learner(
    c: &mut chorus_client::Client,
    m: &MemberNode,
    learner: pb::ChangeMembershipRequest,
) -> Result<ExitCode, ClientError> {
    use tonic::Code;
    let group = m.ep.group;
    c.change_membership(learner.clone()).await?;
    let promote = pb::ChangeMembershipRequest {
        kind: pb::ChangeKind::Promote as i32,
        node_addr: String::new(),
        ..learner.clone()
    };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(m.catch_up);
    let mut last;
    loop {
        match c.change_membership(promote.clone()).await {
            Ok(()) => {
                return Ok(done(
                    m.ep.output,
                    &format!(
                        "node {} joined group {group} as a learner, caught up, and its promotion to voter started; `chorus status` shows when it is accepted",
                        m.node
                    ),
                ))
            }
            // Not caught up or not heard from yet (refused by the leader), or the
            // learner's own change still in progress: wait.
            Err(ClientError::Status { code, message, .. })
                if matches!(
                    code,
                    Code::InvalidArgument | Code::FailedPrecondition | Code::Aborted
                ) && (message.contains("not caught up")
                    || message.contains("heard from")
                    || message.contains("in progress")) =>
            {
                last = message;
            }
            Err(e) => return Err(e),
        }
        if std::time::Instant::now() >= end {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let remove = pb::ChangeMembershipRequest {
        kind: pb::ChangeKind::Remove as i32,
        node_addr: String::new(),
        ..learner
    };
    let undo = c.change_membership(remove).await;
    Err(ClientError::Status {
        endpoint: String::new(),
        code: Code::FailedPrecondition,
        message: format!(
            "node {} did not catch up as a learner of group {group} within {} s (last refusal: {last}); {} — is it running, does it host group {group}, is --addr right? (`chorus member learner` keeps a learner to catch up at its own pace; --force adds a voter at once)",
            m.node,
            m.catch_up,
            match undo {
                Ok(()) => "it was removed again".to_string(),
                Err(e) => format!("removing it again failed ({e}): remove it with `chorus member remove`"),
            }
        ),
    })
}

async fn leader(a: LeaderArgs) -> Result<ExitCode, ClientError> {
    match a.op {
        LeaderOp::Transfer { ep, to, force } => {
            let mut c = ep.client();
            c.transfer_leader_forced(ep.group, to, force).await?;
            Ok(done(
                ep.output,
                &format!("leadership of group {} is moving to node {to}", ep.group),
            ))
        }
        LeaderOp::Priority { ep, at, priority } => {
            check_at(&ep, at)?;
            let mut c = ep.client();
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
        GroupOp::Create {
            ep,
            voters,
            mode,
            replicas,
            look_behind,
            commit_order,
            access_mode,
            chunk_bytes,
            block_bytes,
        } => {
            if mode != "ordered" && access_mode != "append" {
                return Err(ClientError::Status {
                    endpoint: String::new(),
                    code: Code::InvalidArgument,
                    message: "--access-mode applies to ordered groups only".into(),
                });
            }
            let mut c = ep.client();
            c.create_group_with(pb::CreateGroupRequest {
                group: ep.group,
                voters: voters.clone(),
                learners: vec![],
                mode: mode.clone(),
                replicas,
                look_behind,
                commit_order: if commit_order == "any" {
                    String::new()
                } else {
                    commit_order
                },
                access_mode: if access_mode == "append" {
                    String::new()
                } else {
                    access_mode.clone()
                },
                chunk_bytes,
                block_bytes,
                peer_addrs: Default::default(),
            })
            .await?;
            let what = if access_mode == "append" {
                format!(
                    "group {} ({mode} mode) created with voters {voters:?}",
                    ep.group
                )
            } else {
                format!(
                    "group {} (ordered mode, a mirror: access mode {access_mode}) created with voters {voters:?}",
                    ep.group
                )
            };
            Ok(done(ep.output, &what))
        }
        GroupOp::AccessMode { ep, mode } => {
            let mut c = ep.client();
            c.set_access_mode(ep.group, &mode).await?;
            Ok(done(
                ep.output,
                &format!(
                    "group {} switching to access mode {mode} (in force once a majority holds it)",
                    ep.group
                ),
            ))
        }
        GroupOp::Delete { ep, at, force } => {
            check_at(&ep, at)?;
            let mut c = ep.client();
            c.delete_group(at, ep.group, force).await?;
            Ok(done(
                ep.output,
                &format!("group {} deleted at {}", ep.group, ep.endpoints[at]),
            ))
        }
        GroupOp::Restart { ep, at } => {
            check_at(&ep, at)?;
            let mut c = ep.client();
            c.restart_group(at, ep.group).await?;
            Ok(done(
                ep.output,
                &format!("group {} restarted at {}", ep.group, ep.endpoints[at]),
            ))
        }
    }
}

/// `--at` names one of `--endpoints`.
fn check_at(ep: &Endpoints, at: usize) -> Result<(), ClientError> {
    if at >= ep.endpoints.len() {
        return Err(ClientError::BadEndpoint {
            endpoint: at.to_string(),
            detail: format!(
                "--at must be below the number of endpoints ({})",
                ep.endpoints.len()
            ),
        });
    }
    Ok(())
}
