//! OS accounting for benchmarks: what the processes under test really cost.
//!
//! Every system in the benchmark matrix (Chorus and its baselines) is measured the same way,
//! from outside its own counters: per process, the bytes it caused to be written to storage
//! (`write_bytes` in `/proc/<pid>/io`) and its CPU time (`utime + stime` in
//! `/proc/<pid>/stat`); for the disk holding the data, the write requests, sectors written
//! and flushes the block device completed (`/proc/diskstats`). A benchmark samples once at
//! the start of its measured interval and once at its end; [`usage`] gives the deltas, and
//! [`BenchResult`] is the one JSON object every system prints (the matrix's result schema).

use std::path::{Path, PathBuf};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

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
    #[error(
        "no /proc/diskstats line for device {major}:{minor} (holding {dir}); \
         is it on a file system without a block device, such as tmpfs or overlayfs?"
    )]
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
    /// Bytes this process caused to be sent to the storage layer (`write_bytes`): direct
    /// IO as written, buffered writes as the page-cache folios they dirtied (a small
    /// write into a large clean folio counts the whole folio).
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
        let s = Sampler {
            replicas: replicas.to_vec(),
            extra: extra.to_vec(),
            dev: device_of(md.dev(), data_dir)?,
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
        // The instant first: reading the files takes microseconds, and the interval is
        // measured between instants, so both samples place it the same way.
        let at = Instant::now();
        let path = PathBuf::from(DISKSTATS);
        let text = read(&path)?;
        let dev = parse_diskstats(&text, self.dev.0, self.dev.1, &path)?.ok_or_else(|| {
            ProcStatError::NoDevice {
                major: self.dev.0,
                minor: self.dev.1,
                dir: self.dir.clone(),
            }
        })?;
        Ok(Sample {
            at,
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

const DISKSTATS: &str = "/proc/diskstats";

/// The `major:minor` whose `/proc/diskstats` line counts the writes to a file system with
/// device number `st_dev`. Usually `st_dev` itself (a disk, a partition or a device-mapper
/// volume). Some file systems (btrfs) report an anonymous device instead; then the mount
/// source named in `/proc/self/mountinfo` for that device, if it is a block device node,
/// is the disk that really takes the writes.
fn device_of(st_dev: u64, dir: &Path) -> Result<(u32, u32), ProcStatError> {
    let (major, minor) = (libc::major(st_dev), libc::minor(st_dev));
    let path = PathBuf::from(DISKSTATS);
    let stats = read(&path)?;
    if parse_diskstats(&stats, major, minor, &path)?.is_some() {
        return Ok((major, minor));
    }
    let no_device = || ProcStatError::NoDevice {
        major,
        minor,
        dir: dir.to_path_buf(),
    };
    let mi = PathBuf::from("/proc/self/mountinfo");
    let Ok(mounts) = std::fs::read_to_string(&mi) else {
        return Err(no_device());
    };
    let Some(source) = parse_mountinfo_source(&mounts, major, minor) else {
        return Err(no_device());
    };
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::metadata(&source) {
        Ok(md) if md.file_type().is_block_device() => {
            let (ma, mi) = (libc::major(md.rdev()), libc::minor(md.rdev()));
            if parse_diskstats(&stats, ma, mi, &path)?.is_some() {
                Ok((ma, mi))
            } else {
                Err(no_device())
            }
        }
        _ => Err(no_device()),
    }
}

/// The mount source (field after the file system type) of the first `/proc/self/mountinfo`
/// line whose device is `major:minor`, if it names a path.
pub fn parse_mountinfo_source(text: &str, major: u32, minor: u32) -> Option<PathBuf> {
    let want = format!("{major}:{minor}");
    text.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        if f.nth(2)? != want {
            return None;
        }
        // Optional fields end at a lone "-"; then the type, the source, the options.
        let mut after = line.split(" - ").nth(1)?.split_whitespace();
        let source = after.nth(1)?;
        source.starts_with('/').then(|| PathBuf::from(source))
    })
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

/// The fields of the result schema that name a run: which system, how it was driven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPoint {
    /// `"chorus"`, `"etcd-raft"`, `"openraft"` or `"ceiling"`.
    pub system: String,
    /// Client path: `"embedded"`, `"grpc"` or `"direct"` (the ceiling).
    pub path: String,
    /// Chorus's commit-point mode (`"piggyback"`, `"sync"`, `"async"`); `None` for others.
    pub commit_mode: Option<String>,
    /// Closed-loop clients (the ceiling: 1).
    pub clients: u64,
    /// Payload bytes per record.
    pub size: u64,
    /// Replicas (the ceiling: 1).
    pub replicas: u64,
}

/// A [`BenchResult`] could not take an extra field.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// The name is one of the schema's own fields, which extra fields must not shadow.
    #[error("extra result field {0:?} is a field of the result schema itself")]
    ReservedField(String),
}

