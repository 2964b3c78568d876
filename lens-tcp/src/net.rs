//! Connections: non-blocking TCP sockets that the rank's own thread reads and writes
//! (epoll, through `mio`), carrying length-prefixed frames, with limits for peers that have
//! not proven the job key.
//!
//! Why not libzmq (which carried these frames on STREAM sockets until December 2026): every
//! message crossed libzmq's I/O thread on both sides, so one hop woke three threads (the
//! sender's I/O thread, the receiver's, then the receiver's own). The bench measures both
//! transports bare in lens's layout (`lens bench --backend tcp --processes`, `raw` against
//! `raw_zmq`): a round of 2 processes took 57 µs over sockets and 105 µs over ZeroMQ on a
//! 2-core machine. Here a hop wakes one thread. The frames on the wire did not change.
//!
//! Every rank has at most: a listening socket per bound address (rank 0's rendezvous, or a
//! rank's port for its tree children) and the connections accepted there, and one
//! connection each to rank 0 and to its tree parent (in a tree, a rank whose parent is not
//! rank 0 hangs up on rank 0 once it has joined). Those two are made again after a reset
//! or a refusal: 50 ms later, doubling to 1 s while it keeps failing.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lens_core::{Error, Result};
use mio::{Events, Interest, Poll, Token};

use crate::frame::{Codec, Frame, Reassembler, Reject};

use crate::error::TcpError;
use crate::error::socket_err;
use crate::idhash::IdMap;

use socket::{Link, Outbound, Stream, Wrote};

/// Tokens: the two outbound connections, then the listening sockets, then the accepted
/// connections, each under a number never used again in the process's life.
const HUB: Token = Token(0);
const PARENT: Token = Token(1);
const FIRST_LISTENER: usize = 2;
const FIRST_ACCEPTED: usize = 1 << 20;

/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Which socket a connection lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Side {
    /// Accepted on this rank's listening socket.
    Listen,
    /// This rank's connection to rank 0.
    Hub,
    /// This rank's connection to its tree parent (when that is not rank 0).
    Parent,
}

/// One connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ConnId {
    pub side: Side,
    /// The accepted connection's token (0 for outbound ones).
    id: usize,
}

impl ConnId {
    pub(crate) fn outbound(side: Side) -> ConnId {
        ConnId { side, id: 0 }
    }
}

#[derive(Debug)]
struct Conn {
    stream: Reassembler,
    addr: Option<String>,
    frames: u32,
    /// The peer's rank once it proved the key (outbound: the server's rank).
    verified: Option<usize>,
}

impl Conn {
    fn new(addr: Option<String>) -> Conn {
        Conn {
            stream: Reassembler::default(),
            addr,
            frames: 0,
            verified: None,
        }
    }
}

/// Something that happened on a connection.
#[derive(Debug)]
pub(crate) enum Event {
    /// A connection opened (outbound: made, or lost and to be made again: either way its
    /// stream starts over).
    Opened(ConnId),
    /// An accepted connection closed.
    Closed(ConnId),
    /// An authenticated frame.
    Frame(ConnId, Frame),
    /// A frame that failed its checks.
    Rejected {
        conn: ConnId,
        why: Reject,
        addr: Option<String>,
    },
    /// The unsigned hint that our KNOCK failed authentication at the server.
    KeyHint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendFail {
    /// The peer's queue is full (it does not read).
    Full,
    /// No such connection (closed, or not yet open).
    Gone,
}

pub(crate) struct Net {
    poll: Poll,
    /// The readiness a poll returns, kept between polls.
    ready: Events,
    listeners: Vec<mio::net::TcpListener>,
    /// A listening socket signalled and was not read to the end.
    accept_ready: bool,
    accepted: IdMap<usize, Stream>,
    next_token: usize,
    hub: Option<Outbound>,
    parent: Option<Outbound>,
    conns: IdMap<ConnId, Conn>,
    /// Connections that signalled data (or its end) not read yet, in turn.
    readable: VecDeque<Token>,
    read_buf: Box<[u8]>,
    codec: Codec,
    limits: Limits,
    events: VecDeque<Event>,
    /// Accepted connections in the order they opened, for the handshake deadline and the
    /// cap; entries whose connection has since proven the key or closed are skipped when
    /// met, so no pass over every connection is made per message.
    unproven: VecDeque<(Instant, ConnId)>,
    /// The last read pass left nothing that had signalled unread.
    drained: bool,
    /// How a round's waits poll before they sleep.
    spin: Spin,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("listeners", &self.listeners.len())
            .field("accepted", &self.accepted.len())
            .field("hub", &self.hub)
            .field("parent", &self.parent)
            .finish_non_exhaustive()
    }
}

