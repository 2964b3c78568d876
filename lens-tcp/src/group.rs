//! One rank's view of the group: its connections, the session, the round counter, and the
//! join handshake on both ends (as a joiner, and as rank 0 or a tree parent that admits).
//!
//! The handshake is a mutual challenge-response, so nothing recorded from another job or
//! from another connection is accepted:
//!
//! ```text
//! joiner                                   rank 0 (or the tree parent)
//!   KNOCK     world, nonce J          ->
//!                                     <-   CHALLENGE  J, nonce S       (per connection)
//!   HELLO     world, S, endpoint      ->                               (proves the joiner)
//!                                     <-   WELCOME    J, table, session (rank 0 only)
//! ```
//! The joiner accepts a CHALLENGE, WELCOME, REJECT or JOIN FAIL only when it carries J,
//! the nonce it just sent; the server admits a HELLO only when it carries S, the nonce it
//! gave that connection. A rank that reconnects (a reset, a restart during formation) runs
//! the same handshake on its new connection and replaces its old one.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use lens_core::{Error, Result};

use crate::frame::{Frame, Kind, Nonce, payload};
use crate::net::{ConnId, Event, Net, SendFail, Side};
use crate::tree::Tree;

/// What the event loop hands to the join and round logic.
#[derive(Debug)]
pub(crate) enum Input {
    /// An authenticated frame of this session (or a join answer) from a proven peer.
    Frame(ConnId, Frame),
    /// A rank proved the key and (re)joined through this rank.
    Admitted(usize),
    /// The server says this rank's KNOCK failed authentication.
    KeyHint,
    /// Rank 0 (`Side::Hub`) or the tree parent answered this rank's knock: it holds the
    /// key, and the connection carries this rank's frames again.
    Proven(Side),
}

/// Causes worth reporting when a join fails.
#[derive(Debug, Default)]
pub(crate) struct Diagnostics {
    /// What authenticated peers disagreed about (world size, a group already formed).
    pub notes: Vec<String>,
    /// Connections whose KNOCK or HELLO failed the key check: a rank with another key, or
    /// a stranger (whose frames anyone can forge), so they are counted, never blamed.
    pub bad_key: usize,
    /// Where the first few of those came from.
    pub bad_key_from: Vec<String>,
}

impl Diagnostics {
    fn note(&mut self, s: String) {
        if !self.notes.contains(&s) && self.notes.len() < 8 {
            self.notes.push(s);
        }
    }

    /// The connections that failed the key check, for an error message; empty when there
    /// were none.
    pub(crate) fn bad_key_summary(&self) -> String {
        if self.bad_key == 0 {
            return String::new();
        }
        format!(
            "{} connection(s) failed the key check (a rank with another job key, or a stranger) from {}",
            self.bad_key,
            self.bad_key_from.join(", ")
        )
    }
}

pub(crate) struct Group {
    pub net: Net,
    pub rank: usize,
    pub n: usize,
    pub tree: Tree,
    pub session: u64,
    pub round: u64,
    /// Rank 0: every rank's connection. Others: their tree children's.
    pub peers: Vec<Option<ConnId>>,
    /// Rank 0 during formation: the endpoint each rank listens on for tree children.
    pub endpoints: Vec<String>,
    /// Tree parents during formation: the session each child said it had.
    pub child_session: HashMap<usize, u64>,
    /// Where this rank listens for its tree children ("" when it has none).
    pub endpoint: String,
    /// The nonce of this rank's last KNOCK, per outbound side.
    knocked: HashMap<Side, Nonce>,
    pub pending: VecDeque<(ConnId, Frame)>,
    /// What this rank said last in a finished round (a member's ack, rank 0's verdict to
    /// the root), said again when that round's data comes again: the first may have died
    /// with a reset connection.
    pub last_answer: Option<crate::round::machine::Answer>,
    pub diag: Diagnostics,
}

pub(crate) fn nonce() -> Result<Nonce> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).map_err(|e| {
        Error::transport(
            crate::net::BACKEND,
            "no randomness for a nonce",
            e.to_string(),
        )
    })?;
    Ok(n)
}

fn wire(r: usize) -> u32 {
    // The configuration keeps world sizes within u32.
    u32::try_from(r).unwrap_or(u32::MAX)
}

impl Group {
    pub(crate) fn new(net: Net, rank: usize, n: usize, tree: Tree, endpoint: String) -> Group {
        Group {
            net,
            rank,
            n,
            tree,
            session: 0,
            round: 0,
            peers: vec![None; n],
            endpoints: vec![String::new(); n],
            child_session: HashMap::new(),
            endpoint,
            knocked: HashMap::new(),
            pending: VecDeque::new(),
            last_answer: None,
            diag: Diagnostics::default(),
        }
    }

    pub(crate) fn is_hub(&self) -> bool {
        self.rank == 0
    }

    pub(crate) fn formed(&self) -> bool {
        self.session != 0
    }

    /// A frame from this rank, with its prefix.
    pub(crate) fn frame(&self, kind: Kind, round: u64, root: usize, payload: &[u8]) -> Vec<u8> {
        self.net.codec().encode(
            kind,
            wire(self.rank),
            self.session,
            round,
            wire(root),
            payload,
        )
    }

