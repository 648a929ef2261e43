//! `chorus volume` and `chorus node`: the storage layer from the command line, through
//! the control plane (`--control`) and the routing client ([`chorus_client::VolumeClient`]).

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use chorus_client::volume::on_control;
use chorus_client::{pb, VolumeClient, VolumeError};
use clap::{Args, Subcommand};
use serde_json::json;
use tonic::{Code, Status};

use crate::{AnyResult, Output, EXIT_PROBLEM, EXIT_REFUSED, EXIT_UNREACHABLE};

/// Where the control plane is.
#[derive(Args, Clone, Debug)]
pub struct Control {
    /// Client API addresses of the control nodes, comma-separated (default: the `chorus
    /// dev --storage` cluster's).
    #[arg(
        long,
        env = "CHORUS_CONTROL",
        value_delimiter = ',',
        default_value = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    )]
    pub control: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `chorus volume`.
#[derive(Args, Debug)]
pub struct VolumeArgs {
    #[command(subcommand)]
    op: VolumeOp,
}

#[derive(Subcommand, Debug)]
enum VolumeOp {
    /// Create a volume: its chunks are placed on three nodes each (distinct racks when
    /// there are enough) and their groups created; returns once it is ready.
    Create {
        #[command(flatten)]
        c: Control,
        /// The volume's name (letters, digits, `.`, `_`, `-`; up to 64).
        name: String,
        /// Its size: bytes, or with a suffix K, M, G, T (powers of 1024).
        #[arg(long, value_parser = parse_bytes)]
        size: u64,
        /// Chunk size (default: the control plane's, 10 GiB unless configured).
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        chunk_size: u64,
        /// Allocation unit of its chunks (default 64K).
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        block_size: u64,
    },
    /// Every volume.
    List {
        #[command(flatten)]
        c: Control,
    },
    /// A volume's size, state and chunk map.
    Stat {
        #[command(flatten)]
        c: Control,
        /// The volume.
        name: String,
    },
    /// Grow a volume (adding chunks).
    Grow {
        #[command(flatten)]
        c: Control,
        /// The volume.
        name: String,
        /// Its new size (larger than now).
        #[arg(long, value_parser = parse_bytes)]
        size: u64,
    },
    /// Delete a volume and its chunk groups.
    Delete {
        #[command(flatten)]
        c: Control,
        /// The volume.
        name: String,
    },
    /// Snapshots of a volume: create, list, delete (PolarFS section 7.2: taken without
    /// pausing I/O; every write acknowledged before `create` began is in it, none issued
    /// after it returned is).
    Snapshot {
        #[command(subcommand)]
        op: SnapshotOp,
    },
    /// Create a new volume holding a snapshot's contents; returns once it is ready.
    Clone {
        #[command(flatten)]
        c: Control,
        /// The new volume's name.
        name: String,
        /// The volume the snapshot is of.
        #[arg(long)]
        from: String,
        /// The snapshot's name.
        #[arg(long)]
        snapshot: String,
    },
    /// Write bytes at an offset: DATA, or the file --file, or standard input.
    Write {
        #[command(flatten)]
        c: Control,
        /// The volume.
        name: String,
        /// Byte offset.
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        offset: u64,
        /// Read the bytes from this file.
        #[arg(long, conflicts_with = "data")]
        file: Option<std::path::PathBuf>,
        /// The bytes, as text.
        data: Option<String>,
    },
    /// A fio-like closed-loop workload through the routing client: random or sequential
    /// reads or writes of --bs bytes, --depth I/Os in flight, per depth.
    Bench(crate::volume_bench::BenchArgs),
    /// Read bytes at an offset to standard output (raw; `-o json` as hex).
    Read {
        #[command(flatten)]
        c: Control,
        /// The volume.
        name: String,
        /// Byte offset.
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        offset: u64,
        /// Bytes to read.
        #[arg(long, value_parser = parse_bytes)]
        len: u64,
    },
}

