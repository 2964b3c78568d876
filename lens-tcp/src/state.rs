//! One rank's view of the group: its connections, its join state (`handshake.rs`), the
//! round counter, and the event loop that hands authenticated frames of this session to
//! the round and feeds join frames to the join machine whatever the rank is doing.

use std::collections::VecDeque;
use std::time::Instant;

use lens_core::Result;

use crate::frame::{Frame, Kind, Nonce};
use crate::handshake::{Dest, Join, Sender, Unsent, Up, Wire};
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

pub(crate) struct RankState {
    pub net: Net,
    pub rank: usize,
    pub n: usize,
    pub tree: Tree,
    /// The join protocol's state: the session, who proved the key where, the nonces.
    pub join: Join<ConnId>,
    pub round: u64,
    pub pending: VecDeque<(ConnId, Frame)>,
    /// Rank 0 as the root of the last round: when each rank came to it, in ns after rank
    /// 0 did.
    pub arrivals: Vec<(usize, i64)>,
    /// As the root of the last round: the ranks that voted to keep the step it ended.
    pub voted: Vec<usize>,
    /// When the last round's data reached this rank, where that was before it returned
    /// (`Broadcaster::received_at`).
    pub received_at: Option<Instant>,
    /// This rank's vote, for its next round (`Broadcaster::carry_vote`).
    pub vote: bool,
    /// Whom this rank stands for in its next round's arrivals, and when that rank came
    /// (`Broadcaster::stand_for`).
    pub stands_for: Option<(usize, Instant)>,
    /// What this rank said last in a finished round (a member's ack, rank 0's verdict to
    /// the root), said again when that round's data comes again: the first may have died
    /// with a reset connection.
    pub last_answers: Vec<crate::machine::Answer>,
    /// Rank 0: per rank, the last round it took part in (0: none yet), named in a timeout
    /// beside the missing ranks. Empty on other ranks, which keep no record.
    pub last_seen: Vec<u64>,
    /// The round this rank returned from as a queued source, until it is over.
    pub open: Option<OpenRound>,
    /// A member: the ranks rank 0's last failed round waited for, as rank 0 told every rank
    /// it could reach (relayed down the tree); cleared when a later round delivers. A round
    /// that then waits in vain for the parent names them, the root cause, through the path
    /// up to rank 0, instead of naming the parent.
    pub upstream_missing: Vec<usize>,
    /// The frame being sent in a round, kept from frame to frame: a round's sends cost no
    /// allocation (`round.rs`).
    pub out: Vec<u8>,
}

pub(crate) use crate::handshake::wire_u32 as wire;

/// A round this rank returned from as its root before it was over
/// ([`crate::SourceReturns::Queued`]): whatever serves the connections feeds it, and the
/// rank's next call (or a flush) ends it (`round.rs`).
#[derive(Debug)]
pub(crate) struct OpenRound {
    pub(crate) m: crate::machine::RoundMachine,
    pub(crate) root: usize,
}

/// A fresh nonce from the operating system.
pub(crate) fn nonce() -> Result<Nonce> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).map_err(|e| {
        // The system's code where there is one; getrandom's own text where there is not.
        let io = e.raw_os_error().map_or_else(
            || std::io::Error::other(e.to_string()),
            std::io::Error::from_raw_os_error,
        );
        crate::error::setup_err("draw randomness for a nonce")(io)
    })?;
    Ok(n)
}

/// The join machine's [`Wire`] over this rank's connections.
pub(crate) struct NetWire<'a> {
    net: &'a mut Net,
    me: usize,
}

fn conn_of(to: Dest<'_, ConnId>) -> ConnId {
    match to {
        Dest::Up(up) => ConnId::outbound(side_of(up)),
        Dest::Conn(c) => c.clone(),
    }
}

pub(crate) fn side_of(up: Up) -> Side {
    match up {
        Up::Hub => Side::Hub,
        Up::Parent => Side::Parent,
    }
}

pub(crate) fn up_of(side: Side) -> Option<Up> {
    match side {
        Side::Hub => Some(Up::Hub),
        Side::Parent => Some(Up::Parent),
        Side::Listen => None,
    }
}

impl Wire<ConnId> for NetWire<'_> {
    fn send(
        &mut self,
        to: Dest<'_, ConnId>,
        session: u64,
        msg: &Message<'_>,
    ) -> std::result::Result<(), Unsent> {
        let bytes = self.net.codec().encode(msg, wire(self.me), session, 0, 0);
        self.net.send(&conn_of(to), &bytes).map_err(|e| match e {
            SendFail::Gone => Unsent::Gone,
            SendFail::Full => Unsent::Full,
        })
    }

    fn close(&mut self, conn: &ConnId) {
        self.net.close(conn);
    }

    fn proven(&mut self, to: Dest<'_, ConnId>, rank: usize) {
        self.net.set_verified(&conn_of(to), Some(rank));
    }
}

