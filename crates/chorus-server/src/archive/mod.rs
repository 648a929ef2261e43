//! PALF's archive and restore (PALF section 5.2: a standby can be fed "from the archive
//! instead of a live primary"): each ordered group's committed log, copied in order to
//! object storage (S3 or a local directory) by the node that leads the group, in
//! segments ([`segment`]); read back by `chorus restore` and `chorus mirror
//! --from-archive`, which write it into a mirror group at the same LSNs and CSNs.
//!
//! **Layout.** Under the archive's prefix, one folder per log group and one object per
//! segment, named so that a listing alone tells what the archive holds:
//!
//! ```text
//! <prefix>/group-<group>/<start_lsn:020>-<end_lsn:020>-<max_csn:020>.seg
//! ```
//!
//! **Why the listing is the record of progress.** Segments hold committed log only, and a
//! committed log is the same on every replica, so two nodes that both believe they lead
//! (an old leader not yet told) may both write segments: they hold the same bytes where
//! they overlap. What the archive holds is the chain of segments from its first: at each
//! point, the segment that covers it and reaches furthest ([`ArchiveView`]). No separate
//! progress object can disagree with it.
//!
//! **Trimming.** With `[archive]` on, a node trims a group's log only below what the
//! archive holds ([`Archive::check_trim`]), so nothing not yet archived is deleted.

pub mod archiver;
pub mod cli;
pub mod segment;

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

pub use segment::Segment;

/// `[archive]`: where this node archives the ordered groups it leads.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSection {
    /// Where: `s3://bucket/prefix` or `file:///absolute/directory`.
    pub url: String,
    /// An S3-compatible server's endpoint, e.g. `http://10.0.0.5:9000` (unset: AWS).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The S3 region (default `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// A file holding the S3 access key id (unset: `AWS_ACCESS_KEY_ID`).
    #[serde(default)]
    pub access_key_id_file: Option<PathBuf>,
    /// A file holding the S3 secret access key (unset: `AWS_SECRET_ACCESS_KEY`).
    #[serde(default)]
    pub secret_access_key_file: Option<PathBuf>,
    /// Allow a plain-HTTP endpoint (test servers).
    #[serde(default)]
    pub allow_http: bool,
    /// The ordered groups to archive (empty: all of them).
    #[serde(default)]
    pub groups: Vec<u64>,
    /// A segment is written once this many bytes are committed past the archive's end
    /// (and at most about this many go in one).
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    /// ... or once committed log has waited this long (milliseconds): how far the archive
    /// may lag the log when appends are few.
    #[serde(default = "default_flush_ms")]
    pub flush_ms: u64,
}

fn default_segment_bytes() -> u64 {
    4 << 20
}

fn default_flush_ms() -> u64 {
    1000
}

/// Where an archive is, as a client gives it (`--archive`, `--archive-endpoint`, …).
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// `s3://bucket/prefix` or `file:///dir`.
    pub url: String,
    /// S3-compatible endpoint.
    pub endpoint: Option<String>,
    /// S3 region.
    pub region: Option<String>,
    /// Access key id (else from the environment).
    pub access_key_id: Option<String>,
    /// Secret access key (else from the environment).
    pub secret_access_key: Option<String>,
    /// Allow plain HTTP.
    pub allow_http: bool,
}

impl ArchiveSection {
    /// The target, with key files read.
    pub fn target(&self) -> Result<Target, ArchiveError> {
        let read = |what: &str, p: &Option<PathBuf>| -> Result<Option<String>, ArchiveError> {
            p.as_ref()
                .map(|p| {
                    std::fs::read_to_string(p)
                        .map(|s| s.trim().to_string())
                        .map_err(|e| {
                            ArchiveError::Config(format!("archive.{what} `{}`: {e}", p.display()))
                        })
                })
                .transpose()
        };
        Ok(Target {
            url: self.url.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: read("access_key_id_file", &self.access_key_id_file)?,
            secret_access_key: read("secret_access_key_file", &self.secret_access_key_file)?,
            allow_http: self.allow_http,
        })
    }

