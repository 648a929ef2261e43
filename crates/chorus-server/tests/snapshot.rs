//! Volume snapshots and clones through real processes (PolarFS section 7.2): three
//! `chorus server`s, each a control node and a chunk server. Writers run on the volume
//! while a snapshot is taken; a clone of the snapshot is read back and checked against
//! the guarantee, sector by sector: every write acknowledged before the snapshot began
//! is in it, and no write issued after it completed is. The snapshot stays what it was
//! while its volume is overwritten (copy-on-write: a second clone equals the first),
//! survives a chunk server killed and restarted, and is deleted; bad input is refused
//! by name; the CLI lists it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::volume::on_control;
use chorus_client::{pb, VolumeClient, VolumeError};
use tonic::Code;

mod common;
#[path = "common/storage.rs"]
mod storage;
use storage::{Cluster, CHUNK};

const NODES: u64 = 3;
const SECTOR: u64 = 4096;
/// The volume: three chunks.
const SIZE: u64 = 3 * CHUNK;

fn cluster() -> Cluster {
    Cluster::start(NODES, 600_000)
}

/// Calls the control plane until it answers (a leader may still be elected).
async fn ctl<T, F, Fut>(control: &[String], call: F) -> Result<T, tonic::Status>
where
    F: FnMut(pb::control_client::ControlClient<chorus_client::Conn>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    on_control(control, Duration::from_secs(30), call)
        .await
        .expect("control plane reachable")
}

async fn create_volume(c: &Cluster, name: &str) -> pb::VolumeInfo {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let req = pb::CreateVolumeRequest {
            name: name.into(),
            size_bytes: SIZE,
            ..Default::default()
        };
        match ctl(&c.control, |mut cl| {
            let req = req.clone();
            async move { cl.create_volume(req).await.map(|r| r.into_inner()) }
        })
        .await
        {
            Ok(v) if v.state == "ready" => return v,
            // Nodes still registering: not enough of them to place three replicas.
            r if Instant::now() < end => {
                eprintln!("create {name}: {r:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            r => {
                c.dump_logs();
                panic!("create {name}: {r:?}");
            }
        }
    }
}

async fn snapshot(
    control: &[String],
    volume: &str,
    name: &str,
) -> Result<pb::SnapshotInfo, tonic::Status> {
    let req = pb::CreateSnapshotRequest {
        volume: volume.into(),
        name: name.into(),
    };
    ctl(control, |mut cl| {
        let req = req.clone();
        async move { cl.create_snapshot(req).await.map(|r| r.into_inner()) }
    })
    .await
}

async fn clone_of(
    control: &[String],
    name: &str,
    from: &str,
    snap: &str,
) -> Result<pb::VolumeInfo, tonic::Status> {
    let req = pb::CloneVolumeRequest {
        name: name.into(),
        source_volume: from.into(),
        snapshot: snap.into(),
    };
    ctl(control, |mut cl| {
        let req = req.clone();
        async move { cl.clone_volume(req).await.map(|r| r.into_inner()) }
    })
    .await
}

