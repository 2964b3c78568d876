//! One round. Rounds travel down the tree (the star is the tree with k = n - 1): a root
//! other than 0 first hands its payload to rank 0, rank 0 sends it to its children, each
//! rank forwards it to its own, and acknowledgements (each naming the ranks missing below
//! it) flow back up. Rank 0 tells the root when the round is complete or failed.

use std::time::{Duration, Instant};

use lens_core::{Error, Result};

use crate::frame::{Frame, Kind, payload};
use crate::group::{Group, Input};
use crate::net::{ConnId, Side};

/// Frames for later rounds kept while a round is in progress, per group member.
const PENDING_PER_RANK: usize = 4;
/// Ranks other than 0 wait this fraction of a timeout longer than rank 0, so that they
/// hear rank 0's verdict rather than time out on their own.
const MEMBER_GRACE: u32 = 4; // timeout / 4
/// The root waits this much longer again for rank 0's DONE or FAIL.
const ROOT_GRACE: u32 = 2; // timeout / 2

impl Group {
    /// Whether a frame came in over the star: on rank 0 from any rank, elsewhere from 0.
    fn came_over_star(&self, conn: &ConnId) -> bool {
        if self.is_hub() {
            conn.side == Side::Listen
        } else {
            conn.side == Side::Hub
        }
    }

    /// Waits for a frame of the current round that `want` accepts, or a (re)admission.
    /// Later rounds' frames are kept for later; earlier rounds' are dropped.
    fn wait(
        &mut self,
        deadline: Instant,
        mut want: impl FnMut(&Group, &ConnId, &Frame) -> bool,
    ) -> Result<Option<Input>> {
        if let Some(at) = self
            .pending
            .iter()
            .position(|(c, f)| f.round == self.round && want(self, c, f))
        {
            return Ok(self.pending.remove(at).map(|(c, f)| Input::Frame(c, f)));
        }
        while let Some(input) = self.next(deadline)? {
            let Input::Frame(conn, f) = input else {
                if let Input::Admitted(_) = input {
                    return Ok(Some(input));
                }
                continue; // a key hint or a proof mid-job changes nothing here
            };
            if matches!(f.kind, Kind::Welcome | Kind::Reject | Kind::JoinFail) {
                if f.kind == Kind::Reject {
                    tracing::error!(reason = %String::from_utf8_lossy(&f.payload), "rank 0 turned this rank's new connection away");
                }
                continue;
            }
            if f.round < self.round {
                tracing::debug!(round = f.round, now = self.round, kind = ?f.kind, "dropped a frame of an earlier round");
                continue;
            }
            if f.round > self.round || !want(self, &conn, &f) {
                if f.round > self.round && self.pending.len() < PENDING_PER_RANK * self.n {
                    self.pending.push_back((conn, f));
                } else {
                    tracing::warn!(round = f.round, now = self.round, kind = ?f.kind, "dropped an unexpected frame");
                }
                continue;
            }
            return Ok(Some(Input::Frame(conn, f)));
        }
        Ok(None)
    }

    /// Rank 0: sends to rank `r` over the star.
    fn send_star(&mut self, r: usize, bytes: &[u8]) -> bool {
        match self.peers.get(r).cloned().flatten() {
            Some(conn) => self.send(&conn, bytes).is_ok(),
            None => false,
        }
    }

    fn send_child(&mut self, c: usize, bytes: &[u8]) -> bool {
        self.send_star(c, bytes) // rank 0's children and others' both live in `peers`
    }

    fn send_parent(&mut self, bytes: &[u8]) -> Result<()> {
        let side = self.up_side();
        self.send(&ConnId::outbound(side), bytes).map_err(|e| {
            let who = self.tree.parent(self.rank).unwrap_or(0);
            Error::Closed {
                backend: crate::net::BACKEND,
                reason: format!("cannot reach rank {who} (this rank's tree parent): {e:?}"),
            }
        })
    }

    /// Rank 0: tells `ranks` over the star that the round failed for want of `missing`.
    fn fail_to(&mut self, ranks: impl IntoIterator<Item = usize>, root: usize, missing: &[usize]) {
        let fail = self.frame(Kind::Fail, self.round, root, &payload::ranks(missing));
        for r in ranks {
            if r != 0 {
                let _ = self.send_star(r, &fail);
            }
        }
    }

