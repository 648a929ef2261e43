//! A jittery replication link, identical for every system: a TCP proxy in front of one
//! node's replication port. Each chunk of bytes read from the dialling side is forwarded
//! after a random delay below a bound, but never before the chunk read before it (its
//! due time is `max(arrival + U[0, bound), previous due time)`), so byte order is kept —
//! a link whose one-way delay jitters. The other direction is copied without delay.
//!
//! Both replication transports (the ordered runtime's and the out-of-order driver's) dial
//! a peer and only write on that connection, so the proxy in front of node 3 delays
//! exactly what the leader sends to node 3.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chorus_core::rng::Rng;

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
                            match pipe(down, upstream, bound, seed ^ n, &st, &sk) {
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

/// Starts the three threads of one proxied connection.
fn pipe(
    down: TcpStream,
    upstream: SocketAddr,
    bound: Duration,
    seed: u64,
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
    // Dialler → upstream, read side: stamp each chunk with its due time.
    {
        let (mut down, close, stop) = (down.try_clone()?, close.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed);
            let mut last = Instant::now();
            let mut buf = vec![0u8; 256 << 10];
            while !stop.load(Ordering::Relaxed) {
                match down.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let wait = Duration::from_nanos(rng.below(bound.as_nanos() as u64));
                        let due = (Instant::now() + wait).max(last);
                        last = due;
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                }
            }
            close();
        }));
    }
    // Dialler → upstream, write side: each chunk at its due time, in order.
    {
        let (mut up, close) = (up.try_clone()?, close.clone());
        threads.push(std::thread::spawn(move || {
            while let Ok((due, bytes)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if up.write_all(&bytes).is_err() {
                    break;
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
