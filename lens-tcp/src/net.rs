//! Connections: ZeroMQ STREAM sockets carrying length-prefixed frames, with limits for
//! peers that have not proven the job key.
//!
//! Why STREAM and not ROUTER/DEALER: a ROUTER attaches a peer under the routing id the peer
//! claims in its handshake, before any byte of lens is checked, and libzmq aborts the process
//! when a peer without an id is given an automatic id that another peer already claimed
//! (the counter starts at an unseeded `rand()`). A STREAM socket names every connection
//! itself, never reads an id from the peer, reports connections opening and closing, and
//! lets lens close any one of them. So every rank has at most three sockets: one listening
//! (rank 0's rendezvous, or a rank's port for its tree children) and one connection each
//! to rank 0 and to its tree parent (in a tree, a rank whose parent is not rank 0 hangs up
//! on rank 0 once it has joined).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Instant;

use lens_core::{Error, Result};

use crate::frame::{Codec, Frame, Reassembler, Reject};

use crate::error::TcpError;
use crate::idhash::IdMap;
const SIDES: [Side; 3] = [Side::Listen, Side::Hub, Side::Parent];

use crate::error::socket_err;

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
    /// The listening socket's name for the connection (empty for outbound ones).
    id: RoutingId,
}

impl ConnId {
    pub(crate) fn outbound(side: Side) -> ConnId {
        ConnId {
            side,
            id: RoutingId::EMPTY,
        }
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
    /// A connection opened (outbound: opened again after a reset, as far as libzmq says).
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

struct Outbound {
    sock: zmq::Socket,
    /// libzmq's name for the connection, learned from its first message.
    rid: Option<RoutingId>,
}

pub(crate) struct Net {
    ctx: zmq::Context,
    listen: Option<zmq::Socket>,
    hub: Option<Outbound>,
    parent: Option<Outbound>,
    conns: IdMap<ConnId, Conn>,
    codec: Codec,
    limits: Limits,
    turn: usize,
    events: VecDeque<Event>,
    /// Accepted connections in the order they opened, for the handshake deadline and the
    /// cap; entries whose connection has since proven the key or closed are skipped when
    /// met, so no pass over every connection is made per message.
    unproven: VecDeque<(Instant, ConnId)>,
    /// The last read pass found every socket empty.
    drained: bool,
}

/// Sends `[id, bytes]` without waiting. libzmq may answer `EINTR` even then (a signal
/// while it reads its own command queue), for either part: nothing of that part was sent,
/// so that part is sent again (a bounded number of times), never the whole message, which
/// would put the id into the stream.
fn send_now(sock: &zmq::Socket, id: &[u8], bytes: &[u8]) -> zmq::Result<()> {
    fn part(sock: &zmq::Socket, data: &[u8], flags: i32) -> zmq::Result<()> {
        let mut result = Err(zmq::Error::EINTR);
        for _ in 0..1000 {
            result = sock.send(data, flags);
            if result != Err(zmq::Error::EINTR) {
                break;
            }
        }
        result
    }
    part(sock, id, zmq::DONTWAIT | zmq::SNDMORE)?;
    // The queue had room for the id, so the data part goes too (libzmq checks once).
    part(sock, bytes, zmq::DONTWAIT)
}

/// Waits up to `ms` for a message on any of `socks`; the items are made on the stack, as
/// this runs on every wait of every round.
fn poll_sockets(socks: [Option<&zmq::Socket>; 3], ms: i64) -> zmq::Result<i32> {
    fn item(s: &zmq::Socket) -> zmq::PollItem<'_> {
        s.as_poll_item(zmq::POLLIN)
    }
    match socks {
        [Some(a), Some(b), Some(c)] => zmq::poll(&mut [item(a), item(b), item(c)], ms),
        [Some(a), Some(b), None] | [Some(a), None, Some(b)] | [None, Some(a), Some(b)] => {
            zmq::poll(&mut [item(a), item(b)], ms)
        }
        [Some(a), None, None] | [None, Some(a), None] | [None, None, Some(a)] => {
            zmq::poll(&mut [item(a)], ms)
        }
        [None, None, None] => zmq::poll(&mut [], ms),
    }
}

/// `tcp://` endpoint for an address (IPv6 in brackets).
pub(crate) fn endpoint(a: SocketAddr) -> String {
    format!("tcp://{a}")
}

impl Net {
    pub(crate) fn new(codec: Codec, limits: Limits) -> Net {
        Net {
            ctx: zmq::Context::new(),
            listen: None,
            hub: None,
            parent: None,
            conns: IdMap::default(),
            codec,
            limits,
            turn: 0,
            events: VecDeque::new(),
            unproven: VecDeque::new(),
            drained: true,
        }
    }

    pub(crate) fn codec(&self) -> &Codec {
        &self.codec
    }

