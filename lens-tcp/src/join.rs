//! Joining a group: the handshake on both ends, and the formation of the group.
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
//! the nonce it just sent; the server admits a HELLO only when it carries S, the nonce it
//! gave that connection. A rank that reconnects (a reset, a restart during formation) runs
//! the same handshake on its new connection and replaces its old one.
//!
//! Formation: rank 0 chooses the session and admits every rank. In a star it WELCOMEs them
//! all once every rank has joined. In a tree it WELCOMEs a rank as soon as the rank's tree
//! parent has joined, naming where the parent listens; a rank whose parent is not rank 0
//! then leaves rank 0 and joins its parent (the same handshake, with the session), so no
//! rank keeps a connection per rank. Every rank then waits for its own tree children. A
//! formation that fails names the ranks that never joined; rank 0 tells the ranks still
//! connected to it.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use lens_core::{Error, Result};

use crate::addr::resolve;
use crate::frame::{Frame, Nonce};
use crate::group::{Group, Input, wire};
use crate::message::Message;
use crate::net::{BACKEND, ConnId, SendFail, Side};

/// A joiner knocks again this often while the server has not answered.
const KNOCK_RETRY: Duration = Duration::from_secs(1);

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

impl Group {
    /// Knocks (again) at rank 0 or the tree parent with a fresh nonce.
    pub(crate) fn knock(&mut self, side: Side) -> Result<()> {
        let j = nonce()?;
        self.knocked.insert(side, j);
        let knock = Message::Knock {
            world: wire(self.n),
            joiner: j,
        };
        let bytes = self.frame(&knock, 0, 0);
        if let Err(e) = self.net.send(&ConnId::outbound(side), &bytes) {
            // Not connected yet: the connection's opening knocks again.
            tracing::debug!(?side, ?e, "knock not sent");
        }
        Ok(())
    }

    pub(crate) fn knocked(&self, side: Side) -> Option<&Nonce> {
        self.knocked.get(&side)
    }

    /// A joiner: rank 0's or the tree parent's answer to this rank's KNOCK. It proves the
    /// server holds the key; the HELLO back proves this rank does.
    pub(crate) fn on_challenge(&mut self, conn: &ConnId, f: &Frame) -> Result<Option<Input>> {
        let side = conn.side;
        match &f.msg {
            Message::Challenge { joiner, server } if Some(joiner) == self.knocked(side) => {
                let peer = if side == Side::Hub {
                    0
                } else {
                    self.tree.parent(self.rank).unwrap_or(0)
                };
                self.net.set_verified(conn, Some(peer));
                let hello = Message::Hello {
                    world: wire(self.n),
                    server: *server,
                    endpoint: Cow::Borrowed(&self.endpoint),
                };
                let hello = self.frame(&hello, 0, 0);
                let _ = self.net.send(conn, &hello);
                return Ok(Some(Input::Proven(side)));
            }
            _ => tracing::warn!(
                ?side,
                "dropped a challenge that does not answer this rank's knock (replayed?)"
            ),
        }
        Ok(None)
    }

