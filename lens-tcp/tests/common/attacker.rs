//! An attacker's tools, on loopback only: a relay that records what passes (to replay it
//! later) and can reset its connections, and raw connections that send bytes and never
//! read.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A TCP relay from a loopback port to `upstream`, recording both directions.
pub(crate) struct Relay {
    pub(crate) addr: String,
    upstream: String,
    /// Bytes from the connecting side (a joiner), per connection.
    pub(crate) up: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Bytes from the listening side (rank 0), per connection.
    pub(crate) down: Arc<Mutex<Vec<Vec<u8>>>>,
    live: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    pub(crate) fn new(upstream: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        let relay = Relay {
            addr,
            upstream: upstream.to_owned(),
            up: Arc::default(),
            down: Arc::default(),
            live: Arc::default(),
            stop: Arc::default(),
        };
        let (up, down, live, stop) = (
            relay.up.clone(),
            relay.down.clone(),
            relay.live.clone(),
            relay.stop.clone(),
        );
        let upstream = upstream.to_owned();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                // As fast as the ranks' own sockets (lens sets TCP_NODELAY): without it,
                // Nagle's algorithm and delayed acks hold each small frame ~40 ms.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let at = {
                    let mut u = up.lock().expect("lock");
                    u.push(Vec::new());
                    down.lock().expect("lock").push(Vec::new());
                    u.len() - 1
                };
                {
                    let mut l = live.lock().expect("lock");
                    l.push(client.try_clone().expect("clone"));
                    l.push(server.try_clone().expect("clone"));
                }
                pump(
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                    up.clone(),
                    at,
                );
                pump(server, client, down.clone(), at);
            }
        });
        relay
    }

    /// Where it relays to.
    pub(crate) fn upstream(&self) -> String {
        self.upstream.clone()
    }

    /// Resets every connection through the relay (new ones are still relayed).
    pub(crate) fn reset(&self) {
        for s in self.live.lock().expect("lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.reset();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, log: Arc<Mutex<Vec<Vec<u8>>>>, at: usize) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    log.lock().expect("lock")[at].extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// A fake server on a loopback port that answers every connection with `bytes` (after the
/// first bytes arrive) and then stays silent.
pub(crate) fn replaying_server(bytes: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(16) {
            let Ok(mut conn) = conn else { continue };
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                if conn.read(&mut buf).is_ok() {
                    let _ = conn.write_all(&bytes);
                }
                // Hold the connection open, read and discard.
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A connection that sends `bytes` `times` times and never reads.
pub(crate) fn never_reading(addr: &str, bytes: &[u8], times: usize) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    let mut w = s.try_clone().expect("clone");
    w.set_write_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    for _ in 0..times {
        if w.write_all(bytes).is_err() {
            break; // closed by the rank: what we want
        }
    }
    s
}
