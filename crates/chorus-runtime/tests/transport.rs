//! The shared transport: messages of every group mode, for any number of groups, share
//! one connection per peer and arrive whole and in the order they were queued — whether
//! the sender wrote them inline or its writer thread did, and when the socket took only
//! part of a frame.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::ooo::replica::Msg as OooMsg;
use chorus_core::replica::Message;
use chorus_runtime::transport::{Handler, TcpConfig, TcpTransport, Transport};

/// What arrived, in order: (from, group, the message's number).
#[derive(Default)]
struct Log {
    got: Mutex<Vec<(u64, u64, u64)>>,
    /// While set, each delivery sleeps: the receiver falls behind and the sender's socket
    /// fills.
    slow: AtomicBool,
}

impl Log {
    fn note(&self, from: u64, group: u64, n: u64) {
        if self.slow.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(300));
        }
        self.got.lock().unwrap().push((from, group, n));
    }
}

impl Handler for Log {
    fn deliver(&self, from: u64, group: u64, msg: Message) {
        match msg {
            Message::TimeoutNow { pid } => self.note(from, group, pid),
            other => panic!("unexpected ordered message {other:?}"),
        }
    }

    fn deliver_ooo(&self, from: u64, group: u64, msg: OooMsg) {
        match msg {
            OooMsg::Snapshot { term, data, .. } => {
                assert!(
                    data.iter().all(|&b| b == (term % 251) as u8),
                    "message {term} damaged"
                );
                self.note(from, group, term)
            }
            other => panic!("unexpected out-of-order message {other:?}"),
        }
    }
}

#[test]
fn every_mode_shares_one_connection_and_keeps_frames_whole_and_in_order() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let log = Arc::new(Log::default());
    let receiver = TcpTransport::start(TcpConfig::new(2, any), log.clone()).unwrap();
    let mut cfg = TcpConfig::new(1, any);
    cfg.peers.insert(2, receiver.local_addr().to_string());
    cfg.max_frame_bytes = 1 << 20;
    let sender = TcpTransport::start(cfg, Arc::new(Log::default())).unwrap();
    let n = 2000u64;
    log.slow.store(true, Ordering::Relaxed);
    for i in 0..n {
        // Ordered and out-of-order messages for several groups, interleaved; some
        // out-of-order ones larger than a socket buffer takes at once.
        if i.is_multiple_of(3) {
            sender.send(2, 1 + i % 2, &Message::TimeoutNow { pid: i });
        } else {
            let len = (i as usize * 7919) % if i % 10 == 1 { 200_000 } else { 4096 };
            let msg = OooMsg::Snapshot {
                term: i,
                base: 0,
                offset: 0,
                total: len as u64,
                part: None,
                data: vec![(i % 251) as u8; len],
            };
            sender.send_ooo(2, 7 + i % 3, &msg);
        }
        if i == n / 2 {
            // The receiver keeps up from here on: sends go inline again.
            log.slow.store(false, Ordering::Relaxed);
        }
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (log.got.lock().unwrap().len() as u64) < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} arrived; sender {:?}",
            log.got.lock().unwrap().len(),
            sender.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let got = log.got.lock().unwrap().clone();
    for (i, &(from, group, num)) in got.iter().enumerate() {
        let i = i as u64;
        assert_eq!(num, i, "out of order at {i}");
        assert_eq!(from, 1);
        let want = if i.is_multiple_of(3) {
            1 + i % 2
        } else {
            7 + i % 3
        };
        assert_eq!(group, want, "message {i} for the wrong group");
    }
    let s = sender.stats();
    assert_eq!(s.frames_sent, n);
    assert_eq!(s.frames_dropped, 0);
    assert_eq!(receiver.stats().frames_received, n);
    assert_eq!(receiver.stats().bad_connections, 0);
    sender.shutdown();
    receiver.shutdown();
}

/// A message over the sender's frame limit is not sent (the receiver would refuse it
/// and close the connection, losing what follows): it is dropped and counted, and the
/// messages after it arrive.
#[test]
fn an_oversized_message_is_dropped_and_counted_not_sent() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let log = Arc::new(Log::default());
    let receiver = TcpTransport::start(TcpConfig::new(2, any), log.clone()).unwrap();
    let mut cfg = TcpConfig::new(1, any);
    cfg.peers.insert(2, receiver.local_addr().to_string());
    cfg.max_frame_bytes = 64 << 10;
    let sender = TcpTransport::start(cfg, Arc::new(Log::default())).unwrap();
    let big = OooMsg::Snapshot {
        term: 1,
        base: 0,
        offset: 0,
        total: 0,
        part: None,
        data: vec![1; 100 << 10],
    };
    sender.send(2, 1, &Message::TimeoutNow { pid: 0 });
    sender.send_ooo(2, 7, &big);
    sender.send(2, 1, &Message::TimeoutNow { pid: 1 });
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.got.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "the messages did not arrive");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(*log.got.lock().unwrap(), vec![(1, 1, 0), (1, 1, 1)]);
    assert_eq!(sender.stats().frames_dropped, 1);
    sender.shutdown();
    receiver.shutdown();
}

/// A peer that was down long enough for the sender's dial backoff to reach its ceiling
/// (a second) is dialled again as soon as it dials the sender, not when that backoff
/// ends: after a whole cluster restarts, each node otherwise waits up to a second to reach
/// the nodes that came up after it.
#[test]
fn a_peer_that_comes_back_and_dials_us_is_dialled_at_once() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    // A free port for node 2, which is not up yet.
    let port = std::net::TcpListener::bind(any)
        .unwrap()
        .local_addr()
        .unwrap();
    let mut cfg = TcpConfig::new(1, any);
    cfg.peers.insert(2, port.to_string());
    let one = TcpTransport::start(cfg, Arc::new(Log::default())).unwrap();
    let mut pid = 0;
    let mut send = |t: &TcpTransport| {
        pid += 1;
        t.send(2, 1, &Message::TimeoutNow { pid });
    };
    // Failed dials back off 10 ms, 20 ms, ... up to 1 s: after 3 s of sends the backoff is
    // at its ceiling. Then wait for a failed dial, which starts a full backoff.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        send(&one);
        std::thread::sleep(Duration::from_millis(10));
    }
    let dropped = one.stats().frames_dropped;
    let deadline = Instant::now() + Duration::from_secs(10);
    while one.stats().frames_dropped == dropped {
        assert!(Instant::now() < deadline, "no dial failed");
        send(&one);
        std::thread::sleep(Duration::from_millis(2));
    }
    // Node 2 comes up and says something to node 1 (its hello tells node 1 it is up).
    let up = Instant::now();
    let log = Arc::new(Log::default());
    let mut cfg = TcpConfig::new(2, port);
    cfg.peers.insert(1, one.local_addr().to_string());
    let two = TcpTransport::start(cfg, log.clone()).unwrap();
    two.send(1, 1, &Message::TimeoutNow { pid: 0 });
    while log.got.lock().unwrap().is_empty() {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "nothing reached node 2"
        );
        send(&one);
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = up.elapsed();
    assert!(
        took < Duration::from_millis(600),
        "node 1 reached node 2 {took:?} after it came up (its backoff was 1 s)"
    );
    one.shutdown();
    two.shutdown();
}
