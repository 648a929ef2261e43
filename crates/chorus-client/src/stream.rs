//! A streaming appender: concurrent appends to one ordered group share one gRPC stream
//! (`AppendStream`), batched with a short linger as a Kafka producer batches, and each
//! gets its own explicit outcome, exactly as a unary append reports it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), chorus_client::ClientError> {
//! let c = chorus_client::Client::new(vec!["http://127.0.0.1:7001".into()]);
//! let s = chorus_client::stream::AppendStream::new(c, 1, Default::default());
//! let r = s.append(b"hello".to_vec()).await?; // committed, failed, or unknown (Err)
//! println!("LSN {} CSN {}", r.lsn, r.csn);
//! # Ok(()) }
//! ```
//!
//! **Outcomes.** Each record's result is the server's [`pb::AppendResult`] (committed or
//! failed, with its LSN and CSN; or `unknown` set when the replica never learned it), or
//! an error: [`ClientError::Indeterminate`] when the stream broke before the record's
//! batch was answered (it may or may not have been appended: read the log to find out),
//! [`ClientError::NoLeader`] when no node took it within [`Client::leader_timeout`]
//! (nothing was appended), or another refusal by name.
//!
//! **Retries.** A stream ends with a status naming the first batch it did not append
//! (trailer [`NOT_APPENDED_FROM_KEY`]): that batch and every later one were surely not
//! appended (nor the records of an earlier batch past its results), so they are sent
//! again, on the same endpoint or the next (a follower refuses with FAILED_PRECONDITION).
//! A batch sent on a stream that broke without that trailer is never sent again.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use crate::{pb, Client, ClientError, ACCESS_MODE_KEY, REFUSED_KEY};

/// Trailer on a status ending an `AppendStream`: the `seq` of the first batch that was
/// not appended; neither was any later batch.
pub const NOT_APPENDED_FROM_KEY: &str = "chorus-not-appended-from";

/// How an [`AppendStream`] batches.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// How long a batch waits for more records after its first (Kafka's `linger.ms`).
    pub linger: Duration,
    /// Records per batch at most.
    pub max_batch_records: usize,
    /// Bytes of records per batch at most (a batch holds at least one record).
    pub max_batch_bytes: usize,
    /// Records sent and not yet answered, at most: flow control towards the server.
    pub max_in_flight: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            linger: Duration::from_micros(200),
            max_batch_records: 1000,
            max_batch_bytes: 1 << 20,
            max_in_flight: 20_000,
        }
    }
}

type Reply = oneshot::Sender<Result<pb::AppendResult, ClientError>>;

/// One record waiting for its outcome.
struct Pending {
    record: Vec<u8>,
    ref_csn: u64,
    reply: Reply,
}

/// A batch sent on the current stream and not answered yet.
struct Sent {
    seq: u64,
    records: Vec<Pending>,
}

/// Appends to one ordered group through a shared stream (see the module docs). Cheap to
/// clone; the stream's task ends when every clone is dropped and its records answered.
#[derive(Clone, Debug)]
pub struct AppendStream {
    tx: mpsc::Sender<Pending>,
}

impl AppendStream {
    /// Starts the stream's task for `group` on the current Tokio runtime.
    pub fn new(client: Client, group: u64, opts: StreamOptions) -> Self {
        let (tx, rx) = mpsc::channel(opts.max_in_flight.max(1));
        tokio::spawn(run(client, group, opts, rx));
        Self { tx }
    }

    /// Appends `record` and waits for its outcome.
    pub async fn append(&self, record: Vec<u8>) -> Result<pb::AppendResult, ClientError> {
        self.append_with(record, 0).await
    }

