//! Rust client for the Chorus gRPC API (`proto/chorus.proto`).
//!
//! [`Client`] talks to a cluster given the API endpoints of its nodes: leader-only
//! operations (append, membership, leader transfer) find the leader by trying endpoints
//! (a follower answers `FAILED_PRECONDITION`) and remember it; reads go to any node.
//!
//! ```no_run
//! # async fn demo() -> Result<(), chorus_client::ClientError> {
//! let mut c = chorus_client::Client::new(vec!["http://127.0.0.1:7001".into()]);
//! let results = c.append(1, vec![b"hello".to_vec()], 0).await?;
//! println!("committed at LSN {}", results[0].lsn);
//! # Ok(()) }
//! ```

use std::time::Duration;

pub use security::Conn;
use tonic::{Code, Status};

/// Types and stubs generated from `proto/chorus.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("chorus.v1");

    /// `proto/chorus.proto` compiled, as an encoded `google.protobuf.FileDescriptorSet`:
    /// what a server's reflection service describes.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/chorus_descriptor.bin"));
}

use pb::chorus_client::ChorusClient;

pub mod security;
pub mod split;
pub mod stream;
pub mod volume;

pub use volume::{VolumeClient, VolumeError, VolumeMap};

/// What went wrong talking to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An endpoint string is not a valid URI.
    #[error("endpoint `{endpoint}` is not valid: {detail} (expected e.g. http://127.0.0.1:7001)")]
    BadEndpoint {
        /// The endpoint given.
        endpoint: String,
        /// Why.
        detail: String,
    },
    /// No endpoints were given.
    #[error("no endpoints given")]
    NoEndpoints,
    /// No endpoint accepted a leader-only operation before the deadline.
    #[error("no leader found for group {group} within {waited:?} (last answer: {last})")]
    NoLeader {
        /// The group.
        group: u64,
        /// How long it tried.
        waited: Duration,
        /// The last error seen.
        last: String,
    },
    /// The server answered with an error.
    #[error("{endpoint}: {code:?}: {message}")]
    Status {
        /// The endpoint that answered.
        endpoint: String,
        /// gRPC status code.
        code: Code,
        /// Message.
        message: String,
    },
    /// A non-idempotent request (an append, a membership change) was cut off before its
    /// answer — the connection broke, or no answer came within [`Client::call_timeout`]:
    /// it may or may not have taken effect. For an append, read the log to find out;
    /// never blindly retry it (that could append twice).
    #[error("{endpoint}: outcome unknown, the request was cut off before its answer: {detail}")]
    Indeterminate {
        /// The endpoint.
        endpoint: String,
        /// What happened.
        detail: String,
    },
    /// The endpoint could not be reached.
    #[error("{endpoint}: unreachable: {detail}")]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// Why.
        detail: String,
    },
}

