//! The join protocol on one rank as a state machine: no sockets, no clock, no randomness.
//! It is fed the join frames that arrived (already authenticated), connections closing,
//! and fresh nonces from its driver; it sends and closes through [`Wire`], and owns every
//! piece of join state: the nonces on both ends, who proved the key on which connection,
//! the session, and rank 0's view of the formation. The socket layer (`join.rs` and
//! `group.rs`) drives it for real with deadlines and retries; `handshake/sim.rs` drives
//! many of them, with strangers, over an in-memory network in tests.
//!
//! The handshake is a mutual challenge-response, so nothing recorded from another job or
//! from another connection is accepted:
//!
//! ```text
//! joiner                                   rank 0 (or the tree parent)
//!   KNOCK     world, nonce J          ->
//!                                     <-   CHALLENGE  J, nonce S       (per connection)
//!   HELLO     world, S, endpoint      ->                               (proves the joiner)
//!                                     <-   WELCOME    J, parent's endpoint, session
//!                                                                      (rank 0 only)
//! ```
//! The joiner accepts a CHALLENGE, WELCOME, REJECT or JOIN FAIL only when it carries J,
//! the nonce of its latest KNOCK on that connection; the server admits a HELLO only when
//! it carries S, the nonce it gave that connection (once), from the rank that knocked. A
//! rank that reconnects (a reset, a restart during formation) runs the same handshake on
//! its new connection, which replaces its old one.
//!
//! Formation: rank 0 chooses the session and admits every rank. In a star it WELCOMEs them
//! all once every rank has joined. In a tree it WELCOMEs a rank as soon as the rank's tree
//! parent has joined, naming where the parent listens; a rank whose parent is not rank 0
//! then leaves rank 0 and joins its parent (the same handshake, with the session), so no
//! rank keeps a connection per rank. Every rank then waits for its own tree children.

use crate::idhash::IdMap;
use std::borrow::Cow;
use std::hash::Hash;

use crate::diag::Diagnostics;
use crate::message::{Message, Nonce};
use crate::tree::Tree;

/// The connections a rank makes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Up {
    /// To rank 0.
    Hub,
    /// To the tree parent, when that is not rank 0.
    Parent,
}

impl Up {
    fn at(self) -> usize {
        match self {
            Up::Hub => 0,
            Up::Parent => 1,
        }
    }
}

/// Where a join message goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dest<'a, C> {
    /// A connection this rank made.
    Up(Up),
    /// A connection this rank accepted.
    Conn(&'a C),
}

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsent {
    /// No such connection (closed, or not open yet).
    Gone,
    /// The peer does not read: its queue is full.
    Full,
}

/// What the machine needs from the connections.
pub(crate) trait Wire<C> {
    /// Queues a join frame (round 0) of `session` carrying `msg`.
    fn send(&mut self, to: Dest<'_, C>, session: u64, msg: &Message<'_>) -> Result<(), Unsent>;
    /// Closes a connection this rank accepted.
    fn close(&mut self, conn: &C);
    /// The peer on `to` proved the key as `rank`: the socket layer's limits for unproven
    /// connections no longer apply to it.
    fn proven(&mut self, to: Dest<'_, C>, rank: usize);
}

/// Where a join frame on an accepted connection came from, as its header says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sender<'a, C> {
    /// The connection it came in on.
    pub conn: &'a C,
    /// The rank the frame names.
    pub rank: usize,
    /// The session the frame names (0: none yet).
    pub session: u64,
}

/// An accepted connection, from its first sound KNOCK until it closes.
#[derive(Debug)]
struct Accepted {
    /// The rank its KNOCK named, and the nonce it knocked with.
    rank: usize,
    joiner: Nonce,
    /// The nonce this rank's CHALLENGE handed out, until a HELLO uses it.
    issued: Option<Nonce>,
    /// Whether a HELLO answered the challenge: the peer is `rank`.
    proven: bool,
}

/// How rank 0 answered this rank's knock.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Admitted: where the tree parent listens (empty when that is rank 0). The session
    /// is now this rank's, and the group has formed for it.
    Welcome(String),
    /// Turned away.
    Rejected(String),
    /// Rank 0 gave up forming the group for want of these ranks.
    Failed(Vec<usize>),
}

/// Rank 0's view of the formation.
#[derive(Debug, Default)]
struct Formation {
    /// Which ranks proved the key (and named their endpoint)...
    registered: Vec<bool>,
    /// ...how many of them...
    count: usize,
    /// ...and which were sent their WELCOME on their current connection.
    welcomed: Vec<bool>,
}

