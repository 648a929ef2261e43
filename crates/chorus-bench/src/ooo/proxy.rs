//! A jittery replication link, identical for every system: a TCP proxy in front of one
//! node's replication port. What the dialling side sends is delayed; the other direction
//! is copied without delay. Two shapes ([`Shape`]):
//!
//! - **Keep order**: each chunk of bytes read is forwarded after a random delay below a
//!   bound, but never before the chunk read before it (its due time is
//!   `max(arrival + U[0, bound), previous due time)`) — a link whose one-way delay
//!   jitters, as one TCP connection does.
//! - **Reorder**: the proxy cuts the stream into the transport's frames and delays each
//!   *frame* by its own `U[0, bound)`, so a later frame overtakes an earlier one that drew
//!   a longer delay. This is one link standing for several connections between the same
//!   two nodes, one of which is momentarily slow: PolarFS section 5.1's case ("when one
//!   connection blocks or becomes slow, log entries would arrive at follower out of
//!   order"). Frames stay whole and the connection's Hello frame goes first.
//! - **One slow connection**: the link is `of` connections between the same two nodes;
//!   each frame goes on one of them, drawn at random, and only connection 0 jitters (its
//!   frames delayed by `U[0, bound)`, in its own order, as a TCP connection keeps it); the
//!   others forward at once. A frame on a fast connection overtakes the slow one's
//!   backlog. This is PolarFS 5.1's sentence taken literally — "when one connection
//!   blocks or becomes slow, log entries would arrive at follower out of order" — where
//!   **Reorder** makes every connection jittery.
//!
//! Every system's groups replicate over the node's transport, which dials a peer and only
//! writes on that connection, so the proxy in front of a node delays exactly what the
//! leader sends to it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_core::format::wire::FRAME_HEADER_SIZE;
use chorus_core::rng::Rng;

/// The length of the whole transport frame at the start of `buf`
/// (`chorus_core::format::wire`: a 20-byte header with `body_len`, u32 LE, at offset 8),
/// once its header is there.
fn frame_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < FRAME_HEADER_SIZE {
        return None;
    }
    let body = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")) as usize;
    Some(FRAME_HEADER_SIZE + body)
}

/// How the proxy delays what the dialler sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Chunks delayed by up to the bound, byte order kept.
    KeepOrder,
    /// Each frame delayed by its own draw; frames may overtake.
    Reorder,
    /// The link is `of` connections (≥ 2), one of which jitters; frames spread over them
    /// at random, so a frame on a fast one overtakes the slow one's.
    SlowConnection {
        /// How many connections the link stands for.
        of: u32,
    },
}

