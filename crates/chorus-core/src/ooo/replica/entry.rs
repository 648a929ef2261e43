//! Entries: what a slot holds ([`Entry`], [`Body`]) and what an appender declares about a
//! record ([`Declared`]). Besides its slot, an entry carries the term of the leader that
//! last wrote it, the first slot after that leader's merge, an identity that a new
//! leader's merge keeps when it re-stamps the entry at its term (PolarFS section 5.3,
//! DP-Raft section 4.4), and the mode's metadata: block ranges and the look-behind buffer
//! of ParallelRaft (PolarFS section 5.2), or the window base, RAW and WAW predecessors
//! and write set of DP-Raft (section 4.2).

use std::sync::Arc;

use super::Seq;
use crate::ooo::dependent::Deps;
use crate::ooo::merge::Version;
use crate::ooo::parallel::BlockRange;

/// An entry's contents besides its slot, term and identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A merge decided the slot holds nothing.
    Null,
    /// A parallel-mode record.
    Parallel {
        /// Blocks it writes.
        ranges: Vec<BlockRange>,
        /// `look_behind[i]`: the ranges of slot `seq - 1 - i`, as its leader had it.
        look_behind: Vec<Vec<BlockRange>>,
        /// Conflict order ([`OooConfig::conflict_order`]): the uncommitted earlier slots
        /// whose blocks overlap this entry's (or every one in flight, for an entry with
        /// too many blocks to list) that its leader made it wait for, ascending; empty
        /// otherwise. A merge that makes one of them NULL makes this entry NULL too, as
        /// dependent mode does along RAW predecessors: it cannot have committed first.
        ///
        /// [`OooConfig::conflict_order`]: super::OooConfig::conflict_order
        after: Vec<Seq>,
        /// The record, shared: the replica hands one entry to its write, its sends, its
        /// commit and its apply, and a clone must not copy a 128 KiB group.
        data: Arc<[u8]>,
    },
    /// A dependent-mode record.
    Dependent {
        /// The leader's window head when it admitted the entry.
        base: Seq,
        /// RAW and WAW predecessors.
        deps: Deps,
        /// Keys it writes.
        write_set: Vec<u64>,
        /// The record, shared: the replica hands one entry to its write, its sends, its
        /// commit and its apply, and a clone must not copy a 128 KiB group.
        data: Arc<[u8]>,
    },
}

/// One slot's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The slot.
    pub seq: Seq,
    /// Term of the leader that wrote this version.
    pub term: u64,
    /// First slot after the merge of that leader ([`merge::drop_superseded`]).
    ///
    /// [`merge::drop_superseded`]: crate::ooo::merge::drop_superseded
    pub start: Seq,
    /// Identity of the record, kept when a merge re-stamps it; 0 for NULL.
    pub eid: u64,
    /// Contents.
    pub body: Body,
}

impl Entry {
    pub(super) fn null(seq: Seq, term: u64, start: Seq) -> Self {
        Self {
            seq,
            term,
            start,
            eid: 0,
            body: Body::Null,
        }
    }

    /// Whether this is a NULL entry.
    pub fn is_null(&self) -> bool {
        matches!(self.body, Body::Null)
    }

    /// The record's bytes (empty for NULL).
    pub fn data(&self) -> &[u8] {
        match &self.body {
            Body::Null => &[],
            Body::Parallel { data, .. } | Body::Dependent { data, .. } => data,
        }
    }

    pub(super) fn version(&self, committed: bool) -> Version {
        Version {
            term: self.term,
            id: self.eid,
            null: self.is_null(),
            committed,
            after: match &self.body {
                Body::Dependent { deps, .. } => deps.raw.clone(),
                Body::Parallel { after, .. } => after.clone(),
                Body::Null => Vec::new(),
            },
        }
    }

    /// The same record under a new leader: new term and start, no look-behind buffer
    /// (the predecessors it described may have been decided differently).
    pub(super) fn restamp(&self, term: u64, start: Seq) -> Self {
        let mut e = self.clone();
        e.term = term;
        e.start = start;
        if let Body::Parallel { look_behind, .. } = &mut e.body {
            look_behind.clear();
        }
        e
    }
}

/// What an appender declares about a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Declared {
    /// Parallel mode: the blocks it writes.
    Blocks(Vec<BlockRange>),
    /// Dependent mode: the keys it read and writes.
    Txn {
        /// Keys read.
        read_set: Vec<u64>,
        /// Keys written.
        write_set: Vec<u64>,
    },
}

/// Roughly the bytes an entry takes in a message (record bytes, sets and a fixed
/// allowance for the header), for the piece and rate bounds.
pub(super) fn entry_bytes(e: &Entry) -> u64 {
    let meta = match &e.body {
        Body::Null => 0,
        Body::Parallel {
            ranges,
            look_behind,
            after,
            ..
        } => {
            16 * (ranges.len() + look_behind.iter().map(Vec::len).sum::<usize>()) + 8 * after.len()
        }
        Body::Dependent {
            deps, write_set, ..
        } => 8 * (deps.raw.len() + deps.waw.len() + write_set.len()),
    };
    (64 + meta + e.data().len()) as u64
}
