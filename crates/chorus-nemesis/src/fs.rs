//! The file system through its library (PolarFS section 6, libpfs): the `fs` workload.
//! The cluster is the volume workload's (every node a chunk server and a control node);
//! the run creates a volume of [`CHUNKS`] chunks of [`CHUNK_BYTES`], makes a file system
//! on it, and mounts it as the library does in a database's process:
//! - one writing host (host 1, [`Access::ReadWrite`]) with [`FILES`] files of
//!   [`FILE_BLOCKS`] 4 KiB blocks, sized and allocated before the faults begin. Writers
//!   write one block of them at a time in place, with the bytes
//!   [`crate::blocks::encode`] gives, as the parallel workload does to a group;
//! - a metadata writer on the same host creates small files (`m<n>`: a value's block,
//!   then `fsync`, which commits the creation and the size by a Disk Paxos instance on
//!   the volume) and unlinks older ones;
//! - readers, each a reading host of its own ([`Access::ReadOnly`], hosts 2 and up),
//!   replay the journal and read blocks of the files.
//!
//! Any failed call of the writing host drops its mount, and the next call mounts again
//! (taking the journal again), as a database restarts its file system after an I/O
//! error. The outcome of a failed call is unknown: its bytes may be on the volume.
//!
//! After the faults heal, a barrier write must succeed, a fresh reading host reads every
//! block (the last read of each) and every file. The checkers:
//! - the data blocks' history, as the parallel workload's ([`crate::blocks::check`]):
//!   every block's reads and writes linearizable as a register (porcupine), no read of a
//!   write reported failed or of bytes nobody wrote;
//! - the metadata ([`check_files`]): every file whose creation was acknowledged (its
//!   `fsync` returned) and not later unlinked exists with its value's bytes; every file
//!   whose unlink was acknowledged is gone; a file whose last operation's outcome is
//!   unknown may be either; and `fsck` finds no problem;
//! - every replica of every chunk of the volume holds the same bytes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::VolumeClient;
use chorus_fs::pfs::{Access, OpenFlags, Pfs};
use chorus_fs::Device;

use crate::blocks::{decode, decode_all, encode, BLOCKS};
use crate::history::{History, Op, Placement};
use crate::ordered::client;
use crate::Rng;

/// The volume's name.
pub const VOLUME: &str = "nemesis-fs";
/// Bytes per chunk.
pub const CHUNK_BYTES: u64 = 4 << 20;
/// Chunks in the volume.
pub const CHUNKS: u64 = 2;
/// The file system's data block: 16 KiB.
const FS_BLOCK: u64 = 16 << 10;
/// Bytes per workload block (the checker's register).
const BLOCK: u64 = 4096;
/// Files the data writers write.
pub const FILES: u64 = 6;
/// Workload blocks per file.
pub const FILE_BLOCKS: u64 = BLOCKS / FILES;
/// The block the final barrier writes: the first of a file of its own.
const BARRIER_BLOCK: u64 = BLOCKS;
/// The process the barrier, the final reads and the metadata writer's operations are
/// recorded under.
const FINAL: u64 = u64::MAX;
/// Small files the metadata writer keeps at most (it unlinks the oldest past this).
const KEEP: u64 = 12;

/// The volume as the file system's device, through the routing client; called from
/// blocking threads (it blocks on the runtime's handle).
struct VolumeDevice {
    volume: Arc<VolumeClient>,
    rt: tokio::runtime::Handle,
    size: u64,
}

impl Device for VolumeDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.rt
            .block_on(self.volume.read(offset, len as u64))
            .map_err(std::io::Error::other)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.rt
            .block_on(self.volume.write(offset, data))
            .map_err(std::io::Error::other)
    }
}

/// The path of data file `f` (the barrier's is file [`FILES`]).
fn data_file(f: u64) -> String {
    format!("/d{f}")
}