    /// Every socket is made here, so every one gets the same limits.
    fn socket(&self, ipv6: bool) -> Result<zmq::Socket> {
        let s = self
            .ctx
            .socket(zmq::STREAM)
            .map_err(socket_err("create a socket"))?;
        s.set_linger(0).map_err(socket_err("set linger"))?;
        s.set_sndhwm(self.limits.hwm)
            .map_err(socket_err("set the send queue limit"))?;
        s.set_rcvhwm(self.limits.hwm)
            .map_err(socket_err("set the receive queue limit"))?;
        s.set_ipv6(ipv6).map_err(socket_err("enable IPv6"))?;
        // Long idle periods between rounds must not silently lose a peer behind a NAT or
        // firewall, and a dead host must be noticed.
        s.set_tcp_keepalive(1)
            .map_err(socket_err("set TCP keepalive"))?;
        s.set_tcp_keepalive_idle(30)
            .map_err(socket_err("set TCP keepalive"))?;
        s.set_tcp_keepalive_intvl(10)
            .map_err(socket_err("set TCP keepalive"))?;
        s.set_tcp_keepalive_cnt(6)
            .map_err(socket_err("set TCP keepalive"))?;
        s.set_reconnect_ivl(50)
            .map_err(socket_err("set the reconnect interval"))?;
        s.set_reconnect_ivl_max(1000)
            .map_err(socket_err("set the reconnect interval"))?;
        Ok(s)
    }

    /// Listens on every address in `addrs` (all on one port: the first one's, when the
    /// port is 0). Returns the addresses bound.
    pub(crate) fn listen(&mut self, addrs: &[SocketAddr]) -> Result<Vec<SocketAddr>> {
        let ipv6 = addrs.iter().any(SocketAddr::is_ipv6);
        let s = self.socket(ipv6)?;
        let backlog = i32::try_from(self.limits.backlog).unwrap_or(i32::MAX);
        s.set_backlog(backlog)
            .map_err(socket_err("set the listening queue"))?;
        let mut bound: Vec<SocketAddr> = Vec::new();
        let mut last_err = None;
        for &a in addrs {
            let mut a = a;
            if let Some(first) = bound.first() {
                a.set_port(first.port());
            }
            match s.bind(&endpoint(a)) {
                Ok(()) => {
                    let got = s
                        .get_last_endpoint()
                        .map_err(socket_err("read the bound address"))?
                        .unwrap_or_default();
                    let got = got
                        .trim_start_matches("tcp://")
                        .parse::<SocketAddr>()
                        .unwrap_or(a);
                    bound.push(got);
                }
                Err(e) => {
                    tracing::debug!(addr = %a, error = %e, "cannot bind one address of several");
                    last_err = Some((a, e));
                }
            }
        }
        if bound.is_empty() {
            return Err(match last_err {
                Some((addr, e)) => {
                    TcpError::Bind { addr, io: e.into() }.into_error(format!("cannot bind {addr}"))
                }
                None => Error::config("no address to bind"),
            });
        }
        self.listen = Some(s);
        Ok(bound)
    }

    /// Connects `side` to `addr`; libzmq reconnects by itself after a reset.
    pub(crate) fn dial(&mut self, side: Side, addr: SocketAddr) -> Result<()> {
        let s = self.socket(addr.is_ipv6())?;
        s.connect(&endpoint(addr)).map_err(|e| {
            TcpError::Connect { addr, io: e.into() }.into_error(format!("cannot connect to {addr}"))
        })?;
        let out = Some(Outbound { sock: s, rid: None });
        match side {
            Side::Hub => self.hub = out,
            Side::Parent => self.parent = out,
            Side::Listen => return Err(Error::config("cannot dial the listening side")),
        }
        self.conns.insert(ConnId::outbound(side), Conn::new(None));
        Ok(())
    }

