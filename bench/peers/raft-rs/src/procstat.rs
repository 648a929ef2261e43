//! OS accounting over the measured interval, as every system of the matrix reports it
//! (docs/benchmarks/result-fields.md): per replica process the bytes it had written to
//! storage (`/proc/<pid>/io` `write_bytes`) and its CPU time (`/proc/<pid>/stat` utime +
//! stime); for the disk holding the data directory, the writes, sectors and flushes it
//! completed (`/proc/diskstats`). One snapshot after the warm-up, one at the end.
//!
//! Nothing here fails a run: what cannot be read is reported on stderr as
//! `warning: OS accounting: ...` and the fields that need it are null.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

/// The schema's OS fields (null when unknown).
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

#[derive(Clone, Copy)]
struct Disk {
    writes: u64,
    sectors: u64,
    flushes: Option<u64>,
}

pub struct Snapshot {
    at: Instant,
    /// Per pid: (write_bytes, utime+stime ticks).
    procs: Vec<(Option<u64>, Option<u64>)>,
    disk: Option<Disk>,
}

pub struct Accounting {
    pids: Vec<u32>,
    device: Option<(u32, u32)>,
    ticks_per_sec: Option<f64>,
}

fn warn(msg: String) {
    eprintln!("warning: OS accounting: {msg}");
}

impl Accounting {
    /// `pids`: this process first, then the other replicas.
    pub fn new(pids: Vec<u32>, data: &Path) -> Accounting {
        let device = match std::fs::metadata(data) {
            Ok(m) => {
                let d = m.dev() as libc::dev_t;
                Some((libc::major(d), libc::minor(d)))
            }
            Err(e) => {
                warn(format!("stat {}: {e}", data.display()));
                None
            }
        };
        // SAFETY: sysconf only reads a configuration value.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let ticks_per_sec = (hz > 0).then_some(hz as f64);
        if ticks_per_sec.is_none() {
            warn("sysconf(_SC_CLK_TCK) failed".into());
        }
        Accounting {
            pids,
            device,
            ticks_per_sec,
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let procs = self
            .pids
            .iter()
            .map(|&pid| {
                let io = proc_write_bytes(pid).map_err(warn).ok();
                let cpu = proc_cpu_ticks(pid).map_err(warn).ok();
                (io, cpu)
            })
            .collect();
        let disk = self
            .device
            .and_then(|d| disk_counters(d).map_err(warn).ok());
        Snapshot {
            at: Instant::now(),
            procs,
            disk,
        }
    }

    pub fn fields(&self, a: &Snapshot, b: &Snapshot, appends: u64, size: usize) -> OsFields {
        let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
        let mut o = OsFields::default();
        let io: Option<Vec<u64>> = a
            .procs
            .iter()
            .zip(&b.procs)
            .map(|(x, y)| Some(y.0?.saturating_sub(x.0?)))
            .collect();
        if let Some(io) = io {
            let payload = appends as f64 * size as f64;
            if payload > 0.0 && !io.is_empty() {
                o.write_amp = Some(io.iter().sum::<u64>() as f64 / io.len() as f64 / payload);
            }
            o.proc_write_bytes = Some(io);
        }
        let ticks: Option<u64> = a
            .procs
            .iter()
            .zip(&b.procs)
            .map(|(x, y)| Some(y.1?.saturating_sub(x.1?)))
            .sum();
        if let (Some(t), Some(hz)) = (ticks, self.ticks_per_sec) {
            let cpu = t as f64 / hz;
            o.cpu_seconds = Some(cpu);
            if appends > 0 {
                o.cpu_sec_per_million = Some(cpu / appends as f64 * 1e6);
            }
        }
        if let (Some(x), Some(y)) = (a.disk, b.disk) {
            let bytes = y.sectors.saturating_sub(x.sectors) * 512;
            o.dev_write_bytes = Some(bytes);
            o.dev_write_mb_per_sec = Some(bytes as f64 / secs / 1e6);
            o.dev_write_reqs_per_sec = Some(y.writes.saturating_sub(x.writes) as f64 / secs);
            if let (Some(fx), Some(fy)) = (x.flushes, y.flushes) {
                o.dev_flushes_per_sec = Some(fy.saturating_sub(fx) as f64 / secs);
            }
        }
        o
    }
}

fn proc_write_bytes(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/io");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("write_bytes:") {
            return v.trim().parse().map_err(|e| format!("{path}: {e}"));
        }
    }
    Err(format!("{path}: no write_bytes line"))
}

fn proc_cpu_ticks(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    stat_cpu_ticks(&text).ok_or_else(|| format!("{path}: no utime/stime"))
}

/// utime + stime, fields 14 and 15 of a stat line. The command name (field 2) is in
/// parentheses and may contain anything, so counting starts after the last ')', where the
/// next token is field 3.
fn stat_cpu_ticks(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_ascii_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn disk_counters(dev: (u32, u32)) -> Result<Disk, String> {
    let text =
        std::fs::read_to_string("/proc/diskstats").map_err(|e| format!("/proc/diskstats: {e}"))?;
    diskstats_line(&text, dev)
        .ok_or_else(|| format!("/proc/diskstats: no line for device {}:{}", dev.0, dev.1))
}

/// Field 8 (writes completed), 10 (sectors written) and 19 (flushes completed, absent on
/// older kernels) of the device's line; fields counted from 1, major and minor being 1 and 2.
fn diskstats_line(text: &str, (major, minor): (u32, u32)) -> Option<Disk> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_ascii_whitespace().collect();
        if f.len() < 14 || f[0].parse::<u32>().ok()? != major || f[1].parse::<u32>().ok()? != minor
        {
            return None;
        }
        Some(Disk {
            writes: f[7].parse().ok()?,
            sectors: f[9].parse().ok()?,
            flushes: f.get(18).and_then(|v| v.parse().ok()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line() {
        let t = "7 (x) y)) R 1 7 7 0 -1 0 0 0 0 0 11 5 0 0 20 0 1 0 9 9 9";
        assert_eq!(stat_cpu_ticks(t), Some(16));
    }

    #[test]
    fn diskstats() {
        let t = "   8  0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n\
                 253 16 vdb 1 0 0 0 30 0 400 0 0 0 0 0 0 0 0 50 0\n";
        let d = diskstats_line(t, (253, 16)).unwrap();
        assert_eq!((d.writes, d.sectors, d.flushes), (30, 400, Some(50)));
        let short = "253 16 vdb 1 0 0 0 30 0 400 0 0 0 0\n";
        assert_eq!(diskstats_line(short, (253, 16)).unwrap().flushes, None);
        assert!(diskstats_line(short, (8, 0)).is_none());
    }
}
