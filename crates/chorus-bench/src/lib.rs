//! Shared pieces of the Chorus benchmarks: OS accounting ([`procstat`]) used by
//! `chorus bench` and by the `chorus-bench` tools, so every system is measured alike, and
//! the latency floor of one replicated append on this machine ([`floor`]) and the disk's
//! ceiling for durable appends ([`ceiling`]).

pub mod ceiling;
pub mod floor;
pub mod groups;
pub mod ooo;
pub mod spread;
pub use chorus_workload::procstat;
