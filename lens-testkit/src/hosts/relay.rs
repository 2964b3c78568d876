//! A port on a simulated host that forwards each connection to an address of this machine,
//! outside the simulated network: how ranks on the hosts, which have no route out, reach a
//! collector that runs here. Bytes pass as they are (TCP, not a protocol), so plain HTTP
//! and gRPC pass; TLS would pass too, but the ranks would dial an address its certificate
//! does not name.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Host;

/// How long the relay waits for the address it forwards to, per connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the accepting thread looks whether it should stop.
const POLL: Duration = Duration::from_millis(20);

/// A relay from a port on one host to an address of this machine (see
/// [`Host::relay_to`]); stopped, and its connections shut, when dropped.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accepting: Option<JoinHandle<()>>,
}

impl Relay {
    /// The address on the host that the host's processes (and the other hosts') connect
    /// to.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(open) = self.open.lock() {
            for s in open.iter() {
                // Ends both copying threads of each connection.
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.accepting.take() {
            let _ = t.join();
        }
    }
}

impl Host {
    /// Listens on an ephemeral port of this host's address and forwards every connection
    /// made to it to `to`, an address of this machine outside the simulated network (a
    /// collector on 127.0.0.1, say). The connections to `to` are made from the calling
    /// thread's network namespace, which must reach it.
    ///
    /// # Errors
    /// The system's, when the host cannot be entered or the port bound.
    pub fn relay_to(&self, to: SocketAddr) -> io::Result<Relay> {
        // Bound on a thread of its own that enters the host (a thread cannot come back);
        // the listening socket stays the host's wherever it is used.
        let listener = std::thread::scope(|s| {
            s.spawn(|| {
                self.enter()?;
                TcpListener::bind((self.addr(), 0))
            })
            .join()
            .map_err(|_| io::Error::other("the thread binding the relay's port panicked"))?
        })?;
        let addr = match listener.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(a) => {
                return Err(io::Error::other(format!("bound an IPv6 address {a}")));
            }
        };
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let accepting = {
            let (stop, open) = (Arc::clone(&stop), Arc::clone(&open));
            std::thread::Builder::new()
                .name("hosts-relay".into())
                .spawn(move || accept_loop(&listener, to, &stop, &open))?
        };
        Ok(Relay {
            addr,
            stop,
            open,
            accepting: Some(accepting),
        })
    }
}

fn accept_loop(
    listener: &TcpListener,
    to: SocketAddr,
    stop: &AtomicBool,
    open: &Mutex<Vec<TcpStream>>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((inside, _)) => {
                if let Err(e) = forward(inside, to, open) {
                    tracing::warn!(error = %e, %to, "the hosts' relay could not forward a connection");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(e) => {
                tracing::warn!(error = %e, "the hosts' relay stopped accepting");
                return;
            }
        }
    }
}

/// Joins `inside` (a connection from a host) to a new connection to `to`, a thread each
/// way; both are kept in `open` so that dropping the relay shuts them.
fn forward(inside: TcpStream, to: SocketAddr, open: &Mutex<Vec<TcpStream>>) -> io::Result<()> {
    inside.set_nonblocking(false)?;
    let outside = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)?;
    let _ = inside.set_nodelay(true);
    let _ = outside.set_nodelay(true);
    if let Ok(mut o) = open.lock() {
        // Connections that ended are let go as new ones come.
        o.retain(|s| s.peer_addr().is_ok());
        o.push(inside.try_clone()?);
        o.push(outside.try_clone()?);
    }
    let (in_read, out_write) = (inside.try_clone()?, outside.try_clone()?);
    std::thread::Builder::new()
        .name("hosts-relay-in".into())
        .spawn(move || pump(in_read, out_write))?;
    std::thread::Builder::new()
        .name("hosts-relay-out".into())
        .spawn(move || pump(outside, inside))?;
    Ok(())
}

/// Copies until `from` ends or fails, then ends `to`'s writing half, as the peer did.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