/// A running proxy; dropping it closes every connection and stops its threads.
pub struct JitterProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    socks: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl JitterProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`,
    /// delaying the dialler's bytes by up to `bound` (random, seeded with `seed`).
    pub fn start(upstream: SocketAddr, bound: Duration, seed: u64) -> std::io::Result<Self> {
        Self::start_shaped(upstream, bound, seed, Shape::KeepOrder)
    }

    /// As [`JitterProxy::start`], delaying in the given [`Shape`].
    pub fn start_shaped(
        upstream: SocketAddr,
        bound: Duration,
        seed: u64,
        shape: Shape,
    ) -> std::io::Result<Self> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let socks: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (st, sk) = (stop.clone(), socks.clone());
        let accept = std::thread::Builder::new()
            .name("jitter-proxy".into())
            .spawn(move || {
                let mut threads = Vec::new();
                let mut n = 0u64;
                while !st.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((down, _)) => {
                            n += 1;
                            match pipe(down, upstream, bound, seed ^ n, shape, &st, &sk) {
                                Ok(t) => threads.extend(t),
                                Err(e) => eprintln!("jitter proxy: connection dropped: {e}"),
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                for t in threads {
                    let _ = t.join();
                }
            })?;
        Ok(Self {
            addr,
            stop,
            socks,
            accept: Some(accept),
        })
    }

    /// The address to dial instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for JitterProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(s) = self.socks.lock() {
            for s in s.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// When each chunk ([`Shape::KeepOrder`]) or frame the dialler sends is due upstream.
struct Delays {
    shape: Shape,
    bound: Duration,
    rng: Rng,
    /// Per connection the link stands for, the due time of the last thing sent on it
    /// (nothing overtakes within one connection); empty for [`Shape::Reorder`].
    last: Vec<Instant>,
}

impl Delays {
    fn new(shape: Shape, bound: Duration, seed: u64, now: Instant) -> Self {
        let conns = match shape {
            Shape::KeepOrder => 1,
            Shape::Reorder => 0,
            Shape::SlowConnection { of, .. } => of.max(1) as usize,
        };
        Self {
            shape,
            bound,
            rng: Rng::new(seed),
            last: vec![now; conns],
        }
    }

    fn draw(&mut self) -> Duration {
        Duration::from_nanos(self.rng.below(self.bound.as_nanos() as u64))
    }

    /// The due time of the next chunk or frame, read at `now`.
    fn due(&mut self, now: Instant) -> Instant {
        let (conn, due) = match self.shape {
            Shape::KeepOrder => (0, now + self.draw()),
            Shape::Reorder => return now + self.draw(),
            Shape::SlowConnection { .. } => {
                let c = self.rng.below(self.last.len() as u64) as usize;
                // Connection 0 is the slow one; the others add no delay of their own.
                (c, if c == 0 { now + self.draw() } else { now })
            }
        };
        let due = due.max(self.last[conn]);
        self.last[conn] = due;
        due
    }
}

/// A frame longer than this is not a replication frame (both transports refuse far less).
const MAX_FRAME: usize = 256 << 20;

/// Starts the three threads of one proxied connection.
fn pipe(
    down: TcpStream,
    upstream: SocketAddr,
    bound: Duration,
    seed: u64,
    shape: Shape,
    stop: &Arc<AtomicBool>,
    socks: &Arc<Mutex<Vec<TcpStream>>>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    down.set_nonblocking(false)?;
    let up = TcpStream::connect_timeout(&upstream, Duration::from_secs(2))?;
    for s in [&down, &up] {
        s.set_nodelay(true)?;
    }
    if let Ok(mut v) = socks.lock() {
        v.push(down.try_clone()?);
        v.push(up.try_clone()?);
    }
    let close = {
        let (d, u) = (Arc::new(down.try_clone()?), Arc::new(up.try_clone()?));
        move || {
            let _ = d.shutdown(Shutdown::Both);
            let _ = u.shutdown(Shutdown::Both);
        }
    };
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut threads = Vec::new();
    // Dialler → upstream, read side: stamp each chunk (or frame) with its due time.
    {
        let (mut down, close, stop) = (down.try_clone()?, close.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut delays = Delays::new(shape, bound, seed, Instant::now());
            let mut buf = vec![0u8; 256 << 10];
            // Reorder: bytes read but not yet a whole frame, and whether the lead-in went.
            let mut pending: Vec<u8> = Vec::new();
            let mut led = false;
            'read: while !stop.load(Ordering::Relaxed) {
                let n = match down.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                match shape {
                    Shape::KeepOrder => {
                        let due = delays.due(Instant::now());
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                    Shape::Reorder | Shape::SlowConnection { .. } => {
                        pending.extend_from_slice(&buf[..n]);
                        // The first frame (the Hello) goes at once.
                        while let Some(len) = frame_len(&pending) {
                            let due = if led {
                                delays.due(Instant::now())
                            } else {
                                Instant::now()
                            };
                            if len > MAX_FRAME {
                                eprintln!("jitter proxy: a {len}-byte frame; closing");
                                break 'read;
                            }
                            if pending.len() < len {
                                break;
                            }
                            led = true;
                            let rest = pending.split_off(len);
                            let frame = std::mem::replace(&mut pending, rest);
                            if tx.send((due, frame)).is_err() {
                                break 'read;
                            }
                        }
                    }
                }
            }
            close();
        }));
    }
    // Dialler → upstream, write side: whatever is due first goes first (in the order read
    // among equal due times; with KeepOrder the due times never decrease).
    {
        let (mut up, close) = (up.try_clone()?, close.clone());
        threads.push(std::thread::spawn(move || {
            let mut heap: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>> = BinaryHeap::new();
            let mut seq = 0u64;
            let mut open = true;
            while open || !heap.is_empty() {
                let next = heap.peek().map(|Reverse((due, _, _))| *due);
                let got = match next {
                    Some(due) if due <= Instant::now() => {
                        let Reverse((_, _, bytes)) = heap.pop().expect("peeked");
                        if up.write_all(&bytes).is_err() {
                            break;
                        }
                        continue;
                    }
                    Some(due) if open => rx.recv_timeout(due - Instant::now().min(due)),
                    Some(due) => {
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        continue;
                    }
                    None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                };
                match got {
                    Ok((due, bytes)) => {
                        seq += 1;
                        heap.push(Reverse((due, seq, bytes)));
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
                }
            }
            close();
        }));
    }
    // Upstream → dialler: no delay.
    {
        let (mut up, mut down, stop) = (up, down, stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while !stop.load(Ordering::Relaxed) {
                match up.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if down.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            close();
        }));
    }
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes what it reads back on the same connection.
    fn echo_server() -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        (a, t)
    }

    #[test]
    fn bytes_arrive_complete_and_in_order_through_the_jitter() {
        let (up, server) = echo_server();
        let p = JitterProxy::start(up, Duration::from_millis(3), 9).unwrap();
        let mut c = TcpStream::connect(p.addr()).unwrap();
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut r = c.try_clone().unwrap();
        let want = sent.len();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; want];
            r.read_exact(&mut got).unwrap();
            got
        });
        // Many small writes, so the proxy sees many chunks with different delays.
        for chunk in sent.chunks(997) {
            c.write_all(chunk).unwrap();
            if chunk[0] % 7 == 0 {
                std::thread::sleep(Duration::from_micros(300));
            }
        }
        let got = reader.join().unwrap();
        assert!(got == sent, "bytes reordered or corrupted by the proxy");
        drop(c);
        drop(p);
        server.join().unwrap();
    }

    #[test]
    fn one_slow_connection_delays_its_share_of_frames_in_its_own_order() {
        let bound = Duration::from_millis(10);
        let t0 = Instant::now();
        let shape = Shape::SlowConnection { of: 4 };
        let mut d = Delays::new(shape, bound, 5, t0);
        // 4,000 frames read 1 µs apart: about a quarter go on the slow connection.
        let mut slow = Vec::new();
        for i in 0..4_000u64 {
            let now = t0 + Duration::from_micros(i);
            let due = d.due(now);
            assert!(due >= now, "frame {i} due before it was read");
            if due > now {
                slow.push(due);
            }
        }
        assert!(
            (800..1_200).contains(&slow.len()),
            "{} of 4,000 frames delayed, expected about 1,000",
            slow.len()
        );
        assert!(
            slow.windows(2).all(|w| w[0] <= w[1]),
            "the slow connection's frames overtook one another"
        );
        let last = t0 + Duration::from_micros(4_000);
        assert!(
            *slow.last().unwrap() < last + bound,
            "a delay past the bound"
        );
        // Every frame delayed by its own draw (the Reorder shape): far more than a quarter.
        let mut r = Delays::new(Shape::Reorder, bound, 5, t0);
        let delayed = (0..4_000).filter(|_| r.due(t0) > t0).count();
        assert!(delayed > 3_900, "{delayed} of 4,000 delayed under Reorder");
    }

    #[test]
    fn reordering_moves_whole_frames_and_sends_the_hello_first() {
        the_hello_goes_first_then_whole_frames_reorder(Shape::Reorder);
    }

    #[test]
    fn one_slow_connection_moves_whole_frames_and_sends_the_hello_first() {
        the_hello_goes_first_then_whole_frames_reorder(Shape::SlowConnection { of: 4 });
    }

    fn the_hello_goes_first_then_whole_frames_reorder(shape: Shape) {
        let (up, server) = echo_server();
        let p = JitterProxy::start_shaped(up, Duration::from_millis(4), 3, shape).unwrap();
        let mut c = TcpStream::connect(p.addr()).unwrap();
        // Frames laid out as the wire format's: 20-byte header, body_len at offset 8; byte
        // 0 numbers the frame.
        let frame = |k: u8, len: usize| {
            let mut f = vec![0u8; FRAME_HEADER_SIZE];
            f[0] = k;
            f[8..12].copy_from_slice(&(len as u32).to_le_bytes());
            f.extend(std::iter::repeat_n(k, len));
            f
        };
        let frames: Vec<Vec<u8>> = (0..200u8).map(|k| frame(k, 10 + k as usize * 5)).collect();
        let total: usize = frames.iter().map(Vec::len).sum();
        let mut r = c.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut n = 0;
            while n < total {
                let mut h = [0u8; FRAME_HEADER_SIZE];
                r.read_exact(&mut h).unwrap();
                let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
                let mut body = vec![0u8; len];
                r.read_exact(&mut body).unwrap();
                assert!(body.iter().all(|&b| b == h[0]), "frame {} torn", h[0]);
                n += FRAME_HEADER_SIZE + len;
                got.push(h[0]);
            }
            got
        });
        for f in &frames {
            c.write_all(f).unwrap();
            std::thread::sleep(Duration::from_micros(50));
        }
        let got = reader.join().unwrap();
        assert_eq!(got[0], 0, "the Hello (first frame) must go first");
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..200u8).collect::<Vec<_>>());
        assert!(got.windows(2).any(|w| w[0] > w[1]), "nothing reordered");
        drop(c);
        drop(p);
        server.join().unwrap();
    }

    #[test]
    fn the_delay_stays_below_the_bound_on_an_idle_link() {
        let (up, server) = echo_server();
        let bound = Duration::from_millis(20);
        let p = JitterProxy::start(up, bound, 1).unwrap();
        let mut c = TcpStream::connect(p.addr()).unwrap();
        c.set_nodelay(true).unwrap();
        let mut worst = Duration::ZERO;
        let mut total = Duration::ZERO;
        for i in 0..30u8 {
            let t = Instant::now();
            c.write_all(&[i]).unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).unwrap();
            assert_eq!(b[0], i);
            let rtt = t.elapsed();
            worst = worst.max(rtt);
            total += rtt;
        }
        // One delayed direction: every round trip below the bound plus scheduling slack,
        // and on average clearly delayed (uniform over [0, 20 ms) has mean 10 ms).
        assert!(worst < bound + Duration::from_millis(15), "worst {worst:?}");
        assert!(
            total / 30 > Duration::from_millis(4),
            "mean {:?}",
            total / 30
        );
        drop(c);
        drop(p);
        server.join().unwrap();
    }
}
