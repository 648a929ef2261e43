//! `chorus fs`: the file system of PolarFS section 6 (`chorus_fs`) on a volume, from the
//! command line, through the routing client. `mkfs` makes one; `stat`, `fsck`, `ls` and
//! `cat` mount it read-only; `mkdir`, `put` and `rm` mount it read-write as a host
//! (`--host-id`), taking the journal by Disk Paxos for the time of the command.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chorus_client::VolumeClient;
use chorus_fs::fuse::MountOptions;
use chorus_fs::layout::{Geometry, Superblock};
use chorus_fs::meta::FileKind;
use chorus_fs::pfs::{Access, OpenFlags, Pfs};
use chorus_fs::Device;
use clap::{Args, Subcommand};

use crate::metrics_http::{serve_text, Render};
use crate::volume_bench::Pattern;
use crate::volume_cli::{parse_bytes, Control};
use crate::{AnyResult, EXIT_PROBLEM, EXIT_REFUSED, EXIT_UNREACHABLE};

/// A volume as the file system's [`Device`]: reads and writes through the routing
/// client, each acknowledged once a majority of the chunk's replicas hold it. Called from
/// threads outside the runtime (it blocks on the runtime's handle).
pub struct VolumeDevice {
    volume: Arc<VolumeClient>,
    rt: tokio::runtime::Handle,
    size: u64,
}

impl VolumeDevice {
    /// The device of `volume`, driven on `rt`.
    pub fn new(volume: Arc<VolumeClient>, rt: tokio::runtime::Handle) -> Self {
        let size = volume.map().size_bytes;
        Self { volume, rt, size }
    }
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

/// `chorus fs`.
#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(subcommand)]
    op: FsOp,
}

/// Which host the command mounts as.
#[derive(Args, Clone, Debug)]
struct Host {
    /// This host's id (1 to the file system's max hosts): its Disk Paxos page and
    /// journal area when it writes.
    #[arg(long, default_value_t = 1)]
    host_id: u32,
}

#[derive(Subcommand, Debug)]
enum FsOp {
    /// Make a file system on a volume (everything on it is lost).
    Mkfs {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
        /// Data block size (default: 4M, or a sixteenth of the chunk if smaller).
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        block_size: u64,
        /// Inode slots per chunk.
        #[arg(long, default_value_t = 1024)]
        inodes_per_chunk: u32,
        /// Directory-entry slots per chunk.
        #[arg(long, default_value_t = 1024)]
        dirents_per_chunk: u32,
        /// Hosts that may mount it.
        #[arg(long, default_value_t = 16)]
        max_hosts: u32,
        /// Journal size (default: 64M, or a quarter of the chunk if smaller).
        #[arg(long, value_parser = parse_bytes, default_value = "0")]
        journal_size: u64,
    },
    /// The superblock, the journal's writer and anchor, and what is in use.
    Stat {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
    },
    /// Check the metaobjects and the journal against each other.
    Fsck {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
    },
    /// List a directory.
    Ls {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
        /// The directory.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Write a file's bytes to standard output.
    Cat {
        #[command(flatten)]
        c: Control,
        /// The volume.
        volume: String,
        /// The file.
        path: String,
    },
    /// Make a directory.
    Mkdir {
        #[command(flatten)]
        c: Control,
        #[command(flatten)]
        h: Host,
        /// The volume.
        volume: String,
        /// The directory.
        path: String,
    },
    /// Copy a local file (or standard input, `-`) into the file system.
    Put {
        #[command(flatten)]
        c: Control,
        #[command(flatten)]
        h: Host,
        /// The volume.
        volume: String,
        /// The local file, or `-`.
        local: String,
        /// The file to write.
        path: String,
    },
    /// Mount the file system on a local directory (FUSE) until it is unmounted or the
    /// process is told to stop (SIGINT, SIGTERM).
    Mount {
        #[command(flatten)]
        c: Control,
        #[command(flatten)]
        h: Host,
        /// The volume.
        volume: String,
        /// The directory to mount on (it must exist).
        dir: std::path::PathBuf,
        /// Mount read-only: never write the volume, replay the writer's journal.
        #[arg(long)]
        read_only: bool,
        /// How often the journal's anchor is polled, in milliseconds.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
        poll_ms: u64,
        /// How long the kernel caches names and attributes, in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
        ttl_ms: u64,
        /// Kernel request threads.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
        threads: u64,
        /// Serve Prometheus metrics (`GET /metrics`) on this address.
        #[arg(long)]
        metrics: Option<std::net::SocketAddr>,
        /// Let other users in (FUSE `allow_other`); files show the mount point's owner,
        /// and the kernel checks their permission bits.
        #[arg(long)]
        allow_other: bool,
    },
    /// Closed-loop I/O on one preallocated file through the Rust API in this process
    /// (the libpfs path), mounted read-write as `--host-id`: figures shaped as `chorus
    /// volume bench`'s.
    Bench {
        #[command(flatten)]
        c: Control,
        #[command(flatten)]
        h: Host,
        /// The volume.
        volume: String,
        /// The file (made and preallocated to --file-size if shorter).
        #[arg(long, default_value = "/bench.dat")]
        path: String,
        /// The file's size: the span of the I/Os.
        #[arg(long, value_parser = parse_bytes, default_value = "256M")]
        file_size: u64,
        /// What each I/O does.
        #[arg(long, value_enum, default_value_t = Pattern::Randwrite)]
        pattern: Pattern,
        /// Bytes per I/O.
        #[arg(long, value_parser = parse_bytes, default_value = "4K")]
        bs: u64,
        /// Threads, each one I/O at a time, comma-separated: one run each.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        jobs: Vec<u64>,
        /// Seconds per point (after a one-second warm-up).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Grow the file system over all of its volume (after `chorus volume grow`).
    Growfs {
        #[command(flatten)]
        c: Control,
        #[command(flatten)]
        h: Host,
        /// The volume.
        volume: String,
    },
    /// Unmount a mounted file system (the mounting process then ends).
    Umount {
        /// The mount point.
        dir: std::path::PathBuf,
    },
    /// Remove a file, or an empty directory.
    Rm {
        #[command(flatten)]
        c: Control,
        #[command(flatten)]
        h: Host,
        /// The volume.
        volume: String,
        /// The file or directory.
        path: String,
    },
}

/// Runs `chorus fs`.
pub fn fs(a: FsArgs) -> AnyResult<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    Ok(match fs_op(&rt, a.op) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("chorus: {msg}");
            ExitCode::from(code)
        }
    })
}

