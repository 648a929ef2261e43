//! The spec of an out-of-order group: what an [`crate::Env`] needs to start the group again
//! after a restart without its embedder naming it — its id, mode, commit order and initial
//! replicas. It lies in the group's directory, `groups/{id:020}/ooo.spec`, beside the
//! replica's store; that file is also what tells an out-of-order group's directory from an
//! ordered group's. Its byte layout is in `docs/formats.md`, "Out-of-order group spec".
//!
//! Written once, when the group is created, crash-atomically (a temporary file, synced,
//! renamed over, the directory synced): a group that ever voted or acknowledged finds its
//! spec at the next start. Read with every field checked: damaged bytes are a typed
//! [`SpecError`], never a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_core::format::meta::NodeId;
use chorus_core::ooo::replica::Mode;
use chorus_storage::fs::{FileSystem, OpenOptions};

use crate::group::GroupId;

/// The spec file's name in a group's directory.
pub const SPEC_FILE: &str = "ooo.spec";
/// The first four bytes of a spec file.
const MAGIC: [u8; 4] = *b"CHOS";
/// The layout version this build writes; it reads this one and version 1 (which has no
/// state machine parameters).
const VERSION: u8 = 2;
/// The most bytes of state machine parameters a spec holds.
pub const MAX_PARAMS: usize = 256;
/// Bytes before the replica lists: magic, version, mode, flags, span, id, two counts.
const HEADER: usize = 20;
/// Bytes of the checksum after the lists.
const TRAILER: usize = 4;
/// The most voters, and the most other replicas, a spec names.
pub const MAX_REPLICAS: usize = 1024;
/// The longest parallel look-behind span (the server's `look_behind` limit).
pub const MAX_SPAN: usize = 64;

/// An out-of-order group's spec: what it was created with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OooGroupSpec {
    /// The group's id; never 0.
    pub id: GroupId,
    /// Its mode; a parallel group's look-behind span is 1 to [`MAX_SPAN`].
    pub mode: Mode,
    /// Parallel mode only: commit in conflict order
    /// ([`crate::ooo::OooNodeConfig::conflict_order`]); false for a dependent group.
    pub conflict_order: bool,
    /// The voters it was created with: ascending, distinct, no 0, 1 to [`MAX_REPLICAS`].
    pub voters: Vec<NodeId>,
    /// Replicas that were not voters at creation and a membership change may add:
    /// ascending, distinct, none of them a voter, no 0, at most [`MAX_REPLICAS`].
    pub others: Vec<NodeId>,
    /// The state machine's parameters, as the embedder encoded them (the runtime only
    /// keeps them and hands them to [`crate::env::StateMachines::open`]; a chunk group's
    /// geometry, for instance): at most [`MAX_PARAMS`] bytes.
    pub params: Vec<u8>,
}

