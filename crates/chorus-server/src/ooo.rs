//! Out-of-order groups in `chorus server`: what of them is the server's. The node's
//! environment ([`chorus_runtime::Env`]) creates, opens, deletes and restarts them as it
//! does ordered groups, each in `DATA_DIR/groups/{id:020}/` (its spec `ooo.spec`, the
//! replica's store `entries.log`, `hard`, `membership`, and its state machine's files);
//! the server parses the configuration's group specs into the runtime's
//! ([`parse_spec`]), supplies the state machines ([`Machines`]) and checks what
//! appenders declare ([`check_record`]).
//!
//! - **parallel** groups are chunk replicas (PolarFS section 4): a record declares the
//!   4 KiB blocks (sectors) of the chunk it writes and carries their new contents;
//!   applying it writes them into the chunk's thin-provisioned store under `chunk/`
//!   (`ReadBlocks` reads it back). The chunk's geometry is in the group's spec.
//! - **dependent** groups drive a key-value store in the WAL model: the database (the
//!   appender) executed a transaction that read and wrote some keys and logs its redo;
//!   replicas replay it by setting every written key to the record's bytes (`GetKeys`).
//!
//! Both are in [`crate::state_machines`], with their checkpoints and images: once a
//! group's entries file passes `[out_of_order] compact_bytes`, the state is checkpointed
//! and the file compacted; at start the state machine reopens from its checkpoint and the
//! replica replays the log from its base.

use std::path::Path;
use std::sync::Arc;

use chorus_chunk::Geometry;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_runtime::env::{OooGroupSpec, StateMachines};
use chorus_runtime::ooo::OooStateMachine;

use crate::config::GroupSpec;

pub use crate::state_machines::{GroupStateMachine, BLOCK, MAX_BLOCKS};

/// A group spec from the configuration or a request that is not usable; names the field.
#[derive(Debug, thiserror::Error)]
#[error("group {group}: {detail}")]
pub struct BadSpec {
    /// The group.
    pub group: u64,
    /// What is wrong.
    pub detail: String,
}

/// Parses an out-of-order group's spec for node `me` into the runtime's; `None` for an
/// ordered group.
pub fn parse_spec(g: &GroupSpec, me: u64) -> Result<Option<OooGroupSpec>, BadSpec> {
    let bad = |detail: String| BadSpec {
        group: g.id,
        detail,
    };
    let mode = match g.mode.as_str() {
        "" | "ordered" => return Ok(None),
        "parallel" => Mode::Parallel {
            span: if g.look_behind == 0 {
                2
            } else {
                g.look_behind as usize
            },
        },
        "dependent" => Mode::Dependent,
        other => {
            return Err(bad(format!(
                "mode `{other}` is not one of ordered, parallel, dependent"
            )))
        }
    };
    if g.id == 0 {
        return Err(bad("group id 0 is reserved".into()));
    }
    if !g.learners.is_empty() {
        return Err(bad(
            "out-of-order groups have no learners (membership changes of these modes are not built)"
                .into(),
        ));
    }
    if g.look_behind != 0 && matches!(mode, Mode::Dependent) {
        return Err(bad("look_behind applies to parallel groups only".into()));
    }
    if !g.access_mode.is_empty() {
        return Err(bad(
            "access_mode applies to ordered groups only (an out-of-order group has no mirrors)"
                .into(),
        ));
    }
    let conflict_order = match g.commit_order.as_str() {
        "" | "any" => false,
        "conflicts" if matches!(mode, Mode::Parallel { .. }) => true,
        "conflicts" => {
            return Err(bad(
                "commit_order applies to parallel groups only (a dependent group commits in RAW order always)"
                    .into(),
            ))
        }
        other => {
            return Err(bad(format!(
                "commit_order `{other}` is not one of any, conflicts"
            )))
        }
    };
    if g.look_behind as usize > chorus_runtime::env::MAX_SPAN {
        return Err(bad(format!(
            "look_behind {} is above the limit of {}",
            g.look_behind,
            chorus_runtime::env::MAX_SPAN
        )));
    }
    let params = match mode {
        Mode::Parallel { .. } => geometry(g).map_err(|e| bad(e.to_string()))?.to_params(),
        Mode::Dependent if g.chunk_bytes != 0 || g.block_bytes != 0 => {
            return Err(bad(
                "chunk_bytes and block_bytes apply to parallel groups only".into(),
            ))
        }
        Mode::Dependent => Vec::new(),
    };
    let mut voters = g.voters.clone();
    if voters.is_empty() {
        return Err(bad("no voters".into()));
    }
    if let Some(&z) = voters.iter().chain(&g.replicas).find(|&&n| n == 0) {
        return Err(bad(format!("node id {z} is reserved")));
    }
    let mut others: Vec<u64> = g
        .replicas
        .iter()
        .copied()
        .filter(|r| !g.voters.contains(r))
        .collect();
    others.sort_unstable();
    others.dedup();
    if !g.voters.contains(&me) && !others.contains(&me) {
        return Err(bad(format!(
            "this node ({me}) is neither one of its voters nor named in `replicas`"
        )));
    }
    voters.sort_unstable();
    if voters.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad("a voter is listed twice".into()));
    }
    let max = chorus_runtime::env::MAX_REPLICAS;
    if voters.len() > max || others.len() > max {
        return Err(bad(format!(
            "{} voters and {} other replicas; at most {max} each",
            voters.len(),
            others.len()
        )));
    }
    Ok(Some(OooGroupSpec {
        id: g.id,
        mode,
        conflict_order,
        voters,
        others,
        params,
    }))
}