    /// Whether group `g` is archived.
    pub fn covers(&self, g: u64) -> bool {
        self.groups.is_empty() || self.groups.contains(&g)
    }
}

/// What went wrong with the archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The archive's settings are not usable.
    #[error("archive: {0}")]
    Config(String),
    /// The object store failed.
    #[error("archive {at}: {source}")]
    Store {
        /// Where.
        at: String,
        /// Why.
        source: object_store::Error,
    },
    /// A segment's bytes are damaged or not a segment.
    #[error(transparent)]
    Segment(#[from] segment::SegmentError),
}

/// One segment as its name describes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SegmentName {
    /// LSN of its first log group.
    pub start_lsn: u64,
    /// LSN just past its last.
    pub end_lsn: u64,
    /// Its last log group's max CSN.
    pub max_csn: u64,
    /// The object's path.
    pub path: String,
}

/// What the archive holds of one group: the chain of segments from its first.
///
/// Invariants: `chain` is in LSN order, the first starts at `start_lsn`, each starts at or
/// below where the one before ended and ends above it, and the last ends at `end_lsn`;
/// empty chain means nothing archived (`start_lsn == end_lsn == 0`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchiveView {
    /// Where the archive begins.
    pub start_lsn: u64,
    /// Where the contiguous archive ends: everything in `start_lsn..end_lsn` is archived.
    pub end_lsn: u64,
    /// The max CSN of the log group ending at `end_lsn` (0 when empty).
    pub max_csn: u64,
    /// The segments that make it up, in order.
    pub chain: Vec<SegmentName>,
    /// Segments past a gap (written beyond `end_lsn` with nothing reaching them): not
    /// part of what the archive holds.
    pub beyond_gap: usize,
    /// Objects under the group's folder that are not segments (ignored).
    pub strays: usize,
}

impl ArchiveView {
    /// Builds the chain from a listing.
    pub fn from_segments(mut segs: Vec<SegmentName>) -> Self {
        segs.sort();
        let Some(first) = segs.first() else {
            return Self::default();
        };
        let (start, mut pos, mut max_csn) = (first.start_lsn, first.start_lsn, 0);
        let mut chain = Vec::new();
        loop {
            let next = segs
                .iter()
                .filter(|s| s.start_lsn <= pos && s.end_lsn > pos)
                .max_by_key(|s| s.end_lsn);
            match next {
                Some(s) => {
                    pos = s.end_lsn;
                    max_csn = s.max_csn;
                    chain.push(s.clone());
                }
                None => break,
            }
        }
        let beyond_gap = segs.iter().filter(|s| s.start_lsn > pos).count();
        Self {
            start_lsn: start,
            end_lsn: pos,
            max_csn,
            chain,
            beyond_gap,
            strays: 0,
        }
    }

    /// The segment holding `lsn` (at or above `start_lsn`, below `end_lsn`).
    pub fn segment_at(&self, lsn: u64) -> Option<&SegmentName> {
        self.chain
            .iter()
            .find(|s| s.start_lsn <= lsn && s.end_lsn > lsn)
    }
}

/// An open archive.
#[derive(Clone, Debug)]
pub struct Archive {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    /// The URL it was opened from, for messages.
    url: String,
}

