//! `chorus fs bench`: fio-like closed-loop I/O on one file of the file system through the
//! Rust API, in this process — the libpfs path of PolarFS section 3.1, where the
//! database links the file system library and calls it directly, with no kernel in
//! between. The file is preallocated first (`fallocate`, section 4), so its writes touch
//! no metadata. Each of `jobs` threads issues one I/O at a time: the file system plans
//! where it lies (`write_extents`, `read_extents`) and the volume client carries it, so
//! a write returns once a majority of its chunk's replicas hold it. Figures are the
//! same shape as `chorus volume bench`'s, so the two compare point by point.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_fs::pfs::{read_pieces, write_pieces, OpenFlags, Pfs};
use hdrhistogram::Histogram;
use serde_json::json;

use crate::volume_bench::{lane_offset, Pattern};

/// What one point measured.
struct Point {
    ios: u64,
    errors: u64,
    hist: Histogram<u64>,
}

/// Runs `jobs` threads of `pattern` I/Os of `bs` bytes on `path` (made and preallocated
/// to `file_size` bytes if needed) for `seconds` after a one-second warm-up.
#[allow(clippy::too_many_arguments)]
pub fn run(
    fs: Pfs,
    path: &str,
    file_size: u64,
    pattern: Pattern,
    bs: u64,
    jobs: &[u64],
    seconds: u64,
    json_out: bool,
) -> Result<(), String> {
    if bs == 0 || file_size < bs || seconds == 0 || jobs.iter().any(|&j| j == 0 || j > 256) {
        return Err(
            "--bs, --seconds and every --jobs (at most 256) must be positive, and --file-size at least --bs"
                .into(),
        );
    }
    let mut fs = fs;
    let rw = OpenFlags {
        read: true,
        write: true,
        create: true,
        ..OpenFlags::default()
    };
    let fd = fs.open(path, rw, 0o644).map_err(|e| e.to_string())?;
    let size = fs.fstat(fd).map_err(|e| e.to_string())?.size;
    if size < file_size {
        fs.fallocate(fd, 0, file_size).map_err(|e| e.to_string())?;
    }
    let fs = Arc::new(Mutex::new(fs));
    for &n in jobs {
        let p = run_point(&fs, fd, pattern, bs, file_size, n, seconds);
        let iops = p.ios as f64 / seconds as f64;
        let q = |f: f64| p.hist.value_at_quantile(f);
        let line = json!({
            "pattern": format!("{pattern:?}").to_lowercase(),
            "bs": bs,
            "depth": n,
            "ios": p.ios,
            "errors": p.errors,
            "iops": iops,
            "mib_per_sec": iops * bs as f64 / (1 << 20) as f64,
            "p50_us": q(0.5),
            "p99_us": q(0.99),
            "p999_us": q(0.999),
            "mean_us": (p.hist.mean() * 10.0).round() / 10.0,
        });
        if json_out {
            println!("{line}");
        } else {
            println!(
                "{pattern:?} bs {bs} jobs {n:>3}: {iops:>9.0} IOPS {:>8.1} MiB/s  p50 {} us  p99 {} us  errors {}",
                iops * bs as f64 / (1 << 20) as f64,
                q(0.5),
                q(0.99),
                p.errors
            );
        }
    }
    Ok(())
}

fn run_point(
    fs: &Arc<Mutex<Pfs>>,
    fd: u64,
    pattern: Pattern,
    bs: u64,
    span: u64,
    jobs: u64,
    seconds: u64,
) -> Point {
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
    ));
    let (ios, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let warm = Instant::now() + Duration::from_secs(1);
    let end = warm + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..jobs)
        .map(|lane| {
            let (fs, hist, ios, errors) = (fs.clone(), hist.clone(), ios.clone(), errors.clone());
            std::thread::spawn(move || {
                let data = vec![0xA5u8; bs as usize];
                let mut buf = vec![0u8; bs as usize];
                let mut x =
                    0x9E37_79B9_7F4A_7C15u64 ^ (lane + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                let mut n = 0u64;
                loop {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    let off = lane_offset(pattern, lane, jobs, n, span, bs, &mut x);
                    n += 1;
                    let r = match pattern {
                        Pattern::Randwrite | Pattern::Write => {
                            let (plan, dev) = {
                                let p = fs.lock().unwrap_or_else(|e| e.into_inner());
                                (p.write_extents(fd, off, bs as usize), p.device())
                            };
                            match plan {
                                Ok(Some(e)) => write_pieces(dev.as_ref(), &e, &data),
                                Ok(None) => fs
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .pwrite(fd, &data, off)
                                    .map(|_| ()),
                                Err(e) => Err(e),
                            }
                        }
                        Pattern::Randread | Pattern::Read => {
                            let (plan, dev) = {
                                let p = fs.lock().unwrap_or_else(|e| e.into_inner());
                                (p.read_extents(fd, off, bs as usize), p.device())
                            };
                            plan.and_then(|e| read_pieces(dev.as_ref(), &e, &mut buf).map(|_| ()))
                        }
                    };
                    if now < warm {
                        continue;
                    }
                    match r {
                        Ok(()) => {
                            let us = now.elapsed().as_micros().max(1) as u64;
                            let _ = hist.lock().unwrap_or_else(|e| e.into_inner()).record(us);
                            ios.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("chorus fs bench: {e}");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let hist = hist.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Point {
        ios: ios.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        hist,
    }
}