impl Net {
    /// # Errors
    /// When the system gives no epoll instance (out of descriptors).
    pub(crate) fn new(codec: Codec, limits: Limits, spin: Duration) -> Result<Net> {
        Ok(Net {
            poll: Poll::new().map_err(socket_err("make an epoll instance"))?,
            ready: Events::with_capacity(256),
            listeners: Vec::new(),
            accept_ready: false,
            accepted: IdMap::default(),
            next_token: FIRST_ACCEPTED,
            hub: None,
            parent: None,
            conns: IdMap::default(),
            readable: VecDeque::new(),
            read_buf: vec![0; READ_CHUNK].into_boxed_slice(),
            codec,
            limits,
            events: VecDeque::new(),
            unproven: VecDeque::new(),
            drained: true,
            spin: Spin::new(spin),
        })
    }

    /// Whether waits may poll before they sleep: set for a round, cleared after it.
    pub(crate) fn set_round_waits(&mut self, on: bool) {
        self.spin.arm(on);
    }

    pub(crate) fn codec(&self) -> &Codec {
        &self.codec
    }

    /// Listens on every address in `addrs` (all on one port: the first one's, when the
    /// port is 0). Returns the addresses bound.
    pub(crate) fn listen(&mut self, addrs: &[SocketAddr]) -> Result<Vec<SocketAddr>> {
        let mut bound: Vec<SocketAddr> = Vec::new();
        let mut last_err = None;
        for &a in addrs {
            let mut a = a;
            if let Some(first) = bound.first() {
                a.set_port(first.port());
            }
            match socket::listener(a, self.limits.backlog) {
                Ok(mut l) => {
                    let token = Token(FIRST_LISTENER + self.listeners.len());
                    self.poll
                        .registry()
                        .register(&mut l, token, Interest::READABLE)
                        .map_err(socket_err("watch a listening socket"))?;
                    bound.push(l.local_addr().unwrap_or(a));
                    self.listeners.push(l);
                }
                Err(e) => {
                    tracing::debug!(addr = %a, error = %e, "cannot bind one address of several");
                    last_err = Some((a, e));
                }
            }
        }
        if bound.is_empty() {
            return Err(match last_err {
                Some((addr, io)) => {
                    TcpError::Bind { addr, io }.into_error(format!("cannot bind {addr}"))
                }
                None => Error::config("no address to bind"),
            });
        }
        Ok(bound)
    }

    /// Connects `side` to `addr`, and again whenever the connection is refused or lost.
    pub(crate) fn dial(&mut self, side: Side, addr: SocketAddr) -> Result<()> {
        let token = match side {
            Side::Hub => HUB,
            Side::Parent => PARENT,
            Side::Listen => return Err(Error::config("cannot dial the listening side")),
        };
        let mut out = Outbound::new(addr, token);
        if let Err(io) = out.connect(&self.poll, Instant::now()) {
            // A peer not there yet (rank 0 starts late) is tried again; a socket that
            // cannot be made at all (no descriptor left) is an error now.
            if !socket::passing(&io) {
                return Err(
                    TcpError::Connect { addr, io }.into_error(format!("cannot connect to {addr}"))
                );
            }
            tracing::debug!(%addr, error = %io, "cannot connect yet; trying again later");
        }
        *self.outbound_mut(side) = Some(out);
        self.conns.insert(ConnId::outbound(side), Conn::new(None));
        Ok(())
    }

    fn outbound_mut(&mut self, side: Side) -> &mut Option<Outbound> {
        if side == Side::Parent {
            &mut self.parent
        } else {
            &mut self.hub
        }
    }

    /// Closes this rank's connection on `side` for good (a tree member leaves rank 0 once
    /// it has joined its parent).
    pub(crate) fn hang_up(&mut self, side: Side) {
        if side == Side::Listen {
            return;
        }
        if let Some(mut out) = self.outbound_mut(side).take() {
            out.drop_link(&self.poll);
        }
        self.conns.remove(&ConnId::outbound(side));
    }

    pub(crate) fn verified(&self, conn: &ConnId) -> Option<usize> {
        self.conns.get(conn).and_then(|c| c.verified)
    }

    pub(crate) fn set_verified(&mut self, conn: &ConnId, rank: Option<usize>) {
        if let Some(c) = self.conns.get_mut(conn) {
            c.verified = rank;
        }
    }

