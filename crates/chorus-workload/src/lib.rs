//! Workload pieces shared by the `chorus bench` command (in `chorus-server`) and the
//! `chorus-bench` harness, kept apart so that the server does not depend on the
//! benchmark harness: a Zipf key generator ([`zipf`]) and the OS accounting every system
//! under test is measured with ([`procstat`]).

pub mod procstat;
pub mod zipf;
