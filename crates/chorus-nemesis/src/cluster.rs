//! The `chorus server` processes of a run, one per namespace of a [`Net`], driven by pid:
//! started, killed with SIGKILL, paused with SIGSTOP, resumed with SIGCONT. While a node
//! is down its files may be damaged ([`Cluster::flip_bytes`]).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::net::Net;
use crate::{Error, Rng};

/// Replication port of every node (each in its own namespace, so all can use it).
pub const REPL_PORT: u16 = 7000;
/// Client API port of every node.
pub const API_PORT: u16 = 7100;
/// Prometheus metrics port of every node.
pub const METRICS_PORT: u16 = 7200;

/// Where Debian's `faketime` package puts the library ([`NodeOptions::faketime`]).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// How the nodes of a run are set up: short replica timings, so that faults bite within
/// seconds, and what the disk and clock nemeses need.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// `replica.lease_ms`.
    pub lease_ms: u64,
    /// `replica.heartbeat_ms`.
    pub heartbeat_ms: u64,
    /// Environment variables every server starts with (e.g. `CHORUS_BROKEN` for a
    /// deliberately broken test build).
    pub env: Vec<(String, String)>,
    /// Each node's data directory on a tmpfs of this many MiB (0: on the run's file
    /// system): a disk the disk nemesis can fill.
    pub disk_mib: u64,
    /// Each node runs under libfaketime (Debian's `faketime`), its wall clock
    /// (CLOCK_REALTIME) offset by what the clock nemesis writes to its control file
    /// (`nN.faketime`, re-read every second or so). CLOCK_MONOTONIC is left alone.
    pub faketime: bool,
    /// `log.min_free_bytes` (None: the server's default, 128 MiB). 0 turns the guard off,
    /// so that a full disk fails writes with ENOSPC.
    pub min_free_bytes: Option<u64>,
    /// Each node's data directory is a power-loss file system ([`crate::lazyfs`]) over
    /// `nN.disk`: the power nemesis can drop what a node did not sync. Needs FUSE.
    pub power_loss: bool,
    /// `out_of_order.compact_bytes` (None: the server's default). The dependent
    /// workload's checker reads every committed entry back from slot 0, so its runs set
    /// 0 (never compact).
    pub ooo_compact_bytes: Option<u64>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            lease_ms: 1000,
            heartbeat_ms: 100,
            env: Vec::new(),
            disk_mib: 0,
            faketime: false,
            min_free_bytes: None,
            power_loss: false,
            ooo_compact_bytes: None,
        }
    }
}

/// The filler file the disk nemesis writes into a node's data directory.
const FILLER: &str = "nemesis-filler";

