//! The deterministic step of an ordered (PALF) group's driver, shared by the runtime's
//! group task ([`crate::group`]) and the simulator (`chorus_sim::Cluster`), so that the
//! seeds run the very code that decides what is written, synced, sent and answered, and
//! in which order.
//!
//! A round has three parts:
//!
//! 1. [`take_round`]: the reports of the last round's IO ([`Feedback`]) go to the
//!    replica, then the replica's actions are taken and split into the answers to
//!    appenders ([`Answer`]) and the rest. The runtime does this under its core lock.
//! 2. [`execute`]: the rest runs in order on the host's storage and network, with
//!    contiguous writes joined into one ([`coalesce_writes`]). The commit point the batch
//!    carries is handed to the host *after* the batch's writes (a follower may learn that
//!    groups are committed in the same batch that writes them: readers must find them in
//!    the log), and the answers go out after that (whoever is told "Committed" must be
//!    able to read the record at once).
//! 3. The host syncs the log if the round wrote ([`Executed::wrote`]) and reports
//!    [`Feedback::Flushed`] with the end it made durable ([`sync_finished`]); the replica
//!    counts its own copy and acknowledges only then. One sync is in flight at a time,
//!    covering the log up to the [`SyncPoint`] taken when it began; rounds may go on
//!    writing while it runs (pipelined group commit, as PALF's IO workers do it), and what
//!    they wrote waits for the next sync, which starts as the last one ends. The runtime
//!    syncs on the IO worker before the group's next round, or with pipelined syncs
//!    (`EnvConfig::pipelined_sync`) on its sync threads, with no lock held; the simulator
//!    after a seeded disk delay, writing meanwhile.
//!
//! Nothing in a round is acknowledged or voted before what it depends on is durable: the
//! replica emits acknowledgements and votes only after [`Feedback::Flushed`] and
//! [`Feedback::MetaSaved`], and this step reports those only once the host has synced.

use chorus_core::format::group::ChainPoint;
use chorus_core::format::meta::{ConfigVersion, NodeId};
use chorus_core::replica::{Action, Message, Nanos, Outcome, ReadPurpose, Replica, Role};
use chorus_core::{Csn, Lsn};
use chorus_storage::{LogStorage, MetaStorage, StorageError, SyncPoint};

/// A report of the host's IO for the replica's next round.
#[derive(Debug)]
pub enum Feedback {
    /// The hard-state save with this sequence number is durable.
    MetaSaved(u64),
    /// The log is durable up to this end.
    Flushed(Lsn),
    /// A log read the replica asked for ([`Action::ReadLog`]) and what it returned.
    Read(
        ReadPurpose,
        Lsn,
        Result<(chorus_core::format::group::ChainPoint, Vec<u8>), String>,
    ),
    /// A peer's copy of a damaged range did not fit the log ([`Action::Repair`]).
    RepairRefused(NodeId),
}

impl Feedback {
    /// Tells the replica.
    pub fn report(self, replica: &mut Replica, now: Nanos) {
        match self {
            Feedback::MetaSaved(seq) => replica.meta_saved(now, seq),
            Feedback::Flushed(lsn) => replica.log_flushed(now, lsn),
            Feedback::Read(p, from, r) => replica.log_read(now, p, from, r),
            Feedback::RepairRefused(peer) => replica.repair_refused(now, peer),
        }
    }
}

/// An appender's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The append's outcome ([`Action::Result`]).
    Result {
        /// The append's ticket id.
        id: u64,
        /// Its LSN.
        lsn: Lsn,
        /// Its CSN.
        csn: Csn,
        /// Committed or failed.
        outcome: Outcome,
    },
    /// Its outcome can no longer be known here ([`Action::Unknown`]).
    Unknown {
        /// The append's ticket id.
        id: u64,
        /// Its LSN.
        lsn: Lsn,
    },
}

/// What [`take_round`] took from the replica.
#[derive(Debug, Default)]
pub struct Round {
    /// Answers to appenders, in the order the replica gave them: the host holds them
    /// until [`execute`] has run `actions` and published their commit point.
    pub answers: Vec<Answer>,
    /// Every other action, in order.
    pub actions: Vec<Action>,
}