impl ClientError {
    fn status(endpoint: &str, s: Status) -> Self {
        ClientError::Status {
            endpoint: endpoint.to_string(),
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

/// A connection to a Chorus cluster (see the crate docs).
#[derive(Clone, Debug)]
pub struct Client {
    endpoints: Vec<String>,
    conns: Vec<Option<ChorusClient<Conn>>>,
    leader: std::collections::HashMap<u64, usize>,
    /// How long leader-only operations keep looking for a leader.
    pub leader_timeout: Duration,
    /// How long one call waits for its answer (for a stream, for the stream to open)
    /// before it is cut off: an append then ends [`ClientError::Indeterminate`]. Without
    /// a bound, a call whose answer is lost (a server that stops answering without
    /// closing its connection) would wait forever. Applies to connections opened after
    /// it is set; connections open lazily, so set it before the first call.
    pub call_timeout: Duration,
}

/// The default [`Client::call_timeout`]: longer than any commit a live cluster takes,
/// elections included.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// HTTP/2 PING interval on every connection, idle or not, and how long a PING may go
/// unanswered before the connection is closed (failing its calls, so that a dead peer
/// that never closed its side is noticed).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// `host:port` as `http://host:port`; anything naming a scheme is left as written (an
/// unknown one is refused when connecting, naming the endpoint).
fn with_scheme(ep: String) -> String {
    if ep.contains("://") {
        ep
    } else {
        format!("http://{ep}")
    }
}

impl Client {
    /// A client for these endpoints (`http://host:port`; a bare `host:port` is taken as
    /// `http://host:port`); connections open lazily.
    pub fn new(endpoints: Vec<String>) -> Self {
        let n = endpoints.len();
        let endpoints = endpoints.into_iter().map(with_scheme).collect();
        Self {
            endpoints,
            conns: vec![None; n],
            leader: Default::default(),
            leader_timeout: Duration::from_secs(10),
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The gRPC stub for endpoint `i`, connecting if needed.
    pub async fn conn(&mut self, i: usize) -> Result<ChorusClient<Conn>, ClientError> {
        if let Some(c) = &self.conns[i] {
            return Ok(c.clone());
        }
        let ep = &self.endpoints[i];
        let e = security::endpoint(ep)
            .map_err(|detail| ClientError::BadEndpoint {
                endpoint: ep.clone(),
                detail,
            })?
            .connect_timeout(Duration::from_secs(2))
            .timeout(self.call_timeout)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let ch = e.connect().await.map_err(|e| ClientError::Unreachable {
            endpoint: ep.clone(),
            detail: format!("{e}: {}", source_chain(&e)),
        })?;
        let c = ChorusClient::new(security::authed(ch))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        self.conns[i] = Some(c.clone());
        Ok(c)
    }

    /// Runs a leader-only call, trying endpoints until one accepts. A call that is not
    /// `idempotent` is retried elsewhere only when it surely did not take effect: the
    /// endpoint is not the leader, or the connection could not be made.
    async fn on_leader<T, F, Fut>(
        &mut self,
        group: u64,
        idempotent: bool,
        mut call: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(ChorusClient<Conn>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        if self.endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let start = tokio::time::Instant::now();
        let n = self.endpoints.len();
        let mut i = *self.leader.get(&group).unwrap_or(&0);
        let mut last = String::new();
        loop {
            for _ in 0..n {
                match self.conn(i).await {
                    Ok(c) => match call(c).await {
                        Ok(v) => {
                            self.leader.insert(group, i);
                            return Ok(v);
                        }
                        Err(s)
                            if !idempotent
                                && matches!(
                                    s.code(),
                                    Code::Unavailable
                                        | Code::Unknown
                                        | Code::Cancelled
                                        | Code::DeadlineExceeded
                                )
                                && !not_sent(&s) =>
                        {
                            self.conns[i] = None;
                            // tonic reports the call timeout as CANCELLED "Timeout expired".
                            let detail = if s.code() == Code::Cancelled
                                && s.message() == "Timeout expired"
                            {
                                format!("no answer within {:?}", self.call_timeout)
                            } else {
                                s.message().to_string()
                            };
                            return Err(ClientError::Indeterminate {
                                endpoint: self.endpoints[i].clone(),
                                detail,
                            });
                        }
                        Err(s)
                            if matches!(
                                s.code(),
                                Code::FailedPrecondition | Code::Unavailable | Code::Unknown
                            ) && !s.metadata().contains_key(ACCESS_MODE_KEY)
                                && !s.metadata().contains_key(REFUSED_KEY) =>
                        {
                            last = format!("{}: {}", self.endpoints[i], s.message());
                            if s.code() != Code::FailedPrecondition {
                                self.conns[i] = None;
                            }
                        }
                        Err(s) => return Err(ClientError::status(&self.endpoints[i], s)),
                    },
                    Err(e) => last = e.to_string(),
                }
                i = (i + 1) % n;
            }
            if start.elapsed() >= self.leader_timeout {
                return Err(ClientError::NoLeader {
                    group,
                    waited: start.elapsed(),
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Appends records (in order, consecutive LSNs) and waits for each final result: one
    /// per appended record (a refusal ends the list; the records after it were not
    /// appended), `unknown` set on one whose outcome the replica never learned (see
    /// `AppendResponse`).
    pub async fn append(
        &mut self,
        group: u64,
        records: Vec<Vec<u8>>,
        ref_csn: u64,
    ) -> Result<Vec<pb::AppendResult>, ClientError> {
        let req = pb::AppendRequest {
            group,
            records,
            ref_csn,
        };
        self.on_leader(group, false, |mut c| {
            let req = req.clone();
            async move { c.append(req).await.map(|r| r.into_inner().results) }
        })
        .await
    }

    /// Appends records to an out-of-order group (each declaring its blocks or read/write
    /// sets) and waits for each final result: one per record, in request order, with
    /// `refused` set on a record never appended and `unknown` on one whose outcome this
    /// replica cannot know (see `AppendOutOfOrderResponse`). Only a call in which every
    /// record was refused is retried at the leader.
    pub async fn append_out_of_order(
        &mut self,
        group: u64,
        records: Vec<pb::OutOfOrderRecord>,
    ) -> Result<Vec<pb::OutOfOrderResult>, ClientError> {
        let req = pb::AppendOutOfOrderRequest {
            group,
            records,
            snapshot: 0,
        };
        self.on_leader(group, false, |mut c| {
            let req = req.clone();
            async move {
                c.append_out_of_order(req)
                    .await
                    .map(|r| r.into_inner().results)
            }
        })
        .await
    }

    /// Endpoint `i` and a connection to it (an index past the list is `NoEndpoints`).
    async fn at(&mut self, i: usize) -> Result<(String, ChorusClient<Conn>), ClientError> {
        let ep = self
            .endpoints
            .get(i)
            .cloned()
            .ok_or(ClientError::NoEndpoints)?;
        Ok((ep, self.conn(i).await?))
    }

    /// Reads blocks of a parallel group's volume as the replica at endpoint `i` applied
    /// them.
    pub async fn read_blocks_at(
        &mut self,
        i: usize,
        group: u64,
        start: u64,
        count: u64,
    ) -> Result<pb::ReadBlocksResponse, ClientError> {
        let (ep, mut c) = self.at(i).await?;
        c.read_blocks(pb::ReadBlocksRequest {
            group,
            start,
            count,
            at_leader: false,
            snapshot: 0,
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| ClientError::status(&ep, s))
    }

    /// Reads keys of a dependent group's key-value store as the replica at endpoint `i`
    /// applied them.
    pub async fn get_keys_at(
        &mut self,
        i: usize,
        group: u64,
        keys: Vec<u64>,
    ) -> Result<pb::GetKeysResponse, ClientError> {
        let (ep, mut c) = self.at(i).await?;
        c.get_keys(pb::GetKeysRequest { group, keys })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| ClientError::status(&ep, s))
    }

    /// A membership change, sent to the leader.
    pub async fn change_membership(
        &mut self,
        req: pb::ChangeMembershipRequest,
    ) -> Result<(), ClientError> {
        let group = req.group;
        self.on_leader(group, false, |mut c| {
            let req = req.clone();
            async move { c.change_membership(req).await.map(|_| ()) }
        })
        .await
    }

    /// Hands leadership of `group` to `to`; refused if `to` is down or behind (see
    /// [`Client::transfer_leader_forced`]).
    pub async fn transfer_leader(&mut self, group: u64, to: u64) -> Result<(), ClientError> {
        self.transfer_leader_forced(group, to, false).await
    }

    /// Hands leadership of `group` to `to`; with `force`, even to a node the leader has
    /// not heard from within the lease or that is more than a window behind.
    pub async fn transfer_leader_forced(
        &mut self,
        group: u64,
        to: u64,
        force: bool,
    ) -> Result<(), ClientError> {
        self.on_leader(group, true, |mut c| async move {
            c.transfer_leader(pb::TransferLeaderRequest { group, to, force })
                .await
                .map(|_| ())
        })
        .await
    }

    /// Runs `call` on the first endpoint that answers (reads work on any replica).
    async fn on_any<T, F, Fut>(&mut self, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(ChorusClient<Conn>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut last = ClientError::NoEndpoints;
        for i in 0..self.endpoints.len() {
            match self.conn(i).await {
                Ok(c) => match call(c).await {
                    Ok(v) => return Ok(v),
                    Err(s) if s.code() == Code::Unavailable => {
                        self.conns[i] = None;
                        last = ClientError::status(&self.endpoints[i], s);
                    }
                    Err(s) => return Err(ClientError::status(&self.endpoints[i], s)),
                },
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Reads committed records of `group` from `from_lsn`.
    pub async fn read(
        &mut self,
        group: u64,
        from_lsn: u64,
        max_records: u32,
    ) -> Result<pb::ReadResponse, ClientError> {
        self.read_at_csn(group, from_lsn, max_records, AtCsn::default())
            .await
    }

    /// Reads committed records of `group` from `from_lsn` once the replica that answers
    /// (the first endpoint that does: list a follower first for a follower read) holds
    /// every record with a CSN up to `at.min_csn` (PALF section 4.2), waiting up to
    /// `at.wait` for it. The response's `readable_csn` is the replica's. A wait longer
    /// than [`Client::call_timeout`] allows is asked for in turns, each shorter than it.
    /// Past the wait: [`ClientError::Status`] `DEADLINE_EXCEEDED`, naming the group, the
    /// CSN asked and the one reached.
    pub async fn read_at_csn(
        &mut self,
        group: u64,
        from_lsn: u64,
        max_records: u32,
        at: AtCsn,
    ) -> Result<pb::ReadResponse, ClientError> {
        let until = tokio::time::Instant::now() + at.wait;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            // Each turn well inside the call timeout, so the server's answer (the read,
            // or DEADLINE_EXCEEDED naming the CSNs) is not cut off here.
            let turn = left.min(self.call_timeout * 3 / 4);
            let wait_ms = wait_ms(turn);
            let r = self
                .on_any(|mut c| async move {
                    c.read(pb::ReadRequest {
                        group,
                        from_lsn,
                        max_records,
                        min_csn: at.min_csn,
                        wait_ms,
                    })
                    .await
                    .map(|r| r.into_inner())
                })
                .await;
            match r {
                Err(ClientError::Status { code, .. })
                    if code == Code::DeadlineExceeded && turn < left => {}
                r => return r,
            }
        }
    }

    /// Reads committed entries of out-of-order `group` from slot `from_seq` on, in slot
    /// order, from any replica that answers (each serves its own committed prefix).
    pub async fn read_out_of_order(
        &mut self,
        group: u64,
        from_seq: u64,
        max_records: u32,
    ) -> Result<pb::ReadOutOfOrderResponse, ClientError> {
        self.on_any(|mut c| async move {
            c.read_out_of_order(pb::ReadOutOfOrderRequest {
                group,
                from_seq,
                max_records,
            })
            .await
            .map(|r| r.into_inner())
        })
        .await
    }

    /// Streams committed entries of out-of-order `group` from slot `from_seq` on, in slot
    /// order, waiting for new ones (from the first replica that answers).
    pub async fn tail_out_of_order(
        &mut self,
        group: u64,
        from_seq: u64,
    ) -> Result<tonic::Streaming<pb::ReadOutOfOrderResponse>, ClientError> {
        self.on_any(|mut c| async move {
            c.tail_out_of_order(pb::TailOutOfOrderRequest {
                group,
                from_seq,
                max_records: 0,
            })
            .await
            .map(|r| r.into_inner())
        })
        .await
    }

    /// Streams committed records of `group` from `from_lsn`, waiting for new ones.
    pub async fn tail(
        &mut self,
        group: u64,
        from_lsn: u64,
    ) -> Result<tonic::Streaming<pb::ReadResponse>, ClientError> {
        self.tail_at_csn(group, from_lsn, AtCsn::default()).await
    }

    /// As [`Client::tail`], from a replica that first waits, up to `at.wait` (at most
    /// 60 s), until it holds every record with a CSN up to `at.min_csn` (see
    /// [`Client::read_at_csn`]); past it the stream ends `DEADLINE_EXCEEDED` naming the
    /// CSNs. The wait is on the stream, so the call timeout does not bound it.
    pub async fn tail_at_csn(
        &mut self,
        group: u64,
        from_lsn: u64,
        at: AtCsn,
    ) -> Result<tonic::Streaming<pb::ReadResponse>, ClientError> {
        let wait_ms = wait_ms(at.wait);
        self.on_any(|mut c| async move {
            c.tail(pb::TailRequest {
                group,
                from_lsn,
                max_records: 0,
                min_csn: at.min_csn,
                wait_ms,
            })
            .await
            .map(|r| r.into_inner())
        })
        .await
    }

    /// Follows the role of `group`'s replica at the first endpoint that answers (PALF's
    /// monitor_role): its role, leader, proposal id (term) and readable CSN now, then one
    /// event per change. The stream ends `NOT_FOUND` once the group is deleted there.
    pub async fn watch_role(
        &mut self,
        group: u64,
    ) -> Result<tonic::Streaming<pb::RoleEvent>, ClientError> {
        self.on_any(|mut c| async move {
            c.watch_role(pb::WatchRoleRequest { group })
                .await
                .map(|r| r.into_inner())
        })
        .await
    }

    /// Finds the first committed record of `group` with CSN at least `csn`.
    pub async fn locate(&mut self, group: u64, csn: u64) -> Result<Option<u64>, ClientError> {
        self.on_any(|mut c| async move {
            c.locate(pb::LocateRequest { group, csn })
                .await
                .map(|r| r.into_inner())
        })
        .await
        .map(|r| r.found.then_some(r.lsn))
    }

    /// The status of every endpoint (an error for those that do not answer).
    pub async fn status_all(
        &mut self,
        group: u64,
    ) -> Vec<(String, Result<pb::StatusResponse, ClientError>)> {
        let mut out = Vec::new();
        for i in 0..self.endpoints.len() {
            let ep = self.endpoints[i].clone();
            let r = match self.conn(i).await {
                Ok(mut c) => c
                    .status(pb::StatusRequest { group })
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| {
                        self.conns[i] = None;
                        ClientError::status(&ep, s)
                    }),
                Err(e) => Err(e),
            };
            out.push((ep, r));
        }
        out
    }

    /// Creates `group` on every endpoint with the initial membership. Endpoints where it
    /// already exists count as done.
    pub async fn create_group(
        &mut self,
        group: u64,
        voters: Vec<u64>,
        learners: Vec<u64>,
    ) -> Result<(), ClientError> {
        self.create_group_with(pb::CreateGroupRequest {
            group,
            voters,
            learners,
            ..Default::default()
        })
        .await
    }

    /// Creates a group on every endpoint from a full request (mode, out-of-order
    /// replication addresses). Endpoints where it already exists count as done.
    pub async fn create_group_with(
        &mut self,
        req: pb::CreateGroupRequest,
    ) -> Result<(), ClientError> {
        for i in 0..self.endpoints.len() {
            let mut c = self.conn(i).await?;
            let r = c.create_group(req.clone()).await;
            match r {
                Ok(_) => {}
                Err(s) if s.code() == Code::AlreadyExists => {}
                Err(s) => return Err(ClientError::status(&self.endpoints[i], s)),
            }
        }
        Ok(())
    }

    /// Deletes the replica of `group` at endpoint `i` (its data included). Refused while
    /// that node is a voter of the group, unless `force`.
    pub async fn delete_group(
        &mut self,
        i: usize,
        group: u64,
        force: bool,
    ) -> Result<(), ClientError> {
        let (ep, mut c) = self.at(i).await?;
        c.delete_group(pb::DeleteGroupRequest { group, force })
            .await
            .map(|_| ())
            .map_err(|s| ClientError::status(&ep, s))
    }

    /// Restarts the replica of `group` at endpoint `i` from its files (one that stopped
    /// or did not start; see the `RestartGroup` RPC).
    pub async fn restart_group(&mut self, i: usize, group: u64) -> Result<(), ClientError> {
        let (ep, mut c) = self.at(i).await?;
        c.restart_group(pb::RestartGroupRequest { group })
            .await
            .map(|_| ())
            .map_err(|s| ClientError::status(&ep, s))
    }

    /// Sets the election priority of the replica at endpoint `i`.
    pub async fn set_priority(
        &mut self,
        i: usize,
        group: u64,
        priority: u32,
    ) -> Result<(), ClientError> {
        let (ep, mut c) = self.at(i).await?;
        c.set_priority(pb::SetPriorityRequest { group, priority })
            .await
            .map(|_| ())
            .map_err(|s| ClientError::status(&ep, s))
    }

    /// Mirrors whole committed groups of another log into mirror `group` (access mode
    /// raw-write) at its leader and waits for each one's final result (see `Mirror` in
    /// `proto/chorus.proto`): `groups` as [`Client::read_groups`] returns them, in order,
    /// the first at the mirror's end.
    pub async fn mirror(
        &mut self,
        group: u64,
        groups: Vec<Vec<u8>>,
    ) -> Result<Vec<pb::AppendResult>, ClientError> {
        let req = pb::MirrorRequest { group, groups };
        self.on_leader(group, false, |mut c| {
            let req = req.clone();
            async move { c.mirror(req).await.map(|r| r.into_inner().results) }
        })
        .await
    }

    /// Switches `group`'s access mode at its leader: `append` or `raw-write`.
    pub async fn set_access_mode(&mut self, group: u64, mode: &str) -> Result<(), ClientError> {
        let mode = mode.to_string();
        self.on_leader(group, true, |mut c| {
            let mode = mode.clone();
            async move {
                c.set_access_mode(pb::SetAccessModeRequest { group, mode })
                    .await
                    .map(|_| ())
            }
        })
        .await
    }

    /// Whole committed groups of `group` from `from_lsn` (a group boundary), headers
    /// included, from any replica that answers.
    pub async fn read_groups(
        &mut self,
        group: u64,
        from_lsn: u64,
        max_bytes: u32,
    ) -> Result<pb::ReadGroupsResponse, ClientError> {
        self.on_any(|mut c| async move {
            c.read_groups(pb::ReadGroupsRequest {
                group,
                from_lsn,
                max_bytes,
            })
            .await
            .map(|r| r.into_inner())
        })
        .await
    }

    /// Trims `group` below `lsn` on every endpoint.
    pub async fn trim(&mut self, group: u64, lsn: u64) -> Result<(), ClientError> {
        for i in 0..self.endpoints.len() {
            let ep = self.endpoints[i].clone();
            let mut c = self.conn(i).await?;
            c.trim(pb::TrimRequest { group, lsn })
                .await
                .map_err(|s| ClientError::status(&ep, s))?;
        }
        Ok(())
    }
}

/// How a read waits for a CSN (PALF section 4.2, follower reads): see `ReadRequest`'s
/// `min_csn` and `wait_ms`. The default reads at once, as before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtCsn {
    /// Answer only once the replica's readable CSN is at least this, e.g. the CSN an
    /// append returned: the answer then misses no record with a CSN up to it (0: at once).
    pub min_csn: u64,
    /// How long the replica may wait for it (zero: not at all).
    pub wait: Duration,
}

impl AtCsn {
    /// Wait up to `wait` for `min_csn`.
    pub fn new(min_csn: u64, wait: Duration) -> Self {
        Self { min_csn, wait }
    }
}

/// A wait as `wait_ms` carries it (rounded up, so a wait under a millisecond still
/// waits; at most `u32::MAX`).
fn wait_ms(d: Duration) -> u32 {
    d.as_nanos().div_ceil(1_000_000).min(u32::MAX.into()) as u32
}

/// The gRPC metadata key a server's refusal carries when it did nothing with the request
/// because the group is not running on that node (its damaged replica did not start, its
/// replica halted and refuses appends, or the group had stopped there before the request,
/// e.g. on a full disk): even a non-idempotent request (a membership change, an append)
/// may go to another endpoint. The value is the group id.
pub const NOT_STARTED_KEY: &str = "chorus-not-started";

/// The gRPC metadata key of a leader's refusal of a write its group's access mode does
/// not take (an append to a mirror, a mirror write to a primary): no other node would
/// take it, so it is not retried. The value is the mode of the group's config.
pub const ACCESS_MODE_KEY: &str = "chorus-access-mode";

/// The gRPC metadata key of a leader's refusal of an operator's change by the strict
/// check (a voter added directly, a removal that would stop the group, a transfer to a
/// node down or behind): the leader refused it, so no other node is tried. The value is
/// `strict`; the message says why and that forcing skips the check.
pub const REFUSED_KEY: &str = "chorus-refused";

/// Whether a failed call surely did nothing (the connection could not be made, or the
/// server refused it marked [`NOT_STARTED_KEY`]), so that retrying it elsewhere cannot
/// apply it twice.
fn not_sent(s: &Status) -> bool {
    if s.metadata().contains_key(NOT_STARTED_KEY) {
        return true;
    }
    let m = s.message().to_ascii_lowercase();
    let mut src = std::error::Error::source(s);
    let mut chain = m.clone();
    while let Some(e) = src {
        chain.push_str(&e.to_string().to_ascii_lowercase());
        src = e.source();
    }
    chain.contains("connection refused") || chain.contains("tcp connect error")
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal marked "not started here" did nothing and may go to another endpoint; an
    /// UNAVAILABLE without the mark (a connection lost mid-call) may have been applied.
    #[test]
    fn only_a_marked_or_unconnected_failure_counts_as_not_sent() {
        let mut marked = Status::unavailable("group 2 not started on this node");
        marked
            .metadata_mut()
            .insert(NOT_STARTED_KEY, "2".parse().unwrap());
        assert!(not_sent(&marked));
        assert!(!not_sent(&Status::unavailable("connection reset mid-call")));
        assert!(not_sent(&Status::unavailable(
            "tcp connect error: Connection refused"
        )));
    }

    /// A server that takes the connection and the request but never answers (nor closes)
    /// does not hold an append forever: it ends Indeterminate — it may have been taken —
    /// once `call_timeout` passes.
    #[test]
    fn an_append_to_a_server_that_never_answers_ends_indeterminate() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            // Accept and read everything, answer nothing, close nothing.
            let mut held = Vec::new();
            for conn in listener.incoming().take(4) {
                let Ok(mut conn) = conn else { return };
                let reader = conn.try_clone().unwrap();
                held.push(reader);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while matches!(std::io::Read::read(&mut conn, &mut buf), Ok(n) if n > 0) {}
                });
            }
        });
        let mut c = Client::new(vec![addr.to_string()]);
        c.call_timeout = Duration::from_millis(300);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let r = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), c.append(1, vec![b"x".to_vec()], 0))
                .await
                .expect("the append returned")
        });
        match r {
            Err(ClientError::Indeterminate { detail, .. }) => {
                assert!(detail.contains("no answer within 300ms"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// `host:port` works as an endpoint; a written scheme is kept, a bad one is named.
    #[test]
    fn a_bare_host_and_port_is_taken_as_http() {
        let c = Client::new(vec![
            "127.0.0.1:7001".into(),
            "http://127.0.0.1:7002".into(),
            "https://db1:7003".into(),
        ]);
        assert_eq!(
            c.endpoints(),
            [
                "http://127.0.0.1:7001",
                "http://127.0.0.1:7002",
                "https://db1:7003"
            ]
        );
        let mut bad = Client::new(vec!["http://no spaces:1".into()]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match rt.block_on(bad.conn(0)) {
            Err(ClientError::BadEndpoint { endpoint, .. }) => {
                assert_eq!(endpoint, "http://no spaces:1")
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