    /// Rank 0 or a tree parent: a KNOCK or HELLO from a connection.
    pub(crate) fn serve_join(&mut self, conn: &ConnId, f: &Frame) -> Result<Option<Input>> {
        let r = f.sender as usize;
        let (me, n) = (self.rank, self.n);
        match &f.msg {
            &Message::Knock { world, joiner: j } => {
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
                } else if me == 0 && !self.formed() && f.session != 0 && f.session != self.session {
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
                    let reject = self.frame(&reject, 0, 0);
                    let _ = self.net.send(conn, &reject);
                    return Ok(None);
                }
                let s = nonce()?;
                if let Some((issued, joiner)) = self.net.nonces(conn) {
                    *issued = Some(s);
                    *joiner = Some(j);
                }
                let challenge = self.frame(
                    &Message::Challenge {
                        joiner: j,
                        server: s,
                    },
                    0,
                    0,
                );
                let _ = self.net.send(conn, &challenge);
                Ok(None)
            }
            Message::Hello {
                world,
                server: s,
                endpoint,
            } => {
                let (world, s) = (*world, *s);
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
                    // Before formation a joiner does not know the session yet, unless rank 0
                    // welcomed it already (a tree member that connects again).
                    f.session == self.session || (!self.formed() && f.session == 0)
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
                        let again = Message::Welcome {
                            joiner: j,
                            parent: Cow::Borrowed(""),
                        };
                        let again = self.frame(&again, 0, 0);
                        let _ = self.net.send(conn, &again);
                    } else {
                        self.endpoints[r] = endpoint.to_string();
                        if !self.registered[r] {
                            self.registered[r] = true;
                            self.registered_count += 1;
                        }
                        self.welcomed[r] = false; // a new connection gets its own
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

fn missing_ranks(g: &Group) -> Vec<usize> {
    (1..g.n).filter(|&r| !g.registered[r]).collect()
}

/// Why a join failed, with what this rank saw meanwhile: a disagreement of ranks that
/// proved the key is a [`Error::Mismatch`]; otherwise the missing ranks are the error, and
/// connections that failed the key check are counted beside them (anyone can send one, so
/// they are not blamed).
fn join_error(g: &Group, start: Instant, missing: Vec<usize>) -> Error {
    let bad_key = g.diag.bad_key_summary();
    if !bad_key.is_empty() {
        tracing::warn!(?missing, "the group did not form; meanwhile {bad_key}");
    }
    if g.diag.notes.is_empty() {
        return Error::Timeout {
            after: start.elapsed(),
            missing,
        };
    }
    let mut seen = g.diag.notes.join("; ");
    if !bad_key.is_empty() {
        seen = format!("{seen}; {bad_key}");
    }
    Error::Mismatch {
        reason: format!(
            "rank(s) {missing:?} did not join within {:?}; meanwhile: {seen}",
            start.elapsed()
        ),
    }
}

/// Rank 0: admits every rank. In a star every rank gets its WELCOME once all have joined.
/// In a tree a rank gets it as soon as its parent has joined (the WELCOME names where the
/// parent listens), and a rank whose parent is not rank 0 then leaves rank 0 for its
/// parent, so that rank 0 keeps only its own children's connections.
pub(crate) fn form_as_hub(g: &mut Group, start: Instant, join: Duration) -> Result<()> {
    let deadline = start + join;
    let mut session = [0u8; 8];
    session.copy_from_slice(&nonce()?[..8]);
    // Zero means "no session yet".
    g.session = u64::from_le_bytes(session) | 1;
    let tree = !g.tree.is_star();
    // Counted as ranks join and leave, and a WELCOME tried only for the rank that joined
    // and its children: no pass over every rank per input (a million ranks at most).
    while g.registered_count + 1 < g.n {
        match g.next(deadline)? {
            Some(Input::Admitted(r)) if tree => {
                welcome_if_ready(g, r);
                for c in g.tree.children(r) {
                    welcome_if_ready(g, c);
                }
            }
            Some(input) => keep_early_round(g, input),
            None => {
                let missing = missing_ranks(g);
                // Tell the ranks still connected who is missing, then give up.
                for r in 1..g.n {
                    if let (Some(conn), Some(j)) = (g.peers[r].clone(), g.joiner_of(r)) {
                        let fail = Message::JoinFail {
                            joiner: j,
                            missing: missing.clone(),
                        };
                        let fail = g.frame(&fail, 0, 0);
                        let _ = g.send(&conn, &fail);
                    }
                }
                return Err(join_error(g, start, missing));
            }
        }
    }
    if !tree {
        for r in 1..g.n {
            let (Some(conn), Some(j)) = (g.peers[r].clone(), g.joiner_of(r)) else {
                continue;
            };
            let welcome = Message::Welcome {
                joiner: j,
                parent: Cow::Borrowed(""),
            };
            let welcome = g.frame(&welcome, 0, 0);
            if let Err(e) = g.send(&conn, &welcome) {
                let why = match e {
                    SendFail::Gone => "its connection is gone",
                    SendFail::Full => "it does not read: its queue is full",
                };
                return Err(Error::Closed {
                    backend: BACKEND,
                    reason: format!("rank {r} left before the group formed ({why})"),
                });
            }
        }
    }
    g.formed = true;
    g.endpoints = Vec::new();
    Ok(())
}

/// Rank 0 of a tree: a WELCOME to rank `r` if it joined and its parent has (rank 0, or a
/// rank that named where it listens).
fn welcome_if_ready(g: &mut Group, r: usize) {
    if r == 0 || r >= g.n || !g.registered[r] || g.welcomed[r] {
        return;
    }
    let p = g.tree.parent(r).unwrap_or(0);
    if p != 0 && !g.registered[p] {
        return;
    }
    let (Some(conn), Some(j)) = (g.peers[r].clone(), g.joiner_of(r)) else {
        return;
    };
    let parent = if p == 0 { "" } else { g.endpoints[p].as_str() };
    let welcome = Message::Welcome {
        joiner: j,
        parent: Cow::Borrowed(parent),
    };
    let welcome = g.frame(&welcome, 0, 0);
    if g.send(&conn, &welcome).is_ok() {
        g.welcomed[r] = true;
    }
}

/// Waits, knocking again every [`KNOCK_RETRY`] while `side` has not answered, until
/// `done` says so. Join answers from `side` go to `answer`.
pub(crate) fn join_as_member(g: &mut Group, start: Instant, join: Duration) -> Result<()> {
    // A little longer than rank 0, to hear rank 0 name the missing ranks.
    let deadline = start + join + join / 4;
    let hub = ConnId::outbound(Side::Hub);
    let parent_endpoint = loop {
        match next_knocking(g, Side::Hub, deadline)? {
            None => return Err(member_timeout(g, start, vec![0])),
            Some(Input::KeyHint) => {
                return Err(Error::Unauthenticated {
                    reason: format!(
                        "rank 0 ({}) answered that this rank's job key is not the group's: check LENS_TCP_KEY or LENS_TCP_KEY_FILE",
                        g.net
                            .addr(&hub)
                            .unwrap_or_else(|| "the rendezvous address".into())
                    ),
                });
            }
            Some(Input::Frame(conn, f)) if conn.side == Side::Hub => {
                let mine = |j: &[u8; 16]| Some(j) == g.knocked(Side::Hub);
                match f.msg {
                    Message::Welcome { joiner, parent } if mine(&joiner) && f.session != 0 => {
                        g.session = f.session;
                        g.formed = true;
                        break parent.into_owned();
                    }
                    Message::Reject { joiner, reason } if mine(&joiner) => {
                        return Err(Error::Closed {
                            backend: BACKEND,
                            reason: format!("rank 0 turned this rank away: {reason}"),
                        });
                    }
                    Message::JoinFail { joiner, missing } if mine(&joiner) => {
                        return Err(Error::Timeout {
                            after: start.elapsed(),
                            missing,
                        });
                    }
                    Message::Welcome { .. } | Message::Reject { .. } | Message::JoinFail { .. } => {
                        tracing::warn!(
                            kind = ?f.kind(),
                            "dropped a join answer that does not answer this rank's knock (replayed?)"
                        );
                    }
                    _ => {}
                }
            }
            Some(_) => {}
        }
    };
    // Children that joined before this rank knew the session.
    let session = g.session;
    let early: Vec<usize> = g
        .child_session
        .iter()
        .filter(|(_, s)| **s != session)
        .map(|(c, _)| *c)
        .collect();
    for c in early {
        tracing::warn!(rank = c, "dropped a child's join of another session");
        if let Some(conn) = g.peers[c].take() {
            g.net.close(&conn);
        }
        g.child_session.remove(&c);
    }
    // Join the tree parent when it is not rank 0, and leave rank 0: from here on this rank
    // hears from rank 0 only through its parent.
    if let Some(p) = g.tree.parent(g.rank).filter(|&p| p != 0) {
        if parent_endpoint.is_empty() {
            return Err(Error::Corrupt {
                reason: format!("rank 0 named no address for rank {p}, this rank's tree parent"),
            });
        }
        let addr = *resolve(&parent_endpoint)?
            .first()
            .ok_or_else(|| Error::Corrupt {
                reason: format!("rank {p}'s address {parent_endpoint} resolves to nothing"),
            })?;
        g.net.dial(Side::Parent, addr)?;
        g.net.hang_up(Side::Hub);
        let parent = ConnId::outbound(Side::Parent);
        while g.net.verified(&parent).is_none() {
            match next_knocking(g, Side::Parent, deadline)? {
                None => return Err(member_timeout(g, start, vec![p])),
                Some(input) => keep_early_round(g, input),
            }
        }
    }
    // This rank's own tree children.
    let kids: Vec<usize> = g.tree.children(g.rank).collect();
    loop {
        let missing: Vec<usize> = kids
            .iter()
            .copied()
            .filter(|&c| g.peers[c].is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        match g.next(deadline)? {
            None => return Err(member_timeout(g, start, missing)),
            Some(input) => keep_early_round(g, input),
        }
    }
}

/// A round may start while this rank still waits for its tree parent or children: keep
/// its frames for the round.
fn keep_early_round(g: &mut Group, input: Input) {
    if let Input::Frame(conn, f) = input {
        if g.session != 0 && f.session == g.session && f.round > 0 {
            g.pending.push_back((conn, f));
        }
    }
}

/// The next input, knocking at `side` again every [`KNOCK_RETRY`] while it has not proven
/// itself (a lost knock, a server that came up late).
fn next_knocking(g: &mut Group, side: Side, deadline: Instant) -> Result<Option<Input>> {
    loop {
        let retry = (Instant::now() + KNOCK_RETRY).min(deadline);
        if let Some(input) = g.next(retry)? {
            return Ok(Some(input));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        if g.net.verified(&ConnId::outbound(side)).is_none() {
            g.knock(side)?;
        }
    }
}

fn member_timeout(g: &Group, start: Instant, missing: Vec<usize>) -> Error {
    if g.diag.notes.is_empty() {
        return Error::Timeout {
            after: start.elapsed(),
            missing,
        };
    }
    Error::Closed {
        backend: BACKEND,
        reason: format!(
            "could not join within {:?} (waiting for rank(s) {missing:?}): {}",
            start.elapsed(),
            g.diag.notes.join("; ")
        ),
    }
}