impl Round {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty() && self.actions.is_empty()
    }
}

/// Reports the last round's IO to `replica`, ticks it if `tick`, and takes its actions.
pub fn take_round(
    replica: &mut Replica,
    now: Nanos,
    feedback: &mut Vec<Feedback>,
    tick: bool,
) -> Round {
    for f in feedback.drain(..) {
        f.report(replica, now);
    }
    if tick {
        replica.tick(now);
    }
    let all = replica.take_actions();
    let mut round = Round {
        answers: Vec::new(),
        actions: Vec::with_capacity(all.len()),
    };
    for a in all {
        match a {
            Action::Result {
                id,
                lsn,
                csn,
                outcome,
            } => round.answers.push(Answer::Result {
                id,
                lsn,
                csn,
                outcome,
            }),
            Action::Unknown { id, lsn } => round.answers.push(Answer::Unknown { id, lsn }),
            other => round.actions.push(other),
        }
    }
    round
}

/// Something [`execute`] did that the host may count, log or check (the runtime counts
/// and logs; the simulator's checkers look at some).
#[derive(Debug)]
pub enum Note<'a> {
    /// This many bytes were appended to the log.
    Wrote(usize),
    /// The log was cut back to this LSN.
    Truncated(Lsn),
    /// A hard-state record was saved.
    MetaSaved,
    /// The replica's role changed.
    Role {
        /// The new role.
        role: Role,
        /// Its proposal id.
        pid: u64,
        /// The leader it follows, if known.
        leader: Option<NodeId>,
    },
    /// A membership change was accepted by a majority.
    ConfigCommitted(ConfigVersion),
    /// The replica dropped an input.
    Dropped {
        /// Whom it came from.
        from: Option<NodeId>,
        /// Why.
        reason: &'static str,
    },
    /// The replica halted: it takes nothing more.
    Halted(&'a str),
    /// The log starts again, empty, at this point (the replica fell behind a trimmed
    /// log).
    Rebased(&'a ChainPoint),
    /// A damaged range was replaced with a peer's copy.
    Repaired {
        /// Where.
        lsn: Lsn,
        /// Whose copy.
        peer: NodeId,
    },
    /// A peer's copy of a damaged range did not fit.
    RepairRefused {
        /// Where.
        lsn: Lsn,
        /// Whose copy.
        peer: NodeId,
        /// Why.
        error: &'a StorageError,
    },
    /// An uncommitted damaged tail was cut off at this LSN.
    DiscardedDamaged(Lsn),
}

/// What the step runs on: the group's storage, its network sink, and where its notes
/// and commit points go. The runtime's implementation takes its IO lock around each
/// storage call and sends through the node's transport; the simulator's works on a
/// simulated disk and a seeded network.
pub trait Host {
    /// Runs `f` on the group's log.
    fn log<R>(&mut self, f: impl FnOnce(&mut LogStorage) -> R) -> R;
    /// Runs `f` on the group's log, reading only (the runtime lets other readers in).
    fn read_log<R>(&mut self, f: impl FnOnce(&LogStorage) -> R) -> R;
    /// Runs `f` on the group's hard-state storage.
    fn meta<R>(&mut self, f: impl FnOnce(&mut MetaStorage) -> R) -> R;
    /// Queues a message for a peer (a lost one is the protocol's to resend).
    fn send(&mut self, to: NodeId, msg: Message);
    /// The log is committed up to `end`, and every write of the round is in the log;
    /// `csn` is the largest CSN below `end`, the replica's readable CSN from now on
    /// ([`Action::Commit`]).
    fn committed(&mut self, end: Lsn, csn: Csn);
    /// Something happened; see [`Note`].
    fn note(&mut self, note: Note<'_>);
}

/// Settings of the step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepSettings {
    /// Broken on purpose (test-only `broken` build): a write is reported durable
    /// ([`Feedback::Flushed`]) as soon as it is written, before any sync. The simulator
    /// must catch it.
    #[cfg(feature = "broken")]
    pub broken_flushed_before_sync: bool,
    /// Broken on purpose (test-only `broken` build): the runtime's log sync returns
    /// without `fdatasync`, as with syncs turned off. Real-process power losses must catch
    /// it (the simulator's step has no sync of its own to skip).
    #[cfg(feature = "broken")]
    pub broken_skip_fsync: bool,
    /// Broken on purpose (test-only `broken` build): a finished sync reports the log
    /// durable up to everything written so far ([`sync_finished`]), past the point it
    /// covered: a batch written while the previous sync ran is acknowledged before its own
    /// sync. The simulator must catch it.
    #[cfg(feature = "broken")]
    pub broken_ack_past_sync_point: bool,
}

/// The report of a finished log sync: `point` was taken when the sync began
/// ([`LogStorage::sync_point`]) and `r` is what its `fdatasync` returned. The log is
/// durable up to the point's end and no further, whatever was written while the sync ran
/// (that waits for the next sync). A failed sync fails the log (it is never retried and
/// trusted, DESIGN.md principle 4).
pub fn sync_finished(
    log: &mut LogStorage,
    point: &SyncPoint,
    r: Result<(), StorageError>,
    set: &StepSettings,
) -> Result<Feedback, StorageError> {
    let end = log.synced(point, r)?;
    #[cfg(feature = "broken")]
    if set.broken_ack_past_sync_point {
        return Ok(Feedback::Flushed(log.end_lsn()));
    }
    let _ = set;
    Ok(Feedback::Flushed(end))
}

/// What [`execute`] did.
#[derive(Debug, Default)]
pub struct Executed {
    /// The round appended to the log: the host syncs it and reports
    /// [`Feedback::Flushed`].
    pub wrote: bool,
    /// Reports for the replica's next round (meta saves, reads, refused repairs): the
    /// host may hold a [`Feedback::MetaSaved`] back to model the save's latency, never
    /// report one early.
    pub feedback: Vec<Feedback>,
    /// The log was repaired or its damaged tail discarded: the host builds a new replica
    /// from storage. The rest of the batch was not run (it came from the replica being
    /// replaced).
    pub restart: bool,
}

/// Why a step stopped.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The storage failed: the group stops and recovers from what is durable (a failed
    /// write or sync is never retried and trusted, DESIGN.md principle 4).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The replica asked for something impossible (a bug): the group stops.
    #[error("{0}")]
    Broken(String),
}

