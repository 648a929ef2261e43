//! OS accounting of the cluster over the measured interval, the same quantities Chorus's
//! `chorus bench` reports (docs/benchmarks.md "Result fields" in the Chorus repository):
//! per process the bytes it caused to be written to storage (`/proc/<pid>/io`
//! write_bytes) and its CPU time (`/proc/<pid>/stat` utime+stime); for the data disk the
//! write requests, sectors written and flushes the block device completed
//! (`/proc/diskstats`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

/// USER_HZ, the unit of utime/stime: 100 on Linux x86_64 and arm64 (fixed by the ABI).
const CLK_TCK: f64 = 100.0;

pub struct Sampler {
    pids: Vec<u32>,
    dev: (u64, u64),
}

#[derive(Clone)]
pub struct Sample {
    at: Instant,
    /// (write_bytes, cpu ticks) per pid.
    procs: Vec<(u64, u64)>,
    /// (writes completed, sectors written, flushes if reported).
    dev: (u64, u64, Option<u64>),
}

/// The schema's OS fields; `None` serializes as null.
#[derive(Default, Serialize)]
pub struct OsFields {
    pub proc_write_bytes: Option<Vec<u64>>,
    pub write_amp: Option<f64>,
    pub cpu_seconds: Option<f64>,
    pub cpu_sec_per_million: Option<f64>,
    pub dev_write_bytes: Option<u64>,
    pub dev_write_reqs_per_sec: Option<f64>,
    pub dev_flushes_per_sec: Option<f64>,
    pub dev_write_mb_per_sec: Option<f64>,
}

impl Sampler {
    pub fn new(pids: Vec<u32>, data_dir: &Path) -> Result<Self, String> {
        let dev = std::fs::metadata(data_dir)
            .map_err(|e| format!("stat {}: {e}", data_dir.display()))?
            .dev();
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let s = Sampler {
            pids,
            dev: (major, minor),
        };
        s.sample()?;
        Ok(s)
    }

    pub fn sample(&self) -> Result<Sample, String> {
        let mut procs = Vec::new();
        for pid in &self.pids {
            procs.push(read_proc(*pid)?);
        }
        let text = std::fs::read_to_string("/proc/diskstats")
            .map_err(|e| format!("/proc/diskstats: {e}"))?;
        let (major, minor) = (self.dev.0.to_string(), self.dev.1.to_string());
        let line = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() >= 14 && f[0] == major && f[1] == minor)
            .ok_or_else(|| format!("no /proc/diskstats line for device {major}:{minor}"))?;
        let num = |i: usize| {
            line[i]
                .parse::<u64>()
                .map_err(|_| format!("/proc/diskstats field {}", i + 1))
        };
        let flushes = if line.len() >= 20 {
            Some(num(18)?)
        } else {
            None
        };
        Ok(Sample {
            at: Instant::now(),
            procs,
            dev: (num(7)?, num(9)?, flushes),
        })
    }
}

fn read_proc(pid: u32) -> Result<(u64, u64), String> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .map_err(|e| format!("/proc/{pid}/io: {e}"))?;
    let wb = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/io: no write_bytes"))?;
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // Field 2 is "(comm)" and may hold spaces and ')': count fields after the last ')'.
    let rest = &st[st
        .rfind(')')
        .ok_or_else(|| format!("/proc/{pid}/stat: no ')'"))?
        + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: field {}", i + 3))
    };
    Ok((wb, tick(11)? + tick(12)?))
}

impl OsFields {
    pub fn from(a: &Sample, b: &Sample, appends: u64, size: usize) -> Self {
        let secs = b.at.duration_since(a.at).as_secs_f64();
        let writes: Vec<u64> = a
            .procs
            .iter()
            .zip(&b.procs)
            .map(|(x, y)| y.0.saturating_sub(x.0))
            .collect();
        let cpu: u64 = a
            .procs
            .iter()
            .zip(&b.procs)
            .map(|(x, y)| y.1.saturating_sub(x.1))
            .sum();
        let cpu_s = cpu as f64 / CLK_TCK;
        let payload = appends as f64 * size as f64;
        let dev_bytes = b.dev.1.saturating_sub(a.dev.1) * 512;
        OsFields {
            write_amp: (appends > 0)
                .then(|| writes.iter().sum::<u64>() as f64 / writes.len() as f64 / payload),
            proc_write_bytes: Some(writes),
            cpu_seconds: Some(cpu_s),
            cpu_sec_per_million: (appends > 0).then(|| cpu_s / appends as f64 * 1e6),
            dev_write_bytes: Some(dev_bytes),
            dev_write_reqs_per_sec: Some(b.dev.0.saturating_sub(a.dev.0) as f64 / secs),
            dev_flushes_per_sec: match (a.dev.2, b.dev.2) {
                (Some(x), Some(y)) => Some(y.saturating_sub(x) as f64 / secs),
                _ => None,
            },
            dev_write_mb_per_sec: Some(dev_bytes as f64 / secs / 1e6),
        }
    }
}
