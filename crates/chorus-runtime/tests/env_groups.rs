//! One environment hosts groups of every mode and owns their lifecycle (PALF section
//! 3.3: one PALFEnv hosts every log stream of a server): ordered, parallel and dependent
//! groups are created, reopened at the next start with their data, deleted, created
//! again and restarted in the same `Env`, each in `groups/{id:020}/`; an out-of-order
//! group whose spec is damaged does not start, by name, and the others are served.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::ooo::group::Record;
use chorus_core::ooo::parallel::BlockRange;
use chorus_core::ooo::replica::{Declared, Mode};
use chorus_runtime::env::{
    group_dir, GroupMode, OooGroupSpec, OooHandle, StateMachines, SPEC_FILE,
};
use chorus_runtime::ooo::OooStateMachine;
use chorus_runtime::{Env, EnvConfig, Error, LogHandle, Outcome};

/// Each record's bytes under its first block or written key: rebuilt from the log at
/// every start (nothing is compacted, so the replica replays its whole log).
#[derive(Default)]
struct Kv {
    map: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl Kv {
    fn get(&self, k: u64) -> Option<Vec<u8>> {
        self.map.lock().unwrap().get(&k).cloned()
    }
}

impl Kv {
    /// Each record's bytes under its first block or written key.
    fn apply_to(m: &mut BTreeMap<u64, Vec<u8>>, _slot: u64, records: &[(u32, Record)]) {
        for (_, r) in records {
            let k = match &r.declared {
                Declared::Blocks(b) => b[0].start,
                Declared::Txn { write_set, .. } => write_set[0],
            };
            m.insert(k, r.data.clone());
        }
    }
}

impl OooStateMachine for Kv {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> std::io::Result<()> {
        Kv::apply_to(&mut self.map.lock().unwrap(), slot, records);
        Ok(())
    }
    fn checkpoint(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn image(&self) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    fn restore(&self, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct Machines;

impl StateMachines for Machines {
    fn open(&self, _spec: &OooGroupSpec, _dir: &Path) -> std::io::Result<Arc<dyn OooStateMachine>> {
        Ok(Arc::new(Kv::default()))
    }
}

fn config(dir: &Path) -> EnvConfig {
    let mut c = EnvConfig::new(1, dir, "127.0.0.1:0".parse().unwrap());
    c.ooo.election_timeout = Duration::from_millis(100);
    c.ooo.compact_bytes = 0;
    c.state_machines = Some(Arc::new(Machines));
    c
}

fn spec(id: u64, mode: Mode) -> OooGroupSpec {
    OooGroupSpec {
        id,
        mode,
        conflict_order: false,
        voters: vec![1],
        others: vec![],
        params: vec![],
    }
}

const PAR: Mode = Mode::Parallel { span: 2 };

fn declared(mode: Mode, key: u64) -> Declared {
    match mode {
        Mode::Parallel { .. } => Declared::Blocks(vec![BlockRange::new(key, 1).unwrap()]),
        Mode::Dependent => Declared::Txn {
            read_set: vec![],
            write_set: vec![key],
        },
    }
}

/// Appends `data` under `key` once the single voter leads; waits for the commit.
fn ooo_put(h: &OooHandle, key: u64, data: &[u8]) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match h.node().append(declared(h.mode(), key), data.to_vec()) {
            Ok(Outcome::Committed) => return,
            r => {
                assert!(Instant::now() < end, "group {}: {r:?}", h.id());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn ordered_put(log: &LogHandle, data: &[u8]) -> u64 {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(a) = log.append(data, 0) {
            if a.result
                .wait()
                .is_ok_and(|r| r.outcome == Outcome::Committed)
            {
                return a.lsn;
            }
        }
        assert!(Instant::now() < end, "group {}: no commit", log.id());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until group `h`'s state machine holds `data` under `key`.
fn applied(h: &OooHandle, key: u64, data: &[u8]) {
    let kv = h.state::<Kv>().expect("the state machine's own type");
    let end = Instant::now() + Duration::from_secs(20);
    while kv.get(key).as_deref() != Some(data) {
        assert!(
            Instant::now() < end,
            "group {}: key {key} not applied",
            h.id()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn modes(env: &Env) -> Vec<(u64, Option<GroupMode>, bool)> {
    env.list_groups()
        .into_iter()
        .map(|g| (g.id, g.mode, g.not_started.is_some()))
        .collect()
}

#[test]
fn groups_of_every_mode_live_in_one_env_and_are_reopened_with_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(config(dir.path())).unwrap();
    let log = env.create_group(1, &[1], &[]).unwrap();
    let par = env
        .create_ooo_group(OooGroupSpec {
            conflict_order: true,
            ..spec(2, PAR)
        })
        .unwrap();
    let dep = env.create_ooo_group(spec(3, Mode::Dependent)).unwrap();
    let lsn = ordered_put(&log, b"ordered");
    ooo_put(&par, 7, b"parallel");
    ooo_put(&dep, 8, b"dependent");
    let want = vec![
        (1, Some(GroupMode::Ordered), false),
        (2, Some(GroupMode::OutOfOrder(PAR)), false),
        (3, Some(GroupMode::OutOfOrder(Mode::Dependent)), false),
    ];
    assert_eq!(modes(&env), want);
    // One layout for every mode; an out-of-order group's directory has its spec.
    for id in [2, 3] {
        assert!(group_dir(dir.path(), id).join(SPEC_FILE).exists());
    }
    assert!(!group_dir(dir.path(), 1).join(SPEC_FILE).exists());
    assert!(env.hosted(1).unwrap().ordered().is_some());
    assert!(env.hosted(2).unwrap().out_of_order().is_some());
    assert!(matches!(env.hosted(4), Err(Error::NoSuchGroup(4))));
    assert!(matches!(env.ooo_group(1), Err(Error::NoSuchGroup(1))));
    drop((log, par, dep));
    env.shutdown();
    drop(env);

    let env = Env::open(config(dir.path())).unwrap();
    assert_eq!(modes(&env), want);
    let par = env.ooo_group(2).unwrap();
    assert!(par.spec().conflict_order);
    applied(&par, 7, b"parallel");
    applied(&env.ooo_group(3).unwrap(), 8, b"dependent");
    // The ordered group's commit point comes back once its voter leads again.
    let log = env.group(1).unwrap();
    log.wait_committed_past(lsn, Duration::from_secs(20));
    assert_eq!(log.read(lsn).unwrap().data, b"ordered");
    // They commit again.
    ooo_put(&par, 9, b"again");
    env.shutdown();
}

#[test]
fn an_identical_create_is_accepted_and_a_different_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(config(dir.path())).unwrap();
    env.create_group(1, &[1], &[]).unwrap();
    let a = env.create_ooo_group(spec(5, Mode::Dependent)).unwrap();
    let b = env.create_ooo_group(spec(5, Mode::Dependent)).unwrap();
    assert!(Arc::ptr_eq(a.node(), b.node()), "the same group");
    assert!(matches!(
        env.create_ooo_group(spec(5, PAR)),
        Err(Error::GroupExists(5))
    ));
    // An id a group of another mode has, either way round.
    assert!(matches!(
        env.create_ooo_group(spec(1, PAR)),
        Err(Error::GroupExists(1))
    ));
    assert!(matches!(
        env.create_group(5, &[1], &[]),
        Err(Error::GroupExists(5))
    ));
    // A spec that breaks its invariants, or does not name this node, is refused by name
    // and leaves nothing behind.
    let e = env
        .create_ooo_group(OooGroupSpec {
            voters: vec![],
            ..spec(6, PAR)
        })
        .unwrap_err();
    assert!(matches!(e, Error::Spec { group: 6, .. }), "{e}");
    let e = env
        .create_ooo_group(OooGroupSpec {
            voters: vec![2],
            ..spec(6, PAR)
        })
        .unwrap_err();
    assert!(e.to_string().contains("this node (1)"), "{e}");
    assert!(!group_dir(dir.path(), 6).exists());
    env.shutdown();
}

#[test]
fn a_group_is_deleted_and_created_again_empty() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(config(dir.path())).unwrap();
    let h = env.create_ooo_group(spec(4, Mode::Dependent)).unwrap();
    ooo_put(&h, 1, b"old");
    drop(h);
    env.remove_group(4).unwrap();
    assert!(!group_dir(dir.path(), 4).exists());
    assert!(matches!(env.ooo_group(4), Err(Error::NoSuchGroup(4))));
    assert!(env.list_groups().is_empty());
    // Again, in another mode: a new group, empty.
    let h = env.create_ooo_group(spec(4, PAR)).unwrap();
    ooo_put(&h, 2, b"new");
    let kv = h.state::<Kv>().unwrap();
    assert_eq!(kv.get(1), None);
    assert_eq!(env.list_groups()[0].mode, Some(GroupMode::OutOfOrder(PAR)));
    env.shutdown();
}

/// A group whose storage failed (a sync fails: the simulated file system's injected
/// EIO) stops; a restart of a running group is refused; a restart starts it from its
/// files, with its data, and it commits again.
#[test]
fn a_stopped_group_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(chorus_storage::fs::SimFs::new(7));
    let mut cfg = config(dir.path());
    cfg.fs = sim.clone();
    let env = Env::open(cfg).unwrap();
    let h = env.create_ooo_group(spec(3, Mode::Dependent)).unwrap();
    ooo_put(&h, 1, b"before");
    assert!(matches!(env.restart_group(3), Err(Error::GroupRunning(3))));
    sim.fail_next_sync(None);
    let end = Instant::now() + Duration::from_secs(30);
    let mut k = 100;
    while h.node().stopped_reason().is_none() {
        let _ = h.node().append(declared(Mode::Dependent, k), b"x".to_vec());
        k += 1;
        assert!(Instant::now() < end, "the group never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(h);
    let h = env.restart_group(3).unwrap().out_of_order().unwrap();
    assert!(h.node().stopped_reason().is_none());
    applied(&h, 1, b"before");
    ooo_put(&h, 2, b"after");
    assert!(env
        .render_metrics()
        .contains("chorus_group_restarts_total{node=\"1\"} 1"));
    env.shutdown();
}

/// A damaged spec file: the group does not start, by name (the file and what is wrong),
/// in its lookups, the listing and the metrics; the node serves its other groups; the
/// group is deleted as found and created again.
#[test]
fn a_damaged_spec_stops_only_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(config(dir.path())).unwrap();
    env.create_ooo_group(spec(2, PAR)).unwrap();
    env.create_ooo_group(spec(3, Mode::Dependent)).unwrap();
    env.shutdown();
    drop(env);
    let path = group_dir(dir.path(), 2).join(SPEC_FILE);
    let mut b = std::fs::read(&path).unwrap();
    // Both copies (one damaged copy is repaired from the other).
    let half = b.len() / 2;
    b[10] ^= 0x01;
    b[half + 10] ^= 0x01;
    std::fs::write(&path, &b).unwrap();

    // Without state machines, a data directory with out-of-order groups is refused.
    let mut bare = config(dir.path());
    bare.state_machines = None;
    assert!(matches!(Env::open(bare), Err(Error::NoStateMachines(2))));

    let env = Env::open(config(dir.path())).unwrap();
    let e = env.ooo_group(2).unwrap_err();
    match &e {
        Error::GroupDamaged { group: 2, reason } => {
            assert!(reason.contains(&path.display().to_string()), "{reason}");
            assert!(reason.contains("crc32c"), "{reason}");
        }
        e => panic!("{e}"),
    }
    assert!(matches!(
        env.hosted(2),
        Err(Error::GroupDamaged { group: 2, .. })
    ));
    let n = env.not_started(2).unwrap();
    assert_eq!((n.mode, n.mode_label()), (None, "out-of-order"));
    assert_eq!(
        modes(&env),
        vec![
            (2, None, true),
            (3, Some(GroupMode::OutOfOrder(Mode::Dependent)), false)
        ]
    );
    assert!(env
        .render_metrics()
        .contains("chorus_group_not_started{node=\"1\",group=\"2\",mode=\"out-of-order\"} 1"));
    // A restart reads it again: still damaged, still not started.
    assert!(matches!(
        env.restart_group(2),
        Err(Error::Spec { group: 2, .. })
    ));
    assert!(env.not_started(2).is_some());
    // The others are served.
    ooo_put(&env.ooo_group(3).unwrap(), 1, b"served");
    // Deleted as found, then created again.
    assert!(matches!(
        env.create_ooo_group(spec(2, PAR)),
        Err(Error::GroupDamaged { group: 2, .. })
    ));
    env.remove_group(2).unwrap();
    assert!(!path.exists());
    let h = env.create_ooo_group(spec(2, PAR)).unwrap();
    ooo_put(&h, 4, b"new");
    env.shutdown();
}

/// An out-of-order group a full disk stopped is left alone while the disk is low, and
/// restarted by the environment's timer once there is room, as an ordered group is: it
/// recovers its store, holds what was committed, and commits again.
#[test]
fn a_group_a_full_disk_stopped_is_restarted_once_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let disk = chorus_storage::fs::Fillable::new(Arc::new(chorus_storage::fs::RealFs));
    let mut c = config(dir.path());
    c.fs = Arc::new(disk.clone());
    c.min_free_bytes = 0;
    let env = Env::open(c).unwrap();
    let h = env.create_ooo_group(spec(5, Mode::Dependent)).unwrap();
    ooo_put(&h, 1, b"one");
    disk.set_full(true);
    let end = Instant::now() + Duration::from_secs(20);
    let mut k = 100;
    while !h.node().stopped_by_full_disk() {
        let _ = h.node().append(declared(Mode::Dependent, k), b"x".to_vec());
        k += 1;
        assert!(Instant::now() < end, "the group never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Low: left alone. A restart the timer decided before the guard saw the disk low
    // waits up to a second for the handle held here: held past that wait, with the disk
    // still full, that try is refused, and no later one starts while the guard is low.
    let guard = env.disk_space();
    guard.set_min_free(u64::MAX - 1);
    guard.refresh().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    disk.set_full(false);
    drop(h);
    std::thread::sleep(Duration::from_millis(300));
    assert!(env.ooo_group(5).unwrap().node().stopped_by_full_disk());
    guard.set_min_free(0);
    let end = Instant::now() + Duration::from_secs(30);
    let h = loop {
        // Between its stop and its start, requests are not taken: ask again (or elsewhere).
        match env.ooo_group(5) {
            Ok(h) if h.node().stopped_reason().is_none() => break h,
            Ok(_) | Err(Error::NotRunning { group: 5, .. }) => {}
            Err(e) => panic!("while it restarts: {e}"),
        }
        assert!(Instant::now() < end, "not restarted");
        std::thread::sleep(Duration::from_millis(20));
    };
    applied(&h, 1, b"one");
    ooo_put(&h, 2, b"two");
    assert!(!env
        .render_metrics()
        .contains("chorus_group_restarts_total{node=\"1\"} 0"));
    env.shutdown();
}

/// A delete waits for the requests holding the group (here a handle kept) and, still
/// held after `RELEASE_WAIT`, refuses with `GroupBusy`, the group still running and its
/// files in place; let go, it is deleted.
#[test]
fn a_group_still_held_is_not_deleted_under_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::open(config(dir.path())).unwrap();
    let held = env.create_ooo_group(spec(6, Mode::Dependent)).unwrap();
    ooo_put(&held, 1, b"kept");
    let t = Instant::now();
    assert!(matches!(env.remove_group(6), Err(Error::GroupBusy(6))));
    assert!(t.elapsed() >= chorus_runtime::env::RELEASE_WAIT);
    assert!(group_dir(dir.path(), 6).join(SPEC_FILE).exists());
    ooo_put(&env.ooo_group(6).unwrap(), 2, b"still served");
    drop(held);
    env.remove_group(6).unwrap();
    assert!(!group_dir(dir.path(), 6).exists());
    env.shutdown();
}

/// A key-value state machine whose checkpoint is durable: its map, written to `kv` in
/// the group's directory (write, fsync, rename) and read back when the group opens.
struct DurableKv {
    file: std::path::PathBuf,
    map: Mutex<BTreeMap<u64, Vec<u8>>>,
    checkpoints: std::sync::atomic::AtomicU64,
}

impl DurableKv {
    fn open(dir: &Path) -> std::io::Result<Self> {
        let file = dir.join("kv");
        let mut map = BTreeMap::new();
        if let Ok(bytes) = std::fs::read(&file) {
            let mut rest = &bytes[..];
            while rest.len() >= 12 {
                let k = u64::from_le_bytes(rest[..8].try_into().unwrap());
                let n = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
                map.insert(k, rest[12..12 + n].to_vec());
                rest = &rest[12 + n..];
            }
        }
        Ok(Self {
            file,
            map: Mutex::new(map),
            checkpoints: Default::default(),
        })
    }
}

impl OooStateMachine for DurableKv {
    fn apply(&self, slot: u64, records: &[(u32, Record)]) -> std::io::Result<()> {
        Kv::apply_to(&mut self.map.lock().unwrap(), slot, records);
        Ok(())
    }
    fn checkpoint(&self) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut out = Vec::new();
        for (k, v) in self.map.lock().unwrap().iter() {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
        let tmp = self.file.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.file)?;
        std::fs::File::open(self.file.parent().unwrap())?.sync_all()?;
        self.checkpoints
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn image(&self) -> std::io::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    fn restore(&self, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct DurableMachines;

impl StateMachines for DurableMachines {
    fn open(&self, _spec: &OooGroupSpec, dir: &Path) -> std::io::Result<Arc<dyn OooStateMachine>> {
        Ok(Arc::new(DurableKv::open(dir)?))
    }
}

/// The operator's trim of an out-of-order group (`OooNode::compact`, the Trim RPC):
/// the state machine checkpoints, the entries below the slot asked (capped at the applied
/// head) are compacted, and a restart rebuilds the state from the checkpoint and the
/// entries kept.
#[test]
fn an_out_of_order_group_compacts_on_request_and_restarts_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || {
        let mut c = config(dir.path());
        c.state_machines = Some(Arc::new(DurableMachines));
        c
    };
    let env = Env::open(cfg()).unwrap();
    let h = env.create_ooo_group(spec(5, PAR)).unwrap();
    for k in 0..20 {
        ooo_put(&h, k, format!("v{k}").as_bytes());
    }
    let kv = h
        .state::<DurableKv>()
        .expect("the state machine's own type");
    let end = Instant::now() + Duration::from_secs(20);
    while kv.map.lock().unwrap().len() < 20 {
        assert!(Instant::now() < end, "not applied");
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = h.node().status().unwrap();
    assert_eq!(before.base, 0);
    // Below slot 5 first, then everything applied.
    assert_eq!(h.node().compact(5), Some(5));
    let applied = h.node().status().unwrap().applied_head;
    assert!(applied >= 20, "applied head {applied}");
    assert_eq!(h.node().compact(u64::MAX), Some(applied));
    assert_eq!(h.node().status().unwrap().base, applied);
    // Nothing more to compact: answered at once, no checkpoint.
    let checkpoints = kv.checkpoints.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(h.node().compact(3), Some(applied));
    assert_eq!(
        kv.checkpoints.load(std::sync::atomic::Ordering::Relaxed),
        checkpoints
    );
    ooo_put(&h, 20, b"after");
    drop((kv, h));
    env.shutdown();
    drop(env);

    let env = Env::open(cfg()).unwrap();
    let h = env.ooo_group(5).unwrap();
    assert_eq!(h.node().status().unwrap().base, applied);
    let kv = h.state::<DurableKv>().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while kv.map.lock().unwrap().get(&20).map(Vec::as_slice) != Some(&b"after"[..]) {
        assert!(
            Instant::now() < end,
            "the entry above the base not replayed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for k in 0..20 {
        assert_eq!(
            kv.map.lock().unwrap().get(&k).cloned(),
            Some(format!("v{k}").into_bytes()),
            "key {k} lost with the compacted entries"
        );
    }
    env.shutdown();
}
