//! `chorus-bench transport`: the replication transport measured against the alternative
//! the runtime issue names — the same messages in a tonic (gRPC) bidirectional stream.
//!
//! Both carry the same replica messages over loopback between two endpoints in this
//! process, with the same window (at most `window` messages sent and not yet received,
//! like the replica's bounded pipeline). Both encode every message with the wire codec
//! and decode it on receipt; the gRPC side additionally wraps it in a protobuf envelope
//! and HTTP/2 frames. Two loads: `Append`s with a group payload (throughput) and
//! `AppendAck`s (small-message rate). Systems alternate A B A B; medians are printed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::format::meta::ConfigVersion;
use chorus_core::format::wire::{self, Frame};
use chorus_core::replica::{LogPos, Message};
use chorus_runtime::transport::{Handler, TcpConfig, TcpTransport, Transport};

use crate::AnyResult;

#[allow(missing_docs, clippy::all)]
mod pb {
    tonic::include_proto!("replbench");
}

fn append(payload: usize, i: u64) -> Message {
    Message::Append {
        pid: 3,
        ts: i,
        prev: LogPos {
            lsn: i * payload as u64,
            acc: i as u32,
        },
        groups: vec![0xA5; payload],
        leader_end: (i + 1) * payload as u64,
        committed: i * payload as u64,
        config: None,
    }
}

fn ack(i: u64) -> Message {
    Message::AppendAck {
        pid: 3,
        ts: i,
        success: true,
        matched: i * 4096,
        hint: 0,
        committed: i * 4096,
        config_version: ConfigVersion::default(),
    }
}

struct Count(AtomicU64);

impl Handler for Count {
    fn deliver(&self, _from: u64, _group: u64, msg: Message) {
        std::hint::black_box(msg);
        self.0.fetch_add(1, Ordering::Release);
    }

    fn deliver_ooo(&self, _from: u64, _group: u64, msg: chorus_core::ooo::replica::Msg) {
        std::hint::black_box(msg);
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Chorus's transport: seconds to deliver `msgs`.
fn tcp_run(msgs: &[Message], window: u64) -> AnyResult<f64> {
    let rx_count = Arc::new(Count(AtomicU64::new(0)));
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let receiver = TcpTransport::start(TcpConfig::new(2, any), rx_count.clone())?;
    let mut cfg = TcpConfig::new(1, any);
    cfg.peers.insert(2, receiver.local_addr().to_string());
    let sender = TcpTransport::start(cfg, Arc::new(Count(AtomicU64::new(0))))?;
    // Connect and warm up with one message.
    sender.send(2, 1, &msgs[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rx_count.0.load(Ordering::Acquire) < 1 {
        if Instant::now() > deadline {
            return Err("tcp transport: no connection".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let base = rx_count.0.load(Ordering::Acquire);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(120);
    for (i, m) in msgs.iter().enumerate() {
        let mut spins = 0u32;
        while (i as u64).saturating_sub(rx_count.0.load(Ordering::Acquire) - base) >= window {
            if Instant::now() > deadline {
                return Err("tcp transport: stalled".into());
            }
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        sender.send(2, 1, m);
    }
    while rx_count.0.load(Ordering::Acquire) - base < msgs.len() as u64 {
        if Instant::now() > deadline {
            return Err(format!(
                "tcp transport: {} of {} delivered ({} dropped)",
                rx_count.0.load(Ordering::Acquire) - base,
                msgs.len(),
                sender.stats().frames_dropped
            )
            .into());
        }
        std::hint::spin_loop();
    }
    let secs = t0.elapsed().as_secs_f64();
    sender.shutdown();
    receiver.shutdown();
    Ok(secs)
}

#[derive(Default)]
struct Server {
    received: Arc<AtomicU64>,
}

type AckStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Ack, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl pb::repl_server::Repl for Server {
    type StreamStream = AckStream;

    async fn stream(
        &self,
        req: tonic::Request<tonic::Streaming<pb::Frame>>,
    ) -> Result<tonic::Response<Self::StreamStream>, tonic::Status> {
        let mut s = req.into_inner();
        let received = self.received.clone();
        tokio::spawn(async move {
            while let Ok(Some(f)) = s.message().await {
                match wire::decode_frame(&f.msg, u32::MAX) {
                    Ok((Frame::Msg { msg, .. }, _)) => {
                        std::hint::black_box(msg);
                        received.fetch_add(1, Ordering::Release);
                    }
                    _ => return,
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(tokio_stream::empty())))
    }
}

/// The same over a tonic bidirectional stream: seconds to deliver `msgs`.
fn grpc_run(msgs: &[Message], window: u64) -> AnyResult<f64> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let received = Arc::new(AtomicU64::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |s| {
                if let Ok(s) = &s {
                    let _ = s.set_nodelay(true);
                }
                s
            },
        );
        let svc = pb::repl_server::ReplServer::new(Server {
            received: received.clone(),
        })
        .max_decoding_message_size(64 << 20);
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming),
        );
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        let mut client = pb::repl_client::ReplClient::new(ch).max_encoding_message_size(64 << 20);
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::Frame>(1024);
        let call = tokio::spawn(async move {
            client
                .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        let frame = |m: &Message| {
            let mut b = Vec::new();
            wire::encode_msg_frame(1, m, &mut b);
            pb::Frame { group: 1, msg: b }
        };
        tx.send(frame(&msgs[0])).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while received.load(Ordering::Acquire) < 1 {
            if Instant::now() > deadline {
                return Err::<f64, Box<dyn std::error::Error>>("grpc: no connection".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let base = received.load(Ordering::Acquire);
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(120);
        for (i, m) in msgs.iter().enumerate() {
            while (i as u64).saturating_sub(received.load(Ordering::Acquire) - base) >= window {
                if Instant::now() > deadline {
                    return Err("grpc: stalled".into());
                }
                tokio::task::yield_now().await;
            }
            tx.send(frame(m)).await?;
        }
        while received.load(Ordering::Acquire) - base < msgs.len() as u64 {
            if Instant::now() > deadline {
                return Err("grpc: not all delivered".into());
            }
            tokio::task::yield_now().await;
        }
        let secs = t0.elapsed().as_secs_f64();
        drop(tx);
        let _ = call.await;
        server.abort();
        Ok(secs)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the comparison and prints a table.
pub fn run(
    append_msgs: usize,
    payload: usize,
    ack_msgs: usize,
    window: u64,
    rounds: usize,
) -> AnyResult<()> {
    let appends: Vec<Message> = (0..append_msgs as u64)
        .map(|i| append(payload, i))
        .collect();
    let acks: Vec<Message> = (0..ack_msgs as u64).map(ack).collect();
    println!(
        "transport: {append_msgs} appends of {payload} B and {ack_msgs} acks, window {window}, {rounds} rounds alternating"
    );
    for (name, msgs, bytes) in [("append", &appends, payload), ("ack", &acks, 0usize)] {
        let (mut tcp, mut grpc) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            tcp.push(tcp_run(msgs, window)?);
            grpc.push(grpc_run(msgs, window)?);
        }
        let (t, g) = (median(tcp.clone()), median(grpc.clone()));
        let n = msgs.len() as f64;
        println!(
            "{name:>6}: chorus-tcp {:>10.0} msg/s {:>8.1} MB/s | tonic-stream {:>10.0} msg/s {:>8.1} MB/s | ratio {:.2}x  (seconds: tcp {:?} grpc {:?})",
            n / t,
            n * bytes as f64 / t / 1e6,
            n / g,
            n * bytes as f64 / g / 1e6,
            g / t,
            tcp.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            grpc.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        );
    }
    Ok(())
}
