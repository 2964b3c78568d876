//! The acknowledging half of a round: a rank whose children have all answered reports up
//! (or, on rank 0, gives the verdict), and says it again when asked.

use std::time::Instant;

use super::arrivals::{Arrived, few_arrivals};
use super::{Answer, Links, Message, Outcome, RoundMachine, Step, To};
use crate::message::Came;

impl RoundMachine {
    /// Once no child is owed an ack: report up, or (rank 0) the verdict.
    pub(super) fn acks_done(&mut self, links: &mut impl Links, now: Instant) {
        if !self.waiting.is_empty() || !self.unreached.is_empty() {
            return;
        }
        self.missing.sort_unstable();
        self.missing.dedup();
        if self.me == 0 {
            self.verdict(links);
            return;
        }
        let ack = Message::Ack {
            missing: self.missing.clone(),
            voted: self.few_voters(),
            arrivals: few_arrivals(
                std::mem::take(&mut self.arrivals)
                    .into_iter()
                    .map(|a| a.before(now))
                    .collect(),
            ),
        };
        self.answers.push(Answer {
            round: self.round,
            root: self.root,
            asker: None,
            to: To::Up,
            msg: ack,
        });
        // The parent sends the data again once this rank proves the key on a new
        // connection, and hears the ack then.
        self.ack_again(links);
        if self.towards_root().is_some() || self.me == self.root {
            self.step = Step::Verdict;
        } else {
            let data = std::mem::take(&mut self.data);
            self.end(Outcome::Delivered(data));
        }
    }

    pub(super) fn ack_again(&mut self, links: &mut impl Links) {
        if let Some(a) = self.answers.iter().find(|a| a.asker.is_none()) {
            if !links.send(a.to, &a.msg) {
                tracing::debug!("the ack waits for a reconnection");
            }
        }
    }

    /// Rank 0: the round's outcome, told to the root (when another rank) and to the ranks
    /// it could not reach.
    pub(super) fn verdict(&mut self, links: &mut impl Links) {
        let root = self.root;
        let missing = std::mem::take(&mut self.missing);
        let verdict = if missing.is_empty() {
            // The root, when another rank, hears how the ranks came (in ns after rank 0).
            let arrivals = if root == 0 {
                Vec::new()
            } else {
                let after = self.arrivals_after_start();
                // `few_arrivals` keeps the latest of values counted backwards.
                let negated = |c: Came| Came { ns: -c.ns, ..c };
                few_arrivals(after.into_iter().map(negated).collect())
                    .into_iter()
                    .map(negated)
                    .collect()
            };
            let voted = if root == 0 {
                Vec::new()
            } else {
                self.few_voters()
            };
            Message::Done { voted, arrivals }
        } else {
            Message::Fail {
                missing: missing.clone(),
            }
        };
        if let Some(c) = self.towards_root() {
            // The child on the path to the root relays it; its repeat of the root's data
            // asks for it again.
            if !links.send(To::Rank(c), &verdict) {
                // The root hears it when it proves the key again and sends its data again.
                tracing::warn!(
                    rank = root,
                    "cannot tell the root how its round ended (yet)"
                );
            }
            self.answers.push(Answer {
                round: self.round,
                root,
                asker: Some(c),
                to: To::Rank(c),
                msg: verdict.clone(),
            });
        }
        if missing.is_empty() {
            let data = std::mem::take(&mut self.data);
            self.end(Outcome::Delivered(data));
            return;
        }
        for &r in &missing {
            if r != 0 && r != root {
                links.send(To::Rank(r), &verdict);
            }
        }
        // Every other child hears it too (and passes it down), though its part of the round
        // is over: a rank that later waits for rank 0 in vain then names the ranks rank 0
        // waited for, the root cause, rather than rank 0.
        let told = self.towards_root();
        let tree = self.tree;
        for c in tree.children(self.me) {
            if Some(c) != told && !missing.contains(&c) {
                links.send(To::Rank(c), &verdict);
            }
        }
        self.end(Outcome::Missing(missing));
    }
}

/// The ack of a rank with no children whose data came at `now`: no rank missing below it,
/// its own vote, and when it came (`own`: the rank it is shown as, and when), as the
/// machine's own ack says it; `arrivals` is an empty list to fill (one kept from an
/// earlier ack costs no allocation).
pub(crate) fn leaf_ack(
    me: usize,
    vote: bool,
    own: (usize, Instant),
    now: Instant,
    mut arrivals: Vec<Came>,
) -> Message<'static> {
    arrivals.clear();
    let came = Arrived {
        rank: me,
        shown: own.0,
        at: own.1,
    };
    arrivals.push(came.before(now));
    Message::Ack {
        missing: Vec::new(),
        voted: if vote { vec![me] } else { Vec::new() },
        arrivals,
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::{Duration, Instant};

    use super::leaf_ack;
    use crate::machine::{Heard, Links, Plan, RoundMachine, To};
    use crate::message::{Came, Message};
    use crate::tree::Tree;

    /// Links that record what is sent.
    #[derive(Default)]
    struct Sent(Vec<(To, Message<'static>)>);

    impl Links for Sent {
        fn send(&mut self, to: To, msg: &Message<'_>) -> bool {
            self.0.push((to, msg.clone().into_owned()));
            true
        }
    }

    /// The leaf's round in `round/leaf.rs` acks with `leaf_ack`: it must say what the
    /// machine says, or a root would hear another account of its arrivals and votes.
    #[test]
    fn a_leafs_ack_is_the_machines() {
        let start = Instant::now();
        let later = start + Duration::from_micros(700);
        // (why, layout, rank, vote, the rank it stands for)
        let rows: [(&str, Tree, usize, bool, Option<(usize, Instant)>); 4] = [
            ("a star's member", Tree::new(4, None), 3, false, None),
            ("a voter", Tree::new(4, None), 2, true, None),
            ("a tree's leaf", Tree::new(7, Some(2)), 5, false, None),
            (
                "standing for rank 9, who came before the round",
                Tree::new(3, None),
                1,
                true,
                Some((9, start - Duration::from_micros(300))),
            ),
        ];
        for (why, tree, me, vote, stands_for) in rows {
            assert!(tree.children(me).next().is_none(), "{why}: not a leaf");
            let plan = Plan {
                me,
                tree,
                round: 5,
                root: 0,
                timeout: Duration::from_secs(1),
                vote,
                stands_for,
            };
            let mut links = Sent::default();
            let mut m = RoundMachine::start(&mut links, plan, None, start);
            let mut data = Message::Data(Cow::Owned(b"carrier".to_vec()));
            let heard = Heard {
                from: RoundMachine::up(tree, me),
                sender: tree.parent(me).unwrap_or(0),
                root: 0,
                msg: &mut data,
            };
            assert!(m.on_frame(&mut links, heard, later), "{why}: data not used");
            assert!(m.is_over(), "{why}: a leaf is done once it acked");
            let own = stands_for.unwrap_or((me, start));
            let ack = leaf_ack(me, vote, own, later, vec![Came::itself(1, 1); 3]);
            assert_eq!(links.0, vec![(To::Up, ack.clone())], "{why}: what was sent");
            assert_eq!(m.answers()[0].msg, ack, "{why}: what is said again");
        }
    }
}