/// A parallel group spec's chunk geometry: its `chunk_bytes` and `block_bytes`, 0 for
/// the defaults (10 GiB, 64 KiB), checked, and at most [`MAX_BLOCKS`] sectors.
pub fn geometry(g: &GroupSpec) -> Result<Geometry, chorus_chunk::ChunkError> {
    let d = Geometry::default();
    let geo = Geometry {
        chunk_bytes: if g.chunk_bytes == 0 {
            d.chunk_bytes
        } else {
            g.chunk_bytes
        },
        block_bytes: if g.block_bytes == 0 {
            d.block_bytes
        } else {
            g.block_bytes
        },
    };
    geo.check()?;
    if geo.chunk_bytes > MAX_BLOCKS * BLOCK {
        return Err(chorus_chunk::ChunkError::BadGeometry {
            detail: format!(
                "chunk_bytes {} is above the limit of {} (1 TiB)",
                geo.chunk_bytes,
                MAX_BLOCKS * BLOCK
            ),
        });
    }
    Ok(geo)
}

/// The server's state machines, one per out-of-order group, opened by the node's
/// environment in the group's directory: a chunk replica of the geometry in the spec for
/// a parallel group, a key-value store for a dependent one ([`crate::state_machines`]).
#[derive(Debug)]
pub struct Machines;

impl StateMachines for Machines {
    fn open(&self, spec: &OooGroupSpec, dir: &Path) -> std::io::Result<Arc<dyn OooStateMachine>> {
        Ok(match spec.mode {
            Mode::Parallel { .. } => {
                let geo = Geometry::from_params(&spec.params).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("group {}: {e}", spec.id),
                    )
                })?;
                Arc::new(GroupStateMachine::chunk(dir, geo)?)
            }
            Mode::Dependent => Arc::new(GroupStateMachine::key_value(dir)?),
        })
    }
}

/// Checks what an appender declares against the group's mode and state machine (a
/// parallel group's chunk holds `sectors` blocks), before the record reaches the
/// replica: a record the state machine could not apply is never appended.
pub fn check_record(mode: Mode, sectors: u64, d: &Declared, data_len: usize) -> Result<(), String> {
    match (mode, d) {
        (Mode::Parallel { .. }, Declared::Blocks(ranges)) => {
            if ranges.is_empty() {
                return Err("a parallel-mode record declares at least one block range".into());
            }
            let mut sorted = ranges.clone();
            sorted.sort_by_key(|r| r.start);
            if let Some(w) = sorted.windows(2).find(|w| w[0].overlaps(&w[1])) {
                return Err(format!(
                    "block ranges {}..{} and {}..{} overlap",
                    w[0].start, w[0].end, w[1].start, w[1].end
                ));
            }
            if let Some(r) = ranges.iter().find(|r| r.end > sectors) {
                return Err(format!(
                    "block range {}..{} is past the chunk's {sectors} blocks",
                    r.start, r.end
                ));
            }
            let blocks: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            if blocks * BLOCK != data_len as u64 {
                return Err(format!(
                    "the record has {data_len} bytes but declares {blocks} blocks ({} bytes: 4096 per block)",
                    blocks * BLOCK
                ));
            }
            Ok(())
        }
        (Mode::Dependent, Declared::Txn { write_set, .. }) => {
            if write_set.is_empty() {
                return Err(
                    "a dependent-mode record declares at least one written key (a read-only transaction logs nothing)"
                        .into(),
                );
            }
            Ok(())
        }
        (Mode::Parallel { .. }, Declared::Txn { .. }) => {
            Err("this is a parallel-mode group: declare block ranges, not read/write sets".into())
        }
        (Mode::Dependent, Declared::Blocks(_)) => {
            Err("this is a dependent-mode group: declare read/write sets, not block ranges".into())
        }
    }
}

