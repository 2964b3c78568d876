//! The sockets under [`Net`](super::Net): a connection's stream with what is queued for it,
//! an outbound connection that is made again when lost, and the options every socket gets.

use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token};
use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};

/// The first wait before an outbound connection is made again, and the longest.
const REDIAL_FIRST: Duration = Duration::from_millis(50);
const REDIAL_MAX: Duration = Duration::from_secs(1);

/// Options every connection gets: no Nagle delay (a round's frames are small and each one
/// is waited for), and TCP keepalive, so that long idle periods between rounds do not
/// silently lose a peer behind a NAT or firewall, and a dead host is noticed.
pub(super) fn tune(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10))
        .with_retries(6);
    SockRef::from(s).set_tcp_keepalive(&keepalive)
}

/// A listening socket on `addr` with a queue of `backlog` connections the kernel holds.
pub(super) fn listener(addr: SocketAddr, backlog: usize) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    // A restarted rank 0 binds its port again while old connections linger in TIME_WAIT.
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        // `::1` and `127.0.0.1` on one port are two sockets.
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    Ok(TcpListener::from_std(s.into()))
}

/// Whether a failed connection attempt may succeed later (the peer is not there yet, or
/// the network is down a moment), rather than being this process's own failure.
pub(super) fn passing(e: &io::Error) -> bool {
    use io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::TimedOut
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
            | K::Interrupted
            | K::WouldBlock
    )
}

/// How a send went.
#[derive(Debug)]
pub(super) enum Wrote {
    /// The kernel took it all.
    All,
    /// Part or all of it waits in the connection's queue.
    Queued,
    /// The queue is full: nothing of it was taken.
    Full,
    /// The connection failed.
    Failed(io::Error),
}

/// A connection's socket and the bytes it has not taken yet.
#[derive(Debug)]
pub(super) struct Stream {
    sock: TcpStream,
    out: Vec<u8>,
    /// How much of `out` is written.
    sent: usize,
    /// It signalled data (or its end) that is not read yet.
    pub readable: bool,
    /// It signalled its end (the peer closed or reset it): read until the end is seen. The
    /// peer's last bytes and its end can signal as one; a read that takes the bytes does
    /// not see the end, and no later signal comes for it.
    pub ended: bool,
}

impl Stream {
    pub(super) fn new(sock: TcpStream) -> Stream {
        Stream {
            sock,
            out: Vec::new(),
            sent: 0,
            readable: false,
            ended: false,
        }
    }

    #[cfg(test)]
    pub(super) fn sock(&self) -> &TcpStream {
        &self.sock
    }

    /// Bytes waiting in the queue.
    #[cfg(test)]
    pub(super) fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Registers the socket with `poll` under `token`.
    pub(super) fn register(&mut self, poll: &Poll, token: Token) -> io::Result<()> {
        poll.registry().register(
            &mut self.sock,
            token,
            Interest::READABLE | Interest::WRITABLE,
        )
    }

    pub(super) fn peer(&self) -> Option<String> {
        self.sock.peer_addr().ok().map(|a| a.ip().to_string())
    }

