//! Connections opening: accepting on the listening sockets, and making (again) this rank's
//! outbound connections.

use std::time::Instant;

use mio::Token;
use mio::event::Event as Readiness;

use super::socket::{Made, Stream, tune};
use super::{Conn, ConnId, Event, HUB, Net, PARENT, Side};

/// Connections accepted from one listening socket per read pass, so that a flood of
/// connections does not hold up the round's frames.
const ACCEPTS_PER_PASS: usize = 64;

impl Net {
    /// Accepts what the listening sockets hold, up to a bound per socket.
    pub(super) fn accept_some(&mut self) {
        let mut more = false;
        for i in 0..self.listeners.len() {
            let mut taken = 0;
            loop {
                if taken == ACCEPTS_PER_PASS {
                    more = true;
                    break;
                }
                match self.listeners[i].accept() {
                    Ok((sock, peer)) => {
                        taken += 1;
                        self.adopt(sock, peer.ip().to_string());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Out of descriptors, most often: the connection waits in the
                        // kernel's queue and is taken at the next signal.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        break;
                    }
                }
            }
        }
        self.accept_ready = more;
    }

    fn adopt(&mut self, sock: mio::net::TcpStream, peer: String) {
        if let Err(e) = tune(&sock) {
            tracing::debug!(error = %e, "cannot set up an accepted connection");
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        let mut stream = Stream::new(sock);
        if let Err(e) = stream.register(&self.poll, Token(token)) {
            tracing::warn!(error = %e, "cannot watch an accepted connection");
            return;
        }
        self.accepted.insert(token, stream);
        // Bytes may have come with the connection, before it was watched.
        self.mark_readable(Token(token));
        let conn = ConnId {
            side: Side::Listen,
            id: token,
        };
        self.conns.insert(conn.clone(), Conn::new(Some(peer)));
        self.unproven.push_back((Instant::now(), conn.clone()));
        self.evict_unproven();
        self.events.push_back(Event::Opened(conn));
    }

    /// An outbound connection's socket signalled.
    pub(super) fn outbound_ready(&mut self, token: Token, ev: &Readiness) {
        let side = if token == HUB {
            Side::Hub
        } else {
            Side::Parent
        };
        let poll = &self.poll;
        let out = if token == PARENT {
            self.parent.as_mut()
        } else {
            self.hub.as_mut()
        };
        let Some(out) = out else {
            return;
        };
        if out.stream().is_some() {
            let failed = ev.is_writable() && out.stream().is_some_and(|s| s.flush().is_err());
            if ev.is_read_closed() || ev.is_error() {
                self.mark_ended(token);
            } else if failed || ev.is_readable() {
                self.mark_readable(token);
            }
            return;
        }
        match out.settle(poll, Instant::now()) {
            Made::Not | Made::Failed => {}
            Made::Up(addr) => {
                self.mark_readable(token);
                self.restart(side, addr);
            }
        }
    }

    /// Makes again the outbound connections whose wait is over; when the next one is due.
    pub(super) fn redial(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for side in [Side::Hub, Side::Parent] {
            let poll = &self.poll;
            let out = if side == Side::Parent {
                self.parent.as_mut()
            } else {
                self.hub.as_mut()
            };
            let Some(out) = out else {
                continue;
            };
            if let Some(at) = out.due() {
                if at <= now {
                    if let Err(e) = out.connect(poll, now) {
                        tracing::debug!(error = %e, "cannot start a connection; trying again later");
                    }
                }
                if let Some(at) = out.due() {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        next
    }
}
