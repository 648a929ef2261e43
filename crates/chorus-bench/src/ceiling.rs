//! The physical ceiling for log appends on this disk: the same records Chorus appends,
//! written to one file by one thread with group commit — one `pwrite` + `fdatasync` per
//! 1 MiB batch, `O_DIRECT` — and no replication, no protocol, no checksummed groups. No log
//! on this machine can append durably faster; the benchmark matrix reports Chorus's payload
//! MB/s as a fraction of this (three replicas share this one disk and the two cores, so a
//! fraction near 1/3 would already mean the disk is the limit).

use std::path::Path;
use std::time::{Duration, Instant};

use chorus_storage::align::AlignedBuf;
use chorus_storage::fs::{FileSystem, OpenOptions, RealFs};
use hdrhistogram::Histogram;

use crate::procstat::{usage, Sampler, Usage};

/// Bytes of framing per record: u32 length + u32 CRC32C of the payload — the least a log
/// needs to find and check records after a crash (Chorus's entry header is 24 bytes).
pub const RECORD_FRAME: usize = 8;

/// The file wraps to offset 0 after this many bytes so a long run does not fill the disk;
/// overwriting costs the device the same as appending.
const WRAP_BYTES: u64 = 1 << 30;

/// What one ceiling run measured.
#[derive(Debug)]
pub struct CeilingRun {
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
    /// OS accounting of this process over the interval, if it could be read.
    pub usage: Option<Usage>,
}

/// Appends `size`-byte records in batches of `batch_bytes` to a file in `dir` for `warmup`
/// then `duration`; removes the file.
pub fn run(
    dir: &Path,
    size: usize,
    batch_bytes: usize,
    warmup: Duration,
    duration: Duration,
) -> std::io::Result<CeilingRun> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("chorus-ceiling-{}.dat", std::process::id()));
    let r = run_file(&path, dir, size, batch_bytes, warmup, duration);
    let _ = std::fs::remove_file(&path);
    r
}

fn run_file(
    path: &Path,
    dir: &Path,
    size: usize,
    batch_bytes: usize,
    warmup: Duration,
    duration: Duration,
) -> std::io::Result<CeilingRun> {
    let fs = RealFs::new();
    let direct = fs.supports_direct_io(dir);
    if !direct {
        eprintln!(
            "ceiling: {} refuses O_DIRECT; measuring buffered writes",
            dir.display()
        );
    }
    let f = fs.open(path, OpenOptions::create().with_direct(direct))?;
    // One batch: as many framed records as fit in batch_bytes (at least one), padded to
    // whole 4 KiB pages as O_DIRECT requires.
    let rec = RECORD_FRAME + size;
    let per_batch = (batch_bytes / rec).max(1);
    let mut buf = AlignedBuf::with_capacity((per_batch * rec).div_ceil(4096) * 4096);
    let mut payload = vec![0u8; size];
    for (i, b) in payload.iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    let crc = crc32c::crc32c(&payload);
    for _ in 0..per_batch {
        buf.extend_from_slice(&(size as u32).to_le_bytes());
        buf.extend_from_slice(&crc.to_le_bytes());
        buf.extend_from_slice(&payload);
    }
    let len = buf.len();
    buf.resize(len.div_ceil(4096) * 4096);
    let sampler = Sampler::new(&[std::process::id()], &[], dir)
        .map_err(|e| eprintln!("ceiling: OS accounting unavailable: {e}"))
        .ok();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let mut off = 0u64;
    let start = Instant::now();
    let mut measuring: Option<(Instant, Option<crate::procstat::Sample>)> = None;
    let (mut records, mut batches) = (0u64, 0u64);
    loop {
        let now = Instant::now();
        if measuring.is_none() && now.duration_since(start) >= warmup {
            let s = sampler.as_ref().and_then(|s| s.sample().ok());
            measuring = Some((Instant::now(), s));
        }
        if let Some((m0, _)) = &measuring {
            if m0.elapsed() >= duration {
                break;
            }
        }
        let t = Instant::now();
        f.write_all_at(&buf, off)?;
        f.sync_data()?;
        if measuring.is_some() {
            let _ = hist.record(t.elapsed().as_micros() as u64);
            records += per_batch as u64;
            batches += 1;
        }
        off += buf.len() as u64;
        if off >= WRAP_BYTES {
            off = 0;
        }
    }
    let (m0, s0) = measuring.expect("the loop measures before it ends");
    let seconds = m0.elapsed().as_secs_f64();
    let usage = match (sampler.as_ref().map(|s| s.sample()), s0) {
        (Some(Ok(s1)), Some(s0)) => Some(usage(&s0, &s1)),
        _ => None,
    };
    Ok(CeilingRun {
        records,
        batches,
        seconds,
        hist,
        direct,
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_writes_whole_batches_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("chorus-ceiling-test-{}", std::process::id()));
        let r = run(
            &dir,
            512,
            64 << 10,
            Duration::from_millis(50),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(r.batches > 0, "{r:?}");
        assert_eq!(r.records, r.batches * (65536 / 520) as u64);
        assert_eq!(r.hist.len(), r.batches);
        assert!(
            std::fs::read_dir(&dir).unwrap().next().is_none(),
            "file removed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
