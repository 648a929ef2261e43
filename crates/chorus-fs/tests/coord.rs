//! Hosts sharing one file system's journal under a deterministic harness: several hosts
//! acquire the journal, commit transactions, poll, crash in the middle of a commit (their
//! I/O stops after a seeded number of writes) and are cut off for a while (every I/O
//! fails), in a seeded order. Checked at the end: no two commits took one sequence
//! number; every commit reported done is in the journal's chain with its operations; and
//! every host, having polled, holds exactly what a fresh reader replays. A broken variant
//! (commits that skip Disk Paxos) is caught. `COORD_SEED=N` runs one seed,
//! `COORD_TRACE=1` prints every host's steps.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chorus_fs::coord::{CommitError, Node};
use chorus_fs::device::{Device, MemDevice};
use chorus_fs::journal::records_after;
use chorus_fs::layout::{Geometry, Superblock};
use chorus_fs::meta::{FileKind, Inode, Kind, Meta, MetaId};
use chorus_fs::mkfs::mkfs;
use chorus_fs::paxos::{latest, Pages};

/// One host's view of the shared volume: it stops (every I/O fails) once `writes_left`
/// writes have gone through, or while `cut` is set.
struct HostDevice {
    inner: Arc<MemDevice>,
    writes_left: AtomicU64,
    cut: AtomicU64,
}

fn down() -> io::Error {
    io::Error::other("host down")
}

impl Device for HostDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        if self.cut.load(Ordering::SeqCst) > 0 || self.writes_left.load(Ordering::SeqCst) == 0 {
            return Err(down());
        }
        self.inner.read(offset, len)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.cut.load(Ordering::SeqCst) > 0 {
            return Err(down());
        }
        let left = self.writes_left.load(Ordering::SeqCst);
        if left == 0 {
            return Err(down());
        }
        self.writes_left
            .store(left.saturating_sub(1), Ordering::SeqCst);
        self.inner.write(offset, data)
    }
}

mod common;
use common::Rng;

const HOSTS: u32 = 3;

fn geometry(journal_bytes: u64) -> Geometry {
    Geometry {
        volume_bytes: 4 << 20,
        chunk_bytes: 2 << 20,
        block_bytes: 64 << 10,
        inodes_per_chunk: 30,
        dirents_per_chunk: 15,
        max_hosts: 4,
        journal_bytes,
    }
}

fn file(size: u64) -> Meta {
    Meta::Inode(Inode {
        kind: FileKind::File,
        mode: 0o644,
        size,
        mtime_ns: 0,
        ctime_ns: 0,
        parent: MetaId::NONE,
    })
}