    /// Closes this rank's connection on `side` for good (a tree member leaves rank 0 once
    /// it has joined its parent).
    pub(crate) fn hang_up(&mut self, side: Side) {
        match side {
            Side::Hub => self.hub = None,
            Side::Parent => self.parent = None,
            Side::Listen => return,
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

    /// Sends a frame (with its prefix) without ever blocking.
    pub(crate) fn send(
        &mut self,
        conn: &ConnId,
        bytes: &[u8],
    ) -> std::result::Result<(), SendFail> {
        let result = match conn.side {
            Side::Listen => match &self.listen {
                Some(s) if self.conns.contains_key(conn) => send_now(s, conn.id.as_bytes(), bytes),
                _ => return Err(SendFail::Gone),
            },
            Side::Hub | Side::Parent => {
                let out = if conn.side == Side::Hub {
                    &self.hub
                } else {
                    &self.parent
                };
                match out {
                    Some(Outbound {
                        sock,
                        rid: Some(rid),
                    }) => send_now(sock, rid.as_bytes(), bytes),
                    _ => return Err(SendFail::Gone),
                }
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(zmq::Error::EAGAIN) => {
                // A peer that has not proven the key and does not read is dropped.
                if conn.side == Side::Listen && self.verified(conn).is_none() {
                    tracing::debug!("closed an unproven connection that does not read");
                    self.close(conn);
                }
                Err(SendFail::Full)
            }
            Err(e) => {
                tracing::debug!(error = %e, "send failed");
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
                if let Some(s) = &self.listen {
                    // An empty message closes a STREAM connection.
                    let _ = send_now(s, conn.id.as_bytes(), &[]);
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
    /// nothing queued: every socket answered `EAGAIN`, so libzmq signals the sockets'
    /// descriptors ([`Net::wait_fds`]) again when something arrives.
    pub(crate) fn drained(&self) -> bool {
        self.drained
    }

    fn next_event(&mut self, deadline: Instant, sleep: bool) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(Some(e));
            }
            let now = Instant::now();
            let next_expiry = self.expire(now);
            // One message from each socket per pass, starting with a different socket each
            // time, so that no socket starves another.
            self.turn = self.turn.wrapping_add(1);
            let mut got = false;
            for i in 0..SIDES.len() {
                got |= self.read_one(SIDES[(i + self.turn) % SIDES.len()])?;
            }
            self.drained = !got;
            if got && (now < deadline || !self.events.is_empty()) {
                continue;
            }
            if now >= deadline || !sleep {
                return Ok(None);
            }
            // Nothing queued: sleep in poll until something arrives or a deadline passes.
            let wait = deadline.min(next_expiry).saturating_duration_since(now);
            let ms = i64::try_from(wait.as_millis().max(1)).unwrap_or(i64::MAX);
            let polled = poll_sockets(SIDES.map(|s| self.sock(s)), ms);
            match polled {
                // A signal: go round again (training jobs install signal handlers).
                Ok(_) | Err(zmq::Error::EINTR) => {}
                Err(e) => return Err(socket_err("poll")(e)),
            }
        }
    }

    fn sock(&self, side: Side) -> Option<&zmq::Socket> {
        match side {
            Side::Listen => self.listen.as_ref(),
            Side::Hub => self.hub.as_ref().map(|o| &o.sock),
            Side::Parent => self.parent.as_ref().map(|o| &o.sock),
        }
    }

    /// Reads one message from `side` if one is queued; whether it did.
    fn read_one(&mut self, side: Side) -> Result<bool> {
        let Some(sock) = self.sock(side) else {
            return Ok(false);
        };
        let mut id = zmq::Message::new();
        match sock.recv(&mut id, zmq::DONTWAIT) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => return Ok(false),
            Err(e) => return Err(socket_err("receive")(e)),
        }
        let mut data = zmq::Message::new();
        // The parts of a message arrive together, so this never waits; a signal in between
        // must not split the pair.
        while id.get_more() {
            match sock.recv(&mut data, 0) {
                Ok(()) => break,
                Err(zmq::Error::EINTR) => {}
                Err(e) => return Err(socket_err("receive")(e)),
            }
        }
        let addr = if data.is_empty() {
            data.gets("Peer-Address").map(str::to_owned)
        } else {
            None
        };
        let conn = match side {
            Side::Listen => ConnId {
                side,
                id: RoutingId::new(&id),
            },
            Side::Hub | Side::Parent => {
                let out = if side == Side::Hub {
                    &mut self.hub
                } else {
                    &mut self.parent
                };
                // The same id on every message until a reconnection: kept, not copied again.
                if let Some(o) = out
                    && o.rid.as_ref().is_none_or(|r| r.as_bytes() != &id[..])
                {
                    o.rid = Some(RoutingId::new(&id));
                }
                ConnId::outbound(side)
            }
        };
        if data.is_empty() {
            self.notice(conn, addr);
            return Ok(true);
        }
        self.bytes(conn, &data);
        Ok(true)
    }

    /// A STREAM socket's empty message: a connection opened or closed.
    fn notice(&mut self, conn: ConnId, addr: Option<String>) {
        match conn.side {
            Side::Listen => {
                if self.conns.remove(&conn).is_some() {
                    self.events.push_back(Event::Closed(conn));
                    return;
                }
                self.conns.insert(conn.clone(), Conn::new(addr));
                self.unproven.push_back((Instant::now(), conn.clone()));
                self.evict_unproven();
                self.events.push_back(Event::Opened(conn));
            }
            Side::Hub | Side::Parent => {
                // Opened or closed, the stream starts over and the server must be proven
                // again; the rank knocks again.
                let c = self
                    .conns
                    .entry(conn.clone())
                    .or_insert_with(|| Conn::new(None));
                c.stream.reset();
                c.verified = None;
                if addr.is_some() {
                    c.addr = addr;
                }
                self.events.push_back(Event::Opened(conn));
            }
        }
    }
}

mod incoming;
mod limits;
mod routing_id;
mod watch;

use routing_id::RoutingId;

pub(crate) use limits::Limits;

#[cfg(test)]
mod tests;