    pub(crate) fn addr(&self, conn: &ConnId) -> Option<String> {
        self.conns.get(conn).and_then(|c| c.addr.clone())
    }

    /// The bytes a connection may hold queued beyond what the kernel holds for it.
    fn queue_cap(&self) -> usize {
        self.limits.queue.max(1).saturating_mul(READ_CHUNK)
    }

    /// Sends a frame (with its prefix) without ever blocking: what the socket does not
    /// take now is queued and written as it drains, whole frames only.
    pub(crate) fn send(
        &mut self,
        conn: &ConnId,
        bytes: &[u8],
    ) -> std::result::Result<(), SendFail> {
        let cap = self.queue_cap();
        let stream = match conn.side {
            Side::Listen => self.accepted.get_mut(&conn.id),
            Side::Hub | Side::Parent => match self.outbound_mut(conn.side) {
                Some(Outbound {
                    link: Link::Up(s), ..
                }) => Some(s),
                _ => None,
            },
        };
        let Some(stream) = stream else {
            return Err(SendFail::Gone);
        };
        match stream.send(bytes, cap) {
            Wrote::All | Wrote::Queued => Ok(()),
            Wrote::Full => {
                // A peer that has not proven the key and does not read is dropped.
                if conn.side == Side::Listen && self.verified(conn).is_none() {
                    tracing::debug!("closed an unproven connection that does not read");
                    self.close(conn);
                }
                Err(SendFail::Full)
            }
            Wrote::Failed(e) => {
                tracing::debug!(error = %e, "send failed");
                // The read side finds the connection's end and reports it.
                let token = match conn.side {
                    Side::Listen => Token(conn.id),
                    Side::Hub => HUB,
                    Side::Parent => PARENT,
                };
                self.mark_readable(token);
                Err(SendFail::Gone)
            }
        }
    }

    /// Closes an accepted connection (reported as [`Event::Closed`], so that the join
    /// state of a connection closed for a limit goes too); an outbound one only forgets
    /// what it proved.
    pub(crate) fn close(&mut self, conn: &ConnId) {
        match conn.side {
            Side::Listen => {
                if let Some(mut s) = self.accepted.remove(&conn.id) {
                    s.shut(&self.poll);
                }
                if self.conns.remove(conn).is_some() {
                    self.events.push_back(Event::Closed(conn.clone()));
                }
            }
            Side::Hub | Side::Parent => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.verified = None;
                    c.stream.reset();
                }
            }
        }
    }

    /// The next event, or `None` at the deadline. Connections that are slow to prove the
    /// key are closed on the way.
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Option<Event>> {
        self.next_event(deadline, true)
    }

    /// The next event that is ready now, or `None` when nothing is queued or `until` has
    /// passed; never sleeps. After `None`, [`Net::drained`] says which of the two it was.
    pub(crate) fn recv_ready(&mut self, until: Instant) -> Result<Option<Event>> {
        self.next_event(until, false)
    }

    /// Whether the last [`Net::recv_ready`] or [`Net::recv`] that returned `None` left
    /// nothing that had signalled unread: the epoll instance ([`Net::wake_fd`]) signals
    /// again when something arrives.
    pub(crate) fn drained(&self) -> bool {
        self.drained
    }

    fn has_ready(&self) -> bool {
        self.accept_ready || !self.readable.is_empty()
    }

    fn next_event(&mut self, deadline: Instant, sleep: bool) -> Result<Option<Event>> {
        let mut asked = false;
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(Some(e));
            }
            let now = Instant::now();
            let next_expiry = self.expire(now);
            let next_dial = self.redial(now);
            if !self.events.is_empty() {
                continue;
            }
            if self.has_ready() {
                self.read_pass()?;
                asked = false;
                if now < deadline || !self.events.is_empty() {
                    continue;
                }
            } else if !asked && (now >= deadline || !sleep) {
                // What the kernel has signalled since the last poll, without waiting (a
                // wait below returns at once with it too).
                self.collect(Some(Duration::ZERO))?;
                asked = true;
                continue;
            }
            if now >= deadline || !sleep {
                self.drained = !self.has_ready();
                return Ok(None);
            }
            let wake = next_dial.map_or(next_expiry, |d| d.min(next_expiry));
            let wait = deadline.min(wake).saturating_duration_since(now);
            self.collect(Some(wait))?;
            asked = true;
        }
    }
}

mod alone;
mod dial;
mod events;
mod incoming;
mod limits;
mod socket;
mod spin;
mod watch;

pub(crate) use limits::Limits;
use spin::Spin;

#[cfg(test)]
mod tests;
