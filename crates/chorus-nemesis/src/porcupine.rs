//! Linearizability of block reads and writes, checked by porcupine
//! (github.com/anishathalye/porcupine, the checker etcd's robustness suite uses).
//!
//! The history's block operations are split per block (linearizability is local: a
//! history is linearizable exactly when each object's part is), written as JSON, and
//! judged by `chorus-porcupine`, a small Go program in this crate's `porcupine/` module
//! that models each block as a read/write register starting at zero. It is built here
//! with the Go toolchain on first use (modules from the Go proxy; `go.sum` pins them).
//!
//! How outcomes map: a write reported committed spans its call; a write reported failed
//! (or refused) never happened and is left out; a write of unknown outcome may take
//! effect at any time after its invocation, so it returns after every other operation.
//! A read contributes one operation per block it returned.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::history::{Entry, Op, Placement};
use crate::Error;

/// Seconds porcupine may spend on one block before it answers "Unknown".
const TIMEOUT_SECS: u64 = 30;

#[derive(Serialize)]
struct PcOp {
    client: usize,
    write: bool,
    value: u64,
    call: u64,
    ret: u64,
}

#[derive(Serialize)]
struct PcBlock {
    block: u64,
    ops: Vec<PcOp>,
}

#[derive(Serialize)]
struct PcInput {
    timeout_secs: u64,
    blocks: Vec<PcBlock>,
}

#[derive(Deserialize)]
struct PcResult {
    block: u64,
    result: String,
    #[serde(default)]
    html: String,
    ops: usize,
}

/// The per-block operations of `history`, in porcupine's terms.
fn operations(history: &[Entry]) -> BTreeMap<u64, Vec<PcOp>> {
    let end = history.iter().map(|e| e.complete_us).max().unwrap_or(0) + 1;
    let mut clients: HashMap<u64, usize> = HashMap::new();
    let mut blocks: BTreeMap<u64, Vec<PcOp>> = BTreeMap::new();
    let mut unknown = 0usize;
    for e in history {
        let n = clients.len();
        let client = *clients.entry(e.process).or_insert(n);
        match &e.op {
            Op::Write {
                start,
                count,
                value,
                outcome,
            } => {
                let (ret, client) = match outcome {
                    Placement::Committed { .. } => (e.complete_us, client),
                    Placement::Failed { .. } => continue,
                    // Open to the end, on a row of its own (the client went on).
                    Placement::Unknown { .. } => {
                        unknown += 1;
                        (end, 1_000_000 + unknown)
                    }
                };
                for b in *start..start + count {
                    blocks.entry(b).or_default().push(PcOp {
                        client,
                        write: true,
                        value: *value,
                        call: e.invoke_us,
                        ret,
                    });
                }
            }
            Op::BlockRead { start, values, .. } => {
                for (i, v) in values.iter().enumerate() {
                    blocks.entry(start + i as u64).or_default().push(PcOp {
                        client,
                        write: false,
                        value: *v,
                        call: e.invoke_us,
                        ret: e.complete_us,
                    });
                }
            }
            _ => {}
        }
    }
    // Rows for the visualisation: dense client numbers.
    let mut rows: HashMap<usize, usize> = HashMap::new();
    for ops in blocks.values_mut() {
        rows.clear();
        for o in ops.iter_mut() {
            let n = rows.len();
            o.client = *rows.entry(o.client).or_insert(n);
        }
    }
    blocks
}

