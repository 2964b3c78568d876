//! Readiness and reading: what epoll signalled, a read from each connection in turn, and
//! a connection's end.

use std::io;
use std::time::{Duration, Instant};

use lens_core::Result;
use mio::{Events, Token};

use super::socket::{Outbound, Stream};
use super::{Conn, ConnId, Event, FIRST_ACCEPTED, HUB, Net, PARENT, Side};
use crate::error::socket_err;

impl Net {
    /// Waits up to `timeout` for readiness and notes what signalled.
    /// Within a round, a wait first polls without sleeping (`spin.rs`).
    pub(super) fn collect(&mut self, timeout: Option<Duration>) -> Result<()> {
        let waits = timeout.is_none_or(|t| !t.is_zero());
        let start = (waits && self.spin.active()).then(Instant::now);
        let polled = self.poll_first(timeout, start)?;
        if !polled {
            match self.poll.poll(&mut self.ready, timeout) {
                Ok(()) => {}
                // A signal: the caller goes round again (training jobs install handlers).
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
                Err(e) => return Err(socket_err("poll")(e)),
            }
        }
        if let Some(start) = start {
            self.spin.record(start.elapsed(), !self.ready.is_empty());
        }
        let ready = std::mem::replace(&mut self.ready, Events::with_capacity(0));
        for ev in &ready {
            let token = ev.token();
            match token {
                HUB | PARENT => self.outbound_ready(token, ev),
                Token(t) if t < FIRST_ACCEPTED => self.accept_ready = true,
                Token(t) => {
                    if let Some(s) = self.accepted.get_mut(&t)
                        && ev.is_writable()
                        && s.flush().is_err()
                    {
                        self.mark_readable(token);
                    }
                    if ev.is_read_closed() || ev.is_error() {
                        self.mark_ended(token);
                    } else if ev.is_readable() {
                        self.mark_readable(token);
                    }
                }
            }
        }
        self.ready = ready;
        Ok(())
    }

    /// Polls without sleeping for what the spin allows a wait begun at `start` (`None`:
    /// none); whether that found something (then `ready` holds it).
    fn poll_first(&mut self, timeout: Option<Duration>, start: Option<Instant>) -> Result<bool> {
        let Some(start) = start else {
            return Ok(false);
        };
        let allowance = self.spin.allowance(timeout);
        if allowance.is_zero() {
            return Ok(false);
        }
        loop {
            match self.poll.poll(&mut self.ready, Some(Duration::ZERO)) {
                Ok(()) if !self.ready.is_empty() => return Ok(true),
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(socket_err("poll")(e)),
            }
            if start.elapsed() >= allowance {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    /// The connection under `token` signalled its end: read until the end is seen.
    pub(super) fn mark_ended(&mut self, token: Token) {
        if let Some(s) = self.stream_of(token) {
            s.ended = true;
        }
        self.mark_readable(token);
    }

    pub(super) fn mark_readable(&mut self, token: Token) {
        let stream = match token {
            HUB => self.hub.as_mut().and_then(Outbound::stream),
            PARENT => self.parent.as_mut().and_then(Outbound::stream),
            Token(t) => self.accepted.get_mut(&t),
        };
        if let Some(s) = stream
            && !s.readable
        {
            s.readable = true;
            self.readable.push_back(token);
        }
    }

    /// Accepts what waits, then reads once from each connection that signalled, in turn;
    /// one that gave a whole chunk goes to the back of the line.
    pub(super) fn read_pass(&mut self) -> Result<()> {
        if self.accept_ready {
            self.accept_some();
        }
        for _ in 0..self.readable.len() {
            let Some(token) = self.readable.pop_front() else {
                break;
            };
            if self.read_one(token) {
                self.readable.push_back(token);
            }
        }
        Ok(())
    }

    /// Reads once from the connection under `token`; whether it may hold more.
    fn read_one(&mut self, token: Token) -> bool {
        let (conn, stream) = match token {
            HUB => (
                ConnId::outbound(Side::Hub),
                self.hub.as_mut().and_then(Outbound::stream),
            ),
            PARENT => (
                ConnId::outbound(Side::Parent),
                self.parent.as_mut().and_then(Outbound::stream),
            ),
            Token(t) => (
                ConnId {
                    side: Side::Listen,
                    id: t,
                },
                self.accepted.get_mut(&t),
            ),
        };
        let Some(stream) = stream else {
            return false; // closed since it signalled
        };
        let mut buf = std::mem::take(&mut self.read_buf);
        let got = stream.read(&mut buf);
        let more = match got {
            Ok(Some(0)) => {
                self.lost(&conn, None);
                false
            }
            Ok(Some(n)) => {
                // A read that did not fill the buffer took all there was (as tokio
                // reasons too): the next arrival signals again. Not the end, when it
                // signalled with the last bytes: the next read sees it.
                let more = n == buf.len() || stream.ended;
                if !more && let Some(s) = self.stream_of(token) {
                    s.readable = false;
                }
                self.bytes(conn, &buf[..n]);
                more
            }
            Ok(None) => {
                if let Some(s) = self.stream_of(token) {
                    s.readable = false;
                }
                false
            }
            Err(e) => {
                self.lost(&conn, Some(e));
                false
            }
        };
        self.read_buf = buf;
        more && self.stream_of(token).is_some_and(|s| s.readable)
    }

    fn stream_of(&mut self, token: Token) -> Option<&mut Stream> {
        match token {
            HUB => self.hub.as_mut().and_then(Outbound::stream),
            PARENT => self.parent.as_mut().and_then(Outbound::stream),
            Token(t) => self.accepted.get_mut(&t),
        }
    }

    /// A connection ended (its peer closed it, or it was reset).
    fn lost(&mut self, conn: &ConnId, why: Option<io::Error>) {
        tracing::debug!(side = ?conn.side, error = ?why, "a connection ended");
        match conn.side {
            Side::Listen => self.close(conn),
            Side::Hub | Side::Parent => {
                let poll = &self.poll;
                let side = conn.side;
                if let Some(out) = if side == Side::Hub {
                    self.hub.as_mut()
                } else {
                    self.parent.as_mut()
                } {
                    out.lost(poll, Instant::now());
                }
                self.restart(side, None);
            }
        }
    }

    /// An outbound connection was made or lost: its stream starts over and the server
    /// must be proven again; the rank knocks again.
    pub(super) fn restart(&mut self, side: Side, addr: Option<String>) {
        let conn = ConnId::outbound(side);
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