/// Opens the volume as a device, retrying for up to 30 s (a control node may be down).
async fn device(control: &[String]) -> Option<Arc<dyn Device>> {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if let Ok(mut v) = VolumeClient::open(control.to_vec(), VOLUME).await {
            v.retry_for = Duration::from_secs(5);
            v.call_timeout = Duration::from_secs(3);
            let size = v.map().size_bytes;
            return Some(Arc::new(VolumeDevice {
                volume: Arc::new(v),
                rt: tokio::runtime::Handle::current(),
                size,
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Creates the volume, makes the file system and its data files (sized, every block
/// allocated and zero), within `wait`.
pub async fn create(control: &[String], wait: Duration) -> Result<(), String> {
    crate::volume::create_volume(control, VOLUME, CHUNKS * CHUNK_BYTES, CHUNK_BYTES, wait).await?;
    let dev = device(control)
        .await
        .ok_or("the volume could not be opened")?;
    tokio::task::spawn_blocking(move || {
        let g = chorus_fs::Geometry {
            volume_bytes: CHUNKS * CHUNK_BYTES,
            chunk_bytes: CHUNK_BYTES,
            block_bytes: FS_BLOCK,
            inodes_per_chunk: 64,
            dirents_per_chunk: 64,
            max_hosts: 16,
            journal_bytes: 512 << 10,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        chorus_fs::mkfs::mkfs(dev.as_ref(), g, 0x6e65_6d65_7369_7331, now)
            .map_err(|e| format!("mkfs: {e}"))?;
        let mut p =
            Pfs::mount(dev, 1, Access::ReadWrite).map_err(|e| format!("mount to set up: {e}"))?;
        for f in 0..=FILES {
            let fd = p
                .open(&data_file(f), rw(true), 0o644)
                .map_err(|e| format!("create {}: {e}", data_file(f)))?;
            p.fallocate(fd, 0, FILE_BLOCKS * BLOCK)
                .and_then(|_| p.fsync(fd))
                .and_then(|_| p.close(fd))
                .map_err(|e| format!("size {}: {e}", data_file(f)))?;
        }
        p.umount().map_err(|e| format!("unmount after set-up: {e}"))
    })
    .await
    .map_err(|e| format!("set-up task: {e}"))?
}

fn rw(create: bool) -> OpenFlags {
    OpenFlags {
        read: true,
        write: true,
        create,
        ..OpenFlags::default()
    }
}

/// The writing host, shared by the data writers and the metadata writer: its mount
/// (none after a failed call, until the next call mounts again) and the data files'
/// descriptors in it.
struct Host {
    dev: Arc<dyn Device>,
    mounted: Option<(Pfs, Vec<u64>)>,
}

impl Host {
    /// Runs `f` on the mount, mounting first if need be; a failure drops the mount.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut Pfs, &[u64]) -> Result<T, String>,
    ) -> Result<T, String> {
        if self.mounted.is_none() {
            let mut p = Pfs::mount(self.dev.clone(), 1, Access::ReadWrite)
                .map_err(|e| format!("mount: {e}"))?;
            let mut fds = Vec::new();
            for f in 0..=FILES {
                fds.push(
                    p.open(&data_file(f), rw(false), 0)
                        .map_err(|e| format!("open {}: {e}", data_file(f)))?,
                );
            }
            self.mounted = Some((p, fds));
        }
        let (p, fds) = self.mounted.as_mut().expect("mounted above");
        let r = f(p, fds);
        if r.is_err() {
            // Dropped without unmounting, as at a crash: the next mount replays.
            self.mounted = None;
        }
        r
    }
}

/// The writing host of a run, opened once the file system exists.
#[derive(Clone)]
pub struct Writer(Arc<Mutex<Host>>);

impl Writer {
    /// The writing host on the volume (not yet mounted), or `None` if the volume could
    /// not be opened.
    pub async fn open(control: &[String]) -> Option<Writer> {
        let dev = device(control).await?;
        Some(Writer(Arc::new(Mutex::new(Host { dev, mounted: None }))))
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Pfs, &[u64]) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let host = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut h = host.lock().unwrap_or_else(|p| p.into_inner());
            h.with(f)
        })
        .await
        .unwrap_or_else(|e| Err(format!("task: {e}")))
    }

    /// Writes `value` into workload block `b` (file `b / FILE_BLOCKS`).
    async fn write_block(&self, b: u64, value: u64) -> Placement {
        let data = encode(value, b);
        let r = self
            .run(move |p, fds| {
                let n = p
                    .pwrite(
                        fds[(b / FILE_BLOCKS) as usize],
                        &data,
                        (b % FILE_BLOCKS) * BLOCK,
                    )
                    .map_err(|e| e.to_string())?;
                if n != data.len() {
                    return Err(format!("wrote {n} of {} bytes", data.len()));
                }
                Ok(())
            })
            .await;
        match r {
            Ok(()) => Placement::Committed { seq: 0, index: 0 },
            Err(why) => Placement::Unknown { why },
        }
    }
}

/// One data writer: writes one block at a time until `stop`. `process` seeds its
/// choices; its values are `(process % 1000) << 40 | n`.
pub async fn writer(process: u64, w: Writer, hist: History, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(process);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let value = ((process % 1000) << 40) | n;
        let b = rng.range(0, BLOCKS);
        let t0 = hist.now_us();
        let outcome = w.write_block(b, value).await;
        let settled = matches!(outcome, Placement::Committed { .. });
        hist.record(
            process,
            t0,
            Op::Write {
                start: b,
                count: 1,
                value,
                outcome,
            },
        );
        if !settled {
            tokio::time::sleep(Duration::from_millis(rng.range(10, 50))).await;
        }
    }
}

/// The metadata writer: creates `m<n>` holding value `n`'s block (`fsync` commits it),
/// and unlinks `m<n - KEEP>`, until `stop`.
pub async fn meta_writer(w: Writer, hist: History, stop: Arc<AtomicBool>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let value = (998 << 40) | n;
        let name = format!("/m{n}");
        let t0 = hist.now_us();
        let path = name.clone();
        let r = w
            .run(move |p, _| {
                let fd = p
                    .open(
                        &path,
                        OpenFlags {
                            exclusive: true,
                            ..rw(true)
                        },
                        0o644,
                    )
                    .map_err(|e| format!("create: {e}"))?;
                p.pwrite(fd, &encode(value, 0), 0)
                    .and_then(|_| p.fsync(fd))
                    .and_then(|_| p.close(fd))
                    .map_err(|e| format!("write and fsync: {e}"))
            })
            .await;
        let ok = r.is_ok();
        hist.record(FINAL, t0, file_op(name, value, r));
        if n > KEEP {
            let name = format!("/m{}", n - KEEP);
            let path = name.clone();
            let t0 = hist.now_us();
            let r = w
                .run(move |p, _| {
                    p.unlink(&path).map_err(|e| format!("unlink: {e}"))?;
                    // The unlink is acknowledged once committed: a sync commits it.
                    p.sync().map_err(|e| format!("sync: {e}"))
                })
                .await;
            hist.record(FINAL, t0, file_op(name, 0, r));
        }
        tokio::time::sleep(Duration::from_millis(if ok { 50 } else { 200 })).await;
    }
}

fn file_op(name: String, value: u64, r: Result<(), String>) -> Op {
    Op::FileOp {
        name,
        value,
        outcome: match r {
            Ok(()) => Placement::Committed { seq: 0, index: 0 },
            Err(why) => Placement::Unknown { why },
        },
    }
}

/// One reader: a reading host of its own (host `host`), reading one to four blocks of
/// one file at a time until `stop`; the journal is replayed before each read. Only reads
/// that returned are recorded.
pub async fn reader(
    process: u64,
    host: u32,
    control: Vec<String>,
    hist: History,
    stop: Arc<AtomicBool>,
) {
    let Some(dev) = device(&control).await else {
        return;
    };
    let mut rng = Rng::new(process);
    let mut mount: Option<Pfs> = None;
    while !stop.load(Ordering::Relaxed) {
        let start = rng.range(0, BLOCKS);
        let count = rng.range(1, 5).min(FILE_BLOCKS - start % FILE_BLOCKS);
        let t0 = hist.now_us();
        let (dev2, m) = (dev.clone(), mount.take());
        let r = tokio::task::spawn_blocking(move || {
            let mut p = match m {
                Some(p) => p,
                None => Pfs::mount(dev2, host, Access::ReadOnly).map_err(|e| e.to_string())?,
            };
            let r = read_blocks(&mut p, start, count);
            r.map(|d| (d, p))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        match r {
            Ok((data, p)) => {
                mount = Some(p);
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

/// Replays the journal, then reads `count` workload blocks from `start` (within one
/// file).
fn read_blocks(p: &mut Pfs, start: u64, count: u64) -> Result<Vec<u8>, String> {
    p.refresh().map_err(|e| format!("refresh: {e}"))?;
    let path = data_file(start / FILE_BLOCKS);
    let fd = p
        .open(
            &path,
            OpenFlags {
                read: true,
                ..OpenFlags::default()
            },
            0,
        )
        .map_err(|e| format!("open {path}: {e}"))?;
    let mut buf = vec![0u8; (count * BLOCK) as usize];
    let r = p.pread(fd, &mut buf, (start % FILE_BLOCKS) * BLOCK);
    let _ = p.close(fd);
    let n = r.map_err(|e| format!("read {path}: {e}"))?;
    if n != buf.len() {
        return Err(format!("read {n} of {} bytes of {path}", buf.len()));
    }
    Ok(buf)
}

/// After every fault healed: a barrier write that must succeed, then a fresh reading
/// host reads every block into the history and checks the files and `fsck`; then every
/// replica of every chunk must hold the same bytes. Returns the run's own findings.
pub async fn settle(
    control: &[String],
    w: &Writer,
    hist: &History,
    deadline: Duration,
) -> Vec<String> {
    let mut found = Vec::new();
    let end = Instant::now() + deadline;
    let (mut n, mut last) = (0, String::new());
    let committed = loop {
        n += 1;
        let t0 = hist.now_us();
        let value = (999 << 40) | n;
        let outcome = w.write_block(BARRIER_BLOCK, value).await;
        let ok = matches!(outcome, Placement::Committed { .. });
        if let Placement::Unknown { why } | Placement::Failed { why } = &outcome {
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
            "no write succeeded within {deadline:?} after every fault healed (last: {last})"
        ));
    }
    // The writing host's metadata committed: unmount it cleanly.
    {
        let host = w.0.clone();
        let r = tokio::task::spawn_blocking(move || {
            let mut h = host.lock().unwrap_or_else(|p| p.into_inner());
            match h.mounted.take() {
                Some((p, _)) => p.umount().map_err(|e| e.to_string()),
                None => Ok(()),
            }
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        if let Err(e) = r {
            found.push(format!(
                "the writing host did not unmount after the heal: {e}"
            ));
        }
    }
    let Some(dev) = device(control).await else {
        found.push("the volume could not be opened after every fault healed".into());
        return found;
    };
    let files = hist.entries();
    let t0 = hist.now_us();
    let seen = tokio::task::spawn_blocking(move || final_view(dev, &files))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    match seen {
        Err(e) => found.push(format!("the final read failed: {e}")),
        Ok((data, mut problems)) => {
            let (values, bad) = decode_all(&data, 0);
            hist.record(
                FINAL,
                t0,
                Op::BlockRead {
                    node: 0,
                    start: 0,
                    values,
                    bad,
                },
            );
            found.append(&mut problems);
        }
    }
    found.append(&mut same_replicas(control).await);
    found
}

/// A fresh reading host's view: every workload block, and the problems with the files
/// the metadata writer made ([`check_files`]) and `fsck`'s.
fn final_view(
    dev: Arc<dyn Device>,
    history: &[crate::history::Entry],
) -> Result<(Vec<u8>, Vec<String>), String> {
    let mut p = Pfs::mount(dev, 16, Access::ReadOnly).map_err(|e| format!("mount: {e}"))?;
    let mut data = Vec::new();
    for f in 0..FILES {
        data.extend(read_blocks(&mut p, f * FILE_BLOCKS, FILE_BLOCKS)?);
    }
    let mut problems: Vec<String> = p
        .fsck()
        .problems
        .into_iter()
        .map(|x| format!("fsck: {x}"))
        .collect();
    problems.extend(check_files(history, |name| {
        let fd = match p.open(
            name,
            OpenFlags {
                read: true,
                ..OpenFlags::default()
            },
            0,
        ) {
            Ok(fd) => fd,
            Err(e) if e.errno() == libc::ENOENT => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let size = p.fstat(fd).map_err(|e| e.to_string())?.size;
        let mut buf = vec![0u8; size as usize];
        let r = p.pread(fd, &mut buf, 0);
        let _ = p.close(fd);
        r.map_err(|e| e.to_string())?;
        Ok(Some(buf))
    }));
    Ok((data, problems))
}

/// The metadata checker: for every file the history's [`Op::FileOp`]s name, what its
/// final state must be, against `read` (its bytes, `None` if missing). A file's last
/// acknowledged operation decides, unless an operation of unknown outcome follows it
/// (then either the acknowledged state or what the unknown one would make is allowed).
pub fn check_files(
    history: &[crate::history::Entry],
    mut read: impl FnMut(&str) -> Result<Option<Vec<u8>>, String>,
) -> Vec<String> {
    // Per file: every state allowed at the end (Some(value): holds that value's block;
    // None: missing), starting from missing.
    let mut allowed: BTreeMap<&str, Vec<Option<u64>>> = BTreeMap::new();
    for e in history {
        let Op::FileOp {
            name,
            value,
            outcome,
        } = &e.op
        else {
            continue;
        };
        let after = (*value != 0).then_some(*value);
        let states = allowed.entry(name.as_str()).or_insert_with(|| vec![None]);
        match outcome {
            Placement::Committed { .. } => *states = vec![after],
            Placement::Unknown { .. } => states.push(after),
            Placement::Failed { .. } => {}
        }
    }
    let mut bad = Vec::new();
    for (name, states) in allowed {
        let got = match read(name) {
            Err(e) => {
                bad.push(format!("{name}: could not be read after the heal: {e}"));
                continue;
            }
            Ok(None) => None,
            Ok(Some(bytes)) => match decode(&bytes, 0) {
                Ok(v) if v != 0 => Some(v),
                Ok(_) => {
                    bad.push(format!("{name}: exists with zeros where its value was"));
                    continue;
                }
                Err(e) => {
                    bad.push(format!("{name}: {e}"));
                    continue;
                }
            },
        };
        if !states.contains(&got) {
            let show = |s: &Option<u64>| s.map_or("missing".to_string(), |v| format!("{v:#x}"));
            bad.push(format!(
                "{name}: {} after the heal; its acknowledged history allows only {}",
                show(&got),
                states.iter().map(show).collect::<Vec<_>>().join(" or ")
            ));
        }
    }
    bad
}

/// Every replica of every chunk of the volume holds the same bytes, within 60 s.
async fn same_replicas(control: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(v) = VolumeClient::open(control.to_vec(), VOLUME).await else {
        return vec!["the volume's map could not be read after the heal".into()];
    };
    let mut nodes = client(
        control.to_vec(),
        Duration::from_secs(5),
        Duration::from_secs(2),
    );
    let sectors = CHUNK_BYTES / BLOCK;
    for (k, chunk) in v.map().chunks.iter().enumerate() {
        let until = Instant::now() + Duration::from_secs(60);
        let why = loop {
            let mut first: Option<Vec<u8>> = None;
            let mut why = None;
            for i in 0..control.len() {
                match nodes.read_blocks_at(i, chunk.group, 0, sectors).await {
                    Ok(r) => match &first {
                        None => first = Some(r.data),
                        Some(f) if *f == r.data => {}
                        Some(f) => {
                            let at = f.iter().zip(&r.data).position(|(a, b)| a != b);
                            why = Some(format!(
                                "node {}'s replica differs from node 1's (first at byte {at:?}; applied up to slot {})",
                                i + 1,
                                r.applied_seq
                            ));
                        }
                    },
                    Err(e) => why = Some(format!("node {}: reading its blocks failed: {e}", i + 1)),
                }
            }
            if why.is_none() || Instant::now() >= until {
                break why;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if let Some(why) = why {
            found.push(format!(
                "chunk {k} (group {}) does not match 60 s after the heal: {why} [{}]",
                chunk.group,
                crate::blocks::group_states(control, chunk.group).await
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Entry;

    fn op(name: &str, value: u64, ok: Option<bool>) -> Entry {
        Entry {
            process: FINAL,
            invoke_us: 0,
            complete_us: 0,
            op: Op::FileOp {
                name: name.into(),
                value,
                outcome: match ok {
                    Some(true) => Placement::Committed { seq: 0, index: 0 },
                    Some(false) => Placement::Failed { why: "no".into() },
                    None => Placement::Unknown { why: "?".into() },
                },
            },
        }
    }

    /// Acknowledged creations and unlinks are judged; unknown ones allow either state.
    #[test]
    fn lost_and_resurrected_files_are_caught() {
        let h = vec![
            op("/a", 7, Some(true)),
            op("/b", 8, Some(true)),
            op("/b", 0, Some(true)),
            op("/c", 9, None),
            op("/d", 10, Some(true)),
            op("/d", 0, None),
        ];
        let disk = |a: Option<u64>, b: Option<u64>, c: Option<u64>, d: Option<u64>| {
            move |name: &str| -> Result<Option<Vec<u8>>, String> {
                let v = match name {
                    "/a" => a,
                    "/b" => b,
                    "/c" => c,
                    _ => d,
                };
                Ok(v.map(|v| encode(v, 0)))
            }
        };
        assert!(check_files(&h, disk(Some(7), None, None, Some(10))).is_empty());
        assert!(check_files(&h, disk(Some(7), None, Some(9), None)).is_empty());
        // An acknowledged creation lost.
        assert_eq!(check_files(&h, disk(None, None, None, None)).len(), 1);
        // An acknowledged unlink undone.
        assert_eq!(check_files(&h, disk(Some(7), Some(8), None, None)).len(), 1);
        // The wrong bytes.
        assert_eq!(check_files(&h, disk(Some(8), None, None, None)).len(), 1);
    }
}