/// Runs one seed with a journal of `journal_bytes` (small: checkpoints every few
/// transactions); `Err` names what broke.
fn run(seed: u64, broken: bool, journal_bytes: u64) -> Result<(u64, u64), String> {
    let vol = Arc::new(MemDevice::new(4 << 20));
    let sb = mkfs(vol.as_ref(), geometry(journal_bytes), 0x5eed, 0).map_err(|e| e.to_string())?;
    let devs: Vec<Arc<HostDevice>> = (0..=HOSTS + 1)
        .map(|_| {
            Arc::new(HostDevice {
                inner: vol.clone(),
                writes_left: AtomicU64::new(u64::MAX),
                cut: AtomicU64::new(0),
            })
        })
        .collect();
    let mut nodes: Vec<Option<Node>> = (0..=HOSTS).map(|_| None).collect();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    // ((generation, sequence number), the inode changed, the size it was given, the
    // step) of each commit reported; (inode, step) of each whose outcome is unknown.
    let mut committed: Vec<((u64, u64), MetaId, u64, usize)> = Vec::new();
    let mut unknown: Vec<(MetaId, usize)> = Vec::new();
    let mut token = 100;
    for step in 0..300 {
        let h = 1 + rng.below(HOSTS as u64) as u32;
        let d = &devs[h as usize];
        if d.cut.load(Ordering::SeqCst) > 0 {
            d.cut.fetch_sub(1, Ordering::SeqCst);
        }
        let roll = rng.below(100);
        if roll < 4 {
            // A crash in the middle of what comes next: a few more writes, then nothing.
            d.writes_left.store(rng.below(6), Ordering::SeqCst);
            continue;
        }
        if roll < 8 {
            d.cut.store(1 + rng.below(12), Ordering::SeqCst);
            continue;
        }
        let Some(n) = nodes[h as usize].as_mut() else {
            if d.writes_left.load(Ordering::SeqCst) == 0 {
                // Restarted.
                d.writes_left.store(u64::MAX, Ordering::SeqCst);
            }
            if let Ok(n) = Node::mount(d.clone(), h) {
                #[cfg(feature = "broken")]
                let n = {
                    let mut n = n;
                    n.broken_skip_paxos = broken;
                    n
                };
                nodes[h as usize] = Some(n);
            }
            continue;
        };
        let _ = broken;
        let trace = std::env::var_os("COORD_TRACE").is_some();
        let failed = match roll {
            8..=29 => {
                let r = n.poll();
                if trace {
                    eprintln!("host {h} poll: {r:?} -> {:?}", n.decision());
                }
                r.is_err()
            }
            30..=49 => {
                let r = n.acquire();
                if trace {
                    eprintln!("host {h} acquire: {r:?} -> {:?}", n.decision());
                }
                r.is_err()
            }
            _ => {
                let id = MetaId::new(rng.below(2) as u32, 2 + rng.below(6) as u32);
                token += 1;
                n.change(Kind::Inode, id, &file(token))
                    .map_err(|e| e.to_string())?;
                let r = n.commit();
                if std::env::var_os("COORD_TRACE").is_some() {
                    eprintln!(
                        "host {h} txn {token} on {id:?}: {r:?} -> decision {:?}",
                        n.decision()
                    );
                }
                match r {
                    Ok(at) => {
                        committed.push((at, id, token, step));
                        false
                    }
                    Err(CommitError::NotWriter { .. } | CommitError::Lost { .. }) => false,
                    Err(CommitError::Undecided) => {
                        unknown.push((id, step));
                        false
                    }
                    Err(CommitError::Fs(_)) => {
                        unknown.push((id, step));
                        true
                    }
                }
            }
        };
        if failed {
            // Its I/O failed: the host is down (a crash, or cut off); it mounts again.
            nodes[h as usize] = None;
        }
    }
    // Heal; every host mounts or polls; a fresh reader (host 4) mounts.
    for d in &devs {
        d.cut.store(0, Ordering::SeqCst);
        d.writes_left.store(u64::MAX, Ordering::SeqCst);
    }
    let reader =
        Node::mount(devs[4].clone(), 4).map_err(|e| format!("seed {seed}: reader: {e}"))?;
    let pages = Pages {
        start: sb.geometry.paxos_start(),
        hosts: sb.geometry.max_hosts,
        uuid: sb.uuid,
    };
    let (_, value) = latest(
        &pages.read_leader(vol.as_ref()).unwrap(),
        &pages.read_blocks(vol.as_ref()).unwrap(),
    );
    // The current generation's records are all readable: each commit reported in it is
    // there, at its sequence number.
    let chain = records_after(vol.as_ref(), &sb.geometry, sb.uuid, 0, value.anchor)
        .map_err(|e| format!("seed {seed}: the chain: {e}"))?;
    committed.sort();
    for w in committed.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(format!("seed {seed}: two commits reported {:?}", w[0].0));
        }
    }
    for &((generation, seq), id, size, _) in &committed {
        if generation != value.anchor.generation {
            continue;
        }
        let Some((_, r)) = chain.iter().find(|(_, r)| r.seq == seq) else {
            return Err(format!(
                "seed {seed}: commit {seq} of generation {generation} is not in the journal \
                 (last {})",
                value.anchor.seq
            ));
        };
        let want = chorus_fs::meta::encode_obj(Kind::Inode, &file(size));
        if !r.ops.iter().any(|op| op.id == id && op.new == want) {
            return Err(format!(
                "seed {seed}: the journal's record {seq} is another transaction"
            ));
        }
    }
    // Across generations: each inode holds what its last reported commit gave it, unless
    // a transaction of unknown outcome on it came later.
    let mut last: std::collections::HashMap<MetaId, (usize, u64)> = Default::default();
    for &(_, id, size, step) in &committed {
        // Sorted by (generation, sequence): the last one wins.
        last.insert(id, (step, size));
    }
    for (id, (step, size)) in last {
        if unknown.iter().any(|&(u, s)| u == id && s > step) {
            continue;
        }
        let got = reader.store().get(Kind::Inode, id).cloned();
        if got != Some(file(size)) {
            return Err(format!(
                "seed {seed}: inode {id:?} holds {got:?}, its last commit gave it size {size}"
            ));
        }
    }
    for (h, n) in nodes.iter_mut().enumerate() {
        let Some(n) = n else { continue };
        n.poll()
            .map_err(|e| format!("seed {seed}: host {h} polls: {e}"))?;
        if n.decision() == reader.decision() && n.store() != reader.store() {
            for c in 0..2u32 {
                for (id, m) in n.store().iter(c, Kind::Inode) {
                    let r = reader.store().get(Kind::Inode, id).unwrap();
                    if r != m {
                        eprintln!("host {h} {id:?}: {m:?} reader {r:?}");
                    }
                }
            }
        }
        if n.decision() != reader.decision() || n.store() != reader.store() {
            return Err(format!(
                "seed {seed}: host {h} holds decision {:?}, the reader {:?}, or other metadata",
                n.decision(),
                reader.decision()
            ));
        }
    }
    let _ = Superblock::read(vol.as_ref()).unwrap();
    Ok((committed.len() as u64, value.anchor.generation))
}

#[test]
fn hosts_share_the_journal_without_losing_or_splitting_a_commit() {
    let mut commits = 0;
    let only: Option<u64> = std::env::var("COORD_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    for seed in 0..400 {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
        commits += run(seed, false, 512 << 10).unwrap().0;
    }
    assert!(
        only.is_some() || commits > 2000,
        "{commits} commits in 400 seeds"
    );
}

#[cfg(feature = "broken")]
#[test]
fn commits_that_skip_disk_paxos_are_caught() {
    let caught = (0..400)
        .filter(|&s| run(s, true, 512 << 10).is_err())
        .count();
    assert!(
        caught > 0,
        "no seed caught a commit that skipped Disk Paxos"
    );
}

/// The same with a journal of two sectors a host a generation: a checkpoint every
/// couple of transactions, crashes and cut-off I/O in the middle of them.
#[test]
fn checkpoints_keep_every_host_in_step() {
    let (mut commits, mut generations) = (0, 0);
    for seed in 0..300 {
        let (c, g) = run(seed, false, 64 << 10).unwrap();
        commits += c;
        generations += g;
    }
    assert!(commits > 1000, "{commits} commits in 300 seeds");
    assert!(
        generations > commits / 4,
        "{generations} generations for {commits} commits"
    );
}
