//! OS accounting for benchmarks: what the processes under test really cost.
//!
//! Every system in the benchmark matrix (Chorus and its baselines) is measured the same way,
//! from outside its own counters: per process, the bytes it caused to be written to storage
//! (`write_bytes` in `/proc/<pid>/io`) and its CPU time (`utime + stime` in
//! `/proc/<pid>/stat`); for the disk holding the data, the write requests, sectors written
//! and flushes the block device completed (`/proc/diskstats`). A benchmark samples once at
//! the start of its measured interval and once at its end; [`usage`] gives the deltas.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// What went wrong reading the OS accounting, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ProcStatError {
    /// A file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file did not have the expected shape.
    #[error("{path}: {what}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was missing or malformed.
        what: String,
    },
    /// No line of `/proc/diskstats` names the device holding the data directory.
    #[error("no /proc/diskstats line for device {major}:{minor} (holding {dir})")]
    NoDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
        /// The data directory.
        dir: PathBuf,
    },
}

/// Counters of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcCounters {
    /// Bytes this process caused to be sent to the storage layer.
    pub write_bytes: u64,
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
}

/// Counters of one block device (the fields of its `/proc/diskstats` line we use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevCounters {
    /// Writes completed (field 8).
    pub writes: u64,
    /// Sectors written, 512 bytes each (field 10).
    pub sectors_written: u64,
    /// Flush requests completed (field 19), if the kernel reports it.
    pub flushes: Option<u64>,
}

/// Samples a fixed set of processes and the device of a data directory.
#[derive(Debug)]
pub struct Sampler {
    replicas: Vec<u32>,
    extra: Vec<u32>,
    dev: (u32, u32),
    dir: PathBuf,
}

/// One sample.
#[derive(Clone, Debug)]
pub struct Sample {
    at: Instant,
    replicas: Vec<ProcCounters>,
    extra: Vec<ProcCounters>,
    dev: DevCounters,
}

/// The deltas between two samples.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    /// Seconds between the samples.
    pub seconds: f64,
    /// Bytes written by each replica process (in the order given to [`Sampler::new`]).
    pub proc_write_bytes: Vec<u64>,
    /// CPU seconds of all sampled processes (replicas and extra).
    pub cpu_seconds: f64,
    /// Bytes the device wrote.
    pub dev_write_bytes: u64,
    /// Write requests the device completed.
    pub dev_write_reqs: u64,
    /// Flushes the device completed, if reported.
    pub dev_flushes: Option<u64>,
}

impl Sampler {
    /// A sampler of `replicas` (leader first) and `extra` processes (whose CPU counts but
    /// which are not replicas, e.g. a separate client process), and of the block device
    /// holding `data_dir`. Takes one sample to check everything can be read.
    pub fn new(replicas: &[u32], extra: &[u32], data_dir: &Path) -> Result<Self, ProcStatError> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(data_dir).map_err(|source| ProcStatError::Read {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let dev = md.dev();
        let major = libc::major(dev);
        let minor = libc::minor(dev);
        let s = Sampler {
            replicas: replicas.to_vec(),
            extra: extra.to_vec(),
            dev: (major, minor),
            dir: data_dir.to_path_buf(),
        };
        s.sample()?;
        Ok(s)
    }

    /// Reads every counter now.
    pub fn sample(&self) -> Result<Sample, ProcStatError> {
        let procs = |pids: &[u32]| -> Result<Vec<ProcCounters>, ProcStatError> {
            pids.iter().map(|p| read_proc(*p)).collect()
        };
        let path = PathBuf::from("/proc/diskstats");
        let text = read(&path)?;
        let dev = parse_diskstats(&text, self.dev.0, self.dev.1, &path)?.ok_or_else(|| {
            ProcStatError::NoDevice {
                major: self.dev.0,
                minor: self.dev.1,
                dir: self.dir.clone(),
            }
        })?;
        Ok(Sample {
            at: Instant::now(),
            replicas: procs(&self.replicas)?,
            extra: procs(&self.extra)?,
            dev,
        })
    }
}

/// The deltas from `before` to `after` (two samples of the same sampler), CPU ticks
/// converted at the system's `_SC_CLK_TCK`.
pub fn usage(before: &Sample, after: &Sample) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    usage_with_ticks(before, after, if ticks > 0 { ticks as f64 } else { 100.0 })
}

/// [`usage`] with an explicit clock tick rate.
pub fn usage_with_ticks(before: &Sample, after: &Sample, ticks_per_sec: f64) -> Usage {
    let d = |a: u64, b: u64| b.saturating_sub(a);
    let cpu: u64 = before
        .replicas
        .iter()
        .zip(&after.replicas)
        .chain(before.extra.iter().zip(&after.extra))
        .map(|(a, b)| d(a.cpu_ticks, b.cpu_ticks))
        .sum();
    Usage {
        seconds: after.at.duration_since(before.at).as_secs_f64(),
        proc_write_bytes: before
            .replicas
            .iter()
            .zip(&after.replicas)
            .map(|(a, b)| d(a.write_bytes, b.write_bytes))
            .collect(),
        cpu_seconds: cpu as f64 / ticks_per_sec,
        dev_write_bytes: d(before.dev.sectors_written, after.dev.sectors_written) * 512,
        dev_write_reqs: d(before.dev.writes, after.dev.writes),
        dev_flushes: match (before.dev.flushes, after.dev.flushes) {
            (Some(a), Some(b)) => Some(d(a, b)),
            _ => None,
        },
    }
}

