//! The storage layer through real processes: five `chorus server`s, a control plane on
//! three of them (its state in ordered group 1), every node a chunk server in its own
//! rack. A volume of several chunks is created (placed three to a chunk on distinct
//! nodes, balanced), written and read through the routing client at byte offsets that
//! straddle sectors, blocks and chunks, checked against a model; a chunk server that
//! holds a chunk's leader is killed with SIGKILL and I/O goes on (nothing acknowledged is
//! lost); the volume grows and is deleted; bad input is refused by name; the CLI writes
//! and reads a volume.

use std::process::Command;
use std::time::{Duration, Instant};

use chorus_client::volume::on_control;
use chorus_client::{pb, VolumeClient, VolumeError};
use tonic::Code;

mod common;
#[path = "common/storage.rs"]
mod storage;
use storage::{leader_metrics, Cluster, CHUNK};

const NODES: u64 = 5;

fn cluster() -> Cluster {
    Cluster::start(NODES, 3000)
}

async fn list_nodes(control: &[String]) -> Option<pb::ListNodesResponse> {
    match on_control(control, Duration::from_secs(2), |mut c| async move {
        c.list_nodes(pb::Empty {}).await.map(|r| r.into_inner())
    })
    .await
    {
        Ok(Ok(r)) => Some(r),
        _ => None,
    }
}