    /// Appends `record` with reference CSN `ref_csn` (its CSN will be at least that).
    pub async fn append_with(
        &self,
        record: Vec<u8>,
        ref_csn: u64,
    ) -> Result<pb::AppendResult, ClientError> {
        let (reply, rx) = oneshot::channel();
        let gone = || ClientError::Indeterminate {
            endpoint: String::new(),
            detail: "the append stream's task ended".into(),
        };
        self.tx
            .send(Pending {
                record,
                ref_csn,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

/// The open stream: where batches go and where answers come from.
struct Open {
    endpoint: usize,
    requests: mpsc::Sender<pb::AppendStreamRequest>,
    answers: tonic::Streaming<pb::AppendStreamResponse>,
}

/// The task: batches callers' records, keeps one stream open at the leader, matches
/// answers to batches in order, and sends again what a refusal says was not appended.
async fn run(mut client: Client, group: u64, opts: StreamOptions, mut rx: mpsc::Receiver<Pending>) {
    let n = client.endpoints().len();
    let mut endpoint = *client.leader.get(&group).unwrap_or(&0);
    let mut open: Option<Open> = None;
    let mut sent: VecDeque<Sent> = VecDeque::new();
    let mut in_flight = 0usize;
    // Records to send before any new one: those a refusal said were not appended.
    let mut again: VecDeque<Pending> = VecDeque::new();
    let mut batch: Vec<Pending> = Vec::new();
    let mut batch_bytes = 0usize;
    let mut linger_until: Option<tokio::time::Instant> = None;
    let mut seq = 0u64;
    let mut closed = false;
    // Since when no endpoint has taken a batch (for the leader timeout), and why.
    let mut looking: Option<(tokio::time::Instant, String)> = None;
    loop {
        if closed && batch.is_empty() && again.is_empty() && sent.is_empty() {
            return;
        }
        // Refused records go first, in their order.
        while let Some(p) = again.pop_front() {
            batch_bytes += p.record.len();
            batch.push(p);
        }
        let full = batch.len() >= opts.max_batch_records || batch_bytes >= opts.max_batch_bytes;
        // A batch goes at once when nothing is in flight (one client pays no linger),
        // else when full or when its linger is over (many clients share batches).
        let due = sent.is_empty()
            || closed
            || linger_until.is_some_and(|t| tokio::time::Instant::now() >= t);
        if !batch.is_empty() && (full || due) {
            if let Some((since, why)) = &looking {
                if since.elapsed() >= client.leader_timeout {
                    let (waited, last) = (since.elapsed(), why.clone());
                    for p in batch.drain(..) {
                        in_flight -= 1;
                        let _ = p.reply.send(Err(ClientError::NoLeader {
                            group,
                            waited,
                            last: last.clone(),
                        }));
                    }
                    looking = None;
                    batch_bytes = 0;
                    linger_until = None;
                    continue;
                }
            }
            if open.is_none() {
                match open_stream(&mut client, endpoint).await {
                    Ok(o) => open = Some(o),
                    Err(e) => {
                        looking
                            .get_or_insert_with(|| (tokio::time::Instant::now(), String::new()))
                            .1 = e.to_string();
                        endpoint = (endpoint + 1) % n.max(1);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
            let o = open.as_ref().expect("opened");
            let req = pb::AppendStreamRequest {
                group,
                seq: seq + 1,
                records: batch.iter().map(|p| p.record.clone()).collect(),
                // One reference CSN per batch: the largest asked (each record's CSN is at
                // least it, which satisfies every record's own).
                ref_csn: batch.iter().map(|p| p.ref_csn).max().unwrap_or(0),
            };
            // A send that fails means the stream ended: its answers say how, and these
            // records, not sent, wait for the next stream.
            if o.requests.send(req).await.is_ok() {
                seq += 1;
                sent.push_back(Sent {
                    seq,
                    records: std::mem::take(&mut batch),
                });
                batch_bytes = 0;
                linger_until = None;
                continue;
            }
        }
        tokio::select! {
            r = rx.recv(), if !closed && in_flight < opts.max_in_flight && !full => match r {
                Some(p) => {
                    in_flight += 1;
                    batch_bytes += p.record.len();
                    batch.push(p);
                    linger_until.get_or_insert_with(|| tokio::time::Instant::now() + opts.linger);
                }
                None => closed = true,
            },
            _ = sleep_until(linger_until), if !batch.is_empty() => {}
            a = next_answer(&mut open) => {
                match a {
                    Ok(Some(resp)) => {
                        looking = None;
                        client.leader.insert(group, endpoint);
                        let Some(s) = sent.pop_front() else { continue };
                        debug_assert_eq!(s.seq, resp.seq);
                        let mut results = resp.results.into_iter();
                        for p in s.records {
                            match results.next() {
                                Some(r) => {
                                    in_flight -= 1;
                                    let _ = p.reply.send(Ok(r));
                                }
                                // Past its results: not appended (a refusal ends the
                                // stream next, naming the following batch).
                                None => again.push_back(p),
                            }
                        }
                    }
                    Ok(None) | Err(_) => {
                        let o = open.take().expect("answers came from an open stream");
                        let status = match a {
                            Err(s) => s,
                            _ => Status::unavailable("the append stream ended"),
                        };
                        let from = status
                            .metadata()
                            .get(NOT_APPENDED_FROM_KEY)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<u64>().ok());
                        let ep = client.endpoints()[o.endpoint].clone();
                        // Sent batches: answered by the refusal's mark, or unknown.
                        let mut back = VecDeque::new();
                        for s in sent.drain(..) {
                            if from.is_some_and(|f| s.seq >= f) {
                                back.extend(s.records);
                            } else {
                                for p in s.records {
                                    in_flight -= 1;
                                    let _ = p.reply.send(Err(ClientError::Indeterminate {
                                        endpoint: ep.clone(),
                                        detail: format!("the append stream broke before this record's answer: {}", status.message()),
                                    }));
                                }
                            }
                        }
                        // Not appended: again, before the records already waiting.
                        back.extend(again.drain(..));
                        again = back;
                        // As a unary append: another node may take what a follower, a
                        // node without the group started, or a broken stream did not.
                        let retry = matches!(
                            status.code(),
                            Code::FailedPrecondition | Code::Unavailable | Code::Unknown | Code::Cancelled
                        ) && !status.metadata().contains_key(ACCESS_MODE_KEY)
                            && !status.metadata().contains_key(REFUSED_KEY);
                        if !retry {
                            // Refused for a reason every node would give: by name.
                            for p in again.drain(..) {
                                in_flight -= 1;
                                let _ = p.reply.send(Err(ClientError::status(&ep, status.clone())));
                            }
                        } else {
                            looking
                                .get_or_insert_with(|| (tokio::time::Instant::now(), String::new()))
                                .1 = format!("{ep}: {}", status.message());
                            // A follower's connection is fine; another may be broken.
                            if status.code() != Code::FailedPrecondition {
                                client.conns[o.endpoint] = None;
                            }
                            endpoint = (o.endpoint + 1) % n.max(1);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        // Resend at once (no linger for what already waited).
                        if !again.is_empty() {
                            linger_until = Some(tokio::time::Instant::now());
                        }
                    }
                }
            }
        }
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The next answer of the open stream; pending for ever without one.
async fn next_answer(open: &mut Option<Open>) -> Result<Option<pb::AppendStreamResponse>, Status> {
    match open {
        Some(o) => o.answers.message().await,
        None => std::future::pending().await,
    }
}

/// Opens `AppendStream` on endpoint `i`.
async fn open_stream(client: &mut Client, i: usize) -> Result<Open, ClientError> {
    let mut c = client.conn(i).await?;
    let (tx, rx) = mpsc::channel(64);
    let answers = c
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| ClientError::status(&client.endpoints()[i], s))?
        .into_inner();
    Ok(Open {
        endpoint: i,
        requests: tx,
        answers,
    })
}