impl RankState {
    pub(crate) fn new(net: Net, rank: usize, n: usize, tree: Tree, endpoint: String) -> RankState {
        RankState {
            net,
            rank,
            n,
            tree,
            join: Join::new(rank, n, tree, endpoint),
            round: 0,
            pending: VecDeque::new(),
            arrivals: Vec::new(),
            voted: Vec::new(),
            received_at: None,
            vote: false,
            stands_for: None,
            last_answers: Vec::new(),
            last_seen: if rank == 0 { vec![0; n] } else { Vec::new() },
            open: None,
            upstream_missing: Vec::new(),
            out: Vec::new(),
        }
    }

    pub(crate) fn is_hub(&self) -> bool {
        self.rank == 0
    }

    pub(crate) fn formed(&self) -> bool {
        self.join.formed()
    }

    pub(crate) fn session(&self) -> u64 {
        self.join.session()
    }

    /// The join machine and the connections it sends on.
    pub(crate) fn split(&mut self) -> (&mut Join<ConnId>, NetWire<'_>) {
        let wire = NetWire {
            net: &mut self.net,
            me: self.rank,
        };
        (&mut self.join, wire)
    }

    /// Knocks (again) at rank 0 or the tree parent with a fresh nonce.
    pub(crate) fn knock(&mut self, side: Side) -> Result<()> {
        let Some(up) = up_of(side) else {
            return Ok(());
        };
        let j = nonce()?;
        let (join, mut w) = self.split();
        join.knock(&mut w, up, j);
        Ok(())
    }

    /// A frame from this rank, with its prefix.
    pub(crate) fn frame(&self, msg: &Message<'_>, round: u64, root: usize) -> Vec<u8> {
        self.net
            .codec()
            .encode(msg, wire(self.rank), self.session(), round, wire(root))
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
                    if let Some(up) = up_of(conn.side) {
                        self.join.reopened(up);
                        self.knock(conn.side)?;
                    }
                }
                Event::Closed(conn) => {
                    if let Some(r) = self.join.closed(&conn) {
                        tracing::info!(rank = r, "a rank's connection closed");
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
                self.join.diag.bad_key += 1;
                if self.join.diag.bad_key_from.len() < 4
                    && !self.join.diag.bad_key_from.contains(&from)
                {
                    self.join.diag.bad_key_from.push(from);
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
                self.join.diag.note(format!(
                    "the address this rank connected to ({}) answered with bytes that are not lens frames: is another program listening there?",
                    if side == Side::Hub { "rank 0" } else { "the tree parent" }
                ));
            }
            (side, _) => tracing::warn!(?side, %why, "dropped a frame"),
        }
    }

    fn frame_in(&mut self, conn: ConnId, f: Frame) -> Result<Option<Input>> {
        let session = self.session();
        if conn.side == Side::Listen {
            if matches!(f.kind(), Kind::Knock | Kind::Hello) {
                return self.serve_join(&conn, &f);
            }
            let Some(rank) = self.join.rank_of(&conn) else {
                // Net lets only join frames through before a connection proves the key;
                // nothing is answered to a connection that has proven nothing.
                return Ok(None);
            };
            if f.sender as usize != rank || f.session != session {
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
        match &f.msg {
            Message::Challenge { joiner, server } => {
                let Some(up) = up_of(side) else {
                    return Ok(None);
                };
                let (join, mut w) = self.split();
                Ok(join
                    .on_challenge(&mut w, up, joiner, server)
                    .then_some(Input::Proven(side)))
            }
            Message::Welcome { .. } | Message::Reject { .. } | Message::JoinFail { .. } => {
                Ok(Some(Input::Frame(conn, f)))
            }
            _ if f.session != session || !self.formed() => {
                tracing::warn!(
                    ?side,
                    "dropped a frame of another session (replayed or stale)"
                );
                Ok(None)
            }
            _ => Ok(Some(Input::Frame(conn, f))),
        }
    }

    /// A KNOCK or HELLO on a connection this rank accepted.
    fn serve_join(&mut self, conn: &ConnId, f: &Frame) -> Result<Option<Input>> {
        let sender = Sender {
            conn,
            rank: f.sender as usize,
            session: f.session,
        };
        match &f.msg {
            &Message::Knock { world, joiner } => {
                let fresh = nonce()?;
                let (join, mut w) = self.split();
                join.on_knock(&mut w, sender, world, joiner, fresh);
                Ok(None)
            }
            Message::Hello {
                world,
                server,
                endpoint,
            } => {
                let (join, mut w) = self.split();
                Ok(join
                    .on_hello(&mut w, sender, *world, server, endpoint)
                    .map(Input::Admitted))
            }
            _ => Ok(None),
        }
    }
}