/// Waits until every node has registered and is live.
async fn all_registered(c: &Cluster) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let r = list_nodes(&c.control).await;
        if let Some(r) = &r {
            if r.nodes.len() as u64 == NODES && r.nodes.iter().all(|n| n.live) {
                return;
            }
        }
        if Instant::now() >= end {
            c.dump_logs();
            panic!("nodes did not all register: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create(
    control: &[String],
    name: &str,
    size: u64,
) -> Result<pb::VolumeInfo, tonic::Status> {
    let req = pb::CreateVolumeRequest {
        name: name.into(),
        size_bytes: size,
        chunk_bytes: 0,
        block_bytes: 0,
    };
    on_control(control, Duration::from_secs(30), |mut c| {
        let req = req.clone();
        async move { c.create_volume(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect("control plane reachable")
}

/// A deterministic byte pattern.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes until acknowledged: a write whose outcome is unknown (its leader was killed)
/// is written again, which is safe for a blind write of the same bytes.
async fn write_acked(v: &VolumeClient, model: &mut [u8], offset: u64, data: &[u8]) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        match v.write(offset, data).await {
            Ok(()) => break,
            Err(e @ (VolumeError::Unknown { .. } | VolumeError::Failed { .. })) => {
                assert!(
                    Instant::now() < end,
                    "write at {offset} never acknowledged: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("write at {offset}: {e}"),
        }
    }
    model[offset as usize..offset as usize + data.len()].copy_from_slice(data);
}

async fn check_all(v: &VolumeClient, model: &[u8]) {
    let got = v
        .read(0, model.len() as u64)
        .await
        .expect("read the volume");
    assert_eq!(got.len(), model.len());
    if let Some(i) = (0..model.len()).find(|&i| got[i] != model[i]) {
        panic!(
            "byte {i} reads {} where {} was acknowledged",
            got[i], model[i]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_placed_written_read_and_survives_a_chunk_server_kill() {
    let mut c = cluster();
    all_registered(&c).await;
    // 4 chunks of 1 MiB, the last one partly used.
    let size = 3 * CHUNK + 100_000;
    let info = match create(&c.control, "db", size).await {
        Ok(i) => i,
        Err(e) => {
            c.dump_logs();
            panic!("create: {e:?}");
        }
    };
    if info.state != "ready" {
        c.dump_logs();
        panic!("state {}", info.state);
    }
    assert_eq!(info.chunks.len(), 4);
    let mut load = std::collections::BTreeMap::<u64, usize>::new();
    for ch in &info.chunks {
        let mut r = ch.replicas.clone();
        r.sort_unstable();
        r.dedup();
        assert_eq!(r.len(), 3, "three distinct replicas: {:?}", ch.replicas);
        for n in r {
            *load.entry(n).or_default() += 1;
        }
    }
    // 12 replicas on 5 nodes: 2 or 3 each.
    assert!(load.values().all(|&l| (2..=3).contains(&l)), "{load:?}");
    // Bad input is refused by name.
    let dup = create(&c.control, "db", CHUNK).await.unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists, "{dup:?}");
    let bad = create(&c.control, "no/slash", CHUNK).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(matches!(
        VolumeClient::open(c.control.clone(), "nope").await,
        Err(VolumeError::NoSuchVolume(_))
    ));

    let v = VolumeClient::open(c.control.clone(), "db").await.unwrap();
    let mut model = vec![0u8; size as usize];
    // Never-written space reads as zeros.
    check_all(&v, &model).await;
    // Aligned, unaligned, across blocks and chunks, and up to the end.
    let writes: Vec<(u64, usize)> = vec![
        (0, 4096),
        (4096 * 3 + 17, 10_000),
        (CHUNK - 5000, 12_000),
        (2 * CHUNK - 65536, 3 * 65536),
        (size - 777, 777),
        (CHUNK / 2, 300_000),
    ];
    for (i, (off, len)) in writes.iter().enumerate() {
        write_acked(&v, &mut model, *off, &pattern(i as u64, *len)).await;
    }
    check_all(&v, &model).await;
    let e = v.write(size - 10, &[1; 20]).await.unwrap_err();
    assert!(e.to_string().contains("past the volume"), "{e}");
    assert!(v.read(size, 1).await.is_err());

    // Kill the node leading chunk 0 (known from the writes); I/O goes on.
    let status = {
        let mut cl = chorus_client::Client::new(
            info.nodes
                .iter()
                .map(|n| format!("http://{}", n.client_addr))
                .collect(),
        );
        cl.status_all(info.chunks[0].group).await
    };
    let leader = status
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .find(|s| s.groups.iter().any(|g| g.role == "leader"))
        .map(|s| s.node)
        .expect("chunk 0 has a leader");
    c.nodes[(leader - 1) as usize].kill9();
    for i in 0..20u64 {
        let off = (i * 151_111) % (size - 70_000);
        write_acked(&v, &mut model, off, &pattern(100 + i, 65_000)).await;
    }
    check_all(&v, &model).await;

    // The control plane sees the killed node down (and places nothing new on it).
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = list_nodes(&c.control).await;
        if r.is_some_and(|r| r.nodes.iter().any(|n| n.id == leader && !n.live)) {
            break;
        }
        assert!(Instant::now() < end, "node {leader} is not seen down");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Grow: a new chunk, reading as zeros; then delete.
    let req = pb::GrowVolumeRequest {
        name: "db".into(),
        size_bytes: size + CHUNK,
    };
    let grown = on_control(&c.control, Duration::from_secs(30), |mut cl| {
        let req = req.clone();
        async move { cl.grow_volume(req).await.map(|r| r.into_inner()) }
    })
    .await
    .unwrap_or_else(|e| {
        c.dump_logs();
        panic!("grow: {e}")
    });
    match grown {
        Ok(g) => {
            assert_eq!(g.chunks.len(), 5);
            assert!(g.version > info.version);
        }
        // Placing needs three live nodes; with one killed there are four.
        Err(s) => panic!("grow: {s:?}"),
    }
    let end = Instant::now() + Duration::from_secs(10);
    while v.map().chunks.len() != 5 {
        assert!(Instant::now() < end, "the new map was not pushed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(v.refreshes() >= 1);
    let tail = v.read(size, CHUNK).await.unwrap();
    assert!(tail.iter().all(|&b| b == 0));

    // The killed node is replaced automatically: every chunk it held gets a new replica
    // on a live node (a membership change of its group), and the map says so.
    let end = Instant::now() + Duration::from_secs(60);
    let moved = loop {
        let m = VolumeClient::open(c.control.clone(), "db")
            .await
            .unwrap()
            .map();
        let left = m
            .chunks
            .iter()
            .filter(|ch| ch.replicas.contains(&leader) || ch.moving_to != 0)
            .count();
        if left == 0 {
            break m;
        }
        if Instant::now() >= end {
            c.dump_logs();
            panic!(
                "{left} chunks still on node {leader} or moving: {:?}",
                m.chunks
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    for ch in &moved.chunks {
        let mut r = ch.replicas.clone();
        r.sort_unstable();
        r.dedup();
        assert_eq!(
            r.len(),
            3,
            "three distinct replicas after the move: {:?}",
            ch.replicas
        );
    }
    // Nothing acknowledged was lost, and I/O goes on on the new replicas.
    check_all(&v, &model).await;
    write_acked(&v, &mut model, 0, &pattern(999, 3 * CHUNK as usize)).await;
    check_all(&v, &model).await;
    // Every replica of chunk 0, the new one included, applies the same bytes.
    let ch0 = &moved.chunks[0];
    let end = Instant::now() + Duration::from_secs(30);
    for n in &ch0.replicas {
        let addr = &moved.addrs[n];
        loop {
            let mut cl = chorus_client::Client::new(vec![format!("http://{addr}")]);
            let r = cl.read_blocks_at(0, ch0.group, 0, 16).await;
            if r.as_ref().is_ok_and(|r| r.data[..] == model[..16 * 4096]) {
                break;
            }
            assert!(
                Instant::now() < end,
                "node {n} does not hold chunk 0's data: {r:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // A drained node's chunks move off it too, and its old replicas are deleted.
    let drained = (1..=NODES).rev().find(|n| *n != leader).unwrap();
    let req = pb::DrainNodeRequest { node: drained };
    on_control(&c.control, Duration::from_secs(30), |mut cl| async move {
        cl.drain_node(req).await.map(|r| r.into_inner())
    })
    .await
    .unwrap()
    .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let m = VolumeClient::open(c.control.clone(), "db")
            .await
            .unwrap()
            .map();
        if m.chunks
            .iter()
            .all(|ch| !ch.replicas.contains(&drained) && ch.moving_to == 0)
        {
            break m;
        }
        if Instant::now() >= end {
            c.dump_logs();
            panic!("chunks still on drained node {drained}: {:?}", m.chunks);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let drained_addr = format!("http://{}", moved.addrs[&drained]);
    let end = Instant::now() + Duration::from_secs(20);
    for ch in &moved.chunks {
        if !ch.replicas.contains(&drained) {
            continue;
        }
        loop {
            let mut cl = chorus_client::Client::new(vec![drained_addr.clone()]);
            let gone = matches!(
                cl.read_blocks_at(0, ch.group, 0, 1).await,
                Err(chorus_client::ClientError::Status {
                    code: Code::NotFound,
                    ..
                })
            );
            if gone {
                break;
            }
            assert!(
                Instant::now() < end,
                "group {} still on drained node {drained}",
                ch.group
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(after.chunks.len(), 5);
    check_all(&v, &model).await;

    // The killed node comes back (with its stale replicas of chunks that moved away):
    // chunks are rebalanced onto it, stale replicas replaced by fresh ones, and I/O goes
    // on throughout.
    c.nodes[(leader - 1) as usize].start();
    let end = Instant::now() + Duration::from_secs(60);
    let mut i = 0u64;
    loop {
        write_acked(
            &v,
            &mut model,
            (i * 65_536) % (size - 65_536),
            &pattern(500 + i, 65_536),
        )
        .await;
        i += 1;
        let m = v.map();
        let on = m
            .chunks
            .iter()
            .filter(|ch| ch.replicas.contains(&leader))
            .count();
        let moving = m.chunks.iter().any(|ch| ch.moving_to != 0);
        // 15 replicas on the 4 nodes not drained: 3 or 4 on each once balanced.
        if on >= 3 && !moving {
            break;
        }
        if Instant::now() >= end {
            c.dump_logs();
            panic!(
                "node {leader} holds {on} chunks after its return: {:?}",
                m.chunks
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_all(&v, &model).await;

    // The CLI writes and reads the volume too.
    let bin = env!("CARGO_BIN_EXE_chorus");
    let ctl = c.control.join(",");
    let out = Command::new(bin)
        .args([
            "volume",
            "write",
            "db",
            "--control",
            &ctl,
            "--offset",
            "5000",
            "hello volume",
        ])
        .output()
        .unwrap();
    if !out.status.success() {
        for e in &c.control {
            let r = on_control(
                std::slice::from_ref(e),
                Duration::from_secs(2),
                |mut cl| async move {
                    cl.stat_volume(pb::VolumeName { name: "db".into() })
                        .await
                        .map(|r| r.into_inner())
                },
            )
            .await;
            eprintln!("{e}: {:?}", r.map(|r| r.map(|v| (v.state, v.version))));
        }
        c.dump_logs();
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(bin)
        .args([
            "volume",
            "read",
            "db",
            "--control",
            &ctl,
            "--offset",
            "5000",
            "--len",
            "12",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello volume");
    let out = Command::new(bin)
        .args(["volume", "read", "missing", "--control", &ctl, "--len", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("volume `missing` does not exist"));
    // `chorus node list` shows every node live again, the drained one draining with no
    // chunks, and the returned one holding chunks.
    // (Polled: a heartbeat late on a loaded machine shows a node down for a moment.)
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(bin)
            .args(["node", "list", "--control", &ctl, "-o", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let nodes = j["nodes"].as_array().unwrap().clone();
        assert_eq!(nodes.len() as u64, NODES);
        let as_expected = nodes.iter().all(|n| {
            let id = n["id"].as_u64().unwrap();
            n["live"] == true
                && if id == drained {
                    n["state"] == "draining" && n["chunks"] == 0
                } else {
                    n["state"] == "up"
                }
                && (id != leader || n["chunks"].as_u64().unwrap() >= 3)
        });
        if as_expected {
            break;
        }
        assert!(Instant::now() < end, "node list: {nodes:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The control leader's metrics count the moves and see every node live.
    let text = leader_metrics(&c.metrics).expect("a control leader renders its metrics");
    let finished: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("chorus_control_moves_total{event=\"finished\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // A control leader that took over after the moves counts none of them.
    assert!(
        text.contains("chorus_control_chunks{moving=\"false\"} 5"),
        "{text}"
    );
    assert!(
        text.contains(&format!("chorus_control_node_live{{node=\"{drained}\"}} 1")),
        "{text}"
    );
    eprintln!("control leader finished {finished} moves");

    // Leader balancing: every chunk ends up led by its preferred leader (its first
    // replica), and preferred leaderships are spread over the live nodes.
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        let m = VolumeClient::open(c.control.clone(), "db")
            .await
            .unwrap()
            .map();
        let mut st =
            chorus_client::Client::new(m.addrs.values().map(|a| format!("http://{a}")).collect());
        let mut led = std::collections::BTreeMap::new();
        for (_, r) in st.status_all(0).await {
            if let Ok(s) = r {
                for g in s.groups {
                    if g.role == "leader" && g.serving {
                        led.insert(g.group, s.node);
                    }
                }
            }
        }
        let mut per = std::collections::BTreeMap::<u64, usize>::new();
        for ch in &m.chunks {
            *per.entry(ch.replicas[0]).or_default() += 1;
        }
        let on_preferred = m
            .chunks
            .iter()
            .all(|ch| led.get(&ch.group) == Some(&ch.replicas[0]));
        // Five chunks over the live nodes: nobody prefers more than two.
        if on_preferred && per.values().all(|&n| n <= 2) {
            break;
        }
        if Instant::now() >= end {
            c.dump_logs();
            panic!("leaders not balanced: led {led:?}, preferred per node {per:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let text = leader_metrics(&c.metrics).expect("a control leader renders its metrics");
    assert!(
        text.contains("chorus_control_leader_transfers_total"),
        "{text}"
    );

    // Delete: refused I/O, then gone.
    let req = pb::VolumeName { name: "db".into() };
    on_control(&c.control, Duration::from_secs(30), |mut cl| {
        let req = req.clone();
        async move { cl.delete_volume(req).await.map(|r| r.into_inner()) }
    })
    .await
    .unwrap()
    .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while v.map().state == "ready" {
        assert!(Instant::now() < end, "the deletion was not pushed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        v.write(0, &[0; 4096]).await,
        Err(VolumeError::NotReady { .. })
    ));
    // Its groups are removed from the live nodes (the dead one is past replace_after_ms
    // and holds nothing up), then it is gone.
    let end = Instant::now() + Duration::from_secs(30);
    while VolumeClient::open(c.control.clone(), "db").await.is_ok() {
        assert!(Instant::now() < end, "the volume was not removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