type Failure = (u8, String);

fn open(
    rt: &tokio::runtime::Runtime,
    c: &Control,
    volume: &str,
) -> Result<Arc<VolumeDevice>, Failure> {
    let v = rt
        .block_on(VolumeClient::open(c.control.clone(), volume))
        .map_err(|e| {
            let code = if e.to_string().contains("does not exist") {
                EXIT_REFUSED
            } else {
                EXIT_UNREACHABLE
            };
            (code, e.to_string())
        })?;
    Ok(Arc::new(VolumeDevice::new(
        Arc::new(v),
        rt.handle().clone(),
    )))
}

fn mount(dev: Arc<VolumeDevice>, host: u32, access: Access) -> Result<Pfs, Failure> {
    Pfs::mount(dev, host, access).map_err(|e| (EXIT_REFUSED, e.to_string()))
}

fn refused(e: impl std::fmt::Display) -> Failure {
    (EXIT_REFUSED, e.to_string())
}

fn fs_op(rt: &tokio::runtime::Runtime, op: FsOp) -> Result<(), Failure> {
    match op {
        FsOp::Mkfs {
            c,
            volume,
            block_size,
            inodes_per_chunk,
            dirents_per_chunk,
            max_hosts,
            journal_size,
        } => {
            let dev = open(rt, &c, &volume)?;
            let chunk = dev.volume.map().chunk_bytes;
            let block = if block_size == 0 {
                (4 << 20).min(chunk / 16).max(4096)
            } else {
                block_size
            };
            let journal = if journal_size == 0 {
                ((64 << 20).min(chunk / 4) / 4096 * 4096).max(4096 * 4 * max_hosts as u64)
            } else {
                journal_size
            };
            let g = Geometry {
                volume_bytes: dev.size() / chunk * chunk,
                chunk_bytes: chunk,
                block_bytes: block,
                inodes_per_chunk,
                dirents_per_chunk,
                max_hosts,
                journal_bytes: journal,
            };
            let uuid = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let sb = chorus_fs::mkfs::mkfs(dev.as_ref(), g, uuid, now).map_err(refused)?;
            let g = sb.geometry;
            println!(
                "made a file system on `{volume}`: {} chunks of {} bytes, {}-byte blocks, {} data blocks, {} inodes, journal {} bytes for {} hosts, uuid {:#x}",
                g.chunks(),
                g.chunk_bytes,
                g.block_bytes,
                (0..g.chunks()).map(|c| g.data_blocks(c)).sum::<u64>(),
                g.inodes_per_chunk as u64 * g.chunks() as u64,
                g.journal_bytes,
                g.max_hosts,
                sb.uuid
            );
            Ok(())
        }
        FsOp::Stat { c, volume } => {
            let dev = open(rt, &c, &volume)?;
            {
                let sb = Superblock::read(dev.as_ref()).map_err(refused)?;
                let p = mount(dev, 1, Access::ReadOnly)?;
                let r = p.fsck();
                let (instance, value) = p.node().decision();
                let g = sb.geometry;
                println!("uuid            {:#x}", sb.uuid);
                println!("chunks          {} of {} bytes", g.chunks(), g.chunk_bytes);
                println!("block size      {}", g.block_bytes);
                println!(
                    "data blocks     {} in use of {}",
                    r.blocks,
                    (0..g.chunks()).map(|c| g.data_blocks(c)).sum::<u64>()
                );
                println!("files           {}", r.files);
                println!("directories     {}", r.dirs);
                println!("max hosts       {}", g.max_hosts);
                println!(
                    "journal         writer host {}, instance {instance}, generation {}, last transaction {}",
                    value.owner, value.anchor.generation, value.anchor.seq
                );
                Ok(())
            }
        }
        FsOp::Fsck { c, volume } => {
            let dev = open(rt, &c, &volume)?;
            {
                let p = mount(dev, 1, Access::ReadOnly)?;
                let r = p.fsck();
                for problem in &r.problems {
                    println!("{problem}");
                }
                if r.problems.is_empty() {
                    println!(
                        "clean: {} files, {} directories, {} data blocks",
                        r.files, r.dirs, r.blocks
                    );
                    Ok(())
                } else {
                    Err((EXIT_PROBLEM, format!("{} problems", r.problems.len())))
                }
            }
        }
        FsOp::Ls { c, volume, path } => {
            let dev = open(rt, &c, &volume)?;
            {
                let p = mount(dev, 1, Access::ReadOnly)?;
                for e in p.readdir(&path).map_err(refused)? {
                    let name = String::from_utf8_lossy(&e.name).into_owned();
                    let child = format!("{}/{name}", path.trim_end_matches('/'));
                    let st = p.stat(&child).map_err(refused)?;
                    let kind = if e.kind == FileKind::Dir { "d" } else { "-" };
                    println!("{kind}{:o} {:>12} {name}", st.mode, st.size);
                }
                Ok(())
            }
        }
        FsOp::Cat { c, volume, path } => {
            let dev = open(rt, &c, &volume)?;
            {
                let mut p = mount(dev, 1, Access::ReadOnly)?;
                let flags = OpenFlags {
                    read: true,
                    ..OpenFlags::default()
                };
                let fd = p.open(&path, flags, 0).map_err(refused)?;
                let mut out = std::io::stdout().lock();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = p.read(fd, &mut buf).map_err(refused)?;
                    if n == 0 {
                        break;
                    }
                    out.write_all(&buf[..n])
                        .map_err(|e| (EXIT_PROBLEM, e.to_string()))?;
                }
                Ok(())
            }
        }
        FsOp::Mkdir { c, h, volume, path } => {
            let dev = open(rt, &c, &volume)?;
            {
                let mut p = mount(dev, h.host_id, Access::ReadWrite)?;
                p.mkdir(&path, 0o755).map_err(refused)
            }
        }
        FsOp::Put {
            c,
            h,
            volume,
            local,
            path,
        } => {
            let mut data = Vec::new();
            let read = if local == "-" {
                std::io::stdin().read_to_end(&mut data)
            } else {
                std::fs::File::open(&local).and_then(|mut f| f.read_to_end(&mut data))
            };
            read.map_err(|e| (EXIT_REFUSED, format!("{local}: {e}")))?;
            let dev = open(rt, &c, &volume)?;
            {
                let mut p = mount(dev, h.host_id, Access::ReadWrite)?;
                let fd = p.creat(&path, 0o644).map_err(refused)?;
                if !data.is_empty() {
                    // Preallocated first: the data then needs no metadata transaction.
                    p.fallocate(fd, 0, data.len() as u64).map_err(refused)?;
                    p.pwrite(fd, &data, 0).map_err(refused)?;
                }
                p.close(fd).map_err(refused)
            }
        }
        FsOp::Mount {
            c,
            h,
            volume,
            dir,
            read_only,
            poll_ms,
            ttl_ms,
            threads,
            metrics,
            allow_other,
        } => {
            let access = if read_only {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            };
            let dev = open(rt, &c, &volume)?;
            let p = mount(dev, h.host_id, access)?;
            let opts = MountOptions {
                ttl: Duration::from_millis(ttl_ms),
                poll: Duration::from_millis(poll_ms),
                threads: threads as usize,
                fs_name: format!("chorus:{volume}"),
                allow_other,
                ..MountOptions::for_dir(&dir)
                    .map_err(|e| (EXIT_REFUSED, format!("{}: {e}", dir.display())))?
            };
            let m = chorus_fs::fuse::mount(p, &dir, opts)
                .map_err(|e| (EXIT_REFUSED, format!("mounting at {}: {e}", dir.display())))?;
            if let Some(addr) = metrics {
                let l = rt
                    .block_on(tokio::net::TcpListener::bind(addr))
                    .map_err(|e| (EXIT_REFUSED, format!("metrics address {addr}: {e}")))?;
                let fs = m.fs();
                let render: Render = Arc::new(move || {
                    let p = fs.lock().unwrap_or_else(|p| p.into_inner());
                    render_fs_metrics(&p)
                });
                rt.spawn(serve_text(l, render));
            }
            println!(
                "mounted `{volume}` at {} as host {} ({})",
                dir.display(),
                h.host_id,
                if read_only { "read-only" } else { "read-write" }
            );
            let _ = std::io::stdout().flush();
            rt.block_on(async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .map_err(|e| (EXIT_PROBLEM, e.to_string()))?;
                loop {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => break,
                        _ = term.recv() => break,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {
                            if !m.is_mounted() {
                                break;
                            }
                        }
                    }
                }
                Ok::<_, Failure>(())
            })?;
            m.unmount()
                .map_err(|e| (EXIT_PROBLEM, format!("unmounting {}: {e}", dir.display())))
        }
        FsOp::Umount { dir } => umount(&dir),
        FsOp::Growfs { c, h, volume } => {
            let dev = open(rt, &c, &volume)?;
            let mut p = mount(dev, h.host_id, Access::ReadWrite)?;
            let added = p.growfs().map_err(refused)?;
            let u = p.usage();
            println!(
                "{added} chunks added: {} data blocks of {} bytes, {} inodes",
                u.blocks, u.block_bytes, u.inodes
            );
            Ok(())
        }
        FsOp::Bench {
            c,
            h,
            volume,
            path,
            file_size,
            pattern,
            bs,
            jobs,
            seconds,
        } => {
            let dev = open(rt, &c, &volume)?;
            let p = mount(dev, h.host_id, Access::ReadWrite)?;
            let json_out = matches!(c.output, crate::Output::Json);
            crate::fs_bench::run(p, &path, file_size, pattern, bs, &jobs, seconds, json_out)
                .map_err(refused)
        }
        FsOp::Rm { c, h, volume, path } => {
            let dev = open(rt, &c, &volume)?;
            {
                let mut p = mount(dev, h.host_id, Access::ReadWrite)?;
                match p.stat(&path).map_err(refused)?.kind {
                    FileKind::Dir => p.rmdir(&path),
                    FileKind::File => p.unlink(&path),
                }
                .map_err(refused)
            }
        }
    }
}

