//! OS accounting of the cluster over the measured interval, the shared result schema's OS
//! fields: per process the bytes it caused to be written to storage (`/proc/<pid>/io`
//! write_bytes) and its CPU time (`/proc/<pid>/stat` utime+stime); for the data disk the
//! write requests, sectors written and flushes the block device completed
//! (`/proc/diskstats`).
//!
//! Sampling never fails the run: whatever cannot be read is reported on stderr and the
//! fields that depend on it become null.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

pub struct Sampler {
    /// Leader first, then the followers in `--sample-pids` order.
    pids: Vec<u32>,
    /// (major, minor) of the device holding the data directory.
    dev: Option<(u64, u64)>,
    /// sysconf(_SC_CLK_TCK): the unit of utime/stime.
    clk_tck: f64,
}

pub struct Sample {
    at: Instant,
    /// write_bytes per pid.
    io: Vec<Option<u64>>,
    /// utime+stime in ticks per pid.
    cpu: Vec<Option<u64>>,
    /// (writes completed, sectors written, flushes completed if the kernel reports them).
    dev: Option<(u64, u64, Option<u64>)>,
    clk_tck: f64,
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

fn warn(what: &str) {
    eprintln!("warning: OS accounting: {what}");
}

impl Sampler {
    pub fn new(pids: Vec<u32>, data_dir: &Path) -> Self {
        let dev = match std::fs::metadata(data_dir) {
            Ok(m) => {
                let d = m.dev() as libc::dev_t;
                Some((u64::from(libc::major(d)), u64::from(libc::minor(d))))
            }
            Err(e) => {
                warn(&format!("stat {}: {e}", data_dir.display()));
                None
            }
        };
        // SAFETY: sysconf has no preconditions.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let clk_tck = if t > 0 {
            t as f64
        } else {
            warn("sysconf(_SC_CLK_TCK) failed; cpu_seconds will be null");
            0.0
        };
        Sampler { pids, dev, clk_tck }
    }

    /// One sample of every pid and of the device; parts that cannot be read are None.
    pub fn sample(&self) -> Sample {
        let mut io = Vec::with_capacity(self.pids.len());
        let mut cpu = Vec::with_capacity(self.pids.len());
        for &pid in &self.pids {
            io.push(read_io(pid).map_err(|e| warn(&e)).ok());
            cpu.push(read_cpu(pid).map_err(|e| warn(&e)).ok());
        }
        let dev = self
            .dev
            .and_then(|d| read_diskstats(d).map_err(|e| warn(&e)).ok());
        Sample {
            at: Instant::now(),
            io,
            cpu,
            dev,
            clk_tck: self.clk_tck,
        }
    }
}

fn read_io(pid: u32) -> Result<u64, String> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .map_err(|e| format!("/proc/{pid}/io: {e}"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/io: no write_bytes"))
}

fn read_cpu(pid: u32) -> Result<u64, String> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    parse_stat_ticks(&st).ok_or_else(|| format!("/proc/{pid}/stat: cannot parse utime/stime"))
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line. Field 2 is "(comm)" and may
/// hold spaces and ')', so fields are counted after the last ')': field 3 is index 0 there.
fn parse_stat_ticks(st: &str) -> Option<u64> {
    let rest = &st[st.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(14 - 3)?.parse().ok()?;
    let stime: u64 = f.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

fn read_diskstats((major, minor): (u64, u64)) -> Result<(u64, u64, Option<u64>), String> {
    let text =
        std::fs::read_to_string("/proc/diskstats").map_err(|e| format!("/proc/diskstats: {e}"))?;
    parse_diskstats(&text, major, minor)
        .ok_or_else(|| format!("no usable /proc/diskstats line for device {major}:{minor}"))
}

/// (writes completed, sectors written, flushes completed) of the line for major:minor.
/// Fields are 1-based with major, minor, name as 1..3; flushes (field 19) is None on kernels
/// whose lines are shorter.
fn parse_diskstats(text: &str, major: u64, minor: u64) -> Option<(u64, u64, Option<u64>)> {
    let (major, minor) = (major.to_string(), minor.to_string());
    let f = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 14 && f[0] == major && f[1] == minor)?;
    let num = |field: usize| f.get(field - 1).and_then(|v| v.parse::<u64>().ok());
    Some((num(8)?, num(10)?, num(19)))
}

/// Per-element deltas, or None if any element is missing in either sample.
fn deltas(a: &[Option<u64>], b: &[Option<u64>]) -> Option<Vec<u64>> {
    if a.len() != b.len() {
        return None;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| Some(y.as_ref()?.saturating_sub(*x.as_ref()?)))
        .collect()
}

impl OsFields {
    pub fn from(a: &Sample, b: &Sample, appends: u64, size: usize) -> Self {
        let secs = b.at.duration_since(a.at).as_secs_f64();
        let payload = appends as f64 * size as f64;
        let mut o = OsFields::default();

        if let Some(w) = deltas(&a.io, &b.io) {
            if appends > 0 && !w.is_empty() {
                o.write_amp = Some(w.iter().sum::<u64>() as f64 / w.len() as f64 / payload);
            }
            o.proc_write_bytes = Some(w);
        }
        if let Some(c) = deltas(&a.cpu, &b.cpu) {
            if a.clk_tck > 0.0 {
                let cpu_s = c.iter().sum::<u64>() as f64 / a.clk_tck;
                o.cpu_seconds = Some(cpu_s);
                o.cpu_sec_per_million = (appends > 0).then(|| cpu_s / appends as f64 * 1e6);
            }
        }
        if let (Some(x), Some(y)) = (a.dev, b.dev) {
            let bytes = y.1.saturating_sub(x.1) * 512;
            o.dev_write_bytes = Some(bytes);
            o.dev_write_mb_per_sec = Some(bytes as f64 / secs / 1e6);
            o.dev_write_reqs_per_sec = Some(y.0.saturating_sub(x.0) as f64 / secs);
            if let (Some(fx), Some(fy)) = (x.2, y.2) {
                o.dev_flushes_per_sec = Some(fy.saturating_sub(fx) as f64 / secs);
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_comm_with_spaces_and_parens() {
        // Fields 14/15 (utime/stime) are 7 and 3.
        let st = "42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 4 0 1 1 1";
        assert_eq!(parse_stat_ticks(st), Some(10));
    }

    #[test]
    fn diskstats_line() {
        let t = "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11 0 0 0 0 12 13\n \
                 253       1 vda1 10 0 0 0 20 0 300 0 0 0 0 0 0 0 0 40 0\n";
        assert_eq!(parse_diskstats(t, 253, 1), Some((20, 300, Some(40))));
        let old = "253 1 vda1 10 0 0 0 20 0 300 0 0 0 0\n";
        assert_eq!(parse_diskstats(old, 253, 1), Some((20, 300, None)));
        assert_eq!(parse_diskstats(old, 8, 0), None);
    }
}