/// Why a spec's bytes or fields are not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Fewer bytes than the header and the counts call for.
    #[error("{len} bytes, fewer than the {need} its header and counts call for")]
    Truncated {
        /// Bytes found.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// More bytes than the counts call for.
    #[error("{len} bytes, more than the {need} its counts call for")]
    Trailing {
        /// Bytes found.
        len: usize,
        /// Bytes expected.
        need: usize,
    },
    /// Not a spec file.
    #[error("not an out-of-order group spec (magic {found:02x?}, expected {MAGIC:02x?})")]
    Magic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// A layout version this build does not read.
    #[error("layout version {0}; this build reads versions 1 to {VERSION}")]
    Version(u8),
    /// The checksum does not match the bytes.
    #[error("crc32c {stored:#010x} stored, {computed:#010x} computed over the contents")]
    Checksum {
        /// The checksum in the file.
        stored: u32,
        /// The checksum of the bytes before it.
        computed: u32,
    },
    /// A field's value is not accepted; names the field.
    #[error("{field}: {detail}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

fn field(field: &'static str, detail: impl Into<String>) -> SpecError {
    SpecError::Field {
        field,
        detail: detail.into(),
    }
}

/// Checks a replica list: ascending, distinct, no 0, at most [`MAX_REPLICAS`].
fn check_list(name: &'static str, list: &[NodeId]) -> Result<(), SpecError> {
    if list.len() > MAX_REPLICAS {
        return Err(field(
            name,
            format!("{} nodes, at most {MAX_REPLICAS}", list.len()),
        ));
    }
    if list.contains(&0) {
        return Err(field(name, "node id 0 is reserved"));
    }
    if list.windows(2).any(|w| w[0] >= w[1]) {
        return Err(field(name, "not ascending and distinct"));
    }
    Ok(())
}

impl OooGroupSpec {
    /// Checks the invariants stated on the fields.
    pub fn check(&self) -> Result<(), SpecError> {
        if self.id == 0 {
            return Err(field("id", "group id 0 is reserved"));
        }
        match self.mode {
            Mode::Parallel { span } if span == 0 || span > MAX_SPAN => {
                return Err(field("span", format!("{span}, expected 1 to {MAX_SPAN}")));
            }
            Mode::Dependent if self.conflict_order => {
                return Err(field(
                    "conflict_order",
                    "applies to parallel groups only (a dependent group commits in RAW order)",
                ));
            }
            _ => {}
        }
        if self.voters.is_empty() {
            return Err(field("voters", "no voters"));
        }
        check_list("voters", &self.voters)?;
        check_list("others", &self.others)?;
        if self.params.len() > MAX_PARAMS {
            return Err(field(
                "params",
                format!("{} bytes, at most {MAX_PARAMS}", self.params.len()),
            ));
        }
        if let Some(n) = self.others.iter().find(|n| self.voters.contains(n)) {
            return Err(field("others", format!("node {n} is a voter too")));
        }
        Ok(())
    }

    /// Whether `node` is one of the group's replicas (a voter at creation or one a
    /// membership change may add).
    pub fn knows(&self, node: NodeId) -> bool {
        self.voters.contains(&node) || self.others.contains(&node)
    }

    /// The spec's bytes (layout in `docs/formats.md`); the spec must pass
    /// [`OooGroupSpec::check`].
    pub fn encode(&self) -> Vec<u8> {
        let (mode, span) = match self.mode {
            Mode::Parallel { span } => (1u8, span as u8),
            Mode::Dependent => (2u8, 0),
        };
        let mut b = Vec::with_capacity(HEADER + 8 * (self.voters.len() + self.others.len()) + 4);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(mode);
        b.push(self.conflict_order as u8);
        b.push(span);
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&(self.voters.len() as u16).to_le_bytes());
        b.extend_from_slice(&(self.others.len() as u16).to_le_bytes());
        for n in self.voters.iter().chain(&self.others) {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&(self.params.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.params);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a spec from its bytes, checking the layout, the checksum and every field.
    pub fn decode(b: &[u8]) -> Result<Self, SpecError> {
        if b.len() < HEADER + TRAILER {
            return Err(SpecError::Truncated {
                len: b.len(),
                need: HEADER + TRAILER,
            });
        }
        let found: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if found != MAGIC {
            return Err(SpecError::Magic { found });
        }
        let version = b[4];
        if version != 1 && version != VERSION {
            return Err(SpecError::Version(version));
        }
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let (nv, no) = (u16_at(16), u16_at(18));
        // Bounded before they size anything (at most 2 × 1024 × 8 bytes).
        if nv > MAX_REPLICAS || no > MAX_REPLICAS {
            return Err(field(
                "counts",
                format!("{nv} voters and {no} others, at most {MAX_REPLICAS} each"),
            ));
        }
        let lists = HEADER + 8 * (nv + no);
        // Version 2: `u16 params_len | params` after the lists.
        let np = if version == 1 {
            0
        } else if b.len() < lists + 2 + TRAILER {
            return Err(SpecError::Truncated {
                len: b.len(),
                need: lists + 2 + TRAILER,
            });
        } else {
            u16_at(lists)
        };
        if np > MAX_PARAMS {
            return Err(field("params", format!("{np} bytes, at most {MAX_PARAMS}")));
        }
        let params_at = lists + if version == 1 { 0 } else { 2 };
        let need = params_at + np + TRAILER;
        if b.len() < need {
            return Err(SpecError::Truncated { len: b.len(), need });
        }
        if b.len() > need {
            return Err(SpecError::Trailing { len: b.len(), need });
        }
        let body = need - TRAILER;
        let stored = u32::from_le_bytes(b[body..need].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(&b[..body]);
        if stored != computed {
            return Err(SpecError::Checksum { stored, computed });
        }
        let (mode, flags, span) = (b[5], b[6], b[7]);
        let mode = match mode {
            1 => Mode::Parallel {
                span: span as usize,
            },
            2 if span == 0 => Mode::Dependent,
            2 => return Err(field("span", format!("{span} in a dependent group's spec"))),
            m => {
                return Err(field(
                    "mode",
                    format!("{m}, expected 1 (parallel) or 2 (dependent)"),
                ))
            }
        };
        if flags > 1 {
            return Err(field(
                "flags",
                format!("{flags:#04x}: only bit 0 (conflict order) is defined"),
            ));
        }
        let list = |from: usize, n: usize| (0..n).map(|i| u64_at(from + 8 * i)).collect();
        let spec = Self {
            id: u64_at(8),
            mode,
            conflict_order: flags == 1,
            voters: list(HEADER, nv),
            others: list(HEADER + 8 * nv, no),
            params: b[params_at..params_at + np].to_vec(),
        };
        spec.check()?;
        Ok(spec)
    }
}

/// The spec file of the group whose directory is `dir`.
pub fn spec_path(dir: &Path) -> PathBuf {
    dir.join(SPEC_FILE)
}

/// Writes `spec` into `dir` (created if missing) crash-atomically: a temporary file,
/// synced, renamed over the spec file, then `dir` and its parent synced, so that after a
/// crash the spec is either absent or whole, and its directory entry survives. The file
/// holds the spec's bytes twice, back to back, so that damage to one copy (a flipped
/// bit) leaves the other ([`read_spec`] repairs it).
pub fn write_spec(
    fs: &Arc<dyn FileSystem>,
    dir: &Path,
    spec: &OooGroupSpec,
) -> std::io::Result<()> {
    fs.create_dir_all(dir)?;
    let one = spec.encode();
    let bytes = [one.as_slice(), one.as_slice()].concat();
    let tmp = dir.join(format!("{SPEC_FILE}.tmp"));
    if fs.exists(&tmp)? {
        fs.remove_file(&tmp)?;
    }
    let f = fs.open(&tmp, OpenOptions::create())?;
    f.write_all_at(&bytes, 0)?;
    f.set_len(bytes.len() as u64)?;
    f.sync_data()?;
    drop(f);
    fs.rename(&tmp, &spec_path(dir))?;
    fs.sync_dir(dir)?;
    if let Some(parent) = dir.parent() {
        fs.sync_dir(parent)?;
    }
    Ok(())
}

/// Reads the spec in `dir`: `Ok(None)` for a directory without a spec file (an ordered
/// group's), `Ok(Some(Err(_)))` for a spec file whose bytes hold no valid spec, and
/// `Err` when the file cannot be read (or a damaged copy cannot be rewritten).
///
/// The file holds two copies ([`write_spec`]); the first valid one is taken, and a file
/// with one damaged copy is rewritten whole from the other. A file of one copy (the
/// layout written before) is read as it is.
pub fn read_spec(
    fs: &Arc<dyn FileSystem>,
    dir: &Path,
) -> std::io::Result<Option<Result<OooGroupSpec, SpecError>>> {
    let path = spec_path(dir);
    if !fs.exists(&path)? {
        return Ok(None);
    }
    let f = fs.open(&path, OpenOptions::read_only())?;
    let len = f.len()?;
    // A spec is at most a few KiB; a larger file is refused by its length, not read.
    let max = 2 * (HEADER + 16 * MAX_REPLICAS + 2 + MAX_PARAMS + TRAILER) as u64;
    if len > max {
        return Ok(Some(Err(SpecError::Trailing {
            len: len as usize,
            need: max as usize,
        })));
    }
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, 0)?;
    drop(f);
    let whole = OooGroupSpec::decode(&b);
    if whole.is_ok() || b.len() % 2 == 1 {
        return Ok(Some(whole));
    }
    let (x, y) = b.split_at(b.len() / 2);
    match (OooGroupSpec::decode(x), OooGroupSpec::decode(y)) {
        (Ok(s), Ok(_)) if x == y => Ok(Some(Ok(s))),
        // Two valid copies that differ cannot come from one write: neither is trusted.
        (Ok(_), Ok(_)) => Ok(Some(Err(SpecError::Field {
            field: "copies",
            detail: "the file's two copies are both valid but differ".into(),
        }))),
        (Ok(s), Err(_)) | (Err(_), Ok(s)) => {
            write_spec(fs, dir, &s)?;
            Ok(Some(Ok(s)))
        }
        // Both damaged: the first copy's fault names what is wrong.
        (Err(e), Err(_)) => Ok(Some(Err(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> OooGroupSpec {
        OooGroupSpec {
            id: 42,
            mode: Mode::Parallel { span: 3 },
            conflict_order: true,
            voters: vec![1, 2, 3],
            others: vec![9],
            params: vec![7, 0, 1],
        }
    }

    #[test]
    fn a_spec_round_trips() {
        for s in [
            spec(),
            OooGroupSpec {
                id: u64::MAX,
                mode: Mode::Dependent,
                conflict_order: false,
                voters: vec![7],
                others: vec![],
                params: vec![],
            },
        ] {
            assert_eq!(OooGroupSpec::decode(&s.encode()).unwrap(), s);
        }
    }

    /// A version 1 spec (no parameters) written before parameters existed still reads.
    #[test]
    fn a_version_1_spec_reads_with_no_params() {
        let mut s = spec();
        s.params.clear();
        let v2 = s.encode();
        // Version 1 is version 2 without the params length.
        let lists = v2.len() - 2 - TRAILER;
        let mut v1 = v2[..lists].to_vec();
        v1[4] = 1;
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(OooGroupSpec::decode(&v1).unwrap(), s);
        let mut big = spec();
        big.params = vec![0; MAX_PARAMS + 1];
        assert!(matches!(
            big.check(),
            Err(SpecError::Field {
                field: "params",
                ..
            })
        ));
    }

    /// Every damaged byte, a short or long file and bad fields are typed errors: the
    /// checksum catches any one flipped bit, and fields are checked after it.
    #[test]
    fn damaged_bytes_are_typed_errors() {
        let good = spec().encode();
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[i] ^= 1 << bit;
                assert!(OooGroupSpec::decode(&b).is_err(), "byte {i} bit {bit}");
            }
        }
        for n in 0..good.len() {
            assert!(OooGroupSpec::decode(&good[..n]).is_err(), "cut at {n}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            OooGroupSpec::decode(&long),
            Err(SpecError::Trailing { .. })
        ));
        let mut v = good.clone();
        v[4] = 3;
        assert_eq!(OooGroupSpec::decode(&v), Err(SpecError::Version(3)));
        // A well-formed, well-summed spec with a bad field: named.
        let mut s = spec();
        s.voters = vec![2, 1];
        let e = OooGroupSpec::decode(&s.encode()).unwrap_err();
        assert!(e.to_string().starts_with("voters:"), "{e}");
        s = spec();
        s.mode = Mode::Parallel { span: 0 };
        assert!(matches!(
            s.check(),
            Err(SpecError::Field { field: "span", .. })
        ));
        s = spec();
        s.others = vec![2];
        assert!(matches!(
            s.check(),
            Err(SpecError::Field {
                field: "others",
                ..
            })
        ));
        s = spec();
        s.mode = Mode::Dependent;
        assert!(s.check().is_err(), "conflict order on a dependent group");
    }

    /// Arbitrary bytes, and valid specs with bytes changed and the checksum made to match
    /// again (so the field checks behind it are reached), never panic the decoder; any
    /// spec it accepts re-encodes to exactly the bytes it came from (one encoding per
    /// spec).
    #[test]
    fn no_bytes_panic_the_decoder_and_accepted_ones_are_canonical() {
        let mut rng = chorus_core::rng::Rng::new(7);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let mut b = if rng.chance(1, 4) {
                let mut b = vec![0u8; rng.below(64) as usize];
                rng.fill(&mut b);
                b
            } else {
                let mut s = spec();
                s.voters = (1..=rng.range(1, 5)).collect();
                s.others = (10..10 + rng.below(3)).collect();
                let mut b = s.encode();
                for _ in 0..rng.range(1, 3) {
                    let i = rng.below(b.len() as u64 - 4) as usize;
                    b[i] = rng.next_u64() as u8;
                }
                let body = b.len() - 4;
                let crc = crc32c::crc32c(&b[..body]);
                b[body..].copy_from_slice(&crc.to_le_bytes());
                b
            };
            if let Ok(s) = OooGroupSpec::decode(&b) {
                accepted += 1;
                assert_eq!(s.encode(), b);
            }
            b.clear();
        }
        assert!(accepted > 0, "some changed specs are still valid ones");
    }

    #[test]
    fn a_spec_is_written_and_read_through_the_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let fs: Arc<dyn FileSystem> = Arc::new(chorus_storage::fs::RealFs::new());
        let g = dir.path().join("g");
        assert!(matches!(read_spec(&fs, &g), Ok(None)));
        write_spec(&fs, &g, &spec()).unwrap();
        assert_eq!(read_spec(&fs, &g).unwrap().unwrap().unwrap(), spec());
        assert!(!g.join("ooo.spec.tmp").exists());
        std::fs::write(g.join(SPEC_FILE), b"garbage").unwrap();
        assert!(read_spec(&fs, &g).unwrap().unwrap().is_err());
    }

    /// A flipped bit in either copy is survived and repaired; in both, it is named; a
    /// file of one copy (the layout written before) still reads.
    #[test]
    fn one_damaged_copy_of_a_spec_is_repaired_from_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let fs: Arc<dyn FileSystem> = Arc::new(chorus_storage::fs::RealFs::new());
        let g = dir.path().join("g");
        write_spec(&fs, &g, &spec()).unwrap();
        let path = g.join(SPEC_FILE);
        let good = std::fs::read(&path).unwrap();
        let half = good.len() / 2;
        assert_eq!(good[..half], spec().encode()[..]);
        for at in [0, 9, half - 1, half, half + 20, good.len() - 1] {
            let mut b = good.clone();
            b[at] ^= 0x10;
            std::fs::write(&path, &b).unwrap();
            assert_eq!(
                read_spec(&fs, &g).unwrap().unwrap().unwrap(),
                spec(),
                "{at}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), good, "repaired after {at}");
        }
        let mut b = good.clone();
        b[9] ^= 1;
        b[half + 9] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(read_spec(&fs, &g).unwrap().unwrap().is_err());
        std::fs::write(&path, spec().encode()).unwrap();
        assert_eq!(read_spec(&fs, &g).unwrap().unwrap().unwrap(), spec());
    }
}
