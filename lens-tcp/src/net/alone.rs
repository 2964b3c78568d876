//! A leaf's wait for the one frame its round expects, read straight off its connection up
//! when it comes whole and alone. The general loop (`Net::recv`) queues what every socket
//! delivers as events and hands them out one by one; a member of a large group runs that
//! path from cold caches once a round, and its steps were much of what a member costs over
//! a bare socket (docs/SCALING.md). Anything else than one whole frame in one read, or any
//! other socket signalling, is left exactly where `recv` finds it.

use std::time::Instant;

use lens_core::Result;
use mio::Token;

use super::socket::Outbound;
use super::{ConnId, Event, HUB, Net, PARENT, Side};
use crate::frame::{Codec, Frame, Kind, PREFIX};

impl Net {
    /// Waits until `deadline` for a DATA frame on this rank's connection `side` (rank 0's or
    /// the tree parent's) and returns it, authenticated, when it came alone: one whole
    /// frame in one read, no other socket signalled, no event queued. Otherwise `None`,
    /// with what came left for [`Net::recv`] to hand out as it would have (bytes passed to
    /// the connection's stream, frames queued as events); `None` also at the deadline.
    pub(crate) fn recv_alone(&mut self, side: Side, deadline: Instant) -> Result<Option<Frame>> {
        let token = if side == Side::Parent { PARENT } else { HUB };
        let conn = ConnId::outbound(side);
        loop {
            if !self.alone_possible(&conn, token) {
                return Ok(None);
            }
            let Some(readable) = self.up_stream(side).map(|s| s.readable) else {
                return Ok(None);
            };
            // A connection read dry has nothing until it signals again: no read to learn that.
            if readable && let Some(frame) = self.read_up(side, &conn, token) {
                return Ok(frame);
            }
            let now = Instant::now();
            if now >= deadline || self.next_expiry().is_some() {
                return Ok(None); // the deadline, or something due that `recv` handles
            }
            self.collect(Some(deadline.saturating_duration_since(now)))?;
        }
    }

    /// One read of the connection up: `Some` with what [`Net::recv_alone`] returns (the frame,
    /// or `None` when what came is left for `recv`), `None` when it was dry: then marked so,
    /// until it signals again.
    fn read_up(&mut self, side: Side, conn: &ConnId, token: Token) -> Option<Option<Frame>> {
        let mut buf = std::mem::take(&mut self.read_buf);
        let got = self.up_stream(side).map(|s| s.read(&mut buf));
        let read = match got {
            Some(Ok(Some(n))) if n > 0 => Some(self.alone(conn, token, &buf[..n], n == buf.len())),
            Some(Ok(None)) => None,
            // Gone since it was looked at: `recv` finds out.
            None => Some(None),
            // Its end, or an error: `recv` reads again and finds it.
            Some(_) => {
                self.mark_ended(token);
                Some(None)
            }
        };
        self.read_buf = buf;
        if read.is_none() {
            self.readable.clear(); // nothing else was in it (`alone_possible`)
            if let Some(s) = self.up_stream(side) {
                s.readable = false;
            }
        }
        read
    }

    /// Whether nothing but the connection under `token` has anything for the loop, and it
    /// holds no part of a frame from an earlier read.
    fn alone_possible(&self, conn: &ConnId, token: Token) -> bool {
        self.events.is_empty()
            && !self.accept_ready
            && self.readable.iter().all(|&t| t == token)
            && self
                .conns
                .get(conn)
                .is_some_and(|c| c.verified.is_some() && c.stream.is_empty())
    }

    fn up_stream(&mut self, side: Side) -> Option<&mut super::socket::Stream> {
        let out = if side == Side::Parent {
            self.parent.as_mut()
        } else {
            self.hub.as_mut()
        };
        out.and_then(Outbound::stream).filter(|s| !s.ended)
    }

    /// One read's bytes from `conn`: the frame when they are one whole DATA frame that
    /// authenticates and the read took all there was (`!more`); otherwise passed on as
    /// `recv` would have read them.
    fn alone(&mut self, conn: &ConnId, token: Token, chunk: &[u8], more: bool) -> Option<Frame> {
        let whole = chunk.len() > PREFIX
            && chunk.len() - PREFIX <= self.limits.max_frame
            && chunk[..PREFIX]
                == u32::try_from(chunk.len() - PREFIX)
                    .unwrap_or(0)
                    .to_le_bytes();
        if whole && !more {
            let bytes = &chunk[PREFIX..];
            if Codec::peek(bytes) == Ok(Kind::Data) {
                if let Ok(f) = self.codec.decode(bytes, |k| k == Kind::Data) {
                    self.readable.clear(); // nothing else was in it (`alone_possible`)
                    if let Some(s) = self.up_stream(conn.side) {
                        s.readable = false;
                    }
                    return Some(f);
                }
            }
        }
        self.bytes(conn.clone(), chunk);
        if more {
            self.mark_readable(token);
        }
        None
    }

    /// Puts a frame [`Net::recv_alone`] returned back in front of the loop's events: its
    /// caller did not take it.
    pub(crate) fn give_back(&mut self, conn: ConnId, f: Frame) {
        self.events.push_front(Event::Frame(conn, f));
    }
}

#[cfg(test)]
mod tests;