/// The schema's field names, in order (`/tmp/chorus-shared/bench-schema.md`,
/// docs/benchmarks/result-fields.md).
pub const RESULT_FIELDS: [&str; 24] = [
    "system",
    "path",
    "commit_mode",
    "clients",
    "size",
    "replicas",
    "appends",
    "seconds",
    "appends_per_sec",
    "mb_per_sec",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "proc_write_bytes",
    "write_amp",
    "cpu_seconds",
    "cpu_sec_per_million",
    "dev_write_bytes",
    "dev_write_reqs_per_sec",
    "dev_flushes_per_sec",
    "dev_write_mb_per_sec",
    "fsyncs_per_sec",
    "follower_msgs_per_sec",
];

/// One run's result in the benchmark matrix's shared schema: serialize it with
/// `serde_json` to get the one JSON line every system prints. Values that are unknown
/// (no appends to take a latency from, no OS accounting) serialize as `null`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchResult {
    /// See [`RunPoint::system`].
    pub system: String,
    /// See [`RunPoint::path`].
    pub path: String,
    /// See [`RunPoint::commit_mode`].
    pub commit_mode: Option<String>,
    /// See [`RunPoint::clients`].
    pub clients: u64,
    /// See [`RunPoint::size`].
    pub size: u64,
    /// See [`RunPoint::replicas`].
    pub replicas: u64,
    /// Records committed inside the measured interval.
    pub appends: u64,
    /// Length of the measured interval.
    pub seconds: f64,
    /// `appends / seconds` (0 for an empty interval).
    pub appends_per_sec: f64,
    /// Payload MB/s: `appends * size / seconds / 1e6`.
    pub mb_per_sec: f64,
    /// Median commit latency, µs.
    pub p50_us: Option<u64>,
    /// 99th percentile commit latency, µs.
    pub p99_us: Option<u64>,
    /// 99.9th percentile commit latency, µs.
    pub p999_us: Option<u64>,
    /// Largest commit latency, µs.
    pub max_us: Option<u64>,
    /// Δ `write_bytes` per replica process, leader first.
    pub proc_write_bytes: Option<Vec<u64>>,
    /// Mean of `proc_write_bytes` per payload byte.
    pub write_amp: Option<f64>,
    /// Δ CPU seconds of all processes of the system under test.
    pub cpu_seconds: Option<f64>,
    /// `cpu_seconds` per million appends.
    pub cpu_sec_per_million: Option<f64>,
    /// Δ bytes the data disk wrote.
    pub dev_write_bytes: Option<u64>,
    /// Write requests the data disk completed per second.
    pub dev_write_reqs_per_sec: Option<f64>,
    /// Flushes the data disk completed per second (`None` on kernels that do not say).
    pub dev_flushes_per_sec: Option<f64>,
    /// MB the data disk wrote per second.
    pub dev_write_mb_per_sec: Option<f64>,
    /// The system's own count of fsync/fdatasync calls per second, where it counts them.
    pub fsyncs_per_sec: Option<f64>,
    /// Messages received by one follower per second, where the system counts them.
    pub follower_msgs_per_sec: Option<f64>,
    /// System-specific fields printed after the schema's (e.g. the ceiling's `"direct"`).
    /// Private so that [`BenchResult::insert_extra`] can keep them from shadowing a
    /// schema field, which would print the key twice.
    #[serde(flatten)]
    extra: serde_json::Map<String, serde_json::Value>,
}

/// `a / b`, or `None` when `b` is not a positive number (nothing to divide by).
fn per(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && b.is_finite()).then(|| a / b)
}

