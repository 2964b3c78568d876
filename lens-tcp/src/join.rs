//! Joining a group, driven over this rank's connections: the deadlines, the knocks sent
//! again, and the tree member's move from rank 0 to its parent. What is sent and admitted
//! is the join machine's (`handshake.rs`, which documents the protocol); this file waits
//! for it and turns how it ended into an error that names the missing ranks.

use std::time::{Duration, Instant};

use lens_core::{Disagreement, Error, Result};

use crate::addr::resolve;
use crate::error::BACKEND;
use crate::handshake::{Answer, Unsent, Up};
use crate::net::{ConnId, Side};
use crate::state::{Input, RankState, up_of};

/// A joiner knocks again this often while the server has not answered.
const KNOCK_RETRY: Duration = Duration::from_secs(1);

/// Why a join failed, with what this rank saw meanwhile: a disagreement of ranks that
/// proved the key is a [`Error::Mismatch`]; otherwise the missing ranks are the error, and
/// connections that failed the key check are counted beside them (anyone can send one, so
/// they are not blamed).
fn join_error(g: &RankState, start: Instant, missing: Vec<usize>) -> Error {
    let bad_key = g.join.diag.bad_key_summary();
    if !bad_key.is_empty() {
        tracing::warn!(?missing, "the group did not form; meanwhile {bad_key}");
    }
    if g.join.diag.notes.is_empty() {
        return Error::timeout(start.elapsed(), missing);
    }
    let mut seen = g.join.diag.notes.join("; ");
    if !bad_key.is_empty() {
        seen = format!("{seen}; {bad_key}");
    }
    Error::mismatch(
        Disagreement::Group,
        format!(
            "rank(s) {missing:?} did not join within {:?}; meanwhile: {seen}",
            start.elapsed()
        ),
    )
}

/// Rank 0: admits every rank (the join machine WELCOMEs them: in a star once all have
/// joined, in a tree each as soon as its parent has), or names the ranks missing at the
/// deadline to those still connected and to the caller.
pub(crate) fn form_as_hub(g: &mut RankState, start: Instant, join: Duration) -> Result<()> {
    let deadline = start + join;
    let mut session = [0u8; 8];
    session.copy_from_slice(&crate::state::nonce()?[..8]);
    g.join.begin(u64::from_le_bytes(session));
    let tree = !g.tree.is_star();
    while !g.join.all_joined() {
        match g.next(deadline)? {
            Some(Input::Admitted(r)) if tree => {
                let (j, mut w) = g.split();
                j.admitted_in_tree(&mut w, r);
            }
            Some(input) => keep_early_round(g, input),
            None => {
                let missing = g.join.missing();
                let (j, mut w) = g.split();
                j.fail(&mut w, &missing);
                return Err(join_error(g, start, missing));
            }
        }
    }
    if !tree {
        let (j, mut w) = g.split();
        if let Err((r, e)) = j.welcome_all(&mut w) {
            let why = match e {
                Unsent::Gone => "its connection is gone",
                Unsent::Full => "it does not read: its queue is full",
            };
            return Err(Error::Closed {
                backend: BACKEND,
                reason: format!("rank {r} left before the group formed ({why})"),
            });
        }
    }
    g.join.finish();
    Ok(())
}

/// A member: knocks at rank 0 (again every [`KNOCK_RETRY`] while it has not answered)
/// until rank 0 WELCOMEs, turns away or gives up; in a tree then leaves rank 0 for its
/// parent; then waits for its own tree children.
pub(crate) fn join_as_member(g: &mut RankState, start: Instant, join: Duration) -> Result<()> {
    // A little longer than rank 0, to hear rank 0 name the missing ranks.
    let deadline = start + join + join / 4;
    let parent_endpoint = loop {
        match next_knocking(g, Side::Hub, deadline)? {
            None => return Err(member_timeout(g, start, vec![0])),
            Some(Input::KeyHint) => {
                return Err(Error::Unauthenticated {
                    reason: format!(
                        "rank 0 ({}) answered that this rank's job key is not the group's: check LENS_TCP_KEY or LENS_TCP_KEY_FILE",
                        g.net
                            .addr(&ConnId::outbound(Side::Hub))
                            .unwrap_or_else(|| "the rendezvous address".into())
                    ),
                });
            }
            Some(Input::Frame(conn, f)) if conn.side == Side::Hub => {
                let (j, mut w) = g.split();
                match j.on_answer(&mut w, Up::Hub, f.session, &f.msg) {
                    Some(Answer::Welcome(parent)) => break parent,
                    Some(Answer::Rejected(reason)) => {
                        return Err(Error::Closed {
                            backend: BACKEND,
                            reason: format!("rank 0 turned this rank away: {reason}"),
                        });
                    }
                    Some(Answer::Failed(missing)) => {
                        return Err(Error::timeout(start.elapsed(), missing));
                    }
                    None => {}
                }
            }
            Some(_) => {}
        }
    };
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
        g.join.leave(Up::Hub);
        while !g.join.up_proven(Up::Parent) {
            match next_knocking(g, Side::Parent, deadline)? {
                None => return Err(member_timeout(g, start, vec![p])),
                Some(input) => keep_early_round(g, input),
            }
        }
    }
    // This rank's own tree children.
    loop {
        let missing = g.join.children_missing();
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
fn keep_early_round(g: &mut RankState, input: Input) {
    if let Input::Frame(conn, f) = input {
        let session = g.session();
        if session != 0 && f.session == session && f.round > 0 {
            g.pending.push_back((conn, f));
        }
    }
}

/// The next input, knocking at `side` again every [`KNOCK_RETRY`] while it has not proven
/// itself (a lost knock, a server that came up late).
fn next_knocking(g: &mut RankState, side: Side, deadline: Instant) -> Result<Option<Input>> {
    loop {
        let retry = (Instant::now() + KNOCK_RETRY).min(deadline);
        if let Some(input) = g.next(retry)? {
            return Ok(Some(input));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        if up_of(side).is_some_and(|up| !g.join.up_proven(up)) {
            g.knock(side)?;
        }
    }
}

fn member_timeout(g: &RankState, start: Instant, missing: Vec<usize>) -> Error {
    if g.join.diag.notes.is_empty() {
        return Error::timeout(start.elapsed(), missing);
    }
    Error::Closed {
        backend: BACKEND,
        reason: format!(
            "could not join within {:?} (waiting for rank(s) {missing:?}): {}",
            start.elapsed(),
            g.join.diag.notes.join("; ")
        ),
    }
}
