//! Block writes through the storage layer (PolarFS sections 3 and 4): the volume
//! workload. Every node is a chunk server and a control node (the control plane's state
//! in ordered group [`CTRL`]); the run creates a volume of [`CHUNKS`] chunks of
//! [`CHUNK_BYTES`] each, so that the blocks the workload uses lie in several chunk
//! groups, each a parallel group on all three nodes.
//!
//! Writers write one block, or two adjacent blocks of one chunk, through the routing
//! client ([`VolumeClient`]), with the bytes [`crate::blocks::encode`] gives; readers
//! read one to four blocks through it (each piece at its chunk's leader). The checker is
//! the parallel workload's ([`crate::blocks::check`]): every block's reads and writes
//! linearizable as a register (porcupine), no read of a write reported failed or of bytes
//! nobody wrote.
//!
//! After the faults heal, a barrier write must commit, the whole range is read through
//! the client (the last read of every block), and every replica of every chunk must come
//! to hold exactly those blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_client::volume::on_control;
use chorus_client::{pb, VolumeClient, VolumeError};

use crate::blocks::{decode_all, encode, BLOCKS};
use crate::history::{History, Op, Placement};
use crate::ordered::client;
use crate::Rng;

/// The ordered group holding the control plane's state.
pub const CTRL: u64 = 1;
/// The volume's name.
pub const VOLUME: &str = "nemesis";
/// Bytes per block (the chunks' sector and allocation unit).
const BLOCK: u64 = 4096;
/// Bytes per chunk: 16 blocks, so that the workload's blocks span [`CHUNKS`] chunk groups.
pub const CHUNK_BYTES: u64 = 16 * BLOCK;
/// Chunks in the volume: room for the workload's blocks and the barrier's.
pub const CHUNKS: u64 = (BLOCKS + 1).div_ceil(CHUNK_BYTES / BLOCK);
/// The block the final barrier writes (beyond the workload's).
const BARRIER_BLOCK: u64 = BLOCKS;
/// The process the barrier and the final read are recorded under.
const FINAL: u64 = u64::MAX;

/// The configuration fragment of every node for this workload: the control group on
/// every node, and every node a chunk server reporting to all of them (`apis`: each
/// node's client API address). A node down for an hour has its chunks moved: never in a
/// run, and a three-node cluster has nowhere to move them to.
pub fn node_toml(apis: &[String]) -> String {
    let voters: Vec<String> = (1..=apis.len()).map(|i| i.to_string()).collect();
    let endpoints: Vec<String> = apis.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[groups]]\nid = {CTRL}\nvoters = [{}]\n\n[control]\ngroup = {CTRL}\nendpoints = [{}]\n\
         heartbeat_ms = 200\ndown_after_ms = 1500\nreplace_after_ms = 3600000\nchunk_bytes = {CHUNK_BYTES}\n",
        voters.join(", "),
        endpoints.join(", ")
    )
}

/// Creates the volume once every node has registered, within `wait`.
pub async fn create(control: &[String], wait: Duration) -> Result<(), String> {
    create_volume(control, VOLUME, CHUNKS * CHUNK_BYTES, CHUNK_BYTES, wait).await
}