/// Unmounts `dir`: the `umount` system call's tool as root, `fusermount3 -u` otherwise.
fn umount(dir: &std::path::Path) -> Result<(), Failure> {
    let mut last = String::new();
    for (tool, args) in [
        ("umount", &[][..]),
        ("fusermount3", &["-u"][..]),
        ("fusermount", &["-u"][..]),
    ] {
        match std::process::Command::new(tool)
            .args(args)
            .arg(dir)
            .output()
        {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => last = format!("{tool}: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) if last.is_empty() => last = format!("{tool}: {e}"),
            Err(_) => {}
        }
    }
    Err((
        EXIT_REFUSED,
        format!("unmounting {}: {last}", dir.display()),
    ))
}

/// The mount's counters in the Prometheus text format.
pub fn render_fs_metrics(p: &Pfs) -> String {
    let s = p.node().stats();
    let (instance, value) = p.node().decision();
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, v: u64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
        ));
    };
    put(
        "chorus_fs_journal_appends_total",
        "counter",
        "Transactions this host committed to the journal.",
        s.journal_appends,
    );
    put(
        "chorus_fs_replays_total",
        "counter",
        "Journal records replayed (other hosts' or before a restart).",
        s.replays,
    );
    put(
        "chorus_fs_paxos_rounds_total",
        "counter",
        "Disk Paxos proposals run.",
        s.paxos_rounds,
    );
    put(
        "chorus_fs_handovers_total",
        "counter",
        "Times this host won the journal.",
        s.handovers,
    );
    put(
        "chorus_fs_lost_total",
        "counter",
        "Transactions rolled back because another host took the journal over.",
        s.lost,
    );
    put(
        "chorus_fs_checkpoints_total",
        "counter",
        "Checkpoints (new journal generations) this host made.",
        s.checkpoints,
    );
    put(
        "chorus_fs_writer",
        "gauge",
        "1 if this host holds the journal as far as it knows.",
        u64::from(value.owner == p.node().host()),
    );
    put(
        "chorus_fs_journal_instance",
        "gauge",
        "The latest Disk Paxos instance this host knows.",
        instance,
    );
    put(
        "chorus_fs_journal_seq",
        "gauge",
        "The last transaction in the journal's current generation, as this host knows it.",
        value.anchor.seq,
    );
    let u = p.usage();
    put(
        "chorus_fs_free_blocks",
        "gauge",
        "Free data blocks.",
        u.free_blocks,
    );
    put(
        "chorus_fs_free_inodes",
        "gauge",
        "Free inodes.",
        u.free_inodes,
    );
    out
}