impl BenchResult {
    /// A result at `point` of `appends` committed in `seconds`, with commit latencies (µs)
    /// taken from `latency_us`. The OS accounting fields stay `None` until
    /// [`BenchResult::fill_usage`]; `fsyncs_per_sec` and `follower_msgs_per_sec` are set
    /// by systems that count them.
    pub fn new(point: RunPoint, appends: u64, seconds: f64, latency_us: &Histogram<u64>) -> Self {
        let rate = per(appends as f64, seconds).unwrap_or(0.0);
        // An empty histogram has no percentiles; 0 would read as "instant".
        let q = |q: f64| (!latency_us.is_empty()).then(|| latency_us.value_at_quantile(q));
        BenchResult {
            appends,
            seconds,
            appends_per_sec: rate,
            mb_per_sec: rate * point.size as f64 / 1e6,
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: (!latency_us.is_empty()).then(|| latency_us.max()),
            system: point.system,
            path: point.path,
            commit_mode: point.commit_mode,
            clients: point.clients,
            size: point.size,
            replicas: point.replicas,
            proc_write_bytes: None,
            write_amp: None,
            cpu_seconds: None,
            cpu_sec_per_million: None,
            dev_write_bytes: None,
            dev_write_reqs_per_sec: None,
            dev_flushes_per_sec: None,
            dev_write_mb_per_sec: None,
            fsyncs_per_sec: None,
            follower_msgs_per_sec: None,
            extra: serde_json::Map::new(),
        }
    }

    /// Fills the OS accounting fields (`proc_write_bytes`, `write_amp`, `cpu_*`, `dev_*`)
    /// from `u`, the [`usage`] over the measured interval. Rates of the device are per
    /// second of `u`'s own interval (between the two samples), which is the interval the
    /// deltas were counted over.
    pub fn fill_usage(&mut self, u: &Usage) {
        let payload = self.appends as f64 * self.size as f64;
        let mean_written = if u.proc_write_bytes.is_empty() {
            None
        } else {
            Some(u.proc_write_bytes.iter().sum::<u64>() as f64 / u.proc_write_bytes.len() as f64)
        };
        self.proc_write_bytes = Some(u.proc_write_bytes.clone());
        self.write_amp = mean_written.and_then(|m| per(m, payload));
        self.cpu_seconds = Some(u.cpu_seconds);
        self.cpu_sec_per_million = per(u.cpu_seconds * 1e6, self.appends as f64);
        self.dev_write_bytes = Some(u.dev_write_bytes);
        self.dev_write_reqs_per_sec = per(u.dev_write_reqs as f64, u.seconds);
        self.dev_flushes_per_sec = u.dev_flushes.and_then(|f| per(f as f64, u.seconds));
        self.dev_write_mb_per_sec = per(u.dev_write_bytes as f64 / 1e6, u.seconds);
    }

    /// Adds a system-specific field after the schema's; refuses a schema field's name.
    pub fn insert_extra(
        &mut self,
        name: &str,
        value: impl Into<serde_json::Value>,
    ) -> Result<(), ResultError> {
        if RESULT_FIELDS.contains(&name) {
            return Err(ResultError::ReservedField(name.to_string()));
        }
        self.extra.insert(name.to_string(), value.into());
        Ok(())
    }

    /// The system-specific fields added with [`BenchResult::insert_extra`].
    pub fn extra(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.extra
    }

