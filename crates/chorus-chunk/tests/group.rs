//! A chunk as a parallel-mode group on three real environments (loopback TCP, real
//! files): writes go through the group's log and are applied to every replica's chunk
//! store; checkpoints keep the log bounded (the replicas compact); a replica that was
//! down while the others compacted past it catches up from an image; and after all
//! three restart, every replica reads exactly what was written, from its block map and
//! the log's replay.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_chunk::{ChunkStateMachine, Geometry, SECTOR};
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_runtime::env::{OooGroupSpec, OooHandle, StateMachines};
use chorus_runtime::ooo::OooStateMachine;
use chorus_runtime::{Env, EnvConfig, Outcome};
use chorus_storage::fs::RealFs;

const GEO: Geometry = Geometry {
    chunk_bytes: 4 << 20,
    block_bytes: 64 << 10,
};
const GROUP: u64 = 7;

#[derive(Debug)]
struct Chunks;

impl StateMachines for Chunks {
    fn open(&self, spec: &OooGroupSpec, dir: &Path) -> std::io::Result<Arc<dyn OooStateMachine>> {
        assert!(matches!(spec.mode, Mode::Parallel { .. }));
        let geometry = Geometry::from_params(&spec.params)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        assert_eq!(geometry, GEO, "the spec carries the geometry");
        ChunkStateMachine::open(Arc::new(RealFs), &dir.join("chunk"), geometry)
            .map(|c| Arc::new(c) as Arc<dyn OooStateMachine>)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

fn config(node: u64, dir: &Path) -> EnvConfig {
    let mut c = EnvConfig::new(node, dir, "127.0.0.1:0".parse().unwrap());
    c.ooo.election_timeout = Duration::from_millis(150);
    // Checkpoint and compact every 64 KiB of log: the log stays bounded.
    c.ooo.compact_bytes = 64 << 10;
    c.state_machines = Some(Arc::new(Chunks));
    c
}

struct Cluster {
    root: tempfile::TempDir,
    envs: HashMap<u64, Env>,
}

impl Cluster {
    fn start(&mut self, n: u64) {
        let env = Env::open(config(n, &self.root.path().join(format!("n{n}")))).unwrap();
        for (id, other) in &self.envs {
            other.set_peer_addr(n, env.replication_addr().to_string());
            env.set_peer_addr(*id, other.replication_addr().to_string());
        }
        self.envs.insert(n, env);
    }

    fn stop(&mut self, n: u64) {
        if let Some(e) = self.envs.remove(&n) {
            e.shutdown();
        }
    }

    fn group(&self, n: u64) -> OooHandle {
        self.envs[&n].ooo_group(GROUP).unwrap()
    }

    /// Writes `data` at sector `sector` through whichever node leads.
    fn write(&self, sector: u64, data: &[u8]) {
        let n = data.len() as u64 / SECTOR;
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            for e in self.envs.values() {
                let h = e.ooo_group(GROUP).unwrap();
                let declared = Declared::Blocks(vec![BlockRange::new(sector, n).unwrap()]);
                if let Ok(Outcome::Committed) = h.node().append(declared, data.to_vec()) {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "no leader took the write at sector {sector}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until node `n`'s replica of the chunk reads as `model`.
    fn converges(&self, n: u64, model: &[u8]) {
        let h = self.group(n);
        let chunk = h.state::<ChunkStateMachine>().expect("a chunk");
        let end = Instant::now() + Duration::from_secs(30);
        while chunk.store().read(0, model.len()).unwrap() != model {
            assert!(
                Instant::now() < end,
                "node {n}: the chunk never read as written ({:?})",
                h.node().status().map(|s| (s.applied_head, s.base))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A deterministic byte pattern for write `i`.
fn payload(i: u64, sectors: u64) -> Vec<u8> {
    (0..sectors * SECTOR)
        .map(|j| (i.wrapping_mul(31).wrapping_add(j / 512)) as u8)
        .collect()
}

#[test]
fn a_chunk_replicated_by_its_group_reads_what_was_written_through_compaction_catch_up_and_restart()
{
    let mut c = Cluster {
        root: tempfile::tempdir().unwrap(),
        envs: HashMap::new(),
    };
    for n in 1..=3 {
        c.start(n);
    }
    for e in c.envs.values() {
        e.create_ooo_group(OooGroupSpec {
            id: GROUP,
            mode: Mode::Parallel { span: 2 },
            conflict_order: false,
            voters: vec![1, 2, 3],
            others: vec![],
            params: GEO.to_params(),
        })
        .unwrap();
    }
    let mut model = vec![0u8; GEO.chunk_bytes as usize];
    let sectors_in_chunk = GEO.chunk_bytes / SECTOR;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut i = 0u64;
    let mut write = |c: &Cluster, model: &mut Vec<u8>, count: u64| {
        for _ in 0..count {
            let n = 1 + next() % 8;
            let sector = next() % (sectors_in_chunk - n);
            let data = payload(i, n);
            c.write(sector, &data);
            let at = (sector * SECTOR) as usize;
            model[at..at + data.len()].copy_from_slice(&data);
            i += 1;
        }
    };
    write(&c, &mut model, 60);
    for n in 1..=3 {
        c.converges(n, &model);
    }
    // Node 3 goes down; the others write on and compact well past what it holds.
    let held_by_3 = c.group(3).node().status().unwrap().applied_head;
    c.stop(3);
    write(&c, &mut model, 80);
    let compacted = [1, 2].map(|n| c.group(n).node().status().unwrap().base);
    assert!(
        compacted.iter().all(|b| *b > held_by_3),
        "the others did not compact past node 3's {held_by_3}: bases {compacted:?}"
    );
    c.start(3);
    c.converges(3, &model);
    // Node 3 could only catch up from an image of the chunk. The image is installed in
    // the store before its driver hears it was and counts it (the next round), so the
    // chunk can read as written a moment before the counter shows the install.
    let end = Instant::now() + Duration::from_secs(10);
    while c.group(3).node().status().unwrap().counters.installs == 0 {
        assert!(Instant::now() < end, "node 3 installed no image");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Thin: far fewer blocks than the chunk has.
    let chunk3 = c.group(3);
    let blocks = chunk3
        .state::<ChunkStateMachine>()
        .unwrap()
        .store()
        .allocated_blocks();
    assert!(blocks > 0 && blocks <= GEO.blocks(), "{blocks}");
    drop(chunk3);
    // Everyone restarts: each replica comes back from its block map and its log.
    for n in 1..=3 {
        c.stop(n);
    }
    for n in 1..=3 {
        c.start(n);
    }
    for n in 1..=3 {
        c.converges(n, &model);
    }
    write(&c, &mut model, 10);
    for n in 1..=3 {
        c.converges(n, &model);
    }
    for n in 1..=3 {
        c.stop(n);
    }
}
