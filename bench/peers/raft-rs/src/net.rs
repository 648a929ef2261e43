//! A small TCP transport for raft `Message`s.
//!
//! Each node dials every other node once and sends on that connection only; it receives on
//! the connections the others dialled. A connection starts with the sender's id (u64 LE);
//! then frames of `[u32 LE length][protobuf Message]`. Per peer one writer thread takes
//! everything queued since its last write, writes it into a 1 MiB buffer and flushes once.
//! Per inbound connection one reader thread parses frames and hands them to the raft thread.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::node::Event;

const BUF: usize = 1 << 20;
/// Frames larger than this are a protocol error (raft's messages stay near
/// `max_size_per_msg`, 1 MiB).
const MAX_FRAME: usize = 256 << 20;

/// The sending side: one queue per peer.
#[derive(Clone)]
pub struct Transport {
    /// Indexed by node id; `None` for this node itself.
    queues: Arc<Vec<Option<Sender<Message>>>>,
    connected: Arc<Vec<AtomicBool>>,
}

impl Transport {
    /// Starts a writer thread per peer (`peers[i]` is node i+1's address). Messages to a peer
    /// that cannot be reached are dropped and reported as `Event::Unreachable`, so raft
    /// probes it again later.
    pub fn start(my_id: u64, peers: &[String], events: Sender<Event>) -> Transport {
        let n = peers.len();
        let mut queues = vec![None];
        let connected: Arc<Vec<AtomicBool>> =
            Arc::new((0..=n).map(|_| AtomicBool::new(false)).collect());
        for (i, addr) in peers.iter().enumerate() {
            let id = i as u64 + 1;
            if id == my_id {
                queues.push(None);
                continue;
            }
            let (tx, rx) = crossbeam_channel::unbounded();
            queues.push(Some(tx));
            let addr = addr.clone();
            let events = events.clone();
            let connected = connected.clone();
            thread::Builder::new()
                .name(format!("send-{id}"))
                .spawn(move || writer(my_id, id, addr, rx, events, &connected[id as usize]))
                .expect("spawn writer");
        }
        Transport {
            queues: Arc::new(queues),
            connected,
        }
    }

    pub fn send(&self, msgs: Vec<Message>) {
        for m in msgs {
            if let Some(Some(q)) = self.queues.get(m.to as usize) {
                let _ = q.send(m);
            }
        }
    }

    /// Whether this node has a live connection to every peer.
    pub fn all_connected(&self) -> bool {
        self.queues
            .iter()
            .enumerate()
            .all(|(id, q)| q.is_none() || self.connected[id].load(Ordering::Acquire))
    }
}

fn writer(
    my_id: u64,
    to: u64,
    addr: String,
    rx: Receiver<Message>,
    events: Sender<Event>,
    connected: &AtomicBool,
) {
    let mut frame = Vec::with_capacity(64 << 10);
    'reconnect: loop {
        let stream = loop {
            match TcpStream::connect(&addr) {
                Ok(s) => break s,
                Err(_) => {
                    // Whatever was queued meanwhile is lost; raft resends.
                    let mut dropped = false;
                    while rx.try_recv().is_ok() {
                        dropped = true;
                    }
                    if dropped {
                        let _ = events.send(Event::Unreachable(to));
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let mut w = BufWriter::with_capacity(BUF, stream);
        if w.write_all(&my_id.to_le_bytes())
            .and_then(|_| w.flush())
            .is_err()
        {
            continue;
        }
        connected.store(true, Ordering::Release);
        loop {
            let Ok(first) = rx.recv() else { return };
            let mut res = put(&mut w, &mut frame, &first);
            while res.is_ok() {
                match rx.try_recv() {
                    Ok(m) => res = put(&mut w, &mut frame, &m),
                    Err(_) => break,
                }
            }
            if res.and_then(|_| w.flush()).is_err() {
                connected.store(false, Ordering::Release);
                let _ = events.send(Event::Unreachable(to));
                thread::sleep(Duration::from_millis(20));
                continue 'reconnect;
            }
        }
    }
}

fn put(w: &mut BufWriter<TcpStream>, frame: &mut Vec<u8>, m: &Message) -> std::io::Result<()> {
    frame.clear();
    frame.extend_from_slice(&[0; 4]);
    m.write_to_vec(frame)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    w.write_all(frame)
}

/// Accepts connections and starts a reader thread for each. With `exit_when_closed`, the
/// process exits when the connection from that node closes (the followers stop with node 1).
pub fn serve(listener: TcpListener, events: Sender<Event>, exit_when_closed: Option<u64>) {
    thread::Builder::new()
        .name("accept".into())
        .spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { continue };
                let events = events.clone();
                thread::Builder::new()
                    .name("recv".into())
                    .spawn(move || {
                        let from = reader(s, &events);
                        if let (Some(f), Some(w)) = (from, exit_when_closed) {
                            if f == w {
                                eprintln!("connection from node {f} closed; exiting");
                                std::process::exit(0);
                            }
                        }
                    })
                    .expect("spawn reader");
            }
        })
        .expect("spawn acceptor");
}

/// Reads frames until the connection ends; returns the sender's id if the handshake came.
fn reader(s: TcpStream, events: &Sender<Event>) -> Option<u64> {
    let _ = s.set_nodelay(true);
    let mut r = BufReader::with_capacity(BUF, s);
    let mut id = [0u8; 8];
    r.read_exact(&mut id).ok()?;
    let from = u64::from_le_bytes(id);
    let mut len = [0u8; 4];
    loop {
        if r.read_exact(&mut len).is_err() {
            return Some(from);
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > MAX_FRAME {
            eprintln!("frame of {n} bytes from node {from}; closing");
            return Some(from);
        }
        let mut buf = vec![0u8; n];
        if r.read_exact(&mut buf).is_err() {
            return Some(from);
        }
        // Parsed from `Bytes`, entries' data and context share this buffer.
        match Message::parse_from_carllerche_bytes(&Bytes::from(buf)) {
            Ok(m) => {
                if events.send(Event::Msg(m)).is_err() {
                    return Some(from);
                }
            }
            Err(e) => {
                eprintln!("bad message from node {from}: {e}; closing");
                return Some(from);
            }
        }
    }
}