    /// The side this rank hears its tree parent on.
    pub(crate) fn up_side(&self) -> Side {
        match self.tree.parent(self.rank) {
            Some(p) if p != 0 => Side::Parent,
            _ => Side::Hub,
        }
    }

    pub(crate) fn send(
        &mut self,
        conn: &ConnId,
        bytes: &[u8],
    ) -> std::result::Result<(), SendFail> {
        self.net.send(conn, bytes)
    }

    /// Knocks (again) at rank 0 or the tree parent with a fresh nonce.
    pub(crate) fn knock(&mut self, side: Side) -> Result<()> {
        let j = nonce()?;
        self.knocked.insert(side, j);
        let bytes = self.frame(Kind::Knock, 0, 0, &payload::knock(wire(self.n), &j));
        if let Err(e) = self.net.send(&ConnId::outbound(side), &bytes) {
            // Not connected yet: the connection's opening knocks again.
            tracing::debug!(?side, ?e, "knock not sent");
        }
        Ok(())
    }

    pub(crate) fn knocked(&self, side: Side) -> Option<&Nonce> {
        self.knocked.get(&side)
    }

    /// The next input, or `None` at the deadline. Join frames from peers are served here,
    /// whatever this rank is doing, so a peer that reconnects is admitted again mid-job.
    pub(crate) fn next(&mut self, deadline: Instant) -> Result<Option<Input>> {
        self.next_with(deadline, true)
    }

    /// The next input that is ready now; `None` when nothing is, or `until` has passed.
    pub(crate) fn next_ready(&mut self, until: Instant) -> Result<Option<Input>> {
        self.next_with(until, false)
    }

    fn next_with(&mut self, deadline: Instant, sleep: bool) -> Result<Option<Input>> {
        loop {
            let event = if sleep {
                self.net.recv(deadline)?
            } else {
                self.net.recv_ready(deadline)?
            };
            let Some(event) = event else {
                return Ok(None);
            };
            match event {
                Event::Opened(conn) => {
                    if conn.side != Side::Listen {
                        self.knock(conn.side)?;
                    }
                }
                Event::Closed(conn) => {
                    if let Some(r) = self.peers.iter().position(|p| p.as_ref() == Some(&conn)) {
                        // It may come back (a reset, a restart) and prove itself again; until
                        // then a round counts it as unreached instead of sending into the
                        // dead connection.
                        tracing::info!(rank = r, "a rank's connection closed");
                        self.peers[r] = None;
                    }
                }
                Event::KeyHint => return Ok(Some(Input::KeyHint)),
                Event::Rejected { conn, why, addr } => self.rejected(&conn, &why, addr),
                Event::Frame(conn, f) => {
                    if let Some(input) = self.frame_in(conn, f)? {
                        return Ok(Some(input));
                    }
                }
            }
        }
    }

    fn rejected(&mut self, conn: &ConnId, why: &crate::frame::Reject, addr: Option<String>) {
        use crate::frame::Reject;
        let from = addr.unwrap_or_else(|| "an unknown address".to_owned());
        match (conn.side, why) {
            (Side::Listen, Reject::BadTag(Kind::Knock | Kind::Hello)) => {
                tracing::warn!(%from, "a peer knocked with a wrong job key");
                self.diag.bad_key += 1;
                if self.diag.bad_key_from.len() < 4 && !self.diag.bad_key_from.contains(&from) {
                    self.diag.bad_key_from.push(from);
                }
                let hint = self.net.codec().encode(Kind::KeyMismatch, 0, 0, 0, 0, &[]);
                let _ = self.net.send(conn, &hint);
                self.net.close(conn);
            }
            (Side::Listen, _) => {
                tracing::debug!(%from, %why, "dropped a frame from a connection");
            }
            (side, Reject::Malformed(_)) => {
                tracing::warn!(?side, %why, "the peer this rank connected to sent bytes that are not lens frames");
                self.diag.note(format!(
                    "the address this rank connected to ({}) answered with bytes that are not lens frames: is another program listening there?",
                    if side == Side::Hub { "rank 0" } else { "the tree parent" }
                ));
            }
            (side, _) => tracing::warn!(?side, %why, "dropped a frame"),
        }
    }