/// Runs a round's actions (from [`take_round`]) on `host`, in order. See the module docs
/// for what follows what.
pub fn execute<H: Host>(
    actions: Vec<Action>,
    host: &mut H,
    set: &StepSettings,
) -> Result<Executed, StepError> {
    let _ = set;
    let mut done = Executed::default();
    let mut commit = None;
    for a in coalesce_writes(actions) {
        match a {
            Action::Send { to, msg } => host.send(to, msg),
            Action::Write { lsn, bytes } => {
                host.log(|log| {
                    if log.end_lsn() != lsn {
                        return Err(StepError::Broken(format!(
                            "replica wrote at LSN {lsn} but the log ends at {}",
                            log.end_lsn()
                        )));
                    }
                    log.append(&bytes)?;
                    #[cfg(feature = "broken")]
                    if set.broken_flushed_before_sync {
                        done.feedback.push(Feedback::Flushed(log.end_lsn()));
                    }
                    Ok(())
                })?;
                host.note(Note::Wrote(bytes.len()));
                done.wrote = true;
            }
            Action::Truncate { lsn } => {
                host.log(|log| log.truncate(lsn))?;
                host.note(Note::Truncated(lsn));
            }
            Action::SaveMeta { seq, record } => {
                host.meta(|meta| meta.save(&record))?;
                host.note(Note::MetaSaved);
                done.feedback.push(Feedback::MetaSaved(seq));
            }
            Action::ReadLog {
                purpose,
                from,
                max_bytes,
            } => {
                let r = host
                    .read_log(|log| log.read_range(from, max_bytes))
                    .map_err(|e| e.to_string());
                done.feedback.push(Feedback::Read(purpose, from, r));
            }
            Action::Role { role, pid, leader } => host.note(Note::Role { role, pid, leader }),
            // Handed over after the batch's writes (see the module docs).
            Action::Commit { end, csn } => commit = Some((end, csn)),
            Action::ConfigCommitted { version } => host.note(Note::ConfigCommitted(version)),
            Action::Repair { lsn, bytes, peer } => match host.log(|log| log.repair(&bytes)) {
                Ok(()) => {
                    host.note(Note::Repaired { lsn, peer });
                    done.restart = true;
                    return Ok(done);
                }
                Err(error) => {
                    host.note(Note::RepairRefused {
                        lsn,
                        peer,
                        error: &error,
                    });
                    done.feedback.push(Feedback::RepairRefused(peer));
                }
            },
            Action::DiscardDamaged { lsn } => {
                host.log(|log| log.truncate(lsn))?;
                host.note(Note::DiscardedDamaged(lsn));
                done.restart = true;
                return Ok(done);
            }
            Action::Dropped { from, reason } => host.note(Note::Dropped { from, reason }),
            Action::Halt { reason } => host.note(Note::Halted(&reason)),
            Action::Rebase { base } => {
                host.log(|log| log.rebase(base))?;
                host.note(Note::Rebased(&base));
            }
            Action::Result { .. } | Action::Unknown { .. } => {
                return Err(StepError::Broken(
                    "an answer reached the executor: take_round routes them".into(),
                ))
            }
        }
    }
    if let Some((end, csn)) = commit {
        host.committed(end, csn);
    }
    Ok(done)
}

