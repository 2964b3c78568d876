//! One rank's view of the group: its connections, the session, the round counter, and the
//! event loop that hands authenticated frames of this session to the round and serves
//! the join handshake (`join.rs`) whatever the rank is doing.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use lens_core::Result;

use crate::diag::Diagnostics;
use crate::frame::{Frame, Kind, Nonce};
use crate::message::Message;
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

pub(crate) struct Group {
    pub net: Net,
    pub rank: usize,
    pub n: usize,
    pub tree: Tree,
    pub session: u64,
    pub round: u64,
    /// Rank 0: every rank's connection. Others: their tree children's.
    pub peers: Vec<Option<ConnId>>,
    /// Whether the group has formed: rank 0 admitted every rank, others got their WELCOME.
    pub formed: bool,
    /// Rank 0 during formation: the endpoint each rank listens on for tree children.
    pub endpoints: Vec<String>,
    /// Rank 0 during formation: which ranks proved the key (and named their endpoint)...
    pub registered: Vec<bool>,
    /// How many are `true` in `registered`.
    pub registered_count: usize,
    /// ...and which were sent their WELCOME on their current connection.
    pub welcomed: Vec<bool>,
    /// Tree parents during formation: the session each child said it had.
    pub child_session: HashMap<usize, u64>,
    /// Where this rank listens for its tree children ("" when it has none).
    pub endpoint: String,
    /// The nonce of this rank's last KNOCK, per outbound side.
    pub knocked: HashMap<Side, Nonce>,
    pub pending: VecDeque<(ConnId, Frame)>,
    /// What this rank said last in a finished round (a member's ack, rank 0's verdict to
    /// the root), said again when that round's data comes again: the first may have died
    /// with a reset connection.
    pub last_answers: Vec<crate::machine::Answer>,
    pub diag: Diagnostics,
}

pub(crate) fn wire(r: usize) -> u32 {
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
            formed: false,
            endpoints: vec![String::new(); n],
            registered: vec![false; n],
            registered_count: 0,
            welcomed: vec![false; n],
            child_session: HashMap::new(),
            endpoint,
            knocked: HashMap::new(),
            pending: VecDeque::new(),
            last_answers: Vec::new(),
            diag: Diagnostics::default(),
        }
    }

    pub(crate) fn is_hub(&self) -> bool {
        self.rank == 0
    }

    pub(crate) fn formed(&self) -> bool {
        self.formed
    }

    /// A frame from this rank, with its prefix.
    pub(crate) fn frame(&self, msg: &Message<'_>, round: u64, root: usize) -> Vec<u8> {
        self.net
            .codec()
            .encode(msg, wire(self.rank), self.session, round, wire(root))
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
                        if !self.formed && !self.welcomed[r] {
                            // Rank 0 while the group forms: it has to join again (a restart).
                            // A tree rank that was welcomed left for its parent on purpose.
                            if self.registered[r] {
                                self.registered[r] = false;
                                self.registered_count -= 1;
                            }
                        }
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
                let hint = self.net.codec().key_mismatch_hint();
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
            if matches!(f.kind(), Kind::Knock | Kind::Hello) {
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
        match f.kind() {
            Kind::Challenge => self.on_challenge(&conn, &f),
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
}
