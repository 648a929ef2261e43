//! The physical ceiling for log appends on this disk: records of the same size Chorus
//! appends, written to one file by one thread with group commit — one `pwrite` +
//! `fdatasync` per 1 MiB batch, `O_DIRECT` — and no replication, no protocol, no
//! checksummed groups. No log on this machine can append durably faster; the benchmark
//! matrix reports every system's appends/s as a fraction of this (three replicas share this
//! one disk and the two cores, so a fraction near 1/3 would already mean the disk is the
//! limit).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chorus_storage::align::AlignedBuf;
use chorus_storage::fs::{FileSystem, FsFile, OpenOptions, RealFs};
use hdrhistogram::Histogram;

use crate::procstat::{usage, BenchResult, RunPoint, Sample, Sampler, Usage};

/// Bytes of framing per record: u32 length + u32 CRC32C of the payload — the least a log
/// needs to find and check records after a crash (Chorus's entry header is 24 bytes), so
/// the ceiling writes a realistic byte count per record without a real log's format.
pub const RECORD_FRAME: usize = 8;

/// At most this many bytes of file are written in a ring.
///
/// The ring is written once before the warm-up, then overwritten batch after batch. That
/// makes every measured `fdatasync` a pure data flush: appending past the end of a file (or
/// into `fallocate`d, "unwritten" extents) also changes the file's size or extent map, so
/// ext4 commits its journal on each `fdatasync`. Measured here (ext4 on virtio, 2026-11-23):
/// with 1 MiB batches appending, extending in 64 MiB steps, `fallocate` in 64 MiB steps and
/// overwriting all gave 1.3–1.75 GB/s with no consistent order (the metadata commit
/// vanishes next to 1 MiB of data); with 16 KiB batches overwriting reached 117–129 MB/s
/// against 72–101 MB/s for the other three. A ceiling should be the cheapest durable write
/// the disk offers, so it overwrites. 1 GiB keeps the device's own write cache from
/// holding the whole ring.
pub const MAX_RING_BYTES: u64 = 1 << 30;

/// Largest record payload: the 4-byte length field would hold more, but a 1 GiB batch
/// buffer of such records is already far beyond a log's group.
pub const MAX_RECORD: usize = 16 << 20;

/// Largest batch (and so largest buffer held in memory).
pub const MAX_BATCH: usize = 1 << 30;

/// Longest warm-up or measured interval accepted, in seconds.
pub const MAX_SECONDS: f64 = 3600.0;