/// The join state of one rank; `C` names a connection this rank accepted.
#[derive(Debug)]
pub(crate) struct Join<C> {
    me: usize,
    n: usize,
    tree: Tree,
    /// Where this rank listens for its tree children ("" when it has none).
    endpoint: String,
    /// Zero until rank 0 chose it (rank 0) or a WELCOME named it.
    session: u64,
    formed: bool,
    /// Per [`Up`]: the nonce of this rank's latest KNOCK, and whether the server answered it.
    knocked: [Option<Nonce>; 2],
    up_proven: [bool; 2],
    /// Accepted connections that knocked, until they close.
    accepted: IdMap<C, Accepted>,
    /// Rank r's connection once it proved the key (rank 0: every rank's until they leave
    /// for their tree parent; others: their children's).
    peers: Vec<Option<C>>,
    formation: Formation,
    /// Rank 0: where each rank listens for its tree children, and the knock nonce each was
    /// WELCOMEd under, kept after the formation: a rank whose WELCOME died with a reset
    /// knocks again under the same nonce and is WELCOMEd again, where a restarted rank
    /// (another nonce) is turned away.
    endpoints: Vec<String>,
    welcomed_with: Vec<Option<Nonce>>,
    /// Tree parents during formation: the session each child said it had.
    child_session: IdMap<usize, u64>,
    /// What authenticated peers disagreed about, for the error when the group does not form.
    pub diag: Diagnostics,
}

pub(crate) fn wire_u32(r: usize) -> u32 {
    // The configuration keeps world sizes within u32.
    u32::try_from(r).unwrap_or(u32::MAX)
}

impl<C: Clone + Eq + Hash> Join<C> {
    pub(crate) fn new(me: usize, n: usize, tree: Tree, endpoint: String) -> Join<C> {
        let hub = if me == 0 { n } else { 0 };
        let formation = Formation {
            registered: vec![false; hub],
            count: 0,
            welcomed: vec![false; hub],
        };
        Join {
            me,
            n,
            tree,
            endpoint,
            session: 0,
            formed: false,
            knocked: [None; 2],
            up_proven: [false; 2],
            accepted: IdMap::default(),
            peers: vec![None; n],
            formation,
            endpoints: vec![String::new(); hub],
            welcomed_with: vec![None; hub],
            child_session: IdMap::default(),
            diag: Diagnostics::default(),
        }
    }

    pub(crate) fn session(&self) -> u64 {
        self.session
    }

    /// Whether the group has formed: rank 0 admitted every rank, others got their WELCOME.
    pub(crate) fn formed(&self) -> bool {
        self.formed
    }

    /// The connection rank `r` proved the key on here, if it is open.
    pub(crate) fn peer(&self, r: usize) -> Option<&C> {
        self.peers.get(r).and_then(Option::as_ref)
    }

    /// The rank that proved the key on an accepted connection.
    pub(crate) fn rank_of(&self, conn: &C) -> Option<usize> {
        self.accepted.get(conn).filter(|a| a.proven).map(|a| a.rank)
    }

    /// Whether the server on `up` answered this rank's latest knock.
    pub(crate) fn up_proven(&self, up: Up) -> bool {
        self.up_proven[up.at()]
    }

