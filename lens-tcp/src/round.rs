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

    /// Answers a frame that repeats a finished part of a round, and says whether it was
    /// one: a peer that proved the key again after a reset sends again what may have died
    /// with its old connection, and gets again what this rank said then.
    /// - A member gets a round's data again from its parent: it acknowledges again.
    /// - Rank 0 gets a round's data again from the root it already answered: it sends the
    ///   verdict (DONE or FAIL) again.
    fn answer_repeat(&mut self, conn: &ConnId, f: &Frame) -> bool {
        if f.kind != Kind::Data {
            return false;
        }
        if self.is_hub() {
            let Some((round, root, verdict)) = &self.last_verdict else {
                return false;
            };
            if f.round != *round || f.sender as usize != *root || conn.side != Side::Listen {
                return false;
            }
            let (root, verdict) = (*root, verdict.clone());
            tracing::debug!(
                round = f.round,
                rank = root,
                "the root sent its data again: verdict again"
            );
            let _ = self.send_star(root, &verdict);
            return true;
        }
        let Some((round, ack)) = &self.last_ack else {
            return false;
        };
        if f.round != *round || conn.side != self.up_side() {
            return false;
        }
        let ack = ack.clone();
        tracing::debug!(
            round = f.round,
            "the parent sent a finished round again: ack again"
        );
        if let Err(e) = self.send_parent(&ack) {
            tracing::debug!(error = %e, "the ack waits for the next reconnection");
        }
        true
    }

    /// Between rounds (the keeper, and a round before it returns): serves what has arrived
    /// for at most `budget`, without sleeping. Frames of later rounds are kept for them.
    pub(crate) fn serve_idle(&mut self, budget: Duration) -> Result<()> {
        let until = Instant::now() + budget;
        while let Some(input) = self.next_ready(until)? {
            if let Input::Frame(conn, f) = input {
                self.keep_for_later(conn, f);
            }
        }
        Ok(())
    }

    /// A frame that is not for the step of the round this rank is at.
    fn keep_for_later(&mut self, conn: ConnId, f: Frame) {
        if self.answer_repeat(&conn, &f) {
            return;
        }
        match f.kind {
            Kind::Welcome | Kind::JoinFail => {} // answers to a knock after a reconnection
            Kind::Reject => {
                tracing::error!(reason = %String::from_utf8_lossy(&f.payload), "rank 0 turned this rank's new connection away");
            }
            _ if f.round > self.round && self.pending.len() < PENDING_PER_RANK * self.n => {
                self.pending.push_back((conn, f));
            }
            _ => {
                tracing::debug!(round = f.round, now = self.round, kind = ?f.kind, "dropped a frame of another round");
            }
        }
    }

    /// Waits for a frame of the current round that `want` accepts, or a (re)admission or
    /// proof. Later rounds' frames are kept for later; earlier rounds' are answered when they
    /// repeat a finished part, else dropped.
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
            match input {
                Input::Frame(conn, f) => {
                    if f.round == self.round
                        && !matches!(f.kind, Kind::Welcome | Kind::Reject | Kind::JoinFail)
                        && want(self, &conn, &f)
                    {
                        return Ok(Some(Input::Frame(conn, f)));
                    }
                    self.keep_for_later(conn, f);
                }
                Input::Admitted(_) | Input::Proven(_) => return Ok(Some(input)),
                Input::KeyHint => {} // a hint mid-job changes nothing
            }
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
        let plan = Plan::new(self, root, timeout);
        // 1. The payload reaches this rank: at rank 0 from the root over the star, elsewhere
        //    from the tree parent.
        let data = if self.is_hub() {
            match payload {
                Some(p) => p.to_vec(),
                None => self.data_from_root(&plan)?,
            }
        } else {
            self.data_from_parent(&plan, payload)?
        };
        // 2. Down to the children, and their acknowledgements back.
        let missing = self.forward(&plan, &data)?;
        // 3. Report up; rank 0 tells the root (and the ranks it could not reach).
        if self.is_hub() {
            self.verdict(&plan, data, missing)
        } else {
            self.acknowledge(&plan, payload, data, &missing)
        }
    }

    /// Rank 0, when another rank is the root: the root's data over the star.
    fn data_from_root(&mut self, plan: &Plan) -> Result<Vec<u8>> {
        let root = plan.root;
        loop {
            let got = self.wait(plan.start + plan.timeout, |g, c, f| {
                g.came_over_star(c) && f.kind == Kind::Data && f.sender as usize == root
            })?;
            match got {
                Some(Input::Frame(_, f)) => return Ok(f.payload),
                Some(_) => {} // a rank proved the key again: the root resends if it was it
                None => {
                    self.fail_to(1..self.n, root, &[root]);
                    return Err(plan.timed_out(vec![root]));
                }
            }
        }
    }

    /// A rank other than 0: sends its data to rank 0 when it is the root, then waits for the
    /// round's data from its tree parent, or rank 0's word that the round failed.
    fn data_from_parent(&mut self, plan: &Plan, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let hub = ConnId::outbound(Side::Hub);
        let mine = payload.map(|p| self.frame(Kind::Data, self.round, self.rank, p));
        let mut sent = true;
        if let Some(d) = &mine {
            // Not reachable now (a connection being made again): sent when rank 0 answers
            // this rank's knock.
            sent = self.send(&hub, d).is_ok();
        }
        let up = self.up_side();
        loop {
            let got = self.wait(plan.member_deadline, |g, c, f| {
                (f.kind == Kind::Data && c.side == up)
                    || (f.kind == Kind::Fail && g.came_over_star(c))
            })?;
            match got {
                Some(Input::Frame(_, f)) if f.kind == Kind::Fail => {
                    return Err(plan.timed_out(payload::read_ranks(&f.payload).unwrap_or_default()));
                }
                Some(Input::Frame(_, f)) => {
                    if f.root as usize != plan.root {
                        return Err(Error::Mismatch {
                            reason: format!(
                                "round {}: this rank expected root {}, the data came from root {}",
                                self.round, plan.root, f.root
                            ),
                        });
                    }
                    return Ok(f.payload);
                }
                Some(Input::Proven(Side::Hub)) => {
                    // The connection to rank 0 is new: what went on the old one may be lost.
                    if let Some(d) = &mine {
                        sent = self.send(&hub, d).is_ok();
                    }
                }
                Some(_) => {}
                // Silence: rank 0 relays every round and names any other missing rank, so
                // it is rank 0 (or, in a tree, the parent) that is gone.
                None if !sent => return Err(plan.timed_out(vec![0])),
                None => return Err(plan.timed_out(vec![self.tree.parent(self.rank).unwrap_or(0)])),
            }
        }
    }

    /// Sends the round's data to this rank's children and collects their acknowledgements;
    /// returns the ranks missing below this rank. A child that proves the key again on a new
    /// connection within the round gets the data again, whether or not it was sent before.
    fn forward(&mut self, plan: &Plan, data: &[u8]) -> Result<Vec<usize>> {
        let tree = self.tree;
        let me = self.rank;
        let forward = self.frame(Kind::Data, self.round, plan.root, data);
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
        let ack_deadline = plan.ack_deadline(Instant::now());
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
                    let before = waiting.len() + unreached.len();
                    waiting.retain(|&w| w != c);
                    unreached.retain(|&u| u != c);
                    if waiting.len() + unreached.len() < before {
                        if self.send_child(c, &forward) {
                            waiting.push(c);
                        } else {
                            unreached.push(c);
                        }
                    }
                }
                Some(_) => {}
                None => {
                    for c in waiting.drain(..).chain(unreached.drain(..)) {
                        missing.extend(tree.subtree(c));
                    }
                }
            }
        }
        missing.sort_unstable();
        missing.dedup();
        Ok(missing)
    }

    /// A rank other than 0: acknowledges up the tree; the root then waits for rank 0's
    /// verdict.
    fn acknowledge(
        &mut self,
        plan: &Plan,
        payload: Option<&[u8]>,
        data: Vec<u8>,
        missing: &[usize],
    ) -> Result<Vec<u8>> {
        let ack = self.frame(Kind::Ack, self.round, plan.root, &payload::ranks(missing));
        self.last_ack = Some((self.round, ack.clone()));
        if let Err(e) = self.send_parent(&ack) {
            // The parent sends the data again once this rank proves the key on a new
            // connection, and hears the ack then.
            tracing::debug!(error = %e, "the ack waits for a reconnection");
        }
        if self.rank != plan.root {
            return Ok(data);
        }
        let hub = ConnId::outbound(Side::Hub);
        let mine = payload.map(|p| self.frame(Kind::Data, self.round, self.rank, p));
        let deadline = plan.member_deadline + plan.timeout / ROOT_GRACE;
        loop {
            match self.wait(deadline, |g, c, f| {
                g.came_over_star(c) && matches!(f.kind, Kind::Done | Kind::Fail)
            })? {
                Some(Input::Frame(_, f)) if f.kind == Kind::Done => return Ok(data),
                Some(Input::Frame(_, f)) => {
                    return Err(plan.timed_out(payload::read_ranks(&f.payload).unwrap_or_default()));
                }
                Some(Input::Proven(Side::Hub)) => {
                    // Rank 0's verdict may have died with the old connection: the data again
                    // makes rank 0 say it again.
                    if let Some(d) = &mine {
                        let _ = self.send(&hub, d);
                    }
                }
                Some(_) => {}
                None => return Err(plan.timed_out(vec![0])),
            }
        }
    }

    /// Rank 0: the round's outcome, told to the root (when another rank) and to the ranks
    /// it could not reach.
    fn verdict(&mut self, plan: &Plan, data: Vec<u8>, missing: Vec<usize>) -> Result<Vec<u8>> {
        let root = plan.root;
        if missing.is_empty() {
            if root != 0 {
                let done = self.frame(Kind::Done, self.round, root, &[]);
                self.last_verdict = Some((self.round, root, done.clone()));
                if !self.send_star(root, &done) {
                    // Every rank has the data; the root hears so when it proves the key again
                    // and sends its data again.
                    tracing::warn!(
                        rank = root,
                        "cannot tell the root its round completed (yet)"
                    );
                }
            }
            return Ok(data);
        }
        let fail = self.frame(Kind::Fail, self.round, root, &payload::ranks(&missing));
        if root != 0 {
            self.last_verdict = Some((self.round, root, fail));
        }
        let mut tell = missing.clone();
        tell.push(root);
        self.fail_to(tell, root, &missing);
        Err(plan.timed_out(missing))
    }
}

