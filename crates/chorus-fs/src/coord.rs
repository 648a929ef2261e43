//! A mounted host's metadata and its part in keeping every host's metadata in step
//! (PolarFS section 6.2, Fig. 8).
//!
//! A [`Node`] holds every metaobject as of the latest journal anchor it knows. Read-only
//! hosts only [`Node::poll`]: they read the leader record and the host blocks, and
//! replay the records between the anchor they know and the latest one. The writing host
//! first wins the journal with [`Node::acquire`] (a Disk Paxos instance choosing it as
//! the owner); then each transaction — its operations applied in memory as they are made
//! ([`Node::change`]), each holding the old value — is committed by [`Node::commit`]:
//! 1. the record goes into this host's own journal area, after its last committed one
//!    (the pending tail);
//! 2. a Disk Paxos instance is proposed whose value moves the anchor to that record (the
//!    valid tail) with this host as the owner;
//! 3. if that value is chosen, the transaction is committed, and the leader record is
//!    updated for the readers. If another value is chosen, or a later instance
//!    preempts the proposal, another host took the journal over: the transaction is
//!    rolled back from its old values, the new records are replayed (Fig. 8, steps 4
//!    and 5), and the caller may acquire again and retry.
//!
//! A host that still believes itself the writer after another took over can therefore
//! never commit: its proposal is for an instance that already has a value, or loses to
//! a higher ballot. It may write its own journal area, which no committed record of
//! anyone's lies past its tail in (see [`crate::journal`]).

use std::sync::Arc;

use crate::device::Device;
use crate::journal::{fits, half, records_after, write_record, Anchor, At, Op, Record};
use crate::layout::{FsError, Geometry, Superblock, SECTOR};
use crate::meta::{Kind, Meta, MetaId};
use crate::paxos::{ballot, latest, Outcome, Pages, Proposer, Value};
use crate::store::MetaStore;

/// Counters of one mounted host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Transactions this host committed to the journal.
    pub journal_appends: u64,
    /// Journal records replayed (written by other hosts, or before a restart).
    pub replays: u64,
    /// Disk Paxos proposals run.
    pub paxos_rounds: u64,
    /// Times this host won the journal.
    pub handovers: u64,
    /// Transactions rolled back because another host had taken the journal over.
    pub lost: u64,
    /// Checkpoints this host made (new journal generations).
    pub checkpoints: u64,
}

/// Why a transaction was not committed. Its operations are rolled back in every case.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// This host does not hold the journal: [`Node::acquire`] first.
    #[error("host {host} is not the journal's writer (the writer is host {owner})")]
    NotWriter {
        /// This host.
        host: u32,
        /// The writer as this host knows it (0: none yet).
        owner: u32,
    },
    /// Another host took the journal over; its transactions are replayed here.
    #[error(
        "host {owner} took the journal over (instance {instance}); the transaction was rolled back"
    )]
    Lost {
        /// The instance this host now knows.
        instance: u64,
        /// The writer it chose.
        owner: u32,
    },
    /// Other hosts kept preempting the proposal: whether the transaction is chosen is
    /// not decided yet. It is rolled back here; [`Node::poll`] replays it if it was.
    #[error("the journal's instance stayed contended; the transaction may yet be chosen")]
    Undecided,
    /// The volume failed or holds damage. If it failed during the proposal, the
    /// transaction may yet be chosen: [`Node::poll`] replays it if it was.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// A mounted host (see the module docs). Invariant: `store` holds the metaobjects as
/// of decision (`instance`, `value`), plus the operations of `pending` applied in order.
pub struct Node {
    dev: Arc<dyn Device>,
    host: u32,
    sb: Superblock,
    pages: Pages,
    store: MetaStore,
    instance: u64,
    value: Value,
    /// The next ballot round this host proposes with.
    round: u64,
    /// Where this host's next record goes in its area (in `value`'s generation): past
    /// every record of its that a decision names.
    area_tail: u64,
    /// The transaction being made: operations applied to `store`, not yet committed.
    pending: Vec<Op>,
    stats: Stats,
    /// `store` was replaced whole (a reload from the home copy) since
    /// [`Node::take_changes`] last drained it: its touched list does not tell everything
    /// that changed.
    replaced: bool,
    /// Broken variant (the `broken` feature only): commits move the leader record
    /// without a Disk Paxos instance, skipping the check that the anchor has not moved
    /// (the harness must catch a lost or divergent transaction).
    #[cfg(feature = "broken")]
    pub broken_skip_paxos: bool,
}