#[derive(Subcommand, Debug)]
enum SnapshotOp {
    /// Take a snapshot; returns once every chunk has it.
    Create {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
        /// The snapshot's name (letters, digits, `.`, `_`, `-`; up to 64).
        name: String,
    },
    /// A volume's snapshots.
    List {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
    },
    /// Delete a snapshot (its space is freed on every chunk).
    Delete {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
        /// The snapshot.
        name: String,
    },
}

/// `chorus node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    #[command(subcommand)]
    op: NodeOp,
}

#[derive(Subcommand, Debug)]
enum NodeOp {
    /// Every registered node: addresses, rack, state, liveness, chunks and leaders on it,
    /// and chunk replicas being moved onto it.
    List {
        #[command(flatten)]
        c: Control,
    },
    /// Drain a node: nothing new is placed on it and its chunk replicas are moved off.
    Drain {
        #[command(flatten)]
        c: Control,
        /// The node.
        node: u64,
    },
}

/// A byte count: digits, optionally followed by K, M, G or T (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("`{s}`: the suffix is one of K, M, G, T")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("`{s}`: expected a byte count such as 4096, 64K or 10G"))
}

/// What a control call's failure means for the exit code.
fn status_exit(s: &Status) -> u8 {
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown => EXIT_UNREACHABLE,
        _ => EXIT_REFUSED,
    }
}

async fn control<T, F, Fut>(c: &Control, call: F) -> Result<T, (u8, String)>
where
    F: FnMut(pb::control_client::ControlClient<chorus_client::Conn>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    match on_control(&c.control, Duration::from_secs(30), call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(s)) => Err((status_exit(&s), format!("{:?}: {}", s.code(), s.message()))),
        Err(e) => Err((EXIT_UNREACHABLE, e)),
    }
}

fn volume_json(v: &pb::VolumeInfo) -> serde_json::Value {
    json!({
        "name": v.name,
        "size_bytes": v.size_bytes,
        "chunk_bytes": v.chunk_bytes,
        "block_bytes": v.block_bytes,
        "state": v.state,
        "version": v.version,
        "snapshots": v.snapshots.iter().map(snapshot_json).collect::<Vec<_>>(),
        "snapshot_tag": v.snapshot_tag,
        "source_volume": v.source_volume,
        "source_snapshot": v.source_snapshot,
        "chunks": v.chunks.iter().map(|c| json!({
            "group": c.group,
            "replicas": c.replicas,
            "moving_from": c.moving_from,
            "moving_to": c.moving_to,
        })).collect::<Vec<_>>(),
    })
}

fn snapshot_json(s: &pb::SnapshotInfo) -> serde_json::Value {
    json!({"id": s.id, "name": s.name, "state": s.state})
}

fn print_snapshot(out: Output, volume: &str, s: &pb::SnapshotInfo) {
    match out {
        Output::Json => println!("{}", snapshot_json(s)),
        Output::Table => println!("{volume}@{}	id {}	{}", s.name, s.id, s.state),
    }
}

fn print_volume(out: Output, v: &pb::VolumeInfo, chunks: bool) {
    match out {
        Output::Json => println!("{}", volume_json(v)),
        Output::Table => {
            println!(
                "{}\t{} bytes\t{} chunks of {} bytes (blocks of {})\t{}\tversion {}",
                v.name,
                v.size_bytes,
                v.chunks.len(),
                v.chunk_bytes,
                v.block_bytes,
                v.state,
                v.version
            );
            if !v.source_volume.is_empty() {
                println!("  cloning from {}@{}", v.source_volume, v.source_snapshot);
            }
            for s in &v.snapshots {
                println!("  snapshot {}	id {}	{}", s.name, s.id, s.state);
            }
            if chunks {
                for (i, c) in v.chunks.iter().enumerate() {
                    let mv = if c.moving_to != 0 {
                        format!("\tmoving {} -> {}", c.moving_from, c.moving_to)
                    } else {
                        String::new()
                    };
                    println!(
                        "  chunk {i}\tgroup {}\treplicas {:?}{mv}",
                        c.group, c.replicas
                    );
                }
            }
        }
    }
}