/// Creates volume `name` of `size` bytes in chunks of `chunk` bytes, each with a replica
/// on every node, once every node has registered, within `wait`.
pub async fn create_volume(
    control: &[String],
    name: &str,
    size: u64,
    chunk: u64,
    wait: Duration,
) -> Result<(), String> {
    let end = Instant::now() + wait;
    let mut last = String::new();
    while Instant::now() < end {
        let req = pb::CreateVolumeRequest {
            name: name.into(),
            size_bytes: size,
            chunk_bytes: chunk,
            block_bytes: BLOCK as u32,
        };
        let r = on_control(control, Duration::from_secs(5), |mut c| {
            let req = req.clone();
            async move { c.create_volume(req).await.map(|r| r.into_inner()) }
        })
        .await;
        match r {
            Ok(Ok(v)) if v.chunks.iter().all(|c| c.replicas.len() == control.len()) => {
                return Ok(())
            }
            Ok(Ok(v)) => last = format!("placed with too few replicas: {:?}", v.chunks),
            // A retry after a create that went through but whose answer was lost.
            Ok(Err(s)) if s.code() == tonic::Code::AlreadyExists => return Ok(()),
            Ok(Err(s)) => last = format!("{:?}: {}", s.code(), s.message()),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(format!(
        "volume `{name}` not created within {wait:?} (last: {last})"
    ))
}

/// Opens the volume, retrying for up to 30 s (a control node may be down).
async fn open(control: &[String]) -> Option<VolumeClient> {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if let Ok(mut v) = VolumeClient::open(control.to_vec(), VOLUME).await {
            v.retry_for = Duration::from_secs(5);
            v.call_timeout = Duration::from_secs(3);
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// What a write through the routing client came to. Every write of the workload lies in
/// one chunk, so a failure names the one piece, which the client reports not committed
/// (`Failed`) only when it surely was not.
fn placement(r: Result<(), VolumeError>) -> Placement {
    match r {
        Ok(()) => Placement::Committed { seq: 0, index: 0 },
        Err(VolumeError::Unknown { why, .. }) => Placement::Unknown { why },
        Err(e) => Placement::Failed { why: e.to_string() },
    }
}

async fn write(v: &VolumeClient, start: u64, count: u64, value: u64) -> Placement {
    let data: Vec<u8> = (start..start + count)
        .flat_map(|b| encode(value, b))
        .collect();
    placement(v.write(start * BLOCK, &data).await)
}

/// One writer: writes one block, or two adjacent blocks of one chunk, at a time until
/// `stop`. `process` seeds its choices; its values are `(process % 1000) << 40 | n`.
pub async fn writer(process: u64, control: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let Some(v) = open(&control).await else {
        return;
    };
    let mut rng = Rng::new(process);
    let per_chunk = CHUNK_BYTES / BLOCK;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let value = ((process % 1000) << 40) | n;
        let start = rng.range(0, BLOCKS);
        let count =
            if !(start + 1).is_multiple_of(per_chunk) && start + 1 < BLOCKS && rng.chance(25) {
                2
            } else {
                1
            };
        let t0 = hist.now_us();
        let outcome = write(&v, start, count, value).await;
        let settled = matches!(outcome, Placement::Committed { .. });
        hist.record(
            process,
            t0,
            Op::Write {
                start,
                count,
                value,
                outcome,
            },
        );
        if !settled {
            tokio::time::sleep(Duration::from_millis(rng.range(10, 50))).await;
        }
    }
}

/// One reader: reads one to four blocks at a time through the routing client until
/// `stop`. Only reads that returned are recorded (one that failed changed nothing).
pub async fn reader(process: u64, control: Vec<String>, hist: History, stop: Arc<AtomicBool>) {
    let Some(v) = open(&control).await else {
        return;
    };
    let mut rng = Rng::new(process);
    while !stop.load(Ordering::Relaxed) {
        let start = rng.range(0, BLOCKS);
        let count = rng.range(1, 5).min(BLOCKS - start);
        let t0 = hist.now_us();
        match v.read(start * BLOCK, count * BLOCK).await {
            Ok(data) => {
                let (values, bad) = decode_all(&data, start);
                hist.record(
                    process,
                    t0,
                    Op::BlockRead {
                        node: 0,
                        start,
                        values,
                        bad,
                    },
                );
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// After every fault healed: a barrier write that must commit, the whole range read
/// through the client into the history, then every replica of every chunk must hold the
/// same blocks. Returns the run's own findings.
pub async fn settle(control: &[String], hist: &History, deadline: Duration) -> Vec<String> {
    let mut found = Vec::new();
    let Some(v) = open(control).await else {
        return vec!["the volume could not be opened after every fault healed".into()];
    };
    let end = Instant::now() + deadline;
    let (mut n, mut last) = (0, String::new());
    let committed = loop {
        n += 1;
        let t0 = hist.now_us();
        let value = (999 << 40) | n;
        let outcome = write(&v, BARRIER_BLOCK, 1, value).await;
        let ok = matches!(outcome, Placement::Committed { .. });
        if let Placement::Failed { why } | Placement::Unknown { why } = &outcome {
            last = why.clone();
        }
        hist.record(
            FINAL,
            t0,
            Op::Write {
                start: BARRIER_BLOCK,
                count: 1,
                value,
                outcome,
            },
        );
        if ok || Instant::now() >= end {
            break ok;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !committed {
        found.push(format!(
            "no write committed within {deadline:?} after every fault healed (last: {last})"
        ));
    }
    let mut want = None;
    while Instant::now() < end + Duration::from_secs(30) {
        let t0 = hist.now_us();
        if let Ok(data) = v.read(0, (BLOCKS + 1) * BLOCK).await {
            let (values, bad) = decode_all(&data, 0);
            hist.record(
                FINAL,
                t0,
                Op::BlockRead {
                    node: 0,
                    start: 0,
                    values: values.clone(),
                    bad,
                },
            );
            want = Some(values);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(want) = want else {
        found.push("the volume could not be read after every fault healed".into());
        return found;
    };
    // Every replica of every chunk converges on what the client read.
    let map = v.map();
    let per_chunk = CHUNK_BYTES / BLOCK;
    let mut nodes = client(
        control.to_vec(),
        Duration::from_secs(2),
        Duration::from_secs(1),
    );
    for (k, chunk) in map.chunks.iter().enumerate() {
        let first = k as u64 * per_chunk;
        if first > BARRIER_BLOCK {
            break;
        }
        let count = per_chunk.min(BARRIER_BLOCK + 1 - first);
        for i in 0..control.len() {
            let until = Instant::now() + Duration::from_secs(60);
            let why = loop {
                let why = match nodes.read_blocks_at(i, chunk.group, 0, count).await {
                    Ok(r) => {
                        let (values, bad) = decode_all(&r.data, first);
                        match bad {
                            Some(b) => b,
                            None => match (0..values.len())
                                .find(|&b| values[b] != want[first as usize + b])
                            {
                                None => break None,
                                Some(b) => format!(
                                    "block {} holds {:#x} where the volume read {:#x} (applied up to slot {})",
                                    first + b as u64,
                                    values[b],
                                    want[first as usize + b],
                                    r.applied_seq
                                ),
                            },
                        }
                    }
                    Err(e) => format!("reading its blocks failed: {e}"),
                };
                if Instant::now() >= until {
                    break Some(why);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            if let Some(why) = why {
                found.push(format!(
                    "node {}'s replica of chunk {k} (group {}) does not match 60 s after the heal: {why} [{}]",
                    i + 1,
                    chunk.group,
                    crate::blocks::group_states(control, chunk.group).await
                ));
            }
        }
    }
    found
}
