//! The library behind the `chorus` binary: the server (its configuration, the gRPC
//! service, the out-of-order groups with their state machines (a block volume, a key-value store)), the local cluster
//! (`chorus dev`), the client commands and the local tools. The binary (`src/main.rs`)
//! only parses the command line and dispatches here.

pub mod archive;
pub mod auth;
pub mod bench;
mod chunk_io;
pub mod config;
pub mod ctrl;
pub mod dev;
pub mod fs_bench;
pub mod fs_cli;
pub mod local;
pub mod metrics_http;
pub mod ooo;
pub mod remote;
pub mod server;
pub mod service;
pub mod standard;
pub mod state_machines;
pub mod status_page;
pub mod volume_bench;
pub mod volume_cli;

use clap::{Args, ValueEnum};

/// Output format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Human-readable table.
    Table,
    /// JSON.
    Json,
}

/// Where the cluster is.
#[derive(Args, Clone, Debug)]
pub struct Endpoints {
    /// gRPC API endpoints of the nodes, comma-separated, each `http://host:port` or
    /// `host:port` (default: the `chorus dev` cluster).
    #[arg(
        long,
        env = "CHORUS_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
    )]
    pub endpoints: Vec<String>,
    /// Log group.
    #[arg(short, long, default_value_t = 1)]
    pub group: u64,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Seconds one request waits for its answer before it is cut off (an append then
    /// reports outcome unknown, exit 3); for a tail, until its stream opens.
    #[arg(long, default_value = "30", value_parser = parse_timeout)]
    pub timeout: std::time::Duration,
}

impl Endpoints {
    /// A client for these endpoints with this call timeout.
    pub fn client(&self) -> chorus_client::Client {
        self.client_for(self.endpoints.clone())
    }

    /// A client for other endpoints with this call timeout.
    pub fn client_for(&self, endpoints: Vec<String>) -> chorus_client::Client {
        let mut c = chorus_client::Client::new(endpoints);
        c.call_timeout = self.timeout;
        c
    }
}

/// `--timeout`: seconds, more than 0 and at most a day.
pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err(format!(
            "`{s}`: expected seconds, more than 0 and at most 86400 (e.g. 30 or 0.5)"
        )),
    }
}

/// Exit code: a check found a problem, or an append FAILED.
pub const EXIT_PROBLEM: u8 = 1;
/// Exit code: bad usage, configuration or a local error.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: cluster unreachable or without a leader.
pub const EXIT_UNREACHABLE: u8 = 3;
/// Exit code: the server refused.
pub const EXIT_REFUSED: u8 = 4;

/// The result of a command: its exit code, or an error printed before exit code 2.
pub type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;