impl Archive {
    /// Opens the archive `t` describes (nothing is read or written yet).
    pub fn open(t: &Target) -> Result<Self, ArchiveError> {
        // HTTPS to the store goes through rustls with ring, as every other connection of
        // the process does; already installed (by another part) is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let bad = |d: String| ArchiveError::Config(format!("archive url `{}`: {d}", t.url));
        let url = url::Url::parse(&t.url).map_err(|e| bad(e.to_string()))?;
        let (store, prefix): (Arc<dyn ObjectStore>, ObjPath) = match url.scheme() {
            "s3" => {
                let bucket = url
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| bad("no bucket (expected s3://bucket/prefix)".into()))?;
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_region(t.region.clone().unwrap_or_else(|| "us-east-1".into()))
                    .with_allow_http(t.allow_http);
                if let Some(e) = &t.endpoint {
                    b = b.with_endpoint(e);
                }
                if let Some(k) = &t.access_key_id {
                    b = b.with_access_key_id(k);
                }
                if let Some(k) = &t.secret_access_key {
                    b = b.with_secret_access_key(k);
                }
                let s = b.build().map_err(|e| bad(e.to_string()))?;
                let prefix =
                    ObjPath::parse(url.path().trim_matches('/')).map_err(|e| bad(e.to_string()))?;
                (Arc::new(s), prefix)
            }
            "file" => {
                let dir = url
                    .to_file_path()
                    .map_err(|_| bad("not an absolute local path".into()))?;
                std::fs::create_dir_all(&dir)
                    .map_err(|e| bad(format!("creating {}: {e}", dir.display())))?;
                let s = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(e.to_string()))?;
                (Arc::new(s), ObjPath::default())
            }
            other => {
                return Err(bad(format!(
                    "scheme `{other}` (expected s3://bucket/prefix or file:///dir)"
                )))
            }
        };
        Ok(Self {
            store,
            prefix,
            url: t.url.clone(),
        })
    }

    /// The URL it was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn folder(&self, group: u64) -> ObjPath {
        self.prefix.clone().join(format!("group-{group}"))
    }

    fn store_err(
        &self,
        at: impl std::fmt::Display,
    ) -> impl FnOnce(object_store::Error) -> ArchiveError {
        let at = format!("{} {at}", self.url);
        move |source| ArchiveError::Store { at, source }
    }

    /// The groups the archive has folders for.
    pub async fn groups(&self) -> Result<Vec<u64>, ArchiveError> {
        let l = self
            .store
            .list_with_delimiter(Some(&self.prefix))
            .await
            .map_err(self.store_err("listing groups"))?;
        let mut out: Vec<u64> = l
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename()?.strip_prefix("group-")?.parse().ok())
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// What the archive holds of `group`, from a listing of its folder.
    pub async fn view(&self, group: u64) -> Result<ArchiveView, ArchiveError> {
        let folder = self.folder(group);
        let metas: Vec<_> = self
            .store
            .list(Some(&folder))
            .try_collect()
            .await
            .map_err(self.store_err(format!("listing group {group}")))?;
        let mut segs = Vec::new();
        let mut strays = 0;
        for m in metas {
            match parse_name(m.location.filename().unwrap_or_default()) {
                Some((start_lsn, end_lsn, max_csn)) => segs.push(SegmentName {
                    start_lsn,
                    end_lsn,
                    max_csn,
                    path: m.location.to_string(),
                }),
                None => strays += 1,
            }
        }
        let mut v = ArchiveView::from_segments(segs);
        v.strays = strays;
        Ok(v)
    }

    /// Writes a segment of `group` holding log groups `groups` (whole, contiguous);
    /// returns its name once the store has it.
    pub async fn put(&self, group: u64, groups: &[Vec<u8>]) -> Result<SegmentName, ArchiveError> {
        let (bytes, start_lsn, end_lsn, max_csn) =
            segment::encode(group, groups).map_err(ArchiveError::Config)?;
        let path = self
            .folder(group)
            .join(format!("{start_lsn:020}-{end_lsn:020}-{max_csn:020}.seg"));
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(self.store_err(&path))?;
        Ok(SegmentName {
            start_lsn,
            end_lsn,
            max_csn,
            path: path.to_string(),
        })
    }

    /// Reads and checks segment `s` of `group`.
    pub async fn get(&self, group: u64, s: &SegmentName) -> Result<Segment, ArchiveError> {
        let path = ObjPath::parse(&s.path).map_err(|e| ArchiveError::Config(e.to_string()))?;
        let bytes = self
            .store
            .get(&path)
            .await
            .map_err(self.store_err(&path))?
            .bytes()
            .await
            .map_err(self.store_err(&path))?;
        let seg = segment::decode(&s.path, &bytes)?;
        if seg.group != group || seg.start_lsn != s.start_lsn || seg.end_lsn != s.end_lsn {
            return Err(segment::SegmentError {
                name: s.path.clone(),
                detail: format!(
                    "holds group {} LSNs {}..{}, its name says group {group} LSNs {}..{}",
                    seg.group, seg.start_lsn, seg.end_lsn, s.start_lsn, s.end_lsn
                ),
            }
            .into());
        }
        Ok(seg)
    }

    /// `Err` (naming both) unless everything of `group` below `lsn` that the log still
    /// holds — from `log_start` — is archived: what a trim to `lsn` needs.
    pub async fn check_trim(&self, group: u64, log_start: u64, lsn: u64) -> Result<(), String> {
        let v = self.view(group).await.map_err(|e| {
            format!("group {group}: not trimmed: the archive could not be read: {e}")
        })?;
        if lsn <= log_start {
            return Ok(());
        }
        if v.chain.is_empty() || v.start_lsn > log_start || v.end_lsn < lsn {
            let held = if v.chain.is_empty() {
                "nothing".to_string()
            } else {
                format!("LSNs {}..{}", v.start_lsn, v.end_lsn)
            };
            return Err(format!(
                "group {group}: not trimmed to LSN {lsn}: the archive ({}) holds {held} of a log starting at {log_start}; trimming would delete what is not archived",
                self.url
            ));
        }
        Ok(())
    }
}