fn volume_exit(e: &VolumeError) -> u8 {
    match e {
        VolumeError::Control(_) | VolumeError::Unknown { .. } => EXIT_UNREACHABLE,
        VolumeError::ReadFailed { .. } => EXIT_PROBLEM,
        _ => EXIT_REFUSED,
    }
}

/// Runs `chorus volume`.
pub fn volume(a: VolumeArgs) -> AnyResult<ExitCode> {
    run(async move { volume_op(a.op).await })
}

/// Runs `chorus node`.
pub fn node(a: NodeArgs) -> AnyResult<ExitCode> {
    run(async move { node_op(a.op).await })
}

fn run(
    f: impl std::future::Future<Output = Result<ExitCode, (u8, String)>>,
) -> AnyResult<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    Ok(match rt.block_on(f) {
        Ok(c) => c,
        Err((code, msg)) => {
            eprintln!("chorus: {msg}");
            ExitCode::from(code)
        }
    })
}

async fn snapshot_op(op: SnapshotOp) -> Result<(), (u8, String)> {
    match op {
        SnapshotOp::Create { c, volume, name } => {
            let req = pb::CreateSnapshotRequest {
                volume: volume.clone(),
                name,
            };
            let s = control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.create_snapshot(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            print_snapshot(c.output, &volume, &s);
        }
        SnapshotOp::List { c, volume } => {
            let req = pb::VolumeName {
                name: volume.clone(),
            };
            let v = control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.stat_volume(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            match c.output {
                Output::Json => println!(
                    "{}",
                    json!(v.snapshots.iter().map(snapshot_json).collect::<Vec<_>>())
                ),
                Output::Table => {
                    for s in &v.snapshots {
                        print_snapshot(c.output, &volume, s);
                    }
                }
            }
        }
        SnapshotOp::Delete { c, volume, name } => {
            let req = pb::SnapshotName { volume, name };
            control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.delete_snapshot(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        }
    }
    Ok(())
}

async fn volume_op(op: VolumeOp) -> Result<ExitCode, (u8, String)> {
    match op {
        VolumeOp::Bench(a) => crate::volume_bench::run(a).await?,
        VolumeOp::Create {
            c,
            name,
            size,
            chunk_size,
            block_size,
        } => {
            let block_bytes = u32::try_from(block_size).map_err(|_| {
                (
                    EXIT_REFUSED,
                    format!("--block-size {block_size} is above 16M"),
                )
            })?;
            let req = pb::CreateVolumeRequest {
                name,
                size_bytes: size,
                chunk_bytes: chunk_size,
                block_bytes,
            };
            let v = control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.create_volume(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            print_volume(c.output, &v, true);
        }
        VolumeOp::Snapshot { op } => snapshot_op(op).await?,
        VolumeOp::Clone {
            c,
            name,
            from,
            snapshot,
        } => {
            let req = pb::CloneVolumeRequest {
                name,
                source_volume: from,
                snapshot,
            };
            let v = control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.clone_volume(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            print_volume(c.output, &v, true);
        }
        VolumeOp::List { c } => {
            let r = control(&c, |mut cl| async move {
                cl.list_volumes(pb::Empty {}).await.map(|r| r.into_inner())
            })
            .await?;
            match c.output {
                Output::Json => println!(
                    "{}",
                    json!(r.volumes.iter().map(volume_json).collect::<Vec<_>>())
                ),
                Output::Table => {
                    for v in &r.volumes {
                        print_volume(c.output, v, false);
                    }
                }
            }
        }
        VolumeOp::Stat { c, name } => {
            let req = pb::VolumeName { name };
            let v = control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.stat_volume(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            print_volume(c.output, &v, true);
        }
        VolumeOp::Grow { c, name, size } => {
            let req = pb::GrowVolumeRequest {
                name,
                size_bytes: size,
            };
            let v = control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.grow_volume(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            print_volume(c.output, &v, true);
        }
        VolumeOp::Delete { c, name } => {
            let req = pb::VolumeName { name: name.clone() };
            control(&c, |mut cl| {
                let req = req.clone();
                async move { cl.delete_volume(req).await.map(|r| r.into_inner()) }
            })
            .await?;
            say(c.output, &format!("volume `{name}` deleted"));
        }
        VolumeOp::Write {
            c,
            name,
            offset,
            file,
            data,
        } => {
            let bytes = match (file, data) {
                (Some(f), _) => std::fs::read(&f)
                    .map_err(|e| (EXIT_REFUSED, format!("--file {}: {e}", f.display())))?,
                (None, Some(d)) => d.into_bytes(),
                (None, None) => {
                    let mut b = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut b)
                        .map_err(|e| (EXIT_PROBLEM, format!("standard input: {e}")))?;
                    b
                }
            };
            let v = VolumeClient::open(c.control.clone(), &name)
                .await
                .map_err(|e| (volume_exit(&e), e.to_string()))?;
            v.write(offset, &bytes)
                .await
                .map_err(|e| (volume_exit(&e), e.to_string()))?;
            say(
                c.output,
                &format!("wrote {} bytes at offset {offset} of `{name}`", bytes.len()),
            );
        }
        VolumeOp::Read {
            c,
            name,
            offset,
            len,
        } => {
            if len > 1 << 30 {
                return Err((
                    EXIT_REFUSED,
                    format!("--len {len}: read at most 1G at a time"),
                ));
            }
            let v = VolumeClient::open(c.control.clone(), &name)
                .await
                .map_err(|e| (volume_exit(&e), e.to_string()))?;
            let bytes = v
                .read(offset, len)
                .await
                .map_err(|e| (volume_exit(&e), e.to_string()))?;
            match c.output {
                Output::Json => {
                    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                    println!("{}", json!({"offset": offset, "len": len, "hex": hex}));
                }
                Output::Table => {
                    std::io::stdout()
                        .write_all(&bytes)
                        .map_err(|e| (EXIT_PROBLEM, format!("standard output: {e}")))?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn say(out: Output, what: &str) {
    match out {
        Output::Json => println!("{}", json!({"ok": true, "what": what})),
        Output::Table => println!("{what}"),
    }
}

async fn node_op(op: NodeOp) -> Result<ExitCode, (u8, String)> {
    match op {
        NodeOp::List { c } => {
            let r = control(&c, |mut cl| async move {
                cl.list_nodes(pb::Empty {}).await.map(|r| r.into_inner())
            })
            .await?;
            match c.output {
                Output::Json => println!(
                    "{}",
                    json!({
                        "leader": r.leader,
                        "nodes": r.nodes.iter().map(|n| json!({
                            "id": n.id, "client_addr": n.client_addr, "repl_addr": n.repl_addr,
                            "rack": n.rack, "state": n.state, "live": n.live,
                            "chunks": n.chunks, "leaders": n.leaders, "incoming": n.incoming,
                        })).collect::<Vec<_>>(),
                    })
                ),
                Output::Table => {
                    println!("control leader: node {}", r.leader);
                    println!("node\tapi\track\tstate\tlive\tchunks\tleaders\tincoming");
                    for n in &r.nodes {
                        println!(
                            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                            n.id,
                            n.client_addr,
                            if n.rack.is_empty() { "-" } else { &n.rack },
                            n.state,
                            if n.live { "yes" } else { "no" },
                            n.chunks,
                            n.leaders,
                            n.incoming
                        );
                    }
                }
            }
        }
        NodeOp::Drain { c, node } => {
            control(&c, |mut cl| async move {
                cl.drain_node(pb::DrainNodeRequest { node })
                    .await
                    .map(|r| r.into_inner())
            })
            .await?;
            say(c.output, &format!("node {node} draining"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64K").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("10g").unwrap(), 10 << 30);
        assert!(parse_bytes("10X").unwrap_err().contains("suffix"));
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