    /// Writes what is queued, as far as the socket takes it.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.sent = 0;
        Ok(())
    }

    /// Sends `bytes` whole or not at all: written now, or queued behind what waits when
    /// the queue stays within `cap` bytes.
    pub(super) fn send(&mut self, bytes: &[u8], cap: usize) -> Wrote {
        if let Err(e) = self.flush() {
            return Wrote::Failed(e);
        }
        if self.sent < self.out.len() {
            if self.out.len() - self.sent + bytes.len() > cap {
                return Wrote::Full;
            }
            self.out.drain(..self.sent);
            self.sent = 0;
            self.out.extend_from_slice(bytes);
            return Wrote::Queued;
        }
        let mut done = 0;
        while done < bytes.len() {
            match self.sock.write(&bytes[done..]) {
                Ok(0) => return Wrote::Failed(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.out.extend_from_slice(&bytes[done..]);
                    return Wrote::Queued;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Wrote::Failed(e),
            }
        }
        Wrote::All
    }

    /// Reads once: `Some(0)` at the end of the stream, `None` when nothing waits.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match self.sock.read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes what it can of the queue, then closes: the peer reads what was sent, then
    /// the end of the stream.
    pub(super) fn shut(&mut self, poll: &Poll) {
        let _ = self.flush();
        let _ = poll.registry().deregister(&mut self.sock);
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// Whether the connection is made (false while it is still being made).
    fn made(&self) -> io::Result<bool> {
        if let Some(e) = self.sock.take_error()? {
            return Err(e);
        }
        match self.sock.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Where an outbound connection stands.
#[derive(Debug)]
pub(super) enum Link {
    /// Being made.
    Connecting(Stream),
    Up(Stream),
    /// Lost or refused: made again at this time.
    Down(Instant),
}

/// This rank's connection to rank 0 or to its tree parent.
#[derive(Debug)]
pub(super) struct Outbound {
    addr: SocketAddr,
    token: Token,
    pub link: Link,
    /// The wait before the next attempt when this one fails.
    backoff: Duration,
}

/// What became of an outbound connection being made.
pub(super) enum Made {
    /// Still being made.
    Not,
    /// Made: the peer's address.
    Up(Option<String>),
    /// Refused or failed: made again later.
    Failed,
}

impl Outbound {
    pub(super) fn new(addr: SocketAddr, token: Token) -> Outbound {
        Outbound {
            addr,
            token,
            link: Link::Down(Instant::now()),
            backoff: REDIAL_FIRST,
        }
    }

    pub(super) fn stream(&mut self) -> Option<&mut Stream> {
        match &mut self.link {
            Link::Up(s) => Some(s),
            _ => None,
        }
    }

    /// When it is to be made again, if it is down.
    pub(super) fn due(&self) -> Option<Instant> {
        match self.link {
            Link::Down(at) => Some(at),
            _ => None,
        }
    }

    /// Starts making the connection. An error is one the system gave at once (no
    /// descriptor left, no route); the attempt is made again later all the same.
    pub(super) fn connect(&mut self, poll: &Poll, now: Instant) -> io::Result<()> {
        let started = TcpStream::connect(self.addr).and_then(|s| {
            tune(&s)?;
            let mut s = Stream::new(s);
            s.register(poll, self.token)?;
            Ok(s)
        });
        match started {
            Ok(s) => {
                self.link = Link::Connecting(s);
                Ok(())
            }
            Err(e) => {
                self.fail(now);
                Err(e)
            }
        }
    }

    fn fail(&mut self, now: Instant) {
        self.link = Link::Down(now + self.backoff);
        self.backoff = (self.backoff * 2).min(REDIAL_MAX);
    }

    /// The socket signalled while the connection was being made: whether it is made.
    pub(super) fn settle(&mut self, poll: &Poll, now: Instant) -> Made {
        let Link::Connecting(s) = &mut self.link else {
            return Made::Not;
        };
        match s.made() {
            Ok(false) => Made::Not,
            Ok(true) => {
                let peer = s.peer();
                if let Link::Connecting(mut s) = std::mem::replace(&mut self.link, Link::Down(now))
                {
                    s.readable = false;
                    self.link = Link::Up(s);
                }
                self.backoff = REDIAL_FIRST;
                Made::Up(peer)
            }
            Err(e) => {
                tracing::debug!(addr = %self.addr, error = %e, "could not connect; trying again later");
                let _ = poll.registry().deregister(&mut s.sock);
                self.fail(now);
                Made::Failed
            }
        }
    }

    /// The connection was lost: it is made again after the first wait.
    pub(super) fn lost(&mut self, poll: &Poll, now: Instant) {
        self.drop_link(poll);
        self.link = Link::Down(now + REDIAL_FIRST);
        self.backoff = REDIAL_FIRST * 2;
    }

    /// Closes the socket, whatever state it is in.
    pub(super) fn drop_link(&mut self, poll: &Poll) {
        if let Link::Connecting(s) | Link::Up(s) = &mut self.link {
            s.shut(poll);
        }
        self.link = Link::Down(Instant::now() + REDIAL_MAX);
    }

    #[cfg(test)]
    pub(super) fn sock(&self) -> Option<&TcpStream> {
        match &self.link {
            Link::Connecting(s) | Link::Up(s) => Some(&s.sock),
            Link::Down(_) => None,
        }
    }
}
