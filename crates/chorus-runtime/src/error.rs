//! Errors of the runtime and its API.

use chorus_core::replica::{AppendError, ChangeError, MirrorError};
use chorus_core::{Csn, Lsn};
use chorus_storage::StorageError;

/// What went wrong in the runtime. Every variant names what it refers to.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting has a value that is not accepted.
    #[error("setting `{setting}`: value `{value}` is not accepted; expected {accepted}")]
    Config {
        /// The setting.
        setting: String,
        /// The value given.
        value: String,
        /// What is accepted.
        accepted: String,
    },
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Storage refused or failed.
    #[error("group {group}: storage: {source}")]
    Storage {
        /// The log group.
        group: u64,
        /// The storage error.
        #[source]
        source: StorageError,
    },
    /// No such log group on this node.
    #[error("no log group {0} on this node")]
    NoSuchGroup(u64),
    /// The group already exists.
    #[error("log group {0} already exists")]
    GroupExists(u64),
    /// The group's files on this node are damaged beyond what its replica repairs
    /// alone, so it did not start here (the node serves its other groups); see
    /// docs/operations.md, "A damaged replica".
    #[error(
        "log group {group} did not start on this node: its files are damaged ({reason}); \
         remove this node from its membership, then delete the group here and add it back"
    )]
    GroupDamaged {
        /// The log group.
        group: u64,
        /// What was found damaged, naming the file.
        reason: String,
    },
    /// The append was refused before it got an LSN.
    #[error("group {group}: append refused: {source}")]
    Append {
        /// The log group.
        group: u64,
        /// Why.
        #[source]
        source: AppendError,
    },
    /// A mirror write was refused before it got an LSN.
    #[error("group {group}: mirror write refused: {source}")]
    Mirror {
        /// The log group.
        group: u64,
        /// Why.
        #[source]
        source: MirrorError,
    },
    /// A read of whole groups did not start at a group boundary.
    #[error("group {group}: LSN {lsn} is not where a group starts")]
    NotAGroup {
        /// The log group.
        group: u64,
        /// The LSN asked for.
        lsn: Lsn,
    },
    /// A membership change or leader transfer was refused.
    #[error("group {group}: change refused: {source}")]
    Change {
        /// The log group.
        group: u64,
        /// Why.
        #[source]
        source: ChangeError,
    },
    /// A read asked for log that is not (or not yet) committed.
    #[error("group {group}: LSN {lsn} is at or beyond the committed end {committed}")]
    NotCommitted {
        /// The log group.
        group: u64,
        /// The LSN asked for.
        lsn: Lsn,
        /// The committed end.
        committed: Lsn,
    },
    /// A read at a CSN (PALF section 4.2, follower reads) gave up waiting: this
    /// replica's readable CSN did not reach the one asked for within the wait (the
    /// replica is cut off from its leader or behind it, or nothing with that CSN has
    /// committed yet). Nothing was read.
    #[error(
        "group {group}: readable CSN {reached} on this node did not reach CSN {csn} within \
         {waited_ms} ms (this replica is behind or cut off from its leader, or no record \
         with that CSN has committed yet)"
    )]
    CsnNotReached {
        /// The log group.
        group: u64,
        /// The CSN asked for.
        csn: Csn,
        /// The readable CSN reached when the wait ended.
        reached: Csn,
        /// How long the read waited, in milliseconds.
        waited_ms: u64,
    },
    /// A read named an LSN that is not the start of a record.
    #[error("group {group}: LSN {lsn} is not the start of a record")]
    NotARecord {
        /// The log group.
        group: u64,
        /// The LSN asked for.
        lsn: Lsn,
    },
    /// The group was trimmed past the LSN.
    #[error("group {group}: LSN {lsn} was trimmed (log starts at {start})")]
    Trimmed {
        /// The log group.
        group: u64,
        /// The LSN asked for.
        lsn: Lsn,
        /// The first LSN still kept.
        start: Lsn,
    },
    /// The outcome of an append is unknown: this replica (a deposed leader) fell behind
    /// the new leader's log start, which the database had trimmed, before it learned
    /// whether the record committed. As after a crash, the appender finds out from its
    /// own state (the record's effects), not from the log.
    #[error("group {group}: the outcome of the append at LSN {lsn} is unknown: this replica fell behind the leader's log start (trimmed) before it learned whether the record committed")]
    OutcomeUnknown {
        /// The log group.
        group: u64,
        /// The record's LSN.
        lsn: u64,
    },
    /// The group stopped: it halted (no valid copy of committed data) or its storage failed.
    #[error("group {group} stopped: {reason}")]
    Stopped {
        /// The log group.
        group: u64,
        /// Why.
        reason: String,
    },
    /// The group had already stopped ([`Error::Stopped`]) when this request reached it:
    /// the request was not taken, so another replica may be asked (an append included).
    #[error("group {group} is stopped here, the request was not taken: {reason}")]
    NotRunning {
        /// The log group.
        group: u64,
        /// Why it stopped.
        reason: String,
    },
    /// A leader refused an append because the file system holding its data directory has
    /// less free space than [`crate::EnvConfig::min_free_bytes`]: nothing was appended,
    /// the group keeps running, and appends are taken again once space is freed
    /// ([`crate::disk`]).
    #[error("group {group}: append refused, nothing appended: {free} bytes free on the data directory's file system, below min_free_bytes {min_free} (free space or trim the log; appends resume by themselves)")]
    DiskLow {
        /// The log group.
        group: u64,
        /// Bytes free at the last measurement.
        free: u64,
        /// The floor.
        min_free: u64,
    },
    /// [`crate::Env::restart_group`] of a group that is running: only one that stopped
    /// (or did not start) is restarted.
    #[error("group {0} is running on this node; only a stopped group is restarted")]
    GroupRunning(u64),
    /// An out-of-order group's state machine found its files damaged when opened (the
    /// group then does not start, as for damaged replica files).
    #[error("group {group}: its state machine's files in {dir} are damaged: {source}")]
    StateMachineDamaged {
        /// The group.
        group: u64,
        /// The group's directory.
        dir: String,
        /// What the state machine found (an error of kind `InvalidData`).
        #[source]
        source: std::io::Error,
    },
    /// An out-of-order group's spec is not accepted: given to
    /// [`crate::Env::create_ooo_group`], or found damaged in the group's directory (the
    /// group then does not start, [`Error::GroupDamaged`]).
    #[error("group {group}: {what}: {source}")]
    Spec {
        /// The group.
        group: u64,
        /// Where the spec came from: its file, or the request.
        what: String,
        /// What is wrong.
        #[source]
        source: crate::env::SpecError,
    },
    /// The data directory holds an out-of-order group, or one is being created, and the
    /// environment has no state machines for such groups
    /// ([`crate::EnvConfig::state_machines`]).
    #[error(
        "group {0} is an out-of-order group, and this environment was opened without state          machines for them (EnvConfig::state_machines)"
    )]
    NoStateMachines(u64),
    /// An out-of-order group's replica did not start.
    #[error("group {group}: {source}")]
    OooStart {
        /// The group.
        group: u64,
        /// Why.
        #[source]
        source: crate::ooo::OooNodeError,
    },
    /// An out-of-order group to delete or restart is still held by other users (requests
    /// in flight) after a bounded wait; it was left as it was.
    #[error("group {0}: still in use by requests; try again")]
    GroupBusy(u64),
    /// The environment was shut down.
    #[error("the environment is shut down")]
    Shutdown,
}