/// A round's root and deadlines on this rank.
struct Plan {
    root: usize,
    start: Instant,
    timeout: Duration,
    /// Ranks other than 0 wait longer than rank 0, to hear its verdict.
    member_deadline: Instant,
    /// This rank's share of the time for its subtree's acknowledgements, from its depth.
    share: u32,
    levels: u32,
}

impl Plan {
    fn new(g: &Group, root: usize, timeout: Duration) -> Plan {
        let start = Instant::now();
        let max_depth = g.tree.depth(g.tree.n - 1);
        let depth = g.tree.depth(g.rank);
        Plan {
            root,
            start,
            timeout,
            member_deadline: start + timeout + timeout / MEMBER_GRACE,
            share: u32::try_from(max_depth + 1 - depth.min(max_depth)).unwrap_or(1),
            levels: u32::try_from(max_depth + 1).unwrap_or(1),
        }
    }

    /// Deeper ranks give up sooner, so that their parents still hear what they found.
    /// Counted from when this rank got the data, so a rank reached late still gives its
    /// children their share of the time; capped so that a root waiting for the outcome
    /// hears it.
    fn ack_deadline(&self, got_data: Instant) -> Instant {
        (got_data + self.timeout * self.share / self.levels).min(self.member_deadline)
    }

    fn timed_out(&self, missing: Vec<usize>) -> Error {
        Error::Timeout {
            after: self.start.elapsed(),
            missing,
        }
    }
}
