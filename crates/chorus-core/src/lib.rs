//! Chorus core: the byte-exact formats of the replicated log, and (in later modules) the
//! pure replica state machine. This crate does no IO: no files, sockets, threads or clocks
//! (DESIGN.md principle 1), so that everything in it runs unchanged inside the
//! deterministic simulator.

pub mod format;
pub mod ooo;
pub mod quorum;
pub mod replica;
pub mod rng;
pub mod rtt;

/// Log sequence number: the byte offset of a group (or of an entry) in the logical log of
/// one log group (PALF section 3.2). Block `n` of the log holds LSNs
/// `n * block_size .. (n + 1) * block_size`.
pub type Lsn = u64;

/// Commit sequence number: a monotonic number assigned with the LSN, at least the
/// appender's reference CSN, used to order records across log groups (PALF section 4.2).
pub type Csn = u64;

/// A refusal's hint at the leader, as error messages show it: "leader hint: node 2", or
/// "no leader known" (not Rust's `Some(2)` / `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderHint(pub Option<format::meta::NodeId>);

impl std::fmt::Display for LeaderHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "leader hint: node {n}"),
            None => f.write_str("no leader known"),
        }
    }
}
