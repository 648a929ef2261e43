//! The meta record: the small state a replica must never lose, kept in meta storage rather
//! than in the log (PALF section 5.3: membership lives in meta storage, guarded by a log
//! barrier and a config version).
//!
//! ```text
//! payload (little-endian):
//! offset size field
//!  0     2    payload_version      u16 = 1
//!  2     2    flags                u16 = 0 (unknown bits are an error)
//!  4     8    log_id               u64
//! 12     8    block_size           u64
//! 20     8    promised_proposal_id u64, highest proposal id promised (Paxos prepare)
//! 28     1    voted_for present    u8, 0 or 1
//! 29     8    voted_for            u64 (0 when absent)
//! 37     8    config proposal_id   u64 \ config version, compared lexicographically;
//! 45     8    config seq           u64 / the chief election priority
//! 53     8    barrier_lsn          u64, log barrier of the config
//! 61     4    voter count V        u32, <= MAX_MEMBERS
//! 65   8*V    voters               u64 each
//!  .     4    learner count L      u32, <= MAX_MEMBERS
//!  .   8*L    learners             u64 each
//!  .     1    access_mode          u8: 1 Append, 2 RawWrite (part of the config)
//!  .     8    access_mode_version  u64, access-mode switches adopted (informational)
//!  .     8    base_lsn             u64, reserved (written 0)
//! ```
//!
//! Checksums are in the slot that holds the payload (see `chorus-storage`'s meta module).

use super::le::{put_u16, u16_at};
use super::{FormatError, Reader};

/// A replica's identity within a log group.
pub type NodeId = u64;

/// Most voters, and most learners, a membership may have.
pub const MAX_MEMBERS: u32 = 255;
/// The payload version this build writes and reads.
pub const META_VERSION: u16 = 1;

const WHAT: &str = "meta record";

/// A membership configuration's version. Ordered lexicographically; the higher version is
/// the chief election priority (PALF section 5.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigVersion {
    /// Proposal id of the leader that proposed the config.
    pub proposal_id: u64,
    /// Sequence of the config under that proposal id.
    pub seq: u64,
}

/// A membership configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Its version.
    pub version: ConfigVersion,
    /// Voting members.
    pub voters: Vec<NodeId>,
    /// Non-voting members that receive the log.
    pub learners: Vec<NodeId>,
    /// The LSN a replica's log must reach before it accepts this config.
    pub barrier_lsn: u64,
    /// Who may write the log (PALF section 5.2): part of the config, so that a switch is
    /// agreed by a majority, guarded by the barrier and ordered by the version like any
    /// membership change, and a new leader always knows the mode in force.
    pub access_mode: AccessMode,
}

/// Who may write a log group (PALF section 5.2, access modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// A primary group: appenders' records go through the leader.
    #[default]
    Append = 1,
    /// A mirror: the leader takes only whole groups another log committed, each at the
    /// same LSN with the same entries and CSNs (`mirror`); appends are refused.
    RawWrite = 2,
}

impl AccessMode {
    /// The mode's name as the CLI and the service spell it.
    pub fn name(self) -> &'static str {
        match self {
            AccessMode::Append => "append",
            AccessMode::RawWrite => "raw-write",
        }
    }

    /// The mode of a name ([`AccessMode::name`]; `primary` and `mirror` are accepted too).
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "append" | "primary" => Some(AccessMode::Append),
            "raw-write" | "raw_write" | "mirror" => Some(AccessMode::RawWrite),
            _ => None,
        }
    }

    /// The mode of its byte in the meta record and on the wire.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(AccessMode::Append),
            2 => Some(AccessMode::RawWrite),
            _ => None,
        }
    }
}

/// The last promise and vote of the replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Vote {
    /// The highest proposal id promised.
    pub promised_proposal_id: u64,
    /// The candidate voted for under it, if any.
    pub voted_for: Option<NodeId>,
}

/// Everything meta storage keeps. See the module docs for the layout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaRecord {
    /// The log's identity (also in every block header).
    pub log_id: u64,
    /// Bytes of log per block.
    pub block_size: u64,
    /// Promise and vote.
    pub vote: Vote,
    /// Current membership (with the access mode).
    pub membership: Membership,
    /// How many access-mode switches this replica has adopted: for operators only (the
    /// config version is what orders switches).
    pub access_mode_version: u64,
    /// Reserved for a trim point; written 0 and not acted on: a log's start is the start
    /// of its first block file (trims delete whole blocks), so nothing else records it.
    pub base_lsn: u64,
}