/// One node.
///
/// Invariants: `child` is `Some` exactly while a process started by this harness runs
/// (or is stopped) and has not been reaped; `paused` only while `child` is `Some`.
#[derive(Debug)]
pub struct Node {
    /// Node id (1-based).
    pub id: usize,
    /// Its data directory.
    pub dir: PathBuf,
    /// Where its files lie on the disk: `dir`, or the backing directory of the
    /// power-loss file system mounted at `dir` (faults at rest are made here, not
    /// through the mount).
    pub disk: PathBuf,
    cfg: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// The cluster of a run.
#[derive(Debug)]
pub struct Cluster {
    /// The network the nodes live in.
    pub net: Net,
    /// The nodes, `nodes[i - 1]` is node `i`.
    pub nodes: Vec<Node>,
    chorus: PathBuf,
    env: Vec<(String, String)>,
    /// Data directories this run mounted a tmpfs on (unmounted at drop).
    mounted: Vec<PathBuf>,
    /// Each node's power-loss file system, when [`NodeOptions::power_loss`]
    /// (`lazy[i - 1]` is node `i`'s).
    lazy: Vec<Option<crate::lazyfs::LazyFs>>,
}

impl Cluster {
    /// Writes each node's configuration under `root` (serving `groups`, a TOML fragment of
    /// `[[groups]]` tables) and starts every node.
    pub fn start(
        net: Net,
        chorus: &Path,
        root: &Path,
        groups: &str,
        t: &NodeOptions,
    ) -> Result<Cluster, Error> {
        if !chorus.is_file() {
            return Err(Error::Unavailable(format!(
                "no chorus binary at {} (build it: cargo build --release -p chorus-server)",
                chorus.display()
            )));
        }
        let n = net.nodes();
        let mut nodes = Vec::new();
        let mut env = t.env.clone();
        let mut mounted = Vec::new();
        if t.faketime && !Path::new(LIBFAKETIME).exists() {
            return Err(Error::Unavailable(format!(
                "{LIBFAKETIME} not found (Debian package faketime)"
            )));
        }
        let mut lazy = Vec::new();
        for i in 1..=n {
            let dir = root.join(format!("n{i}"));
            let disk = if t.power_loss {
                root.join(format!("n{i}.disk"))
            } else {
                dir.clone()
            };
            std::fs::create_dir_all(&disk).map_err(|e| Error::io(disk.display(), e))?;
            if t.disk_mib > 0 {
                crate::net::run_cmd(
                    std::process::Command::new("mount")
                        .args([
                            "-t",
                            "tmpfs",
                            "-o",
                            &format!("size={}m", t.disk_mib),
                            "tmpfs",
                        ])
                        .arg(&disk),
                )?;
                mounted.push(disk.clone());
            }
            lazy.push(if t.power_loss {
                Some(crate::lazyfs::LazyFs::mount(&disk, &dir)?)
            } else {
                None
            });
            if t.faketime {
                let f = root.join(format!("n{i}.faketime"));
                std::fs::write(&f, "+0\n").map_err(|e| Error::io(f.display(), e))?;
            }
            let mut peers = String::new();
            for j in (1..=n).filter(|j| *j != i) {
                peers.push_str(&format!("\"{j}\" = \"{}:{REPL_PORT}\"\n", net.ip(j)));
            }
            let cfg = root.join(format!("n{i}.toml"));
            // Blocks of 4 MiB, so a run of a minute seals several and the nemesis's flips
            // meet older blocks (the scrubber's work), not only the tail.
            const BLOCK_SIZE: u64 = 4 << 20;
            let text = format!(
                "node = {i}\ndata_dir = \"{}\"\nlisten = \"{ip}:{REPL_PORT}\"\napi_listen = \"{ip}:{API_PORT}\"\n\
                 metrics_listen = \"{ip}:{METRICS_PORT}\"\nio_workers = 2\nlog_filter = \"info\"\n\n[peers]\n{peers}\n{groups}\n\
                 [replica]\nlease_ms = {}\nheartbeat_ms = {}\nping_ms = {}\nresend_ms = {}\n\n\
                 [out_of_order]\nelection_timeout_ms = {}\n{}\n[log]\nblock_size = {BLOCK_SIZE}\n{}",
                dir.display(),
                t.lease_ms,
                t.heartbeat_ms,
                t.heartbeat_ms,
                2 * t.heartbeat_ms,
                t.lease_ms,
                t.ooo_compact_bytes
                    .map_or(String::new(), |b| format!("compact_bytes = {b}\n")),
                t.min_free_bytes
                    .map_or(String::new(), |b| format!("min_free_bytes = {b}\n")),
                ip = net.ip(i),
            );
            std::fs::write(&cfg, text).map_err(|e| Error::io(cfg.display(), e))?;
            nodes.push(Node {
                id: i,
                dir,
                disk,
                cfg,
                log: root.join(format!("n{i}.log")),
                child: None,
                paused: false,
            });
        }
        if t.faketime {
            env.push(("LD_PRELOAD".into(), LIBFAKETIME.into()));
            env.push(("FAKETIME_CACHE_DURATION".into(), "1".into()));
            // Wall-clock jumps only: with CLOCK_MONOTONIC faked too, libfaketime 0.9.10
            // stalls the servers' runtime (no node ever connected to another). The
            // monotonic clock leases use is jumped and skewed by the simulator instead.
            env.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
        }
        let mut c = Cluster {
            net,
            nodes,
            chorus: chorus.to_path_buf(),
            env,
            mounted,
            lazy,
        };
        for i in 1..=n {
            c.start_node(i)?;
        }
        Ok(c)
    }

    /// The client API endpoint of node `i`.
    pub fn api(&self, i: usize) -> String {
        format!("http://{}:{API_PORT}", self.net.ip(i))
    }

