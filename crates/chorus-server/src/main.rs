//! The `chorus` command line.
//!
//! - `chorus dev` — starts a local 3-replica cluster as three processes on loopback and
//!   prints how to talk to it.
//! - `chorus server` — runs one node of a cluster (config file, `CHORUS_*` environment,
//!   flags; see `docs/operations.md`).
//! - `chorus append | read | tail | locate | status | trim | member | leader | group | state | bench` —
//!   client commands against `--endpoints` (the nodes' gRPC API addresses).
//! - `chorus demo DIR` and `chorus inspect DIR` — local tools on a data directory.
//!
//! Every command takes `-o table|json`. Exit codes (stable): 0 success; 1 a check found a
//! problem or an append was reported FAILED; 2 bad usage, bad configuration or a local
//! error; 3 the cluster could not be reached or has no leader; 4 the server refused the
//! request (the message says why).

use chorus_server::{bench, dev, local, remote, server, Output, EXIT_USAGE};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: the gRPC path allocates per request (tonic,
/// h2, prost) on several threads, and glibc's malloc/free showed up at ~11% of CPU in
/// `perf` of a 1,000-client gRPC benchmark (the before/after is in
/// bench/results/2026-11-23-matrix-b/NOTES.md).
/// Built with `no_thp` (the workspace's feature): mimalloc's arenas otherwise ask for
/// transparent huge pages, and with the kernel's common `defrag = madvise` a page fault
/// can stall in direct compaction — an out-of-order follower's apply gap p99 went from
/// ~1.5 ms to 27–38 ms under mimalloc at 64 clients, and back to 1.1–1.3 ms with `no_thp`
/// (bench/results/2026-11-23-ooo-f/NOTES.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "chorus",
    version,
    about = "Chorus: a replicated write-ahead log",
    after_help = "Start here: `chorus dev` runs a local 3-node cluster and prints what to try next."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Client commands: the CA certificate (PEM) that signs the nodes' API certificates;
    /// connections are then TLS (nodes with `[api_tls]`).
    #[arg(long, global = true, env = "CHORUS_CA", value_name = "PEM")]
    ca: Option<std::path::PathBuf>,
    /// Client commands: this client's certificate (PEM), for nodes that require client
    /// certificates (`api_tls.client_ca`); with --key.
    #[arg(
        long,
        global = true,
        env = "CHORUS_CERT",
        value_name = "PEM",
        requires = "ca"
    )]
    cert: Option<std::path::PathBuf>,
    /// Client commands: the private key (PEM) of --cert.
    #[arg(
        long,
        global = true,
        env = "CHORUS_KEY",
        value_name = "PEM",
        requires = "ca"
    )]
    key: Option<std::path::PathBuf>,
    /// Client commands: the name the nodes' API certificates carry (default: the host of
    /// each endpoint).
    #[arg(
        long,
        global = true,
        env = "CHORUS_TLS_NAME",
        value_name = "NAME",
        requires = "ca"
    )]
    tls_name: Option<String>,
    /// Client commands: the bearer token sent on every call (nodes with `[api_auth]`).
    /// Prefer the environment variable: a command line is visible to other users.
    #[arg(
        long,
        global = true,
        env = "CHORUS_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a local 3-replica cluster (three processes on loopback) and print how to use it.
    Dev(dev::DevArgs),
    /// Run one node of a cluster.
    Server(server::ServerArgs),
    /// Append records and wait for each to commit.
    Append(remote::AppendArgs),
    /// Read committed records.
    Read(remote::ReadArgs),
    /// Print committed records from an LSN; with -f keep following the tail.
    Tail(remote::TailArgs),
    /// Find the first committed record with a CSN at least the given one.
    Locate(remote::LocateArgs),
    /// Follow the role of a group's replica on every endpoint (PALF's monitor_role): one
    /// line per replica now, then one per change of its role, leader or proposal id.
    WatchRole(remote::WatchRoleArgs),
    /// Members, roles, LSNs and replication lag of a group on every endpoint.
    Status(remote::StatusArgs),
    /// Delete the committed log below an LSN on every node of a group (ordered groups).
    ///
    /// Each node named in --endpoints is sent Trim in turn and trims only itself: it
    /// deletes the whole block files of its committed log below --lsn (space comes back a
    /// block, `log.block_size`, at a time); its log then starts at the first block kept
    /// (at or below --lsn), and reads below that start fail as trimmed (OUT_OF_RANGE). A
    /// node whose committed end is below --lsn refuses, naming its committed end; one that
    /// cannot be reached is reported by name; the others are trimmed all the same. Prints
    /// one row per node: trimmed, with its log start (and the one before) and committed
    /// end, or why not. Exit 0 when every node trimmed, else the highest code among the
    /// failed nodes (4 refused, 3 unreachable).
    ///
    /// Trimming is the database's call, after its own checkpoint: trim below what every
    /// reader has consumed. A replica behind the leader's log start is rebased there: its
    /// log restarts empty at the leader's start, and its readers get "trimmed" below it.
    Trim(remote::TrimArgs),
    /// Membership changes: add, remove, learner, promote, replace.
    Member(remote::MemberArgs),
    /// Leadership: transfer, priority.
    Leader(remote::LeaderArgs),
    /// Groups: create, delete, restart, access-mode.
    Group(remote::GroupArgs),
    /// Mirror a primary group's committed log into a mirror group (PALF section 5.2).
    ///
    /// The mirror is an ordered group created in access mode raw-write (`chorus group
    /// create --access-mode raw-write`), on its own nodes, reconfigured on its own. This
    /// reads the primary's committed groups (--from, --from-group) from the mirror
    /// leader's end and writes them into the mirror (--endpoints, -g): each keeps its LSN,
    /// entries and CSNs, so the mirror's readers see the primary's log. After a refusal or
    /// a leader change it resumes from the mirror leader's end. Without --follow it stops
    /// once the mirror holds, committed, what the primary had committed; with it, it goes
    /// on. Failover: `chorus group access-mode --mode append` on the mirror.
    Mirror(remote::MirrorArgs),
    /// What the archive holds (`[archive]`: each group's committed log in object storage).
    Archive(chorus_server::archive::cli::ArchiveArgs),
    /// Write a group's archived log into an ordered group in access mode raw-write, at its
    /// LSNs and CSNs, up to an LSN or CSN (or, with --follow, as the archive grows: a
    /// mirror fed from the archive); --promote then makes it a primary.
    Restore(chorus_server::archive::cli::RestoreArgs),
    /// The applied state of an out-of-order group's state machine (parallel: blocks
    /// of its volume; dependent: keys of its key-value store) on every endpoint.
    State(remote::StateArgs),
    /// Volumes of the storage layer: create, list, stat, grow, delete, read, write
    /// (through the control plane, `--control`, and the routing client).
    Volume(chorus_server::volume_cli::VolumeArgs),
    /// Chunk servers as the control plane sees them: list, drain.
    Node(chorus_server::volume_cli::NodeArgs),
    /// The file system on a volume (PolarFS section 6): mkfs, stat, fsck, ls, cat,
    /// mkdir, put, rm.
    Fs(chorus_server::fs_cli::FsArgs),
    /// Closed-loop append benchmark: against a running cluster over gRPC, or `--local DIR`
    /// to start three replica processes and drive them from the leader's process.
    Bench(bench::BenchArgs),
    /// Write a demo log of 512-byte records into DIR, reopen it, and report.
    Demo {
        /// Data directory (created if missing).
        dir: PathBuf,
        /// Records to append.
        #[arg(long, default_value_t = 200_000)]
        records: u64,
        /// Records per group (one group per fdatasync batch of 64).
        #[arg(long, default_value_t = 64)]
        group_records: u64,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// List and check the blocks and groups in a replica directory (a group's directory,
    /// `DATA_DIR/groups/<id>`, the one holding `log/`), or an out-of-order group's
    /// (also in `DATA_DIR/groups/<id>`, holding `entries.log`: hard state, membership and
    /// every entry record). Reads only.
    Inspect {
        /// The replica directory.
        dir: PathBuf,
        /// Check every checksum and the accumulated chain; exit 1 at the first bad place.
        #[arg(long)]
        verify: bool,
        /// List every group, not only the blocks (out-of-order: every entry record).
        #[arg(long)]
        groups: bool,
        /// List every entry of every group (implies --groups).
        #[arg(long)]
        entries: bool,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// A command's output piped into a reader that stops early (`chorus read | head`) ends
/// the command quietly, as it does for other Unix tools: Rust ignores SIGPIPE, so a write
/// to the closed pipe would otherwise make `println!` panic. Not for `chorus server`,
/// which must outlive a closed client connection (sockets send with `MSG_NOSIGNAL`, so
/// clients are unaffected either way).
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: setting a signal's disposition to its default, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Server(_)) {
        die_quietly_on_a_closed_pipe();
    }
    if let Some(t) = &cli.token {
        if let Err(e) = chorus_client::security::set_default_token(Some(t)) {
            eprintln!("chorus: --token: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    if let Some(ca) = &cli.ca {
        match chorus_client::security::ClientTls::load(
            ca,
            cli.cert.as_deref(),
            cli.key.as_deref(),
            cli.tls_name.clone(),
        ) {
            Ok(t) => chorus_client::security::set_default_tls(Some(t)),
            Err(e) => {
                eprintln!("chorus: {e}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    let r = match cli.cmd {
        Cmd::Demo {
            dir,
            records,
            group_records,
            output,
        } => local::demo(&dir, records, group_records.max(1), output),
        Cmd::Inspect {
            dir,
            verify,
            groups,
            entries,
            output,
        } => local::inspect(&dir, verify, groups || entries, entries, output),
        Cmd::Server(a) => server::run(a),
        Cmd::Dev(a) => dev::run(a),
        Cmd::Append(a) => remote::run(remote::Remote::Append(a)),
        Cmd::Read(a) => remote::run(remote::Remote::Read(a)),
        Cmd::Tail(a) => remote::run(remote::Remote::Tail(a)),
        Cmd::Locate(a) => remote::run(remote::Remote::Locate(a)),
        Cmd::WatchRole(a) => remote::run(remote::Remote::WatchRole(a)),
        Cmd::Status(a) => remote::run(remote::Remote::Status(a)),
        Cmd::Trim(a) => remote::run(remote::Remote::Trim(a)),
        Cmd::Member(a) => remote::run(remote::Remote::Member(a)),
        Cmd::Leader(a) => remote::run(remote::Remote::Leader(a)),
        Cmd::Group(a) => remote::run(remote::Remote::Group(a)),
        Cmd::Mirror(a) => remote::run(remote::Remote::Mirror(a)),
        Cmd::Archive(a) => chorus_server::archive::cli::archive(a),
        Cmd::Restore(a) => chorus_server::archive::cli::restore(a),
        Cmd::State(a) => remote::run(remote::Remote::State(a)),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Volume(a) => chorus_server::volume_cli::volume(a),
        Cmd::Node(a) => chorus_server::volume_cli::node(a),
        Cmd::Fs(a) => chorus_server::fs_cli::fs(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("chorus: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}
