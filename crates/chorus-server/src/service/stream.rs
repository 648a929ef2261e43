//! `AppendStream`: batches of records in, each batch's outcomes out, in order, on one
//! stream (see `proto/chorus.proto`). The gRPC path's answer to one unary call per append:
//! a client batches its callers' records onto one stream with a short linger
//! (`chorus_client::stream`), and several batches are in flight at once.
//!
//! Two tasks per stream: the **reader** appends each batch as it arrives (its records get
//! their LSNs and CSNs in arrival order, as unary appends do) and queues the batch's
//! pending results; the **answerer** waits for them in order and sends each batch's
//! answer. The queue between them is bounded ([`MAX_BATCHES_AHEAD`]): once full the reader
//! stops reading, and HTTP/2 flow control holds the client back. A refusal stops the
//! reader before anything else of the stream is appended, so the status that ends the
//! stream can name the first batch not appended ([`NOT_APPENDED_FROM_KEY`]), and a client
//! may send it and the later ones again elsewhere.

use chorus_client::stream::NOT_APPENDED_FROM_KEY;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::*;

/// Batches the reader appends ahead of their answers, at most.
pub(super) const MAX_BATCHES_AHEAD: usize = 256;

/// A batch appended (wholly or cut short by a refusal) and waiting for its results.
struct Batch {
    seq: u64,
    pending: Vec<chorus_runtime::Appended>,
    /// The refusal that ended the stream, and the first batch it left not appended.
    refused: Option<(Status, u64)>,
}

/// `status` marked with the first batch not appended.
fn ending(mut s: Status, not_appended_from: u64) -> Status {
    if let Ok(v) = not_appended_from.to_string().parse() {
        s.metadata_mut().insert(NOT_APPENDED_FROM_KEY, v);
    }
    s
}

/// Serves one `AppendStream`.
pub(super) fn serve(
    svc: &Service,
    req: Request<tonic::Streaming<pb::AppendStreamRequest>>,
) -> Result<Response<Follow<pb::AppendStreamResponse>>, Status> {
    let meta = req.metadata().clone();
    let mut inbound = req.into_inner();
    let (queue_tx, mut queue_rx) = mpsc::channel::<Batch>(MAX_BATCHES_AHEAD);
    let (out_tx, out_rx) = mpsc::channel(64);
    let svc = svc.clone();
    // The reader.
    tokio::spawn(async move {
        let mut group = None;
        loop {
            let m = match inbound.message().await {
                Ok(Some(m)) => m,
                // The client closed its side, or the stream broke: nothing more to append.
                Ok(None) | Err(_) => return,
            };
            let seq = m.seq;
            let refuse = |s: Status| Batch {
                seq,
                pending: Vec::new(),
                refused: Some((s, seq)),
            };
            let checked = (|| {
                if *group.get_or_insert(m.group) != m.group {
                    return Err(Status::invalid_argument(format!(
                        "batch {seq} names group {}, this stream's batches group {}",
                        m.group,
                        group.unwrap_or_default()
                    )));
                }
                svc.auth.check(&meta, Class::Append, Some(m.group))?;
                if m.records.len() > MAX_APPEND_BATCH {
                    return Err(Status::invalid_argument(format!(
                        "{} records in batch {seq}; at most {MAX_APPEND_BATCH}",
                        m.records.len()
                    )));
                }
                svc.ordered(m.group, "Append")
            })();
            let batch = match checked {
                Err(s) => refuse(s),
                Ok(log) => {
                    let mut pending = Vec::with_capacity(m.records.len());
                    let mut refused = None;
                    for (i, r) in m.records.iter().enumerate() {
                        match log.append(r, m.ref_csn) {
                            Ok(a) => pending.push(a),
                            Err(e) => {
                                // Records before it stand; it and everything after it
                                // in the stream were not appended.
                                let next = if i == 0 { seq } else { seq + 1 };
                                refused = Some((status(e), next));
                                break;
                            }
                        }
                    }
                    Batch {
                        seq,
                        pending,
                        refused,
                    }
                }
            };
            let stop = batch.refused.is_some();
            if queue_tx.send(batch).await.is_err() || stop {
                return;
            }
        }
    });
    // The answerer.
    tokio::spawn(async move {
        while let Some(b) = queue_rx.recv().await {
            if !b.pending.is_empty() {
                let mut results = Vec::with_capacity(b.pending.len());
                for a in b.pending {
                    let (lsn, csn) = (a.lsn, a.csn);
                    let r = a.result.await;
                    results.push(match r {
                        Ok(r) => pb::AppendResult {
                            lsn: r.lsn,
                            csn: r.csn,
                            outcome: pb_outcome(r.outcome),
                            ..Default::default()
                        },
                        // Appended, outcome not learned: unknown, by name.
                        Err(e) => pb::AppendResult {
                            lsn,
                            csn,
                            unknown: e.to_string(),
                            ..Default::default()
                        },
                    });
                }
                let answer = pb::AppendStreamResponse {
                    seq: b.seq,
                    results,
                };
                if out_tx.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
            if let Some((s, from)) = b.refused {
                let _ = out_tx.send(Err(ending(s, from))).await;
                return;
            }
        }
    });
    Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
}
