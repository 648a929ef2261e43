//! Real-process fault testing for Chorus, in the manner of Jepsen and etcd's robustness
//! suite: a cluster of `chorus server` processes with real sockets and real files, faults
//! injected from outside, a workload that records a history of every operation, and a
//! checker that judges the whole history against what every node holds afterwards.
//!
//! - [`net`]: each node in a network namespace of its own; links cut, one-way or lossy.
//! - [`cluster`]: the server processes, started, killed, paused and resumed by pid, their
//!   files damaged while they are stopped, their disks (a tmpfs each) filled, their wall
//!   clocks jumped (libfaketime).
//! - [`nemesis`]: the faults and a seeded schedule that mixes them.
//! - [`history`]: what the workload did, written as JSON lines.
//! - [`ordered`]: the ordered-append workload and its checker.
//! - [`blocks`]: parallel block writes and reads at the leader, checked for
//!   linearizability per block by porcupine ([`porcupine`]).
//! - [`txn`]: dependent transactions, checked for serial equivalence.
//! - [`volume`]: block writes through the storage layer's routing client to a volume of
//!   several chunk groups, the control plane on every node; checked as [`blocks`] is.
//! - [`fs`]: the file system's library on such a volume: block writes in place into
//!   files, files created and unlinked, other hosts reading; the blocks checked as
//!   [`blocks`] are, the files against what their acknowledged operations left.
//! - [`run`]: one whole run: cluster, workload, nemesis, heal, check, report.
//! - [`catchup`]: the recovery time of a follower cut off until it is far behind, for
//!   each mode.
//!
//! - [`lazyfs`]: the power-loss file system (FUSE) under each node's data directory.
//!
//! Not yet: jumps of the monotonic clock as a nemesis; `docs/reliability.md` lists it.
//!
//! `chorus-nemesis --help` runs it by hand; `crates/chorus-server/tests/nemesis.rs` runs
//! a short mixed run in CI. docs/reliability.md records the runs made.

pub mod blocks;
pub mod catchup;
pub mod cluster;
pub mod fs;
pub mod history;
pub mod lazyfs;
pub mod nemesis;
pub mod net;
pub mod ordered;
pub mod porcupine;
pub mod run;
pub mod txn;
pub mod volume;

/// What stopped the harness (not an anomaly: those are the checker's findings).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The machine cannot run this harness.
    #[error("cannot run real-process fault tests here: {0}")]
    Unavailable(String),
    /// A system command failed.
    #[error("`{cmd}` failed: {detail}")]
    Command {
        /// The command.
        cmd: String,
        /// Its exit status and what it printed.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The cluster did not come up, or did not settle after the faults healed.
    #[error("cluster: {0}")]
    Cluster(String),
    /// The run was interrupted ([`run::interrupt`]): its faults were healed, its workload
    /// stopped, and its processes and namespaces removed; nothing was checked.
    #[error("interrupted after {0:.1} s: faults healed, processes and namespaces removed; nothing checked")]
    Interrupted(f64),
}

impl Error {
    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }
}

/// A small seeded generator (splitmix64): the nemesis schedule and the workload's
/// choices follow from the run's seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6a09_e667_f3bc_c909)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next_u64() % (hi - lo)
        }
    }

    /// True with probability `p` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.range(0, 100) < pct
    }
}