fn read(path: &Path) -> Result<String, ProcStatError> {
    std::fs::read_to_string(path).map_err(|source| ProcStatError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_proc(pid: u32) -> Result<ProcCounters, ProcStatError> {
    let io = PathBuf::from(format!("/proc/{pid}/io"));
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    Ok(ProcCounters {
        write_bytes: parse_io_write_bytes(&read(&io)?, &io)?,
        cpu_ticks: parse_stat_cpu_ticks(&read(&stat)?, &stat)?,
    })
}

/// `write_bytes` from the text of `/proc/<pid>/io`.
pub fn parse_io_write_bytes(text: &str, path: &Path) -> Result<u64, ProcStatError> {
    text.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ProcStatError::Parse {
            path: path.to_path_buf(),
            what: "no numeric write_bytes line".into(),
        })
}

/// `utime + stime` (fields 14 and 15) from the text of `/proc/<pid>/stat`. Field 2 is the
/// command name in parentheses and may itself hold spaces and parentheses, so the fields
/// are counted from after the last `)`.
pub fn parse_stat_cpu_ticks(text: &str, path: &Path) -> Result<u64, ProcStatError> {
    let bad = |what: &str| ProcStatError::Parse {
        path: path.to_path_buf(),
        what: what.into(),
    };
    let rest = &text[text
        .rfind(')')
        .ok_or_else(|| bad("no ')' after the command name"))?
        + 1..];
    // After ')' come field 3 (state) onwards: utime is field 14, the 12th of these.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize, name: &str| -> Result<u64, ProcStatError> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(&format!("no numeric {name}")))
    };
    Ok(num(11, "utime (field 14)")? + num(12, "stime (field 15)")?)
}

/// The counters of device `major:minor` from the text of `/proc/diskstats`, if listed.
pub fn parse_diskstats(
    text: &str,
    major: u32,
    minor: u32,
    path: &Path,
) -> Result<Option<DevCounters>, ProcStatError> {
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 || f[0].parse() != Ok(major) || f[1].parse() != Ok(minor) {
            continue;
        }
        let num = |i: usize| -> Result<u64, ProcStatError> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| ProcStatError::Parse {
                    path: path.to_path_buf(),
                    what: format!("device {major}:{minor}: no numeric field {}", i + 1),
                })
        };
        return Ok(Some(DevCounters {
            writes: num(7)?,
            sectors_written: num(9)?,
            // Flushes arrived in Linux 5.5 (fields 19-20); older kernels list 14 or 18.
            flushes: if f.len() >= 20 { Some(num(18)?) } else { None },
        }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> PathBuf {
        PathBuf::from("/proc/test")
    }

    #[test]
    fn io_write_bytes() {
        let t = "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_io_write_bytes(t, &p()).unwrap(), 4096);
        assert!(parse_io_write_bytes("rchar: 1\n", &p()).is_err());
    }

    #[test]
    fn stat_cpu_with_awkward_command_name() {
        let t = "1234 (my (odd) prog) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 99 1000 10 18446744073709551615\n";
        assert_eq!(parse_stat_cpu_ticks(t, &p()).unwrap(), 300);
        assert!(parse_stat_cpu_ticks("1234 (x) S 1 2", &p()).is_err());
        assert!(parse_stat_cpu_ticks("garbage", &p()).is_err());
    }

    #[test]
    fn diskstats_line_shapes() {
        let t = "   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0\n\
                 254       0 vda 10 1 480 5 3653072 596907 229223568 877696 0 306168 2506503 136603 35 179366104 34376 1131856 65792\n\
                 254       1 vda1 10 1 480 5 20 2 160 7 0 9 10 0 0 0 0\n\
                 253       0 zram0 1 2 3 4 5 6 7 8 9 10 11\n";
        let d = parse_diskstats(t, 254, 0, &p()).unwrap().unwrap();
        assert_eq!(
            d,
            DevCounters {
                writes: 3653072,
                sectors_written: 229223568,
                flushes: Some(1131856)
            }
        );
        // 18 fields (no flush columns).
        let d = parse_diskstats(t, 254, 1, &p()).unwrap().unwrap();
        assert_eq!((d.writes, d.sectors_written, d.flushes), (20, 160, None));
        // 14 fields: the old layout still has the write columns.
        let d = parse_diskstats(t, 253, 0, &p()).unwrap().unwrap();
        assert_eq!((d.writes, d.sectors_written, d.flushes), (5, 7, None));
        assert_eq!(parse_diskstats(t, 1, 1, &p()).unwrap(), None);
        assert!(parse_diskstats("254 0 vda 1 2", 254, 0, &p()).is_err());
    }

    #[test]
    fn sampling_this_process_sees_its_cpu() {
        let me = std::process::id();
        let s = Sampler::new(&[me], &[], Path::new("/tmp")).unwrap();
        let a = s.sample().unwrap();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 300 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = s.sample().unwrap();
        let u = usage(&a, &b);
        assert!(u.cpu_seconds > 0.05, "{u:?}");
        assert!(u.seconds >= 0.3);
        assert_eq!(u.proc_write_bytes.len(), 1);
    }
}