    /// One round on this rank.
    pub(crate) fn run_round(
        &mut self,
        root: usize,
        payload: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        let me = self.rank;
        let round = self.round;
        let tree = self.tree;
        let max_depth = tree.depth(tree.n - 1);
        let timed_out = |missing: Vec<usize>| Error::Timeout {
            after: start.elapsed(),
            missing,
        };
        let member_deadline = start + timeout + timeout / MEMBER_GRACE;

        // 1. The payload reaches this rank: at rank 0 from the root over the star, elsewhere
        //    from the tree parent. Failures come over the star.
        let data = if me == 0 {
            match payload {
                Some(p) => p.to_vec(),
                None => {
                    let got = self.wait(start + timeout, |g, c, f| {
                        g.came_over_star(c) && f.kind == Kind::Data && f.sender as usize == root
                    })?;
                    match got {
                        Some(Input::Frame(_, f)) => f.payload,
                        _ => {
                            self.fail_to(1..tree.n, root, &[root]);
                            return Err(timed_out(vec![root]));
                        }
                    }
                }
            }
        } else {
            if let Some(p) = payload {
                let data = self.frame(Kind::Data, round, me, p);
                self.send(&ConnId::outbound(Side::Hub), &data)
                    .map_err(|e| Error::Closed {
                        backend: crate::net::BACKEND,
                        reason: format!("cannot reach rank 0 to start the round: {e:?}"),
                    })?;
            }
            let up = self.up_side();
            let got = self.wait(member_deadline, |g, c, f| {
                (f.kind == Kind::Data && c.side == up)
                    || (f.kind == Kind::Fail && g.came_over_star(c))
            })?;
            match got {
                Some(Input::Frame(_, f)) if f.kind == Kind::Fail => {
                    return Err(timed_out(
                        payload::read_ranks(&f.payload).unwrap_or_default(),
                    ));
                }
                Some(Input::Frame(_, f)) => {
                    if f.root as usize != root {
                        return Err(Error::Mismatch {
                            reason: format!(
                                "round {round}: this rank expected root {root}, the data came from root {}",
                                f.root
                            ),
                        });
                    }
                    f.payload
                }
                // Silence: rank 0 relays every round and names any other missing rank, so
                // it is rank 0 (or, in a tree, the parent) that is gone.
                _ => return Err(timed_out(vec![tree.parent(me).unwrap_or(0)])),
            }
        };

        let got_data = Instant::now();

        // 2. Down to the children; a child that cannot be reached now may still reconnect
        //    and prove the key within the round.
        let forward = self.frame(Kind::Data, round, root, &data);
        let mut waiting: Vec<usize> = Vec::new();
        let mut unreached: Vec<usize> = Vec::new();
        for c in tree.children(me) {
            if self.send_child(c, &forward) {
                waiting.push(c);
            } else {
                tracing::warn!(rank = c, "cannot reach a rank (yet)");
                unreached.push(c);
            }
        }

        // 3. Acknowledgements from the children, each naming what is missing below it. Deeper
        //    ranks give up sooner, so that their parents still hear what they found.
        let depth = tree.depth(me);
        let share = u32::try_from(max_depth + 1 - depth.min(max_depth)).unwrap_or(1);
        let levels = u32::try_from(max_depth + 1).unwrap_or(1);
        // Counted from when this rank got the data, so a rank reached late still gives its
        // children their share of the time; capped so that a root waiting for the outcome
        // hears it.
        let ack_deadline = (got_data + timeout * share / levels).min(member_deadline);
        let mut missing = Vec::new();
        while !waiting.is_empty() || !unreached.is_empty() {
            let got = self.wait(ack_deadline, |g, c, f| {
                f.kind == Kind::Ack
                    && if me == 0 {
                        g.came_over_star(c)
                    } else {
                        c.side == Side::Listen
                    }
            })?;
            match got {
                Some(Input::Frame(_, f)) => {
                    let child = f.sender as usize;
                    if let Some(at) = waiting.iter().position(|&c| c == child) {
                        waiting.remove(at);
                        // An ack may only speak for the sender's own subtree.
                        let below = payload::read_ranks(&f.payload).unwrap_or_default();
                        if below.iter().any(|&r| !tree.is_below(r, child)) {
                            tracing::warn!(
                                rank = child,
                                "an ack named ranks outside its subtree; ignored them"
                            );
                        }
                        missing.extend(below.into_iter().filter(|&r| tree.is_below(r, child)));
                    }
                }
                Some(Input::Admitted(c)) => {
                    if let Some(at) = unreached.iter().position(|&u| u == c) {
                        unreached.remove(at);
                        if self.send_child(c, &forward) {
                            waiting.push(c);
                        } else {
                            missing.extend(tree.subtree(c));
                        }
                    }
                }
                _ => {
                    for c in waiting.drain(..).chain(unreached.drain(..)) {
                        missing.extend(tree.subtree(c));
                    }
                }
            }
        }
        missing.sort_unstable();
        missing.dedup();

        // 4. Report up; rank 0 tells the root (and the ranks it could not reach).
        if me != 0 {
            let ack = self.frame(Kind::Ack, round, root, &payload::ranks(&missing));
            self.send_parent(&ack)?;
            if me == root {
                return match self.wait(member_deadline + timeout / ROOT_GRACE, |g, c, f| {
                    g.came_over_star(c) && matches!(f.kind, Kind::Done | Kind::Fail)
                })? {
                    Some(Input::Frame(_, f)) if f.kind == Kind::Done => Ok(data),
                    Some(Input::Frame(_, f)) => Err(timed_out(
                        payload::read_ranks(&f.payload).unwrap_or_default(),
                    )),
                    _ => Err(timed_out(vec![0])),
                };
            }
            return Ok(data);
        }
        if missing.is_empty() {
            if root != 0 {
                let done = self.frame(Kind::Done, round, root, &[]);
                if !self.send_star(root, &done) {
                    // Every rank has the data; only the root will not hear so.
                    tracing::warn!(rank = root, "cannot tell the root its round completed");
                }
            }
            return Ok(data);
        }
        let mut tell = missing.clone();
        tell.push(root);
        self.fail_to(tell, root, &missing);
        Err(timed_out(missing))
    }
}