    /// How many accepted connections the machine holds state for.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.accepted.len()
    }

    // ---- the joiner's end ----

    /// Knocks (again) on `up` with the fresh nonce `j`. Until rank 0 has WELCOMEd this
    /// rank, its knocks there keep their first nonce: rank 0 knows it by that nonce when its
    /// WELCOME dies with a reset after the group formed.
    pub(crate) fn knock(&mut self, w: &mut impl Wire<C>, up: Up, j: Nonce) {
        let slot = &mut self.knocked[up.at()];
        let keep = up == Up::Hub && !self.formed && slot.is_some();
        let j = if keep { slot.unwrap_or(j) } else { j };
        *slot = Some(j);
        let knock = Message::Knock {
            world: wire_u32(self.n),
            joiner: j,
        };
        if let Err(e) = w.send(Dest::Up(up), self.session, &knock) {
            // Not connected yet: the connection's opening knocks again.
            tracing::debug!(?up, ?e, "knock not sent");
        }
    }

    /// The connection on `up` opened again: the server has to prove itself again.
    pub(crate) fn reopened(&mut self, up: Up) {
        self.up_proven[up.at()] = false;
    }

    /// This rank leaves the server on `up` for good (a tree member leaves rank 0).
    pub(crate) fn leave(&mut self, up: Up) {
        self.up_proven[up.at()] = false;
        self.knocked[up.at()] = None;
    }

    fn answers_knock(&self, up: Up, j: &Nonce) -> bool {
        self.knocked[up.at()].as_ref() == Some(j)
    }

    /// The server's CHALLENGE on `up`: when it answers this rank's latest knock, the server
    /// holds the key, and the HELLO back proves this rank does. Returns whether it did.
    pub(crate) fn on_challenge(
        &mut self,
        w: &mut impl Wire<C>,
        up: Up,
        joiner: &Nonce,
        server: &Nonce,
    ) -> bool {
        if !self.answers_knock(up, joiner) {
            tracing::warn!(
                ?up,
                "dropped a challenge that does not answer this rank's knock (replayed?)"
            );
            return false;
        }
        let peer = match up {
            Up::Hub => 0,
            Up::Parent => self.tree.parent(self.me).unwrap_or(0),
        };
        self.up_proven[up.at()] = true;
        w.proven(Dest::Up(up), peer);
        let hello = Message::Hello {
            world: wire_u32(self.n),
            server: *server,
            endpoint: Cow::Borrowed(&self.endpoint),
        };
        let _ = w.send(Dest::Up(up), self.session, &hello);
        true
    }

    /// Rank 0's WELCOME, REJECT or JOIN FAIL on `up` in a frame of `session`; `None` when it
    /// answers no knock of this rank's (replayed, or an answer to an older knock).
    pub(crate) fn on_answer(
        &mut self,
        w: &mut impl Wire<C>,
        up: Up,
        session: u64,
        msg: &Message<'_>,
    ) -> Option<Answer> {
        let answer = match msg {
            Message::Welcome { joiner, parent }
                if self.answers_knock(up, joiner) && session != 0 && !self.formed =>
            {
                self.session = session;
                self.formed = true;
                self.drop_children_of_other_sessions(w);
                Answer::Welcome(parent.to_string())
            }
            Message::Reject { joiner, reason } if self.answers_knock(up, joiner) => {
                Answer::Rejected(reason.to_string())
            }
            Message::JoinFail { joiner, missing } if self.answers_knock(up, joiner) => {
                Answer::Failed(missing.clone())
            }
            _ => {
                tracing::debug!(
                    ?up,
                    "a join answer that answers no knock of this rank's (replayed, or again)"
                );
                return None;
            }
        };
        Some(answer)
    }

    /// Children that joined before this rank knew the session, with another one.
    fn drop_children_of_other_sessions(&mut self, w: &mut impl Wire<C>) {
        let session = self.session;
        let early: Vec<usize> = self
            .child_session
            .iter()
            .filter(|(_, s)| **s != session)
            .map(|(c, _)| *c)
            .collect();
        for c in early {
            tracing::warn!(rank = c, "dropped a child's join of another session");
            if let Some(conn) = self.peers[c].take() {
                self.accepted.remove(&conn);
                w.close(&conn);
            }
            self.child_session.remove(&c);
        }
    }

    // ---- the server's end ----

    fn joins_me(&self, r: usize) -> bool {
        if self.me == 0 {
            (1..self.n).contains(&r)
        } else {
            self.tree.parent(r) == Some(self.me)
        }
    }

    /// A KNOCK from `from` with its world size and nonce `j`; `fresh` is the nonce to
    /// challenge it with.
    pub(crate) fn on_knock(
        &mut self,
        w: &mut impl Wire<C>,
        from: Sender<'_, C>,
        world: u32,
        j: Nonce,
        fresh: Nonce,
    ) {
        let Sender {
            conn,
            rank: r,
            session,
        } = from;
        let (me, n) = (self.me, self.n);
        let why = if world as usize != n {
            let s = format!("rank {r} knocked with world size {world}; rank {me} has {n}");
            self.diag.note(s.clone());
            Some(s)
        } else if !self.joins_me(r) {
            Some(format!(
                "rank {r} does not join rank {me} in a group of {n}"
            ))
        } else if self.formed && session != self.session && !self.missed_welcome(r, session, &j) {
            let s = format!("the group formed already; rank {r} cannot join it again (restarted?)");
            self.diag.note(s.clone());
            Some(s)
        } else if me == 0 && !self.formed && session != 0 && session != self.session {
            Some("the knock names a session of another job".to_owned())
        } else {
            None
        };
        if let Some(why) = why {
            tracing::warn!(rank = r, %why, "turned a joiner away");
            let reject = Message::Reject {
                joiner: j,
                reason: Cow::Owned(why),
            };
            let _ = w.send(Dest::Conn(conn), self.session, &reject);
            return;
        }
        let entry = self.accepted.entry(conn.clone()).or_insert(Accepted {
            rank: r,
            joiner: j,
            issued: None,
            proven: false,
        });
        if entry.proven && entry.rank != r {
            // A connection stays with the rank that proved the key on it.
            tracing::warn!(
                rank = r,
                "dropped a knock naming another rank than its connection's"
            );
            return;
        }
        entry.rank = r;
        entry.joiner = j;
        entry.issued = Some(fresh);
        let challenge = Message::Challenge {
            joiner: j,
            server: fresh,
        };
        let _ = w.send(Dest::Conn(conn), self.session, &challenge);
    }

    /// A HELLO from `from`: when it answers the challenge this connection was given (once),
    /// by the rank that knocked, the rank is admitted and returned.
    pub(crate) fn on_hello(
        &mut self,
        w: &mut impl Wire<C>,
        from: Sender<'_, C>,
        world: u32,
        server: &Nonce,
        endpoint: &str,
    ) -> Option<usize> {
        let Sender {
            conn,
            rank: r,
            session,
        } = from;
        let (me, n, formed) = (self.me, self.n, self.formed);
        let Some(entry) = self.accepted.get_mut(conn) else {
            tracing::warn!(
                rank = r,
                "dropped a join on a connection that never knocked"
            );
            return None;
        };
        // One use per nonce; a HELLO with another nonce (an answer to an older challenge)
        // does not use up the current one.
        let fresh = entry.issued.as_ref() == Some(server);
        if fresh {
            entry.issued = None;
        }
        if !fresh || entry.rank != r || world as usize != n || r >= n || r == me {
            tracing::warn!(
                rank = r,
                "dropped a join that does not answer this connection's challenge (replayed?)"
            );
            return None;
        }
        let j = entry.joiner;
        let session_ok = if me == 0 {
            // Before formation a joiner does not know the session yet, unless rank 0
            // welcomed it already (a tree member that connects again).
            session == self.session
                || (!formed && session == 0)
                || self.missed_welcome(r, session, &j)
        } else {
            !formed || session == self.session
        };
        if !session_ok {
            tracing::warn!(rank = r, "dropped a join of another session");
            return None;
        }
        if let Some(entry) = self.accepted.get_mut(conn) {
            entry.proven = true;
        }
        w.proven(Dest::Conn(conn), r);
        if let Some(old) = self.peers[r].replace(conn.clone()) {
            if &old != conn {
                tracing::info!(
                    rank = r,
                    "a rank joined again; its previous connection is dropped"
                );
                self.accepted.remove(&old);
                w.close(&old);
            }
        }
        if me == 0 {
            if formed {
                // Again: to a rank that proves the key again, and to one whose WELCOME died.
                let again = Message::Welcome {
                    joiner: j,
                    parent: Cow::Borrowed(self.parent_endpoint(r)),
                };
                let _ = w.send(Dest::Conn(conn), self.session, &again);
            } else {
                endpoint.clone_into(&mut self.endpoints[r]);
                let f = &mut self.formation;
                if !f.registered[r] {
                    f.registered[r] = true;
                    f.count += 1;
                }
                f.welcomed[r] = false; // a new connection gets its own
            }
        } else {
            self.child_session.insert(r, session);
        }
        tracing::debug!(rank = r, "admitted");
        Some(r)
    }

    /// An accepted connection closed (the peer, or this rank's socket layer, closed it).
    /// Returns the rank that had proved the key on it, when it was that rank's current one.
    pub(crate) fn closed(&mut self, conn: &C) -> Option<usize> {
        let a = self.accepted.remove(conn)?;
        if !a.proven || self.peers[a.rank].as_ref() != Some(conn) {
            return None;
        }
        let r = a.rank;
        // It may come back (a reset, a restart) and prove itself again; until then a round
        // counts it as unreached instead of sending into the dead connection.
        self.peers[r] = None;
        let f = &mut self.formation;
        if !self.formed && f.welcomed.get(r) == Some(&false) && f.registered[r] {
            // Rank 0 while the group forms: it has to join again (a restart). A tree rank
            // that was welcomed left for its parent on purpose.
            f.registered[r] = false;
            f.count -= 1;
        }
        Some(r)
    }
}

mod formation;
#[cfg(test)]
mod sim;