    /// The sum over the nodes that answer of every sample of the counter `name` in
    /// their Prometheus metrics (`GET /metrics`); nodes that do not answer within a
    /// second add nothing.
    pub async fn metric_sum(&self, name: &str) -> u64 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut sum = 0;
        for i in 1..=self.nodes.len() {
            let addr = format!("{}:{METRICS_PORT}", self.net.ip(i));
            let get = async {
                let mut s = tokio::net::TcpStream::connect(&addr).await?;
                s.write_all(b"GET /metrics HTTP/1.0\r\nHost: nemesis\r\n\r\n")
                    .await?;
                let mut body = String::new();
                s.read_to_string(&mut body).await?;
                Ok::<_, std::io::Error>(body)
            };
            let Ok(Ok(body)) = tokio::time::timeout(std::time::Duration::from_secs(1), get).await
            else {
                continue;
            };
            for line in body.lines() {
                let Some(rest) = line.strip_prefix(name) else {
                    continue;
                };
                if !(rest.starts_with('{') || rest.starts_with(' ')) {
                    continue;
                }
                if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                    sum += v as u64;
                }
            }
        }
        sum
    }

    /// Every node's client API endpoint.
    pub fn apis(&self) -> Vec<String> {
        (1..=self.nodes.len()).map(|i| self.api(i)).collect()
    }

    /// Whether node `i` has a process (running or paused).
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i - 1].child.is_some()
    }

    /// Whether node `i` is paused.
    pub fn is_paused(&self, i: usize) -> bool {
        self.nodes[i - 1].paused
    }

    /// Starts node `i` (no-op when it runs).
    pub fn start_node(&mut self, i: usize) -> Result<(), Error> {
        let faketime = self.faketime();
        let node = &mut self.nodes[i - 1];
        if node.child.is_some() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|e| Error::io(node.log.display(), e))?;
        let err = log.try_clone().map_err(|e| Error::io("log", e))?;
        let child = self
            .net
            .command(i, &self.chorus)
            .args(["server", "--config"])
            .arg(&node.cfg)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(faketime.then(|| {
                (
                    "FAKETIME_TIMESTAMP_FILE",
                    node.cfg.with_extension("faketime"),
                )
            }))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Command {
                cmd: format!("{} server", self.chorus.display()),
                detail: e.to_string(),
            })?;
        node.child = Some(child);
        node.paused = false;
        Ok(())
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = &self.nodes[i - 1].child {
            // SAFETY: kill on the pid of our own unreaped child: it cannot name another
            // process.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// SIGKILL to node `i`, and reap it.
    pub fn kill(&mut self, i: usize) {
        self.signal(i, libc::SIGKILL);
        let node = &mut self.nodes[i - 1];
        if let Some(mut c) = node.child.take() {
            let _ = c.wait();
        }
        node.paused = false;
    }

    /// Nodes `nodes` lose power at once: each one's unsynced writes dropped and its file
    /// system failing every call from that instant, then each sent SIGKILL and reaped. Returns the bytes dropped per
    /// node. Needs [`NodeOptions::power_loss`].
    pub fn lose_power(&mut self, nodes: &[usize]) -> Result<Vec<u64>, Error> {
        if nodes.iter().any(|&i| self.lazy[i - 1].is_none()) {
            return Err(Error::Unavailable(
                "power loss needs each node's data directory on the power-loss file system (NodeOptions::power_loss)".into(),
            ));
        }
        // The power goes first (nothing in flight reaches the disk after it), then the
        // processes.
        let lost: Vec<u64> = nodes
            .iter()
            .map(|&i| self.lazy[i - 1].as_ref().map_or(0, |l| l.cut_power()))
            .collect();
        for &i in nodes {
            self.signal(i, libc::SIGKILL);
        }
        for &i in nodes {
            self.kill(i);
            if let Some(l) = &self.lazy[i - 1] {
                l.restore_power();
            }
        }
        Ok(lost)
    }

    /// SIGSTOP to node `i`.
    pub fn pause(&mut self, i: usize) {
        if self.nodes[i - 1].child.is_some() {
            self.signal(i, libc::SIGSTOP);
            self.nodes[i - 1].paused = true;
        }
    }

    /// SIGCONT to node `i`.
    pub fn resume(&mut self, i: usize) {
        if self.nodes[i - 1].paused {
            self.signal(i, libc::SIGCONT);
            self.nodes[i - 1].paused = false;
        }
    }

    /// Whether node `i`'s process exited on its own (it should not): its exit status.
    pub fn exited(&mut self, i: usize) -> Option<String> {
        let c = self.nodes[i - 1].child.as_mut()?;
        match c.try_wait() {
            Ok(Some(st)) => Some(st.to_string()),
            _ => None,
        }
    }

    /// Flips one random bit in each of `count` random places of node `i`'s files (the
    /// node must be down). With `repairable`, only what a replica repairs by itself is
    /// damaged: an ordered log's meta and any block file (recovery checks the last block
    /// at open, the scrubber the older ones, and either is repaired from peers), and an
    /// out-of-order replica's spec, hard state, membership and entries; state machine
    /// files (a chunk's map and data, a key-value image) are spared, since damage there
    /// stops the group until the operator replaces the replica (docs/operations.md).
    /// Returns what was flipped, as `path@offset^mask`.
    pub fn flip_bytes(
        &self,
        i: usize,
        rng: &mut Rng,
        count: usize,
        repairable: bool,
    ) -> Vec<String> {
        assert!(!self.is_up(i), "flip bytes only at rest");
        let mut files = Vec::new();
        walk(&self.nodes[i - 1].disk, &mut files);
        files.retain(|(_, len)| *len > 0);
        if repairable {
            // Any block of an ordered log (the scrubber finds damage in the sealed ones
            // and repairs it from peers, recovery at open the tail's); not a chunk's data
            // or a state machine's files, which nothing repairs from peers yet, nor the
            // copy of a damaged file kept for the operator.
            files.retain(|(p, _)| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                !p.components().any(|c| c.as_os_str() == "chunk")
                    && !name.starts_with("kv.")
                    && !name.starts_with("entries.damaged")
            });
        }
        let mut done = Vec::new();
        for _ in 0..count {
            if files.is_empty() {
                break;
            }
            // One place per file: the files that keep two copies (meta, hard, members,
            // spec) survive one damaged copy, and two flips at once in one small file are
            // not what bit rot does.
            let (path, len) = files.swap_remove(rng.range(0, files.len() as u64) as usize);
            let off = rng.range(0, len);
            let mask = 1u8 << rng.range(0, 8);
            if flip(&path, off, mask).is_ok() {
                done.push(format!("{}@{off}^{mask:#04x}", path.display()));
            }
        }
        done
    }

    /// Fills node `i`'s disk until `leave` bytes are left (its data directory must be on
    /// a tmpfs, [`NodeOptions::disk_mib`]). Returns the bytes written.
    pub fn fill_disk(&self, i: usize, leave: u64) -> Result<u64, Error> {
        use std::os::fd::AsRawFd;
        let dir = &self.nodes[i - 1].disk;
        let free = free_bytes(dir)?;
        let len = free.saturating_sub(leave);
        let path = dir.join(FILLER);
        let f = std::fs::File::create(&path).map_err(|e| Error::io(path.display(), e))?;
        // The last pages of a tmpfs may go to its own bookkeeping: ask for a little less
        // each time the whole does not fit.
        let mut want = len;
        loop {
            // SAFETY: fallocate on a file descriptor we own, with no buffer.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, want as libc::off_t) };
            if r == 0 {
                return Ok(want);
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSPC) || want < 1 << 20 {
                return Err(Error::io(path.display(), e));
            }
            want -= (want / 1024).max(4096);
        }
    }

    /// Frees what [`Cluster::fill_disk`] took.
    pub fn free_disk(&self, i: usize) -> Result<(), Error> {
        let path = self.nodes[i - 1].disk.join(FILLER);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path.display(), e)),
            _ => Ok(()),
        }
    }

    /// Whether the nodes run under libfaketime ([`NodeOptions::faketime`]).
    pub fn faketime(&self) -> bool {
        self.env.iter().any(|(k, _)| k == "LD_PRELOAD")
    }

    /// Offsets node `i`'s clocks by `secs` from real time (in force within about two
    /// seconds, when libfaketime next reads the control file).
    pub fn set_clock(&self, i: usize, secs: f64) -> Result<(), Error> {
        let f = self.nodes[i - 1].cfg.with_extension("faketime");
        std::fs::write(&f, format!("{secs:+.6}\n")).map_err(|e| Error::io(f.display(), e))
    }

    /// The last `lines` lines of node `i`'s log (for a report).
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.nodes[i - 1].log).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.metadata() {
            Ok(m) if m.is_dir() => walk(&p, out),
            Ok(m) if m.is_file() => out.push((p, m.len())),
            _ => {}
        }
    }
}

fn flip(path: &Path, off: u64, mask: u8) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off)?;
    b[0] ^= mask;
    f.write_all_at(&b, off)?;
    f.sync_all()
}

/// Bytes an unprivileged process may still write on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, Error> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| Error::io(dir.display(), std::io::Error::other(e)))?;
    // SAFETY: statvfs fills the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Error::io(dir.display(), std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 1..=self.nodes.len() {
            self.resume(i);
            self.kill(i);
        }
        // The power-loss mounts before the tmpfs under them.
        self.lazy.clear();
        for d in &self.mounted {
            let _ = crate::net::run_cmd(std::process::Command::new("umount").arg("-l").arg(d));
        }
    }
}