/// What went wrong measuring the ceiling.
#[derive(Debug, thiserror::Error)]
pub enum CeilingError {
    /// An argument was out of range.
    #[error("{name} {value}: {expected}")]
    Argument {
        /// The argument, as the command line names it.
        name: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// `secs` as a [`Duration`] if it is a number of seconds within `0..=MAX_SECONDS`
/// (`positive`: greater than 0), else an error naming `name`.
pub fn seconds(name: &'static str, secs: f64, positive: bool) -> Result<Duration, CeilingError> {
    let ok = secs.is_finite() && secs <= MAX_SECONDS && (secs > 0.0 || !positive && secs == 0.0);
    if !ok {
        return Err(CeilingError::Argument {
            name,
            value: secs.to_string(),
            expected: if positive {
                "expected seconds in (0, 3600]"
            } else {
                "expected seconds in [0, 3600]"
            },
        });
    }
    Ok(Duration::from_secs_f64(secs))
}

/// What one ceiling run measured.
#[derive(Debug)]
pub struct CeilingRun {
    /// Payload bytes per record.
    pub size: usize,
    /// Bytes written per batch (framed records, padded to whole 4 KiB pages).
    pub batch_bytes: usize,
    /// Records written in the measured interval.
    pub records: u64,
    /// Batches (fdatasyncs) in the measured interval.
    pub batches: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Write + fdatasync latency per batch, microseconds.
    pub hist: Histogram<u64>,
    /// Whether the file was opened with O_DIRECT.
    pub direct: bool,
    /// Bytes of the ring the batches were written over (see [`MAX_RING_BYTES`]).
    pub ring_bytes: u64,
    /// OS accounting of this process over the interval, if it could be read.
    pub usage: Option<Usage>,
}

impl CeilingRun {
    /// The run in the benchmark matrix's result schema: system `"ceiling"`, path
    /// `"direct"`, 1 client, 1 replica; latency is per batch; `fsyncs_per_sec` counts this
    /// run's own fdatasyncs; extra fields `"direct"` (false when the file system refused
    /// O_DIRECT), `"batch_bytes"` and `"record_frame_bytes"`.
    pub fn result(&self) -> BenchResult {
        let point = RunPoint {
            system: "ceiling".into(),
            path: "direct".into(),
            commit_mode: None,
            clients: 1,
            size: self.size as u64,
            replicas: 1,
        };
        let mut r = BenchResult::new(point, self.records, self.seconds, &self.hist);
        if let Some(u) = &self.usage {
            r.fill_usage(u);
        }
        r.fsyncs_per_sec = (self.seconds > 0.0).then(|| self.batches as f64 / self.seconds);
        // None of these names is a schema field, so insert_extra cannot refuse them.
        let _ = r.insert_extra("direct", self.direct);
        let _ = r.insert_extra("batch_bytes", self.batch_bytes);
        let _ = r.insert_extra("record_frame_bytes", RECORD_FRAME);
        r
    }
}

/// Appends `size`-byte records in batches of about `batch_bytes` to a file in `dir` for
/// `warmup`, then for `duration` measured; removes the file (and `dir`, if this created it).
pub fn run(
    dir: &Path,
    size: usize,
    batch_bytes: usize,
    warmup: Duration,
    duration: Duration,
) -> Result<CeilingRun, CeilingError> {
    run_ring(dir, size, batch_bytes, warmup, duration, MAX_RING_BYTES)
}

/// [`run`] with the ring capped at `max_ring` bytes (tests keep it small).
fn run_ring(
    dir: &Path,
    size: usize,
    batch_bytes: usize,
    warmup: Duration,
    duration: Duration,
    max_ring: u64,
) -> Result<CeilingRun, CeilingError> {
    if size == 0 || size > MAX_RECORD {
        return Err(CeilingError::Argument {
            name: "--size",
            value: size.to_string(),
            expected: "expected 1..=16777216 payload bytes per record",
        });
    }
    if batch_bytes == 0 || batch_bytes > MAX_BATCH {
        return Err(CeilingError::Argument {
            name: "--batch-bytes",
            value: batch_bytes.to_string(),
            expected: "expected 1..=1073741824 bytes per batch",
        });
    }
    for (name, d, positive) in [("--warmup", warmup, false), ("--duration", duration, true)] {
        seconds(name, d.as_secs_f64(), positive)?;
    }
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|source| CeilingError::Io {
        op: "create directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(format!("chorus-ceiling-{}.dat", std::process::id()));
    let r = run_file(&path, dir, size, batch_bytes, (warmup, duration), max_ring);
    let _ = std::fs::remove_file(&path);
    if created {
        let _ = std::fs::remove_dir(dir);
    }
    r
}

/// Bytes free for an unprivileged writer on the file system holding `dir`, if known.
fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs that the call
    // fills; both outlive the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// One batch: as many framed records as fit in `batch_bytes` (at least one), padded with
/// zeros to whole 4 KiB pages as O_DIRECT requires, in a page-aligned buffer. Returns the
/// buffer and its record count.
fn batch(size: usize, batch_bytes: usize) -> (AlignedBuf, usize) {
    let rec = RECORD_FRAME + size;
    let per_batch = (batch_bytes / rec).max(1);
    let mut buf = AlignedBuf::with_capacity((per_batch * rec).div_ceil(4096) * 4096);
    // A non-constant payload, so no layer below can compress or deduplicate it away.
    let payload: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let crc = crc32c::crc32c(&payload);
    for _ in 0..per_batch {
        // `size` ≤ MAX_RECORD, so it fits the u32 length field.
        buf.extend_from_slice(&(size as u32).to_le_bytes());
        buf.extend_from_slice(&crc.to_le_bytes());
        buf.extend_from_slice(&payload);
    }
    let len = buf.len();
    buf.resize(len.div_ceil(4096) * 4096);
    (buf, per_batch)
}

fn run_file(
    path: &Path,
    dir: &Path,
    size: usize,
    batch_bytes: usize,
    (warmup, duration): (Duration, Duration),
    max_ring: u64,
) -> Result<CeilingRun, CeilingError> {
    let io = |op: &'static str| {
        move |source| CeilingError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let fs = RealFs::new();
    let direct = fs.supports_direct_io(dir);
    if !direct {
        eprintln!(
            "ceiling: {} refuses O_DIRECT; measuring buffered writes (\"direct\": false)",
            dir.display()
        );
    }
    let f = fs
        .open(path, OpenOptions::create().with_direct(direct))
        .map_err(io("open"))?;
    let (buf, per_batch) = batch(size, batch_bytes);
    let step = buf.len() as u64;
    // The ring: at most `max_ring` and a quarter of the free space, whole batches.
    let room = free_bytes(dir).map_or(max_ring, |b| (b / 4).min(max_ring));
    let ring_bytes = (room / step).max(1) * step;
    prewrite(&*f, &buf, ring_bytes).map_err(io("pre-write ring of"))?;

    let sampler = Sampler::new(&[std::process::id()], &[], dir)
        .map_err(|e| eprintln!("ceiling: OS accounting unavailable: {e}"))
        .ok();
    // Constant bounds (1 µs to 60 s, 3 significant digits) that hdrhistogram accepts.
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid constant bounds");
    let mut off = 0u64;
    let start = Instant::now();
    // Set when the measured interval starts: its start instant and the OS sample then.
    let mut measuring: Option<(Instant, Option<Sample>)> = None;
    let (mut records, mut batches) = (0u64, 0u64);
    let m0 = loop {
        let now = Instant::now();
        if measuring.is_none() && now.duration_since(start) >= warmup {
            let s = sampler.as_ref().and_then(|s| s.sample().ok());
            measuring = Some((Instant::now(), s));
        }
        if let Some((m0, _)) = &measuring {
            if m0.elapsed() >= duration {
                break *m0;
            }
        }
        let t = Instant::now();
        f.write_all_at(&buf, off).map_err(io("write"))?;
        f.sync_data().map_err(io("fdatasync"))?;
        if measuring.is_some() {
            hist.saturating_record(t.elapsed().as_micros() as u64);
            records += per_batch as u64;
            batches += 1;
        }
        off += step;
        if off >= ring_bytes {
            off = 0;
        }
    };
    let seconds = m0.elapsed().as_secs_f64();
    let s0 = measuring.and_then(|(_, s)| s);
    let usage = match (sampler.as_ref().map(|s| s.sample()), s0) {
        (Some(Ok(s1)), Some(s0)) => Some(usage(&s0, &s1)),
        _ => None,
    };
    Ok(CeilingRun {
        size,
        batch_bytes: buf.len(),
        records,
        batches,
        seconds,
        hist,
        direct,
        ring_bytes,
        usage,
    })
}

/// Writes `buf` over `[0, ring_bytes)` and flushes once, so that the measured writes
/// overwrite allocated, written blocks (see [`MAX_RING_BYTES`]).
fn prewrite(f: &dyn FsFile, buf: &AlignedBuf, ring_bytes: u64) -> std::io::Result<()> {
    let mut off = 0;
    while off < ring_bytes {
        f.write_all_at(buf, off)?;
        off += buf.len() as u64;
    }
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_writes_whole_batches_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("chorus-ceiling-test-{}", std::process::id()));
        let r = run_ring(
            &dir,
            512,
            64 << 10,
            Duration::from_millis(50),
            Duration::from_millis(300),
            1 << 20,
        )
        .unwrap();
        assert_eq!(r.ring_bytes, 1 << 20);
        assert!(r.batches > 0, "{r:?}");
        assert_eq!(r.records, r.batches * (65536 / 520) as u64);
        assert_eq!(r.hist.len(), r.batches);
        assert_eq!(
            r.batch_bytes, 65536,
            "126 records of 520 B, padded to 16 pages"
        );
        assert!(
            !dir.exists(),
            "the file and the directory it created are removed"
        );
        let v: serde_json::Value = serde_json::from_str(&r.result().to_json_line()).unwrap();
        assert_eq!(v["system"], "ceiling");
        assert_eq!(v["path"], "direct");
        assert_eq!(v["clients"], 1);
        assert_eq!(v["replicas"], 1);
        assert_eq!(v["appends"], r.records);
        assert!(v["fsyncs_per_sec"].as_f64().unwrap() > 0.0);
        assert!(v["direct"].is_boolean());
        if r.usage.is_some() {
            // This process wrote at least the framed records in the interval.
            let wa = v["write_amp"].as_f64().unwrap();
            assert!(wa >= 520.0 / 512.0 * 0.99, "{v}");
        }
    }

    #[test]
    fn bad_arguments_are_named() {
        let d = Path::new("/nonexistent-never-created");
        let s = Duration::from_secs(1);
        let e = run(d, 0, 1 << 20, s, s).unwrap_err();
        assert!(e.to_string().starts_with("--size 0:"), "{e}");
        let e = run(d, 512, 0, s, s).unwrap_err();
        assert!(e.to_string().starts_with("--batch-bytes 0:"), "{e}");
        let e = run(d, 512, 1 << 20, s, Duration::ZERO).unwrap_err();
        assert!(e.to_string().starts_with("--duration 0:"), "{e}");
        assert!(seconds("--warmup", -1.0, false).is_err());
        assert!(seconds("--warmup", f64::NAN, false).is_err());
        assert!(seconds("--duration", 1e300, true).is_err());
        assert_eq!(seconds("--warmup", 0.0, false).unwrap(), Duration::ZERO);
        assert!(!d.exists());
    }

    #[test]
    fn an_unwritable_directory_is_named() {
        let e = run(
            Path::new("/proc/chorus-ceiling"),
            512,
            4096,
            Duration::ZERO,
            Duration::from_millis(10),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/proc/chorus-ceiling"), "{e}");
    }

    #[test]
    fn a_record_larger_than_the_batch_makes_a_batch_of_one() {
        let (buf, n) = batch(5000, 4096);
        assert_eq!((n, buf.len()), (1, 8192));
        assert_eq!(&buf[..4], &5000u32.to_le_bytes());
    }
}