/// Parses `START+COUNT` or `START` (one block).
pub fn parse_blocks(s: &str) -> Result<BlockRange, String> {
    let (a, b) = s.split_once('+').unwrap_or((s, "1"));
    let start: u64 = a
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected START or START+COUNT (block numbers)"))?;
    let count: u64 = b
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected START or START+COUNT (block numbers)"))?;
    BlockRange::new(start, count).ok_or_else(|| format!("`{s}`: an empty or overflowing range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mode: &str, voters: &[u64], replicas: &[u64]) -> GroupSpec {
        let mut g = GroupSpec::ordered(5, voters.to_vec(), vec![]);
        g.mode = mode.into();
        g.replicas = replicas.to_vec();
        g
    }

    #[test]
    fn specs_are_checked_by_name() {
        let ok = spec("parallel", &[1, 2], &[]);
        let p = parse_spec(&ok, 1).unwrap().unwrap();
        assert_eq!(p.mode, Mode::Parallel { span: 2 });
        assert!(parse_spec(&spec("ordered", &[1], &[]), 1)
            .unwrap()
            .is_none());
        let err = |g: &GroupSpec, me| parse_spec(g, me).unwrap_err().to_string();
        assert!(err(&spec("fast", &[1], &[]), 1).contains("mode `fast`"));
        assert!(err(&spec("parallel", &[1, 1], &[]), 1).contains("a voter is listed twice"));
        assert!(err(&spec("parallel", &[], &[1]), 1).contains("no voters"));
        assert!(err(&spec("parallel", &[1], &[0]), 1).contains("node id 0 is reserved"));
        // A replica that is not a voter yet (a membership change may add it) may open
        // the group; a voter named in `replicas` too is a voter.
        let spare = spec("dependent", &[1], &[1, 9]);
        for me in [1, 9] {
            let p = parse_spec(&spare, me).unwrap().unwrap();
            assert_eq!(p.voters, vec![1]);
            assert_eq!(p.others, vec![9]);
        }
        assert!(err(&spare, 8).contains("neither one of its voters nor named in `replicas`"));
        assert!(err(&ok, 3).contains("this node (3)"));
        let mut lb = spec("dependent", &[1], &[]);
        lb.look_behind = 3;
        assert!(err(&lb, 1).contains("parallel groups only"));
        assert!(!p.conflict_order, "commit order `any` by default");
        let mut co = ok.clone();
        co.commit_order = "conflicts".into();
        assert!(parse_spec(&co, 1).unwrap().unwrap().conflict_order);
        co.commit_order = "any".into();
        assert!(!parse_spec(&co, 1).unwrap().unwrap().conflict_order);
        co.commit_order = "serial".into();
        assert!(err(&co, 1).contains("commit_order `serial` is not one of any, conflicts"));
        let mut dep = spec("dependent", &[1], &[]);
        dep.commit_order = "conflicts".into();
        assert!(err(&dep, 1).contains("commit_order applies to parallel groups only"));
        let mut learners = ok.clone();
        learners.learners = vec![3];
        assert!(err(&learners, 1).contains("no learners"));
        // A parallel group carries its chunk geometry; a dependent one has none.
        assert_eq!(
            Geometry::from_params(&p.params).unwrap(),
            Geometry::default()
        );
        let mut small = ok.clone();
        small.chunk_bytes = 1 << 20;
        small.block_bytes = 4096;
        let geo = Geometry::from_params(&parse_spec(&small, 1).unwrap().unwrap().params).unwrap();
        assert_eq!((geo.chunk_bytes, geo.block_bytes), (1 << 20, 4096));
        small.block_bytes = 3000;
        assert!(err(&small, 1).contains("block_bytes 3000"));
        small.block_bytes = 0;
        small.chunk_bytes = 2 << 40;
        assert!(err(&small, 1).contains("above the limit"));
        let mut dep = spec("dependent", &[1], &[]);
        dep.chunk_bytes = 1 << 20;
        assert!(err(&dep, 1).contains("parallel groups only"));
    }

    #[test]
    fn records_are_checked_against_the_mode() {
        const S: u64 = 1024;
        let par = Mode::Parallel { span: 2 };
        let r = |s, n| BlockRange::new(s, n).unwrap();
        assert!(check_record(par, S, &Declared::Blocks(vec![r(0, 2)]), 8192).is_ok());
        assert!(check_record(par, S, &Declared::Blocks(vec![r(0, 2)]), 4096)
            .unwrap_err()
            .contains("declares 2 blocks"));
        assert!(
            check_record(par, S, &Declared::Blocks(vec![r(0, 2), r(1, 1)]), 3 * 4096)
                .unwrap_err()
                .contains("overlap")
        );
        assert!(check_record(par, S, &Declared::Blocks(vec![]), 0).is_err());
        assert!(
            check_record(par, S, &Declared::Blocks(vec![r(S - 1, 2)]), 8192)
                .unwrap_err()
                .contains("past the chunk's 1024 blocks")
        );
        let txn = |w: Vec<u64>| Declared::Txn {
            read_set: vec![1],
            write_set: w,
        };
        assert!(check_record(Mode::Dependent, S, &txn(vec![2]), 3).is_ok());
        assert!(check_record(Mode::Dependent, S, &txn(vec![]), 3).is_err());
        assert!(check_record(par, S, &txn(vec![2]), 3)
            .unwrap_err()
            .contains("parallel-mode group"));
        assert!(
            check_record(Mode::Dependent, S, &Declared::Blocks(vec![r(0, 1)]), 4096)
                .unwrap_err()
                .contains("dependent-mode group")
        );
        assert_eq!(parse_blocks("7").unwrap(), r(7, 1));
        assert_eq!(parse_blocks("7+3").unwrap(), r(7, 3));
        assert!(parse_blocks("7+0").is_err());
        assert!(parse_blocks("x").is_err());
    }
}