/// Joins consecutive contiguous writes of one batch into one: one `write` instead of
/// one per group when the lane closed several groups while the last fsync ran writes
/// them at once (bench/results/2026-11-23-matrix-b/NOTES.md). Sends may overtake the
/// pending write (the leader replicates in parallel with its own write;
/// acknowledgements follow the fsync); anything else may read or change the log, so the
/// writes before it go first, in order.
pub fn coalesce_writes(actions: Vec<Action>) -> Vec<Action> {
    let mut out = Vec::with_capacity(actions.len());
    let mut pending: Option<(Lsn, Vec<u8>)> = None;
    for a in actions {
        match a {
            Action::Write { lsn, bytes } => match &mut pending {
                Some((start, buf)) if *start + buf.len() as u64 == lsn => {
                    buf.extend_from_slice(&bytes)
                }
                _ => {
                    if let Some((lsn, bytes)) = pending.replace((lsn, bytes)) {
                        out.push(Action::Write { lsn, bytes });
                    }
                }
            },
            a @ Action::Send { .. } => out.push(a),
            a => {
                if let Some((lsn, bytes)) = pending.take() {
                    out.push(Action::Write { lsn, bytes });
                }
                out.push(a);
            }
        }
    }
    if let Some((lsn, bytes)) = pending {
        out.push(Action::Write { lsn, bytes });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(lsn: Lsn, bytes: &[u8]) -> Action {
        Action::Write {
            lsn,
            bytes: bytes.to_vec(),
        }
    }

    fn send(to: NodeId) -> Action {
        Action::Send {
            to,
            msg: Message::Ping {
                prio: chorus_core::replica::Priority {
                    config_version: Default::default(),
                    priority: 0,
                    id: to,
                },
                max_pid: 0,
                leader: None,
                voter: true,
            },
        }
    }

    /// A host on a simulated disk that checks, when handed a commit point, that the log
    /// holds it.
    struct TestHost {
        log: LogStorage,
        meta: MetaStorage,
        committed: Vec<Lsn>,
        /// The readable CSNs handed over, each checked against the log.
        csns: Vec<Csn>,
        sent: usize,
    }

    impl Host for TestHost {
        fn log<R>(&mut self, f: impl FnOnce(&mut LogStorage) -> R) -> R {
            f(&mut self.log)
        }
        fn read_log<R>(&mut self, f: impl FnOnce(&LogStorage) -> R) -> R {
            f(&self.log)
        }
        fn meta<R>(&mut self, f: impl FnOnce(&mut MetaStorage) -> R) -> R {
            f(&mut self.meta)
        }
        fn send(&mut self, _to: NodeId, _msg: Message) {
            self.sent += 1;
        }
        fn committed(&mut self, end: Lsn, csn: Csn) {
            assert!(
                self.log.end_lsn() >= end,
                "commit point {end} handed over before the log holds it (ends at {})",
                self.log.end_lsn()
            );
            // The readable CSN is exactly the largest CSN the log holds below `end`.
            let held = self
                .log
                .chain_at(end)
                .expect("the commit point is a boundary");
            assert_eq!(
                csn, held.max_csn,
                "readable CSN {csn} handed over with commit point {end}; the log's is {}",
                held.max_csn
            );
            self.committed.push(end);
            self.csns.push(csn);
        }
        fn note(&mut self, _note: Note<'_>) {}
    }

    fn single_voter() -> (Replica, TestHost) {
        use chorus_core::format::meta::{Membership, MetaRecord};
        use chorus_storage::fs::{FileSystem, SimFs};
        use chorus_storage::LogOptions;
        let fs: std::sync::Arc<dyn FileSystem> = std::sync::Arc::new(SimFs::new(7));
        let dir = std::path::Path::new("/g");
        fs.create_dir_all(dir).expect("dir");
        let opts = LogOptions {
            block_size: 64 << 10,
            direct_io: false,
            preallocate: 0,
        };
        let record = MetaRecord {
            log_id: 1,
            block_size: opts.block_size,
            membership: Membership {
                voters: vec![1],
                ..Membership::default()
            },
            ..MetaRecord::default()
        };
        let meta = MetaStorage::create(fs.clone(), dir, &record).expect("meta");
        let log = LogStorage::create(fs, dir, opts, 1).expect("log");
        let cfg = chorus_core::replica::ReplicaConfig {
            id: 1,
            block_size: opts.block_size,
            ..Default::default()
        };
        let r = Replica::new(cfg, record, log.recovered().expect("recovered"), 0);
        let host = TestHost {
            log,
            meta,
            committed: Vec::new(),
            csns: Vec::new(),
            sent: 0,
        };
        (r, host)
    }

    /// Runs rounds at `now`, syncing after each that wrote, until nothing is left;
    /// returns the answers.
    fn settle(r: &mut Replica, h: &mut TestHost, now: Nanos) -> Vec<Answer> {
        let mut feedback = Vec::new();
        let mut answers = Vec::new();
        for _ in 0..100 {
            let round = take_round(r, now, &mut feedback, true);
            if round.is_empty() && feedback.is_empty() {
                break;
            }
            answers.extend(round.answers);
            let done = execute(round.actions, h, &StepSettings::default()).expect("step");
            feedback = done.feedback;
            if done.wrote {
                feedback.push(Feedback::Flushed(h.log.sync().expect("sync")));
            }
        }
        answers
    }

    /// An append is answered Committed only after the round that wrote it was synced and
    /// reported, and its commit point reaches the host after the write (the host checks).
    #[test]
    fn an_append_is_answered_only_after_its_write_is_reported_durable() {
        let (mut r, mut h) = single_voter();
        let mut now = 0;
        while r.role() != chorus_core::replica::Role::Leader {
            now += 10_000_000;
            assert!(now < 10_000_000_000, "a single voter never led");
            settle(&mut r, &mut h, now);
        }
        settle(&mut r, &mut h, now);
        let ticket = r.append(now, b"record", 0).expect("append");
        // One round without the sync's report: written, not answered.
        let mut feedback = Vec::new();
        let round = take_round(&mut r, now, &mut feedback, false);
        assert!(round.answers.is_empty(), "answered before any write");
        let done = execute(round.actions, &mut h, &StepSettings::default()).expect("step");
        assert!(done.wrote, "the append was not written");
        let round = take_round(&mut r, now, &mut Vec::new(), false);
        assert!(
            round.answers.is_empty(),
            "answered before the write was reported durable: {:?}",
            round.answers
        );
        execute(round.actions, &mut h, &StepSettings::default()).expect("step");
        // The sync's report answers it.
        let mut feedback = vec![Feedback::Flushed(h.log.sync().expect("sync"))];
        let round = take_round(&mut r, now, &mut feedback, false);
        execute(round.actions, &mut h, &StepSettings::default()).expect("step");
        assert!(
            round.answers.iter().any(|a| matches!(a,
                Answer::Result { id, outcome: Outcome::Committed, .. } if *id == ticket.id)),
            "not answered once durable: {:?}",
            round.answers
        );
        assert!(h.committed.last().copied() >= Some(ticket.lsn));
    }

    /// The readable CSN handed over with each commit point is the largest CSN the log
    /// holds below it (the host checks each against storage), never goes back, and
    /// reaches the CSN of every committed record, a reference CSN's jump included.
    #[test]
    fn the_readable_csn_follows_the_commit_point() {
        let (mut r, mut h) = single_voter();
        let mut now = 0;
        while r.role() != chorus_core::replica::Role::Leader {
            now += 10_000_000;
            assert!(now < 10_000_000_000, "a single voter never led");
            settle(&mut r, &mut h, now);
        }
        settle(&mut r, &mut h, now);
        let mut last = 0;
        for (i, ref_csn) in [0, 0, 1_000, 0].into_iter().enumerate() {
            let t = r
                .append(now, format!("r{i}").as_bytes(), ref_csn)
                .expect("append");
            assert!(t.csn > last && t.csn >= ref_csn);
            last = t.csn;
            settle(&mut r, &mut h, now);
            assert_eq!(h.csns.last().copied(), Some(t.csn), "after record {i}");
            assert_eq!(r.committed_csn(), t.csn);
        }
        assert!(h.csns.windows(2).all(|w| w[0] <= w[1]), "{:?}", h.csns);
        assert_eq!(last, 1_001);
    }

    /// A write at an LSN other than the log's end is the replica's bug: the step refuses
    /// it with nothing written, and an answer handed to the executor is refused too.
    #[test]
    fn impossible_actions_stop_the_step() {
        let (_, mut h) = single_voter();
        let e = execute(vec![w(4096, b"x")], &mut h, &StepSettings::default());
        assert!(matches!(e, Err(StepError::Broken(_))), "{e:?}");
        assert_eq!(h.log.end_lsn(), 0);
        let e = execute(
            vec![Action::Unknown { id: 1, lsn: 0 }],
            &mut h,
            &StepSettings::default(),
        );
        assert!(matches!(e, Err(StepError::Broken(_))), "{e:?}");
    }

    /// Discarding a damaged tail restarts the replica: the rest of the batch, which came
    /// from the replica being replaced, does not run.
    #[test]
    fn a_restart_ends_the_batch() {
        let (_, mut h) = single_voter();
        let done = execute(
            vec![Action::DiscardDamaged { lsn: 0 }, send(2), send(3)],
            &mut h,
            &StepSettings::default(),
        )
        .expect("step");
        assert!(done.restart);
        assert_eq!(h.sent, 0, "sends of the replaced replica ran");
    }

    #[test]
    fn consecutive_writes_join_and_keep_their_order_around_other_actions() {
        let out = coalesce_writes(vec![
            w(0, b"ab"),
            send(2),
            w(2, b"cd"),
            w(4, b"e"),
            Action::Truncate { lsn: 3 },
            w(3, b"x"),
            w(9, b"y"), // not contiguous: a write of its own
        ]);
        assert_eq!(
            out,
            vec![
                send(2),
                w(0, b"abcde"),
                Action::Truncate { lsn: 3 },
                w(3, b"x"),
                w(9, b"y"),
            ]
        );
        assert_eq!(coalesce_writes(vec![]), vec![]);
    }
}
