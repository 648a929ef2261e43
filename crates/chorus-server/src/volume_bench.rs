//! `chorus volume bench`: a fio-like closed-loop workload on a volume through the routing
//! client (PolarFS section 8's FIO runs, Figs. 9–10): random or sequential reads or
//! writes of a fixed size at a fixed depth (that many I/Os in flight, each issued when the
//! one before it on its lane completes), for a fixed time, per depth. Each write is
//! acknowledged only once committed on a majority of its chunk's replicas, so the figures
//! are durable ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_client::VolumeClient;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::json;

use crate::volume_cli::{parse_bytes, Control};

/// What each I/O does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// Writes at uniformly random offsets aligned to the I/O size.
    Randwrite,
    /// Reads at uniformly random offsets aligned to the I/O size.
    Randread,
    /// Writes in order (each lane its own region).
    Write,
    /// Reads in order (each lane its own region).
    Read,
}

/// Flags of `chorus volume bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The control plane and the output format.
    #[command(flatten)]
    pub c: Control,
    /// The volume (created beforehand with `chorus volume create`).
    pub name: String,
    /// What each I/O does.
    #[arg(long, value_enum, default_value_t = Pattern::Randwrite)]
    pub pattern: Pattern,
    /// Bytes per I/O (a multiple of 4K keeps writes free of read-modify-write).
    #[arg(long, value_parser = parse_bytes, default_value = "4K")]
    pub bs: u64,
    /// I/Os in flight, comma-separated: one run per depth.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32")]
    pub depth: Vec<u64>,
    /// Seconds per depth (after a one-second warm-up).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Bytes of the volume the I/Os fall in, from offset 0 (default: all of it).
    #[arg(long, value_parser = parse_bytes, default_value = "0")]
    pub span: u64,
}

/// One depth's figures.
#[derive(Debug)]
struct Point {
    depth: u64,
    ios: u64,
    errors: u64,
    secs: f64,
    hist: Histogram<u64>,
}

/// The offset of lane `lane`'s `n`th I/O (of `lanes`) in `span` bytes: random (seeded by
/// `x`) or in order in the lane's own region.
pub(crate) fn lane_offset(
    p: Pattern,
    lane: u64,
    lanes: u64,
    n: u64,
    span: u64,
    bs: u64,
    x: &mut u64,
) -> u64 {
    let slots = (span / bs).max(1);
    match p {
        Pattern::Randwrite | Pattern::Randread => {
            // xorshift64*: a cheap, seeded, uniform-enough offset stream per lane.
            *x ^= *x >> 12;
            *x ^= *x << 25;
            *x ^= *x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % slots) * bs
        }
        Pattern::Write | Pattern::Read => {
            let region = (slots / lanes).max(1);
            ((lane * region + n % region) % slots) * bs
        }
    }
}

async fn run_depth(v: &VolumeClient, a: &BenchArgs, depth: u64, span: u64) -> Point {
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
    ));
    let ios = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let warm = Instant::now() + Duration::from_secs(1);
    let end = warm + Duration::from_secs(a.seconds);
    let data = Arc::new(vec![0xA5u8; a.bs as usize]);
    let mut tasks = Vec::new();
    for lane in 0..depth {
        let (v, hist, ios, errors, data) = (
            v.clone(),
            hist.clone(),
            ios.clone(),
            errors.clone(),
            data.clone(),
        );
        let (p, bs) = (a.pattern, a.bs);
        tasks.push(tokio::spawn(async move {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (lane + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let mut n = 0u64;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let off = lane_offset(p, lane, depth, n, span, bs, &mut x);
                n += 1;
                let r = match p {
                    Pattern::Randwrite | Pattern::Write => v.write(off, &data).await.map(|_| ()),
                    Pattern::Randread | Pattern::Read => v.read(off, bs).await.map(|_| ()),
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
                            eprintln!("chorus volume bench: {e}");
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let hist = hist.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Point {
        depth,
        ios: ios.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        secs: a.seconds as f64,
        hist,
    }
}

/// Runs `chorus volume bench`.
pub async fn run(a: BenchArgs) -> Result<(), (u8, String)> {
    let refused = |m: String| (crate::EXIT_REFUSED, m);
    if a.bs == 0 || a.depth.iter().any(|d| *d == 0 || *d > 1024) || a.seconds == 0 {
        return Err(refused(
            "--bs, --seconds and every --depth (at most 1024) must be positive".into(),
        ));
    }
    let v = VolumeClient::open(a.c.control.clone(), &a.name)
        .await
        .map_err(|e| (crate::EXIT_UNREACHABLE, e.to_string()))?;
    let size = v.map().size_bytes;
    let span = if a.span == 0 { size } else { a.span.min(size) };
    if span < a.bs {
        return Err(refused(format!(
            "--span {span} is smaller than one I/O of --bs {}",
            a.bs
        )));
    }
    for &d in &a.depth {
        let p = run_depth(&v, &a, d, span).await;
        let iops = p.ios as f64 / p.secs;
        let q = |f: f64| p.hist.value_at_quantile(f);
        let line = json!({
            "pattern": format!("{:?}", a.pattern).to_lowercase(),
            "bs": a.bs,
            "depth": p.depth,
            "ios": p.ios,
            "errors": p.errors,
            "iops": iops,
            "mib_per_sec": iops * a.bs as f64 / (1 << 20) as f64,
            "p50_us": q(0.5),
            "p99_us": q(0.99),
            "p999_us": q(0.999),
        });
        match a.c.output {
            crate::Output::Json => println!("{line}"),
            crate::Output::Table => println!(
                "{:?} bs {} depth {:>3}: {:>9.0} IOPS {:>8.1} MiB/s  p50 {} us  p99 {} us  errors {}",
                a.pattern,
                a.bs,
                p.depth,
                iops,
                iops * a.bs as f64 / (1 << 20) as f64,
                q(0.5),
                q(0.99),
                p.errors
            ),
        }
    }
    Ok(())
}