/// Builds `chorus-porcupine` into `dir` (the Go build cache makes this quick after the
/// first time).
fn build(dir: &Path) -> Result<PathBuf, Error> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("porcupine");
    let bin = dir.join("chorus-porcupine");
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .env("GOFLAGS", "-buildvcs=false -mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .output()
        .map_err(|e| {
            Error::Unavailable(format!(
                "the Go toolchain (`go`) is needed to build the porcupine checker: {e}"
            ))
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: format!("go build ({})", src.display()),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(bin)
}

/// Checks every block's operations in `history` for linearizability; returns one
/// anomaly per block that is not (naming porcupine's visualisation, in `dir`), and per
/// block the check could not decide in time.
pub fn check_blocks(history: &[Entry], dir: &Path) -> Result<Vec<String>, Error> {
    let blocks = operations(history);
    let input = PcInput {
        timeout_secs: TIMEOUT_SECS,
        blocks: blocks
            .into_iter()
            .map(|(block, ops)| PcBlock { block, ops })
            .collect(),
    };
    let path = dir.join("porcupine-input.json");
    let text = serde_json::to_vec(&input).map_err(|e| Error::io("porcupine input", e.into()))?;
    std::fs::write(&path, text).map_err(|e| Error::io(path.display(), e))?;
    let bin = build(dir)?;
    let out = Command::new(&bin)
        .arg("-in")
        .arg(&path)
        .arg("-html")
        .arg(dir)
        .output()
        .map_err(|e| Error::io(bin.display(), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: bin.display().to_string(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut found = Vec::new();
    let mut judged = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let r: PcResult = serde_json::from_str(line).map_err(|e| Error::Command {
            cmd: bin.display().to_string(),
            detail: format!("unreadable output {line:?}: {e}"),
        })?;
        judged += 1;
        match r.result.as_str() {
            "Ok" => {}
            "Illegal" => found.push(format!(
                "block {}: its {} reads and writes are not linearizable (porcupine; see {})",
                r.block, r.ops, r.html
            )),
            other => found.push(format!(
                "block {}: porcupine could not decide its {} operations within {TIMEOUT_SECS} s ({other})",
                r.block, r.ops
            )),
        }
    }
    if judged != input.blocks.len() {
        return Err(Error::Command {
            cmd: bin.display().to_string(),
            detail: format!("judged {judged} of {} blocks", input.blocks.len()),
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(process: u64, t: (u64, u64), op: Op) -> Entry {
        Entry {
            process,
            invoke_us: t.0,
            complete_us: t.1,
            op,
        }
    }

    fn w(block: u64, value: u64, outcome: Placement) -> Op {
        Op::Write {
            start: block,
            count: 1,
            value,
            outcome,
        }
    }

    fn r(block: u64, value: u64) -> Op {
        Op::BlockRead {
            node: 1,
            start: block,
            values: vec![value],
            bad: None,
        }
    }

    fn ok() -> Placement {
        Placement::Committed { seq: 1, index: 0 }
    }

    /// Teeth: porcupine (built from the Go proxy) judges histories both ways. Needs Go.
    #[test]
    fn porcupine_accepts_linearizable_histories_and_rejects_stale_reads() {
        if Command::new("go").arg("version").output().is_err() {
            assert!(
                std::env::var("CHORUS_REQUIRE_NETNS").as_deref() != Ok("1"),
                "CHORUS_REQUIRE_NETNS=1 but there is no Go toolchain"
            );
            eprintln!("skipped: no Go toolchain");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let unknown = Placement::Unknown { why: "cut".into() };
        let failed = Placement::Failed { why: "no".into() };
        // Concurrent write and read; an unknown write seen later; a failed one never.
        let good = vec![
            at(1, (0, 10), w(0, 7, ok())),
            at(2, (5, 8), r(0, 7)),
            at(2, (11, 12), r(0, 7)),
            at(1, (13, 20), w(0, 8, unknown.clone())),
            at(2, (30, 31), r(0, 8)),
            at(1, (32, 33), w(1, 9, failed.clone())),
            at(2, (34, 35), r(1, 0)),
        ];
        assert_eq!(
            check_blocks(&good, dir.path()).unwrap(),
            Vec::<String>::new()
        );
        // A read after an acknowledged write returns the older value (a lost write).
        let stale = vec![
            at(1, (0, 10), w(0, 7, ok())),
            at(1, (11, 20), w(0, 8, ok())),
            at(2, (21, 22), r(0, 7)),
        ];
        let found = check_blocks(&stale, dir.path()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("block 0") && found[0].contains("not linearizable"));
        assert!(dir.path().join("porcupine-block-0.html").exists());
        // A read returns a failed write's value.
        let ghost = vec![at(1, (0, 10), w(2, 5, failed)), at(2, (11, 12), r(2, 5))];
        assert_eq!(check_blocks(&ghost, dir.path()).unwrap().len(), 1);
        // A read goes back in time after another read saw the new value.
        let back = vec![
            at(1, (0, 100), w(3, 4, unknown)),
            at(2, (10, 11), r(3, 4)),
            at(3, (12, 13), r(3, 0)),
        ];
        assert_eq!(check_blocks(&back, dir.path()).unwrap().len(), 1);
    }
}
