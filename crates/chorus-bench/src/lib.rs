//! Shared pieces of the Chorus benchmarks: OS accounting ([`procstat`]) used by
//! `chorus bench` and by the `chorus-bench` tools, so every system is measured alike.

pub mod procstat;