impl Node {
    /// Mounts the file system on `dev` as host `host` (1 to the superblock's
    /// `max_hosts`): loads every metaobject and replays the journal to the latest anchor.
    pub fn mount(dev: Arc<dyn Device>, host: u32) -> Result<Self, FsError> {
        let sb = Superblock::read(dev.as_ref())?;
        let g = sb.geometry;
        if host == 0 || host > g.max_hosts {
            return Err(FsError::Layout(format!(
                "host id {host}: this file system takes hosts 1 to {}",
                g.max_hosts
            )));
        }
        let store = MetaStore::load(dev.as_ref(), sb)?;
        let pages = Pages {
            start: g.paxos_start(),
            hosts: g.max_hosts,
            uuid: sb.uuid,
        };
        let mut n = Self {
            dev,
            host,
            sb,
            pages,
            store,
            instance: 0,
            value: Value::default(),
            round: 1,
            area_tail: 0,
            pending: Vec::new(),
            stats: Stats::default(),
            replaced: true,
            #[cfg(feature = "broken")]
            broken_skip_paxos: false,
        };
        n.poll()?;
        n.skip_proposed()?;
        Ok(n)
    }

    /// Moves this host's area tail past every record it wrote in the current generation
    /// after its last committed one: such a record was proposed (a record is proposed
    /// only once written whole) and another host's phase 1 may yet choose it, so it must
    /// never be overwritten. Records are written one after another, so the first place
    /// that holds no record of this generation ends them.
    fn skip_proposed(&mut self) -> Result<(), FsError> {
        let g = self.sb.geometry;
        let (_, end) = half(&g, self.host, self.value.anchor.generation);
        loop {
            let at = At {
                host: self.host,
                offset: self.area_tail,
            };
            if at.offset + SECTOR > end {
                return Ok(());
            }
            match crate::journal::read_record(self.dev.as_ref(), &g, self.sb.uuid, at) {
                Ok(r) if r.generation == self.value.anchor.generation => {
                    self.area_tail += r.sectors() * SECTOR;
                }
                // No record there (zeros, an earlier generation's, a torn write that was
                // never proposed): the records end here.
                Ok(_) | Err(FsError::Corrupt { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// This host.
    pub fn host(&self) -> u32 {
        self.host
    }

    /// The metaobjects (with the pending transaction's operations applied).
    pub fn store(&self) -> &MetaStore {
        &self.store
    }

    /// The latest decision this host knows: instance and value.
    pub fn decision(&self) -> (u64, Value) {
        (self.instance, self.value)
    }

    /// Takes in a growth of the file system another host made (`growfs`): the larger
    /// geometry from the superblock and the new chunks' metaobjects.
    fn refresh_geometry(&mut self) -> Result<(), FsError> {
        let sb = Superblock::read(self.dev.as_ref())?;
        if sb.uuid != self.sb.uuid {
            return Err(FsError::Corrupt {
                what: "superblock",
                offset: 0,
                detail: format!(
                    "uuid {:#x}, mounted {:#x}: another file system was made here",
                    sb.uuid, self.sb.uuid
                ),
            });
        }
        if sb.geometry.volume_bytes > self.sb.geometry.volume_bytes {
            self.store.grow_load(self.dev.as_ref(), sb)?;
            self.sb = sb;
            self.replaced = true;
        }
        Ok(())
    }

    /// Grows the file system over the whole volume (`pfs_mount_growfs`, after the volume
    /// grew): the new chunks' metaobjects written, all free, then the superblock naming
    /// them — a growth cut off before the superblock write leaves nothing behind. Other
    /// hosts take it in when they next learn a decision. Only the writer grows; the
    /// chunks added.
    pub fn grow(&mut self) -> Result<u32, FsError> {
        if !self.is_writer() || !self.pending.is_empty() {
            return Err(FsError::Layout(format!(
                "host {} grows the file system only as the journal's writer, between transactions",
                self.host
            )));
        }
        let g = self.sb.geometry;
        let bytes = self.dev.size() / g.chunk_bytes * g.chunk_bytes;
        if bytes <= g.volume_bytes {
            return Ok(0);
        }
        let sb = Superblock {
            geometry: Geometry::new(Geometry {
                volume_bytes: bytes,
                ..g
            })?,
            uuid: self.sb.uuid,
        };
        let mut grown = self.store.clone();
        grown.grow_fresh(sb);
        grown.write_chunks(self.dev.as_ref(), g.chunks())?;
        self.dev.write(0, &sb.encode())?;
        self.store = grown;
        self.sb = sb;
        self.replaced = true;
        Ok(sb.geometry.chunks() - g.chunks())
    }

    /// What changed in the store since the last call: the records touched, or `None`
    /// when the store was reloaded whole (every index over it must be rebuilt).
    pub fn take_changes(&mut self) -> Option<Vec<(Kind, MetaId)>> {
        let touched = self.store.take_touched();
        if std::mem::take(&mut self.replaced) {
            None
        } else {
            Some(touched)
        }
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether the latest decision this host knows makes it the writer (another host may
    /// have taken over since: [`Node::commit`] finds out).
    pub fn is_writer(&self) -> bool {
        self.value.owner == self.host
    }

    /// Learns the latest decision and replays the records up to its anchor; true if it
    /// moved. A pending transaction is rolled back first if there is anything to learn
    /// (it was made against the state this replaces).
    pub fn poll(&mut self) -> Result<bool, FsError> {
        let leader = self.pages.read_leader(self.dev.as_ref())?;
        let blocks = self.pages.read_blocks(self.dev.as_ref())?;
        let (instance, value) = latest(&leader, &blocks);
        if instance <= self.instance {
            return Ok(false);
        }
        self.roll_back();
        self.learn(instance, value)?;
        Ok(true)
    }

    /// Takes decision (`instance`, `value`) in: replays the records between the anchor
    /// known and its anchor. In another generation, from the metaobjects' home copy:
    /// the previous generation's records redone over it (it holds that generation's
    /// start or later states, see the checkpoints below), then this generation's. A
    /// checkpoint beginning meanwhile can leave the home copy newer than that; the
    /// replay then finds an operation whose old value is not there, and the load is
    /// tried again from the latest decision.
    fn learn(&mut self, instance: u64, value: Value) -> Result<(), FsError> {
        if instance <= self.instance {
            return Ok(());
        }
        // Records past the anchor known may name chunks a growth added: the superblock,
        // read after the decision, covers every chunk a record it names uses.
        self.refresh_geometry()?;
        if value.anchor.generation == self.value.anchor.generation {
            return self.replay(instance, value, self.value.anchor.seq);
        }
        let (mut instance, mut value) = (instance, value);
        let mut tries = 0;
        self.replaced = true;
        loop {
            let saved = (self.store.clone(), self.area_tail);
            match self.reload(instance, value) {
                Ok(()) => return Ok(()),
                Err(FsError::Corrupt { .. }) if tries < 4 => {
                    tries += 1;
                    (self.store, self.area_tail) = saved;
                    let leader = self.pages.read_leader(self.dev.as_ref())?;
                    let blocks = self.pages.read_blocks(self.dev.as_ref())?;
                    (instance, value) = latest(&leader, &blocks);
                }
                Err(e) => {
                    (self.store, self.area_tail) = saved;
                    return Err(e);
                }
            }
        }
    }

    /// [`Node::learn`] of a decision of another generation: the home copy loaded, the
    /// previous generation redone over it, this generation replayed.
    fn reload(&mut self, instance: u64, value: Value) -> Result<(), FsError> {
        let (uuid, dev) = (self.sb.uuid, self.dev.clone());
        let g = self.sb.geometry;
        let mut store = MetaStore::load(dev.as_ref(), self.sb)?;
        for (at, r) in records_after(dev.as_ref(), &g, uuid, 0, value.anchor.base())? {
            for op in &r.ops {
                store.redo(op).map_err(|detail| FsError::Corrupt {
                    what: "journal record",
                    offset: crate::journal::record_offset(&g, at),
                    detail: format!("sequence {} does not redo: {detail}", r.seq),
                })?;
            }
        }
        self.store = store;
        self.area_tail = half(&g, self.host, value.anchor.generation).0;
        self.replay(instance, value, 0)
    }

    /// Applies the records of `value`'s generation after sequence number `after`, then
    /// takes (`instance`, `value`) as known.
    fn replay(&mut self, instance: u64, value: Value, after: u64) -> Result<(), FsError> {
        let g = self.sb.geometry;
        let (uuid, dev) = (self.sb.uuid, self.dev.clone());
        for (at, r) in records_after(dev.as_ref(), &g, uuid, after, value.anchor)? {
            for op in &r.ops {
                self.store.apply(op).map_err(|detail| FsError::Corrupt {
                    what: "journal record",
                    offset: crate::journal::record_offset(&g, at),
                    detail: format!("sequence {} does not apply: {detail}", r.seq),
                })?;
            }
            if at.host == self.host {
                self.area_tail = self.area_tail.max(at.offset + r.sectors() * SECTOR);
            }
            self.stats.replays += 1;
        }
        self.instance = instance;
        self.value = value;
        Ok(())
    }

    /// Runs one Disk Paxos instance (the next one) proposing `v`.
    fn propose(&mut self, v: Value) -> Result<Outcome, FsError> {
        let own = self.pages.read_blocks(self.dev.as_ref())?[self.host as usize - 1];
        // Ballots only grow, across restarts too: a block's ballot moving back would let
        // a lower ballot's phase 1 miss what this host accepted.
        self.round = self.round.max((own.mbal >> 16) + 1);
        let b = ballot(self.round, self.host);
        let mut p = Proposer::new(self.host, self.instance + 1, b, v, own, self.value);
        self.stats.paxos_rounds += 1;
        let out = p.run(self.dev.as_ref(), &self.pages)?;
        if let Outcome::Preempted { mbal, .. } = out {
            self.round = self.round.max((mbal >> 16) + 1);
        }
        Ok(out)
    }

    /// Tries to win the journal (Fig. 8, steps 1 and 4): true if this host is the writer
    /// now. False if another host won it meanwhile (its records replayed here); the
    /// caller tries again later.
    pub fn acquire(&mut self) -> Result<bool, FsError> {
        for _ in 0..16 {
            self.poll()?;
            if self.is_writer() {
                return Ok(true);
            }
            let mine = Value {
                owner: self.host,
                anchor: self.value.anchor,
            };
            match self.propose(mine)? {
                Outcome::Chosen(v) => {
                    let instance = self.instance + 1;
                    // The leader record is what readers poll; the blocks tell the
                    // decision too if this write is lost.
                    self.pages.write_leader(self.dev.as_ref(), instance, v)?;
                    self.roll_back();
                    self.learn(instance, v)?;
                    if v.owner == self.host {
                        self.stats.handovers += 1;
                        return Ok(true);
                    }
                    return Ok(false);
                }
                Outcome::Preempted { .. } => continue,
            }
        }
        Ok(false)
    }

    /// The next instance chose `v`, another host's value: the pending transaction is
    /// rolled back, the decision learned (its records replayed), and the loss reported.
    fn lost_to(&mut self, v: Value) -> CommitError {
        self.roll_back();
        self.stats.lost += 1;
        let instance = self.instance + 1;
        // A hint for readers; the blocks hold the decision if this write is lost.
        let _ = self.pages.write_leader(self.dev.as_ref(), instance, v);
        if let Err(e) = self.learn(instance, v) {
            return CommitError::Fs(e);
        }
        CommitError::Lost {
            instance,
            owner: v.owner,
        }
    }

    /// Changes metaobject (`kind`, `id`) to `new` as part of the pending transaction,
    /// in memory. Refused if the identifier names no slot of that kind or `new` is not
    /// of it.
    pub fn change(&mut self, kind: Kind, id: MetaId, new: &Meta) -> Result<(), String> {
        let op = self.store.op(kind, id, new).ok_or_else(|| {
            format!(
                "{kind:?} {:#x}: no such slot, or a value of another kind",
                id.0
            )
        })?;
        self.store.apply(&op)?;
        self.pending.push(op);
        Ok(())
    }

    /// Rolls the pending transaction back (its operations' old values, in reverse).
    pub fn roll_back(&mut self) {
        while let Some(op) = self.pending.pop() {
            // The op was applied to this very state: its slot exists and takes the value.
            self.store
                .roll_back(&op)
                .expect("an applied operation rolls back");
        }
    }

    /// Commits the pending transaction (see the module docs): its journal generation
    /// and sequence number. On any error it is rolled back.
    pub fn commit(&mut self) -> Result<(u64, u64), CommitError> {
        if self.pending.is_empty() {
            return Ok((self.value.anchor.generation, self.value.anchor.seq));
        }
        if !self.is_writer() {
            self.roll_back();
            return Err(CommitError::NotWriter {
                host: self.host,
                owner: self.value.owner,
            });
        }
        let g = self.sb.geometry;
        let record_at = |n: &Self| {
            let anchor = n.value.anchor;
            let record = Record {
                generation: anchor.generation,
                seq: anchor.seq + 1,
                prev: anchor.last,
                ops: n.pending.clone(),
            };
            let at = At {
                host: n.host,
                offset: n.area_tail,
            };
            (record, at)
        };
        let (mut record, mut at) = record_at(self);
        if !fits(&g, at, &record) {
            // This host's half of the journal is full: a checkpoint starts the next
            // generation, in the other half.
            self.checkpoint()?;
            (record, at) = record_at(self);
        }
        if let Err(e) = write_record(self.dev.as_ref(), &g, self.sb.uuid, at, &record) {
            self.roll_back();
            return Err(e.into());
        }
        let anchor = self.value.anchor;
        let new = Value {
            owner: self.host,
            anchor: Anchor {
                generation: anchor.generation,
                seq: record.seq,
                last: at,
                base_seq: anchor.base_seq,
                base_last: anchor.base_last,
            },
        };
        #[cfg(feature = "broken")]
        if self.broken_skip_paxos {
            self.pages
                .write_leader(self.dev.as_ref(), self.instance + 1, new)?;
            self.area_tail += record.sectors() * SECTOR;
            return Ok(self.committed(new));
        }
        // The record's place is never written again in this generation, whatever comes
        // of the proposal: a proposal preempted after its phase 2 may still be chosen by
        // another host's phase 1.
        self.area_tail += record.sectors() * SECTOR;
        for _ in 0..8 {
            let out = match self.propose(new) {
                Ok(o) => o,
                Err(e) => {
                    self.roll_back();
                    return Err(e.into());
                }
            };
            match out {
                Outcome::Chosen(v) if v == new => {
                    // Committed: the leader record is a hint for the readers (the blocks
                    // hold the decision if this write fails).
                    let _ = self
                        .pages
                        .write_leader(self.dev.as_ref(), self.instance + 1, v);
                    return Ok(self.committed(new));
                }
                Outcome::Chosen(v) => {
                    // Another value took this instance: it is not built on this record.
                    return Err(self.lost_to(v));
                }
                Outcome::Preempted { later: false, .. } => {
                    // A higher ballot of the same instance: propose again past it until
                    // the instance decides (this record's value, or another).
                    continue;
                }
                Outcome::Preempted { later: true, .. } => {
                    // The instance was decided and built on: learn how far, then whether
                    // this record is in the chain.
                    self.roll_back();
                    self.poll()?;
                    match self.in_chain(&record, at)? {
                        Some(true) => {
                            self.stats.journal_appends += 1;
                            return Ok((record.generation, record.seq));
                        }
                        Some(false) => {
                            self.stats.lost += 1;
                            return Err(CommitError::Lost {
                                instance: self.instance,
                                owner: self.value.owner,
                            });
                        }
                        None => return Err(CommitError::Undecided),
                    }
                }
            }
        }
        // Still contended: whether the record is chosen is not known here yet.
        self.roll_back();
        Err(CommitError::Undecided)
    }

    /// A checkpoint (journal generations): the metaobjects' home copy is brought to the
    /// current generation's start (the sectors the previous generation's records
    /// touched, read, those records redone over them, and written back), then a Disk Paxos instance begins the next generation: its
    /// records go in the other half of every host's area, and its anchor names the
    /// current generation's last record as its base. A reader loading the home copy
    /// redoes the base generation over it. If this host dies writing the home copy, the
    /// next generation was not begun, and the home copy is a mix of the previous and the
    /// current generation's start, which the redo of the previous generation's records
    /// (still readable: the other half) makes whole again. The pending transaction is
    /// never part of it. Rolled back (`Lost`) if another host took the journal over.
    fn checkpoint(&mut self) -> Result<(), CommitError> {
        let g = self.sb.geometry;
        let (uuid, dev) = (self.sb.uuid, self.dev.clone());
        let cur = self.value.anchor;
        let fail = |n: &mut Self, e: FsError| {
            n.roll_back();
            Err(CommitError::Fs(e))
        };
        // 1. The home copy whole for this generation's start. It holds the previous
        //    generation's start (the last checkpoint wrote it whole) or, in sectors a
        //    checkpoint that died before this one reached, this generation's start: the
        //    two differ only in the sectors the previous generation's records touched,
        //    so only those are read, redone and written back.
        let start = (|| {
            let records = records_after(dev.as_ref(), &g, uuid, 0, cur.base())?;
            let mut sectors = std::collections::BTreeMap::new();
            for (_, r) in &records {
                for op in &r.ops {
                    let (offset, _) = self.store.sector_of(op.kind, op.id);
                    sectors.insert(offset, (op.kind, op.id));
                }
            }
            let mut start = self.store.clone();
            for &(kind, id) in sectors.values() {
                start.load_sector(dev.as_ref(), kind, id)?;
            }
            for (_, r) in &records {
                for op in &r.ops {
                    start
                        .redo(op)
                        .map_err(|d| FsError::Layout(format!("checkpoint: {d}")))?;
                }
            }
            for &(kind, id) in sectors.values() {
                let (offset, b) = start.sector(kind, id);
                dev.write(offset, &b)?;
            }
            Ok::<(), FsError>(())
        })();
        if let Err(e) = start {
            return fail(self, e);
        }
        // 2. The next generation, decided.
        let next = Value {
            owner: self.host,
            anchor: Anchor {
                generation: cur.generation + 1,
                seq: 0,
                last: At::default(),
                base_seq: cur.seq,
                base_last: cur.last,
            },
        };
        for _ in 0..8 {
            let out = match self.propose(next) {
                Ok(o) => o,
                Err(e) => return fail(self, e),
            };
            match out {
                Outcome::Chosen(v) if v == next => {
                    let _ = self
                        .pages
                        .write_leader(self.dev.as_ref(), self.instance + 1, v);
                    self.instance += 1;
                    self.value = next;
                    self.area_tail = half(&g, self.host, next.anchor.generation).0;
                    self.stats.checkpoints += 1;
                    return Ok(());
                }
                Outcome::Preempted { later: false, .. } => continue,
                Outcome::Chosen(v) => return Err(self.lost_to(v)),
                Outcome::Preempted { later: true, .. } => {
                    self.roll_back();
                    self.stats.lost += 1;
                    self.poll()?;
                    return Err(CommitError::Lost {
                        instance: self.instance,
                        owner: self.value.owner,
                    });
                }
            }
        }
        self.roll_back();
        Err(CommitError::Undecided)
    }

    /// Whether `record`, written at `at`, is in the journal's chain as this host now
    /// knows it: in the current generation, or the previous one (the base); `None` when
    /// the journal has moved on by two generations since (it cannot be told here).
    fn in_chain(&self, record: &Record, at: At) -> Result<Option<bool>, FsError> {
        let g = self.sb.geometry;
        let anchor = self.value.anchor;
        let holding = if anchor.generation == record.generation {
            anchor
        } else if anchor.generation == record.generation + 1 {
            anchor.base()
        } else {
            return Ok(None);
        };
        if holding.seq < record.seq {
            return Ok(Some(false));
        }
        let chain = records_after(self.dev.as_ref(), &g, self.sb.uuid, record.seq - 1, holding)?;
        Ok(Some(
            chain
                .first()
                .is_some_and(|(a, r)| *a == at && r.seq == record.seq),
        ))
    }

    /// Notes the pending transaction committed as decision `new`; its generation and
    /// sequence number.
    fn committed(&mut self, new: Value) -> (u64, u64) {
        self.pending.clear();
        self.instance += 1;
        self.value = new;
        self.stats.journal_appends += 1;
        (new.anchor.generation, new.anchor.seq)
    }
}