/// `<start:020>-<end:020>-<max_csn:020>.seg`.
fn parse_name(name: &str) -> Option<(u64, u64, u64)> {
    let stem = name.strip_suffix(".seg")?;
    let mut it = stem.split('-').map(|p| p.parse::<u64>().ok());
    let (a, b, c) = (it.next()??, it.next()??, it.next()??);
    (it.next().is_none() && b > a).then_some((a, b, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(a: u64, b: u64) -> SegmentName {
        SegmentName {
            start_lsn: a,
            end_lsn: b,
            max_csn: b / 10,
            path: format!("{a}-{b}"),
        }
    }

    #[test]
    fn the_chain_follows_overlaps_and_stops_at_a_gap() {
        // Two archivers raced: 100..200 and 100..180, 180..300 and 200..250.
        let v = ArchiveView::from_segments(vec![
            seg(0, 100),
            seg(100, 200),
            seg(100, 180),
            seg(200, 250),
            seg(180, 300),
            seg(400, 500),
        ]);
        assert_eq!((v.start_lsn, v.end_lsn, v.max_csn), (0, 300, 30));
        assert_eq!(v.beyond_gap, 1);
        assert_eq!(v.segment_at(250).unwrap().path, "180-300");
        assert!(v.segment_at(300).is_none());
        assert_eq!(ArchiveView::from_segments(vec![]), ArchiveView::default());
    }

    #[test]
    fn only_segment_names_parse() {
        assert_eq!(
            parse_name("00000000000000000064-00000000000000000128-00000000000000000007.seg"),
            Some((64, 128, 7))
        );
        for bad in ["x.seg", "1-2.seg", "2-1-0.seg", "1-2-3", "1-2-3-4.seg"] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn a_directory_archive_lists_what_was_put_and_guards_trims() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Archive::open(&Target {
            url: format!("file://{}", tmp.path().join("arch").display()),
            ..Default::default()
        })
        .unwrap();
        let groups = segment::tests::log_groups();
        let s1 = a.put(3, &groups[..2]).await.unwrap();
        let v = a.view(3).await.unwrap();
        assert_eq!((v.start_lsn, v.end_lsn), (0, s1.end_lsn));
        assert!(a.check_trim(3, 0, s1.end_lsn).await.is_ok());
        let e = a.check_trim(3, 0, s1.end_lsn + 1).await.unwrap_err();
        assert!(e.contains("not archived"), "{e}");
        let s2 = a.put(3, &groups[2..]).await.unwrap();
        let v = a.view(3).await.unwrap();
        assert_eq!((v.end_lsn, v.max_csn, v.chain.len()), (s2.end_lsn, 12, 2));
        let got = a.get(3, &v.chain[1]).await.unwrap();
        assert_eq!(got.groups[0].1, groups[2]);
        // Nothing archived of another group: no trim above its start.
        assert!(a.check_trim(4, 0, 1).await.is_err());
        assert!(a.check_trim(4, 5, 5).await.is_ok());
    }
}