    /// The result as one line of JSON (no trailing newline).
    pub fn to_json_line(&self) -> String {
        // Serializing plain numbers, strings and a JSON map cannot fail; NaN, were one to
        // slip in, prints as null.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
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
        // A name that itself looks like the start of the fields: only the last ')' counts.
        let t = "77 (evil) S 1 2 3) R 1 77 77 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 5 0 0\n";
        assert_eq!(parse_stat_cpu_ticks(t, &p()).unwrap(), 15);
        assert!(parse_stat_cpu_ticks("1234 (x) S 1 2", &p()).is_err());
        assert!(parse_stat_cpu_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 1", &p()).is_err());
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
    fn mountinfo_source_of_a_device() {
        let t = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                 29 1 0:33 / / rw,relatime shared:1 - btrfs /dev/nvme0n1p2 rw,ssd\n\
                 30 29 254:0 / /data rw master:7 - ext4 /dev/vda rw\n\
                 31 29 0:40 / /tmp rw - tmpfs tmpfs rw\n";
        assert_eq!(
            parse_mountinfo_source(t, 0, 33),
            Some(PathBuf::from("/dev/nvme0n1p2"))
        );
        assert_eq!(
            parse_mountinfo_source(t, 254, 0),
            Some(PathBuf::from("/dev/vda"))
        );
        assert_eq!(
            parse_mountinfo_source(t, 0, 40),
            None,
            "tmpfs has no device path"
        );
        assert_eq!(parse_mountinfo_source(t, 9, 9), None);
        assert_eq!(parse_mountinfo_source("garbage\n1 2\n", 0, 33), None);
    }

    fn point() -> RunPoint {
        RunPoint {
            system: "chorus".into(),
            path: "embedded".into(),
            commit_mode: Some("piggyback".into()),
            clients: 10,
            size: 512,
            replicas: 3,
        }
    }

    #[test]
    fn result_has_exactly_the_schema_fields_in_order() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for v in 1..=1000u64 {
            h.record(v).unwrap();
        }
        let mut r = BenchResult::new(point(), 2000, 2.0, &h);
        r.fill_usage(&Usage {
            seconds: 2.0,
            proc_write_bytes: vec![1_024_000, 2_048_000, 3_072_000],
            cpu_seconds: 0.5,
            dev_write_bytes: 8_000_000,
            dev_write_reqs: 100,
            dev_flushes: Some(40),
        });
        r.fsyncs_per_sec = Some(10.0);
        r.insert_extra("direct", true).unwrap();
        let line = r.to_json_line();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want: Vec<&str> = RESULT_FIELDS.to_vec();
        want.push("direct");
        // The parsed map forgets the order, so the line itself shows it: every key appears
        // after the one before it.
        let at: Vec<usize> = want
            .iter()
            .map(|k| line.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
        keys.sort_unstable();
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(v["appends_per_sec"], 1000.0);
        assert_eq!(v["mb_per_sec"], 0.512);
        assert_eq!(v["p50_us"], 500);
        assert_eq!(v["max_us"], 1000);
        // mean written 2,048,000 B per replica / 1,024,000 B payload.
        assert_eq!(v["write_amp"], 2.0);
        assert_eq!(v["cpu_sec_per_million"], 250.0);
        assert_eq!(v["dev_write_reqs_per_sec"], 50.0);
        assert_eq!(v["dev_flushes_per_sec"], 20.0);
        assert_eq!(v["dev_write_mb_per_sec"], 4.0);
        assert_eq!(v["follower_msgs_per_sec"], serde_json::Value::Null);
        assert_eq!(v["commit_mode"], "piggyback");
    }

    #[test]
    fn an_empty_run_prints_nulls_not_zeros_or_nan() {
        let h = Histogram::<u64>::new(3).unwrap();
        let mut r = BenchResult::new(point(), 0, 0.0, &h);
        r.fill_usage(&Usage {
            seconds: 0.0,
            proc_write_bytes: vec![],
            cpu_seconds: 0.0,
            dev_write_bytes: 0,
            dev_write_reqs: 0,
            dev_flushes: None,
        });
        let v: serde_json::Value = serde_json::from_str(&r.to_json_line()).unwrap();
        assert_eq!(v["appends_per_sec"], 0.0);
        for k in ["p50_us", "max_us", "write_amp", "cpu_sec_per_million"] {
            assert!(v[k].is_null(), "{k}: {}", v[k]);
        }
        for k in ["dev_write_reqs_per_sec", "dev_flushes_per_sec"] {
            assert!(v[k].is_null(), "{k}: {}", v[k]);
        }
    }

    #[test]
    fn extra_fields_cannot_shadow_the_schema() {
        let h = Histogram::<u64>::new(3).unwrap();
        let mut r = BenchResult::new(point(), 1, 1.0, &h);
        let e = r.insert_extra("appends", 5).unwrap_err();
        assert!(e.to_string().contains("\"appends\""), "{e}");
        r.insert_extra("batch_bytes", 4096).unwrap();
        assert_eq!(r.extra()["batch_bytes"], 4096);
    }

    #[test]
    fn sampling_this_process_sees_its_cpu() {
        let me = std::process::id();
        let s = Sampler::new(&[me], &[], Path::new("/tmp")).unwrap();
        let a = s.sample().unwrap();
        // Spin until this process used 0.2 s of CPU (not of wall time: on a loaded
        // machine the thread may get a small share of it), bounded by 20 s of wall time.
        let cpu = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes one timespec through a valid pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
        };
        let (t, c0) = (Instant::now(), cpu());
        let mut x = 0u64;
        while (cpu() - c0 < 0.2 || t.elapsed().as_millis() < 300) && t.elapsed().as_secs() < 20 {
            for _ in 0..10_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let b = s.sample().unwrap();
        let u = usage(&a, &b);
        assert!(u.cpu_seconds > 0.05, "{u:?}");
        assert!(u.seconds >= 0.3);
        assert_eq!(u.proc_write_bytes.len(), 1);
        // A pid that is gone is an error naming its file, not a panic.
        let e = Sampler::new(&[u32::MAX], &[], Path::new("/tmp")).unwrap_err();
        assert!(
            e.to_string().contains(&format!("/proc/{}/", u32::MAX)),
            "{e}"
        );
        let e = Sampler::new(&[me], &[], Path::new("/nonexistent/chorus")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/chorus"), "{e}");
    }
}
