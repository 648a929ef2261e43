//! Scrubbing, and the control plane's leader killed, through real processes (PolarFS
//! sections 7.3 and 3.2.3): five `chorus server`s, a volume of two chunks written
//! through the routing client. The control group's leader is killed with SIGKILL: I/O
//! goes on through the cached map, and the control duties resume on a new leader. Then
//! one follower replica's data file is damaged on disk behind its server's back: the new
//! control leader's scrubber finds the replica that disagrees with its majority (its
//! counters say so) and rebuilds it on another node from the majority; every replica of
//! the chunk then holds the bytes that were written, and reads never saw the damage.

use std::time::{Duration, Instant};

use chorus_client::volume::on_control;
use chorus_client::{pb, VolumeClient};

mod common;
#[path = "common/storage.rs"]
mod storage;
use storage::{control_counter, leader_metrics, Cluster, CHUNK};

const NODES: u64 = 5;
const SIZE: u64 = 2 * CHUNK;

/// The chunk data files under a node's data directory for chunk group `group`.
fn data_files(c: &Cluster, node: u64, group: u64) -> Vec<std::path::PathBuf> {
    let dir = c
        .dir
        .path()
        .join(format!("n{node}/groups/{group:020}/chunk"));
    std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "data"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_finds_a_damaged_replica_and_rebuilds_it_from_the_majority() {
    let mut c = Cluster::start(NODES, 600_000);
    // Create once every node is registered (placement needs three live nodes).
    let end = Instant::now() + Duration::from_secs(60);
    let info = loop {
        let req = pb::CreateVolumeRequest {
            name: "db".into(),
            size_bytes: SIZE,
            ..Default::default()
        };
        let r = on_control(&c.control, Duration::from_secs(30), |mut cl| {
            let req = req.clone();
            async move { cl.create_volume(req).await.map(|r| r.into_inner()) }
        })
        .await;
        match r {
            Ok(Ok(v)) if v.state == "ready" => break v,
            r if Instant::now() < end => {
                eprintln!("create: {r:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            r => {
                c.dump_logs();
                panic!("create: {r:?}");
            }
        }
    };
    let v = VolumeClient::open(c.control.clone(), "db").await.unwrap();
    let mut model: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    v.write(0, &model).await.expect("write the volume");
    assert!(v.read(0, SIZE).await.unwrap() == model);

    // Kill the control group's leader: I/O goes on through the cached map.
    let ctl_leader = on_control(&c.control, Duration::from_secs(30), |mut cl| async move {
        cl.list_nodes(pb::Empty {})
            .await
            .map(|r| r.into_inner().leader)
    })
    .await
    .unwrap()
    .unwrap();
    assert!((1..=3).contains(&ctl_leader), "control leader {ctl_leader}");
    c.nodes[(ctl_leader - 1) as usize].kill9();
    for i in 0..8u64 {
        let off = i * 200_000;
        let data = vec![i as u8 + 1; 70_000];
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            match v.write(off, &data).await {
                Ok(()) => break,
                // The killed node led this chunk: its outcome is unknown; write it again.
                Err(e) if Instant::now() < end => {
                    eprintln!("write at {off}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("write at {off}: {e}"),
            }
        }
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
    assert!(v.read(0, SIZE).await.unwrap() == model);
    // A new control leader serves (and renders its metrics).
    let end = Instant::now() + Duration::from_secs(30);
    while leader_metrics(&c.metrics).is_none() {
        assert!(Instant::now() < end, "no new control leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The old leader comes back as a follower (so every chunk has its three replicas for
    // the scrubber's majority).
    c.nodes[(ctl_leader - 1) as usize].start();

    // Damage a follower of chunk 0 (its leader serves the reads).
    let group = info.chunks[0].group;
    let mut st = chorus_client::Client::new(
        info.nodes
            .iter()
            .map(|n| format!("http://{}", n.client_addr))
            .collect(),
    );
    let leader = st
        .status_all(group)
        .await
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .find(|s| {
            s.groups
                .iter()
                .any(|g| g.group == group && g.role == "leader")
        })
        .map(|s| s.node)
        .expect("chunk 0 has a leader");
    let victim = *info.chunks[0]
        .replicas
        .iter()
        .find(|n| **n != leader && **n != ctl_leader)
        .unwrap();
    // The damage must outlive the victim's apply: wait until it has applied everything
    // the leader committed (a write applied after the damage would overwrite it).
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut applied = 0;
        let mut committed = u64::MAX;
        for (_, r) in st.status_all(group).await {
            let Ok(s) = r else { continue };
            for g in s.groups.iter().filter(|g| g.group == group) {
                if s.node == victim {
                    applied = g.applied_seq;
                }
                if g.role == "leader" {
                    committed = g.committed_seq;
                }
            }
        }
        if applied >= committed {
            break;
        }
        if Instant::now() >= end {
            for (n, r) in st.status_all(group).await {
                eprintln!("node {n}: {r:?}");
            }
            c.dump_logs();
            panic!("node {victim} never applied up to {committed} (applied {applied})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let files = data_files(&c, victim, group);
    assert_eq!(files.len(), 1, "one data file: {files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    assert!(bytes.len() >= 8192, "the replica holds data");
    for b in &mut bytes[100..4196] {
        *b ^= 0x5a;
    }
    std::fs::write(&files[0], bytes).unwrap();

    // The scrubber finds it and moves the replica off the victim.
    let end = Instant::now() + Duration::from_secs(60);
    let moved = loop {
        let m = VolumeClient::open(c.control.clone(), "db")
            .await
            .unwrap()
            .map();
        let ch = &m.chunks[0];
        if !ch.replicas.contains(&victim) && ch.moving_to == 0 {
            break ch.replicas.clone();
        }
        if Instant::now() >= end {
            c.dump_logs();
            panic!("the damaged replica on node {victim} was not replaced: {ch:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Counted by whichever control node led when it found it (summed over the control
    // nodes: the damage was made after the restart, so no count was lost with it).
    let found = control_counter(&c.metrics, "chorus_control_scrub_mismatches_total");
    let repairs = control_counter(&c.metrics, "chorus_control_scrub_repairs_total");
    assert!(
        found >= 1 && repairs >= 1,
        "mismatches {found}, repairs {repairs}"
    );
    assert!(control_counter(&c.metrics, "chorus_control_scrub_bytes_total") > 0);

    // Every replica of the chunk, the rebuilt one included, holds what was written.
    let addrs: std::collections::BTreeMap<u64, String> = {
        let m = VolumeClient::open(c.control.clone(), "db")
            .await
            .unwrap()
            .map();
        m.addrs.clone().into_iter().collect()
    };
    for n in moved {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let mut cl = chorus_client::Client::new(vec![format!("http://{}", addrs[&n])]);
            let got = cl.read_blocks_at(0, group, 0, CHUNK / 4096).await;
            match got {
                Ok(r) if r.data[..] == model[..CHUNK as usize] => break,
                r => {
                    assert!(
                        Instant::now() < end,
                        "node {n}'s replica of chunk 0 does not hold what was written: {:?}",
                        r.map(|r| r.applied_seq)
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }
    let got = v.read(0, SIZE).await;
    match got {
        Ok(got) if got == model => {}
        Ok(got) => {
            let first = got.iter().zip(&model).position(|(a, b)| a != b).unwrap();
            let last = got.iter().zip(&model).rposition(|(a, b)| a != b).unwrap();
            c.dump_logs();
            panic!(
                "the volume reads wrong bytes at {first}..={last}: got {} want {}",
                got[first], model[first]
            );
        }
        Err(e) => {
            c.dump_logs();
            panic!("the final read failed: {e}");
        }
    }
}