/// Waits until the control plane sees every node live.
async fn all_live(c: &Cluster) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let r = on_control(&c.control, Duration::from_secs(2), |mut cl| async move {
            cl.list_nodes(pb::Empty {}).await.map(|r| r.into_inner())
        })
        .await;
        if let Ok(Ok(r)) = &r {
            if r.nodes.len() as u64 == NODES && r.nodes.iter().all(|n| n.live) {
                return;
            }
        }
        assert!(Instant::now() < end, "nodes not all live: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The bytes of write `id` (distinct for every write, so a sector names its writer).
fn bytes_of(id: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The write id a sector holds (0: never written).
fn id_in(sector: &[u8]) -> u64 {
    u64::from_le_bytes(sector[..8].try_into().unwrap())
}

/// One write as its writer saw it.
#[derive(Clone, Debug)]
struct Done {
    id: u64,
    first_sector: u64,
    sectors: u64,
    issued: Instant,
    /// When it was acknowledged; None if its outcome is unknown or it failed.
    acked: Option<Instant>,
}

/// Writes until `stop`: sector-aligned writes of 1 to 40 sectors (some across chunks)
/// in `region` (sectors), one at a time, each a new id (`base` + n).
async fn writer(
    v: Arc<VolumeClient>,
    base: u64,
    region: std::ops::Range<u64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    log: Arc<Mutex<Vec<Done>>>,
) {
    let mut x = base | 1;
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let sectors = 1 + x % 40;
        let span = region.end - region.start - sectors;
        let first = region.start + (x >> 8) % span;
        n += 1;
        let id = base + n;
        let issued = Instant::now();
        let r = v
            .write(first * SECTOR, &bytes_of(id, (sectors * SECTOR) as usize))
            .await;
        let acked = match r {
            Ok(()) => Some(Instant::now()),
            Err(VolumeError::Unknown { .. } | VolumeError::Failed { .. }) => None,
            Err(e) => panic!("write {id}: {e}"),
        };
        log.lock().unwrap().push(Done {
            id,
            first_sector: first,
            sectors,
            issued,
            acked,
        });
    }
}

/// Reads a whole volume.
async fn read_all(control: &[String], name: &str) -> Vec<u8> {
    let v = VolumeClient::open(control.to_vec(), name).await.unwrap();
    v.read(0, SIZE).await.expect("read the volume")
}

/// Checks `image` (a clone of a snapshot taken over [begin, end]) against the writes:
/// each sector holds the last write to it acknowledged before `begin`, or a later one
/// issued before `end` (or zeros if none was acknowledged before `begin` and it holds
/// no later one).
fn check_guarantee(image: &[u8], writes: &[Done], begin: Instant, end: Instant) {
    let sectors = SIZE / SECTOR;
    let mut per: Vec<Vec<&Done>> = vec![Vec::new(); sectors as usize];
    for w in writes {
        for s in w.first_sector..w.first_sector + w.sectors {
            per[s as usize].push(w);
        }
    }
    let mut from_window = 0;
    for s in 0..sectors as usize {
        let got = id_in(&image[s * SECTOR as usize..(s + 1) * SECTOR as usize]);
        // Writers are one at a time per region, so their order per sector is the log's.
        let floor = per[s]
            .iter()
            .rev()
            .find(|w| w.acked.is_some_and(|a| a < begin))
            .map_or(0, |w| w.id);
        if got == floor {
            continue;
        }
        let later_ok = per[s]
            .iter()
            .any(|w| w.id == got && w.id > floor && w.issued < end);
        assert!(
            later_ok,
            "sector {s} of the snapshot holds write {got}; the last acknowledged before the snapshot began is {floor} (later writes to it: {:?})",
            per[s]
                .iter()
                .filter(|w| w.id > floor)
                .map(|w| (w.id, w.issued < end))
                .collect::<Vec<_>>()
        );
        from_window += 1;
    }
    eprintln!("snapshot checked: {from_window} sectors hold writes from the snapshot's window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_hold_what_was_acknowledged_before_and_nothing_issued_after() {
    let mut c = cluster();
    let info = create_volume(&c, "db").await;
    assert_eq!(info.chunks.len(), 3);
    let v = Arc::new(VolumeClient::open(c.control.clone(), "db").await.unwrap());

    // Writers on two regions (one across the chunk 0/1 boundary) while a snapshot is taken.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let per_chunk = CHUNK / SECTOR;
    let tasks = vec![
        tokio::spawn(writer(
            v.clone(),
            1 << 32,
            0..per_chunk * 3 / 2,
            stop.clone(),
            log.clone(),
        )),
        tokio::spawn(writer(
            v.clone(),
            2 << 32,
            per_chunk * 3 / 2..per_chunk * 3,
            stop.clone(),
            log.clone(),
        )),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let begin = Instant::now();
    let s1 = snapshot(&c.control, "db", "s1").await;
    let end = Instant::now();
    let s1 = match s1 {
        Ok(s) => s,
        Err(e) => {
            c.dump_logs();
            panic!("snapshot: {e:?}");
        }
    };
    assert_eq!(s1.state, "ready");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let writes = log.lock().unwrap().clone();
    assert!(
        writes
            .iter()
            .filter(|w| w.issued > end && w.acked.is_some())
            .count()
            > 0
            && writes
                .iter()
                .filter(|w| w.acked.is_some_and(|a| a < begin))
                .count()
                > 0,
        "writes ran before and after the snapshot: {} writes",
        writes.len()
    );

    // A clone of the snapshot holds exactly what the guarantee allows.
    let cl = match clone_of(&c.control, "db-s1", "db", "s1").await {
        Ok(v) => v,
        Err(e) => {
            c.dump_logs();
            panic!("clone: {e:?}");
        }
    };
    assert_eq!(cl.state, "ready");
    assert_eq!(cl.size_bytes, SIZE);
    let image = read_all(&c.control, "db-s1").await;
    check_guarantee(&image, &writes, begin, end);

    // The volume is overwritten everywhere; the snapshot does not change (copy on write).
    for i in 0..(SIZE / (256 << 10)) {
        v.write(i * (256 << 10), &bytes_of(99, 256 << 10))
            .await
            .expect("overwrite");
    }
    // A chunk server is killed and restarted: it catches up, snapshots included.
    c.nodes[2].kill9();
    let s2 = snapshot(&c.control, "db", "s2")
        .await
        .expect("a snapshot with a node down");
    assert_eq!(s2.state, "ready");
    c.nodes[2].start();
    all_live(&c).await;
    let again = clone_of(&c.control, "db-s1b", "db", "s1")
        .await
        .expect("second clone");
    assert_eq!(again.state, "ready");
    assert!(
        read_all(&c.control, "db-s1b").await == image,
        "snapshot s1 changed"
    );
    let now = read_all(&c.control, "db").await;
    assert!(now.chunks(SECTOR as usize).all(|s| id_in(s) == 99));
    let c2 = clone_of(&c.control, "db-s2", "db", "s2")
        .await
        .expect("clone of s2");
    assert_eq!(c2.state, "ready");
    assert!(
        read_all(&c.control, "db-s2").await == now,
        "snapshot s2 is the overwritten volume"
    );

    // Bad input is refused by name.
    let e = snapshot(&c.control, "nope", "x").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nope"), "{e:?}");
    let e = snapshot(&c.control, "db", "s1").await.unwrap_err();
    assert!(e.message().contains("s1"), "{e:?}");
    let e = clone_of(&c.control, "x", "db", "nosuch").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // The CLI lists the snapshots.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args([
            "volume",
            "snapshot",
            "list",
            "db",
            "--control",
            &c.control.join(","),
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2"]);

    // Deleted: gone from the volume, and its chunk space freed.
    let req = pb::SnapshotName {
        volume: "db".into(),
        name: "s1".into(),
    };
    ctl(&c.control, |mut cl| {
        let req = req.clone();
        async move { cl.delete_snapshot(req).await.map(|r| r.into_inner()) }
    })
    .await
    .expect("delete s1");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = ctl(&c.control, |mut cl| async move {
            cl.stat_volume(pb::VolumeName { name: "db".into() })
                .await
                .map(|r| r.into_inner())
        })
        .await
        .unwrap();
        let names: Vec<String> = st.snapshots.iter().map(|s| s.name.clone()).collect();
        if names == ["s2"] {
            break;
        }
        assert!(Instant::now() < deadline, "s1 not gone: {names:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A snapshot of a volume being deleted is refused.
    ctl(&c.control, |mut cl| async move {
        cl.delete_volume(pb::VolumeName {
            name: "db-s1b".into(),
        })
        .await
        .map(|r| r.into_inner())
    })
    .await
    .expect("delete db-s1b");
    if let Err(e) = snapshot(&c.control, "db-s1b", "late").await {
        assert!(
            matches!(e.code(), Code::FailedPrecondition | Code::NotFound),
            "{e:?}"
        );
    } else {
        panic!("a snapshot of a volume being deleted was taken");
    }
}