impl MetaRecord {
    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        put_u16(&mut b, 0, META_VERSION);
        let u64s = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
        u64s(&mut b, self.log_id);
        u64s(&mut b, self.block_size);
        u64s(&mut b, self.vote.promised_proposal_id);
        b.push(self.vote.voted_for.is_some() as u8);
        u64s(&mut b, self.vote.voted_for.unwrap_or(0));
        u64s(&mut b, self.membership.version.proposal_id);
        u64s(&mut b, self.membership.version.seq);
        u64s(&mut b, self.membership.barrier_lsn);
        for list in [&self.membership.voters, &self.membership.learners] {
            b.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for id in list {
                u64s(&mut b, *id);
            }
        }
        b.push(self.membership.access_mode as u8);
        u64s(&mut b, self.access_mode_version);
        u64s(&mut b, self.base_lsn);
        b
    }

    /// Decodes a payload; total (never panics).
    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(buf, WHAT, "");
        let version = u16_at(r.take(2)?, 0);
        if version != META_VERSION {
            return Err(FormatError::UnknownVersion {
                what: WHAT,
                found: version,
                supported: META_VERSION,
            });
        }
        let flags = u16_at(r.take(2)?, 0);
        if flags != 0 {
            return Err(FormatError::UnknownFlags {
                what: WHAT,
                found: flags as u32,
            });
        }
        let log_id = r.u64()?;
        let block_size = r.u64()?;
        let promised_proposal_id = r.u64()?;
        let present = r.take(1)?[0];
        let voted = r.u64()?;
        let voted_for = match present {
            // Canonical form: an absent vote is stored as 0, so that every record has one
            // encoding (found by the `meta` fuzz target).
            0 if voted != 0 => {
                return Err(FormatError::Malformed {
                    what: WHAT,
                    detail: format!("voted_for is {voted} but marked absent"),
                })
            }
            0 => None,
            1 => Some(voted),
            other => {
                return Err(FormatError::Malformed {
                    what: WHAT,
                    detail: format!("voted_for present flag is {other}, not 0 or 1"),
                })
            }
        };
        let version = ConfigVersion {
            proposal_id: r.u64()?,
            seq: r.u64()?,
        };
        let barrier_lsn = r.u64()?;
        let voters = r.ids("voter count")?;
        let learners = r.ids("learner count")?;
        let mut all: Vec<NodeId> = voters.iter().chain(&learners).copied().collect();
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(FormatError::Malformed {
                what: WHAT,
                detail: format!("node {} listed twice in the membership", w[0]),
            });
        }
        let mode = r.take(1)?[0];
        let Some(access_mode) = AccessMode::from_byte(mode) else {
            return Err(FormatError::Malformed {
                what: WHAT,
                detail: format!("unknown access mode {mode} (1 Append, 2 RawWrite)"),
            });
        };
        let access_mode_version = r.u64()?;
        let base_lsn = r.u64()?;
        if r.pos != buf.len() {
            return Err(FormatError::Malformed {
                what: WHAT,
                detail: format!("{} trailing bytes", buf.len() - r.pos),
            });
        }
        Ok(Self {
            log_id,
            block_size,
            vote: Vote {
                promised_proposal_id,
                voted_for,
            },
            membership: Membership {
                version,
                voters,
                learners,
                barrier_lsn,
                access_mode,
            },
            access_mode_version,
            base_lsn,
        })
    }
}

/// Decodes `data` as a meta payload and, if it decodes, checks that re-encoding gives the
/// same bytes. The body of the `meta` cargo-fuzz target.
pub fn fuzz_decode(data: &[u8]) {
    if let Ok(m) = MetaRecord::decode(data) {
        assert_eq!(m.encode(), data, "meta re-encode differs");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> MetaRecord {
        MetaRecord {
            log_id: 9,
            block_size: 1 << 26,
            vote: Vote {
                promised_proposal_id: 4,
                voted_for: Some(2),
            },
            membership: Membership {
                version: ConfigVersion {
                    proposal_id: 4,
                    seq: 1,
                },
                voters: vec![1, 2, 3],
                learners: vec![7],
                barrier_lsn: 4096,
                access_mode: AccessMode::RawWrite,
            },
            access_mode_version: 1,
            base_lsn: 0,
        }
    }

    #[test]
    fn round_trip_and_errors() {
        let b = sample().encode();
        assert_eq!(MetaRecord::decode(&b).unwrap(), sample());
        assert!(matches!(
            MetaRecord::decode(&b[..b.len() - 1]),
            Err(FormatError::Truncated { .. })
        ));
        let mut dup = sample();
        dup.membership.learners = vec![3];
        assert!(matches!(
            MetaRecord::decode(&dup.encode()),
            Err(FormatError::Malformed { .. })
        ));
        let mut bad = b.clone();
        bad.push(0);
        assert!(matches!(
            MetaRecord::decode(&bad),
            Err(FormatError::Malformed { .. })
        ));
    }

    proptest! {
        #[test]
        fn prop_round_trip(log_id in any::<u64>(), voters in proptest::collection::btree_set(0u64..1000, 0..7),
                           voted in proptest::option::of(any::<u64>()), base in any::<u64>()) {
            let mut m = sample();
            m.log_id = log_id;
            m.vote.voted_for = voted;
            m.membership.voters = voters.into_iter().collect();
            m.membership.learners = vec![5000];
            m.base_lsn = base;
            prop_assert_eq!(MetaRecord::decode(&m.encode()).unwrap(), m);
        }

        #[test]
        fn prop_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            fuzz_decode(&bytes);
        }
    }
}

#[cfg(test)]
mod fuzz_regressions {
    use super::*;

    /// Found by `cargo fuzz run meta`: an absent vote with a non-zero id decoded, and
    /// re-encoded differently.
    #[test]
    fn absent_vote_with_an_id_is_refused() {
        let mut m = MetaRecord::default().encode();
        // Layout: version(2) flags(2) log_id(8) block_size(8) promised(8) present(1) voted(8).
        let voted_at = 2 + 2 + 8 + 8 + 8 + 1;
        m[voted_at] = 7;
        assert!(matches!(
            MetaRecord::decode(&m),
            Err(FormatError::Malformed { .. })
        ));
        fuzz_decode(&m);
    }
}