    fn frame_in(&mut self, conn: ConnId, f: Frame) -> Result<Option<Input>> {
        if conn.side == Side::Listen {
            if matches!(f.kind, Kind::Knock | Kind::Hello) {
                return self.serve_join(&conn, &f);
            }
            let Some(rank) = self.net.verified(&conn) else {
                // Net lets only join frames through before a connection proves the key;
                // nothing is answered to a connection that has proven nothing.
                return Ok(None);
            };
            if f.sender as usize != rank || f.session != self.session {
                tracing::warn!(
                    sender = f.sender,
                    "dropped a frame whose sender or session is not its connection's"
                );
                return Ok(None);
            }
            return Ok(Some(Input::Frame(conn, f)));
        }
        // From rank 0 or the tree parent.
        let side = conn.side;
        match f.kind {
            Kind::Challenge => {
                match payload::read_challenge(&f.payload) {
                    Some((j, s)) if Some(&j) == self.knocked(side) => {
                        let peer = if side == Side::Hub {
                            0
                        } else {
                            self.tree.parent(self.rank).unwrap_or(0)
                        };
                        self.net.set_verified(&conn, Some(peer));
                        let hello = self.frame(
                            Kind::Hello,
                            0,
                            0,
                            &payload::hello(wire(self.n), &s, &self.endpoint),
                        );
                        let _ = self.net.send(&conn, &hello);
                        return Ok(Some(Input::Proven(side)));
                    }
                    _ => tracing::warn!(
                        ?side,
                        "dropped a challenge that does not answer this rank's knock (replayed?)"
                    ),
                }
                Ok(None)
            }
            Kind::Welcome | Kind::Reject | Kind::JoinFail => Ok(Some(Input::Frame(conn, f))),
            _ if f.session != self.session || !self.formed() => {
                tracing::warn!(
                    ?side,
                    "dropped a frame of another session (replayed or stale)"
                );
                Ok(None)
            }
            _ => Ok(Some(Input::Frame(conn, f))),
        }
    }

    /// Rank 0 or a tree parent: a KNOCK or HELLO from a connection.
    fn serve_join(&mut self, conn: &ConnId, f: &Frame) -> Result<Option<Input>> {
        let r = f.sender as usize;
        let (me, n) = (self.rank, self.n);
        match f.kind {
            Kind::Knock => {
                let Some((world, j)) = payload::read_knock(&f.payload) else {
                    return Ok(None);
                };
                let joins_me = if me == 0 {
                    (1..n).contains(&r)
                } else {
                    self.tree.parent(r) == Some(me)
                };
                let why = if world as usize != n {
                    let s = format!("rank {r} knocked with world size {world}; rank {me} has {n}");
                    self.diag.note(s.clone());
                    Some(s)
                } else if !joins_me {
                    Some(format!(
                        "rank {r} does not join rank {me} in a group of {n}"
                    ))
                } else if self.formed() && f.session != self.session {
                    let s = format!(
                        "the group formed already; rank {r} cannot join it again (restarted?)"
                    );
                    self.diag.note(s.clone());
                    Some(s)
                } else if me == 0 && !self.formed() && f.session != 0 {
                    Some("the knock names a session of another job".to_owned())
                } else {
                    None
                };
                if let Some(why) = why {
                    tracing::warn!(rank = r, %why, "turned a joiner away");
                    let reject =
                        self.frame(Kind::Reject, 0, 0, &payload::tagged(&j, why.as_bytes()));
                    let _ = self.net.send(conn, &reject);
                    return Ok(None);
                }
                let s = nonce()?;
                if let Some((issued, joiner)) = self.net.nonces(conn) {
                    *issued = Some(s);
                    *joiner = Some(j);
                }
                let challenge = self.frame(Kind::Challenge, 0, 0, &payload::challenge(&j, &s));
                let _ = self.net.send(conn, &challenge);
                Ok(None)
            }
            Kind::Hello => {
                let Some((world, s, endpoint)) = payload::read_hello(&f.payload) else {
                    return Ok(None);
                };
                let Some((issued, joiner)) = self.net.nonces(conn) else {
                    return Ok(None);
                };
                // One use per nonce.
                let fresh = issued.take() == Some(s);
                let j = *joiner;
                if !fresh || world as usize != n || r >= n || r == me {
                    tracing::warn!(
                        rank = r,
                        "dropped a join that does not answer this connection's challenge (replayed?)"
                    );
                    return Ok(None);
                }
                let session_ok = if me == 0 {
                    f.session == self.session
                } else {
                    !self.formed() || f.session == self.session
                };
                if !session_ok {
                    tracing::warn!(rank = r, "dropped a join of another session");
                    return Ok(None);
                }
                self.net.set_verified(conn, Some(r));
                if let Some(old) = self.peers[r].replace(conn.clone()) {
                    if &old != conn {
                        tracing::info!(
                            rank = r,
                            "a rank joined again; its previous connection is dropped"
                        );
                        self.net.close(&old);
                    }
                }
                if me == 0 {
                    if self.formed() {
                        let j = j.unwrap_or_default();
                        let again = self.frame(Kind::Welcome, 0, 0, &payload::welcome(&j, &[]));
                        let _ = self.net.send(conn, &again);
                    } else {
                        self.endpoints[r] = endpoint;
                    }
                } else {
                    self.child_session.insert(r, f.session);
                }
                tracing::debug!(rank = r, "admitted");
                Ok(Some(Input::Admitted(r)))
            }
            _ => Ok(None),
        }
    }

    /// Rank 0: the joiner nonce a rank's connection knocked with.
    pub(crate) fn joiner_of(&mut self, r: usize) -> Option<Nonce> {
        let conn = self.peers.get(r)?.clone()?;
        self.net.nonces(&conn).and_then(|(_, j)| *j)
    }
}
