//! Scrubbing through real processes (PolarFS section 7.3): four `chorus server`s, a
//! volume of two chunks written through the routing client; one follower replica's data
//! file is damaged on disk behind the server's back. The control plane's scrubber finds
//! the replica that disagrees with its majority (its counters say so), rebuilds it on
//! the spare node from the majority, and every replica of the chunk then holds the
//! bytes that were written; reads never saw the damage.

use std::time::{Duration, Instant};

use chorus_client::volume::on_control;
use chorus_client::{pb, VolumeClient};

mod common;
#[path = "common/storage.rs"]
mod storage;
use storage::{leader_metrics, Cluster, CHUNK};

const NODES: u64 = 4;
const SIZE: u64 = 2 * CHUNK;

fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

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
    let c = Cluster::start(NODES, 600_000);
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
    let model: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    v.write(0, &model).await.expect("write the volume");
    assert!(v.read(0, SIZE).await.unwrap() == model);

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
        .find(|n| **n != leader)
        .unwrap();
    let before = leader_metrics(&c.metrics)
        .map_or(0, |t| counter(&t, "chorus_control_scrub_mismatches_total"));
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
    let text = leader_metrics(&c.metrics).expect("a control leader renders its metrics");
    assert!(
        counter(&text, "chorus_control_scrub_mismatches_total") > before
            || counter(&text, "chorus_control_scrub_repairs_total") >= 1,
        "{text}"
    );
    assert!(
        counter(&text, "chorus_control_scrub_bytes_total") > 0,
        "{text}"
    );

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
                Ok(r) if r.data == model[..CHUNK as usize] => break,
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
    assert!(v.read(0, SIZE).await.unwrap() == model);
}
