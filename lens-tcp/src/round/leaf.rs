//! A leaf member's steady round without the round machine: a rank with no children that
//! is not the root waits for one frame, its parent's data, then acknowledges it and is
//! done. At hundreds of processes on a few cores every member runs its round from cold
//! caches, and the machine's general steps (its state, its sets, its bookkeeping of what
//! to say again) were most of what a member costs over a bare socket (docs/SCALING.md).
//! Whatever else comes first (a frame of another round, a reset, nothing by the deadline)
//! is handed to the machine, which takes the round from there as if it had run from the
//! start: until the data comes it has sent nothing and kept nothing.

use std::time::Instant;

use lens_core::Result;

use super::from_of;
use crate::frame::Kind;
use crate::machine::{Answer, Plan, RoundMachine, To, data_deadline, leaf_ack, take_data};
use crate::message::Message;
use crate::net::ConnId;
use crate::state::{Input, RankState};

/// How a leaf's round began.
pub(super) enum Began {
    /// Its data came first: acknowledged, and the round is over on this rank.
    Delivered(Vec<u8>),
    /// Something else came first, or nothing by the deadline (`None`): the machine's.
    Other(Option<Input>),
}

impl RankState {
    /// Whether this rank's round `root` may begin as a leaf's: a rank other than 0 with
    /// no children, not the root (so it has no payload, and no round of its own is open),
    /// with no frame of this round kept from before it.
    pub(super) fn is_steady_leaf(&self, root: usize) -> bool {
        self.rank != 0
            && root != self.rank
            && self.tree.children(self.rank).next().is_none()
            && !self.pending.iter().any(|(_, f)| f.round == self.round)
    }

    /// The round's first input: the frame that came alone on the connection up, read where
    /// it lies, when it is of this session; else the event loop's.
    fn first_input(&mut self, deadline: Instant) -> Result<Option<Input>> {
        let side = self.up_side();
        match self.net.recv_alone(side, deadline)? {
            Some(f) if self.formed() && f.session == self.session() => {
                Ok(Some(Input::Frame(ConnId::outbound(side), f)))
            }
            Some(f) => {
                // The loop drops it, and says why.
                self.net.give_back(ConnId::outbound(side), f);
                self.next(deadline)
            }
            None => self.next(deadline),
        }
    }

    /// Waits for the first input of the round `plan` says (started at `start`); when it is
    /// the parent's data, acknowledges it as the machine would and returns it.
    pub(super) fn leaf_round(&mut self, plan: &Plan, start: Instant) -> Result<Began> {
        let deadline = data_deadline(start, plan.timeout);
        let input = self.first_input(deadline)?;
        let Some(Input::Frame(conn, mut f)) = input else {
            return Ok(Began::Other(input));
        };
        let expected = f.round == plan.round
            && f.kind() == Kind::Data
            && f.root as usize == plan.root
            && from_of(&conn, f.sender) == RoundMachine::up(self.tree, self.rank);
        if !expected {
            return Ok(Began::Other(Some(Input::Frame(conn, f))));
        }
        let now = Instant::now();
        let data = take_data(&mut f.msg);
        // The last round's ack (a leaf says nothing else) lends its list of arrivals.
        let kept = match self.last_answers.pop() {
            Some(Answer {
                msg: Message::Ack { arrivals, .. },
                ..
            }) => arrivals,
            _ => Vec::new(),
        };
        self.last_answers.clear();
        let own = plan.stands_for.unwrap_or((plan.me, start));
        let ack = leaf_ack(plan.me, plan.vote, own, now, kept);
        self.encode_out(&ack, plan.round, plan.root);
        if !self.send_out(To::Up) {
            // The parent sends the data again once this rank proves the key on a new
            // connection, and hears the ack then.
            tracing::debug!("the ack waits for a reconnection");
        }
        self.last_answers.push(Answer {
            round: plan.round,
            root: plan.root,
            asker: None,
            to: To::Up,
            msg: ack,
        });
        // What the machine's end of the round leaves on a rank that is not the root.
        self.arrivals.clear();
        self.voted.clear();
        self.received_at = Some(now);
        self.upstream_missing.clear();
        Ok(Began::Delivered(data))
    }
}
