//! The bytes a connection delivers: cut into frames where they lie, each checked and
//! turned into an event.

use super::{ConnId, Event, Net, Side};
use crate::frame::{JOIN_FRAME_MAX, Kind, Reject};

impl Net {
    pub(super) fn bytes(&mut self, conn: ConnId, chunk: &[u8]) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return; // a connection closed here a moment ago
        };
        // Whether the peer proved the key changes only as the events are handled, after
        // this chunk.
        let proven = c.verified.is_some();
        let limit = if proven {
            self.limits.max_frame
        } else {
            JOIN_FRAME_MAX
        };
        // Out of the map while its frames are used in place (they may close the
        // connection); put back after if it holds a partial frame and the connection is
        // still open (an empty one is what `take` left).
        let mut stream = std::mem::take(&mut c.stream);
        let pushed = stream.push(chunk, limit, |bytes| self.frame(&conn, proven, bytes));
        match pushed {
            Ok(()) => {
                if !stream.is_empty()
                    && let Some(c) = self.conns.get_mut(&conn)
                {
                    c.stream = stream;
                }
            }
            Err(big) => {
                let addr = self.addr(&conn);
                tracing::warn!(len = big.len, limit = big.limit, addr = ?addr, "a peer announced a frame over the limit");
                self.events.push_back(Event::Rejected {
                    conn: conn.clone(),
                    why: Reject::Malformed("frame over the size limit"),
                    addr,
                });
                self.close(&conn);
            }
        }
    }

    /// One whole frame from `conn` (`proven`: it proved the key); whether the connection
    /// is still open for the next.
    fn frame(&mut self, conn: &ConnId, proven: bool, bytes: &[u8]) -> bool {
        if conn.side == Side::Listen && !proven {
            let Some(c) = self.conns.get_mut(conn) else {
                return false;
            };
            c.frames += 1;
            if c.frames > self.limits.unproven_frames {
                tracing::debug!("closed an unproven connection that sent too many frames");
                self.close(conn);
                return false;
            }
        }
        let allowed = |k: Kind| match conn.side {
            // Only join frames until the connection proves the key: a rank that
            // reconnected knocks again by itself.
            // Data and acks on a connection that has not proven the key yet: a rank that
            // reconnected may send them right behind its HELLO, which is decoded in the
            // same pass; the group drops them unless the HELLO admitted the connection.
            Side::Listen => matches!(k, Kind::Knock | Kind::Hello | Kind::Data | Kind::Ack),
            Side::Hub | Side::Parent if !proven => {
                matches!(k, Kind::Challenge | Kind::Reject | Kind::JoinFail)
            }
            Side::Hub | Side::Parent => !matches!(k, Kind::Knock | Kind::Hello | Kind::Ack),
        };
        match self.codec.decode(bytes, allowed) {
            Ok(f) => self.events.push_back(Event::Frame(conn.clone(), f)),
            Err(Reject::NotAllowed(Kind::KeyMismatch)) if conn.side != Side::Listen => {
                self.events.push_back(Event::KeyHint);
            }
            Err(why) => {
                let addr = self.addr(conn);
                self.events.push_back(Event::Rejected {
                    conn: conn.clone(),
                    why,
                    addr,
                });
            }
        }
        true
    }
}
