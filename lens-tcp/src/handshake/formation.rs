//! Rank 0's side of the formation: who has joined, the WELCOMEs (all at once in a star,
//! each as soon as the rank's parent has joined in a tree), the JOIN FAIL naming the
//! missing ranks, and what it keeps after the formation for a rank whose WELCOME died.

use std::borrow::Cow;
use std::hash::Hash;

use super::{Dest, Formation, Join, Unsent, Wire};
use crate::message::{Message, Nonce};

impl<C: Clone + Eq + Hash> Join<C> {
    /// Rank 0 after formation: a knock of `session` 0 from rank `r` under the nonce it was
    /// WELCOMEd with is that rank again, its WELCOME lost to a reset, not a restart.
    pub(super) fn missed_welcome(&self, r: usize, session: u64, j: &Nonce) -> bool {
        self.me == 0
            && self.formed
            && session == 0
            && self.welcomed_with.get(r).and_then(Option::as_ref) == Some(j)
    }

    /// Rank 0: where rank `r`'s tree parent listens ("" when that is rank 0).
    pub(super) fn parent_endpoint(&self, r: usize) -> &str {
        match self.tree.parent(r) {
            Some(p) if p != 0 => self.endpoints.get(p).map_or("", String::as_str),
            _ => "",
        }
    }

    // ---- rank 0's formation ----

    /// Rank 0 starts forming a group under `session` (never zero: zero means none yet).
    pub(crate) fn begin(&mut self, session: u64) {
        self.session = session | 1;
    }

    /// Rank 0: whether every rank has joined.
    pub(crate) fn all_joined(&self) -> bool {
        self.formation.count + 1 >= self.n
    }

    /// Rank 0: the ranks that have not joined.
    pub(crate) fn missing(&self) -> Vec<usize> {
        (1..self.n)
            .filter(|&r| !self.formation.registered[r])
            .collect()
    }

    /// Rank 0 of a tree: rank `r` was admitted; WELCOMEs it and its children that are
    /// ready. Only those: no pass over every rank per join.
    pub(crate) fn admitted_in_tree(&mut self, w: &mut impl Wire<C>, r: usize) {
        self.welcome_if_ready(w, r);
        for c in self.tree.children(r) {
            self.welcome_if_ready(w, c);
        }
    }

    /// A WELCOME to rank `r` if it joined and its parent has (rank 0, or a rank that named
    /// where it listens).
    fn welcome_if_ready(&mut self, w: &mut impl Wire<C>, r: usize) {
        let f = &self.formation;
        if r == 0 || r >= self.n || !f.registered[r] || f.welcomed[r] {
            return;
        }
        let p = self.tree.parent(r).unwrap_or(0);
        if p != 0 && !f.registered[p] {
            return;
        }
        let (Some(conn), Some(j)) = (self.peers[r].as_ref(), self.joiner_of(r)) else {
            return;
        };
        let welcome = Message::Welcome {
            joiner: j,
            parent: Cow::Borrowed(self.parent_endpoint(r)),
        };
        if w.send(Dest::Conn(conn), self.session, &welcome).is_ok() {
            self.formation.welcomed[r] = true;
            self.welcomed_with[r] = Some(j);
        }
    }

    /// The nonce rank `r`'s current connection knocked with.
    fn joiner_of(&self, r: usize) -> Option<Nonce> {
        let conn = self.peers.get(r)?.as_ref()?;
        self.accepted.get(conn).map(|a| a.joiner)
    }

    /// Rank 0 of a star, every rank joined: WELCOMEs them all. A rank that cannot be sent
    /// its WELCOME left before the group formed: it is returned, with why.
    pub(crate) fn welcome_all(&mut self, w: &mut impl Wire<C>) -> Result<(), (usize, Unsent)> {
        for r in 1..self.n {
            let (Some(conn), Some(j)) = (self.peers[r].as_ref(), self.joiner_of(r)) else {
                continue;
            };
            let welcome = Message::Welcome {
                joiner: j,
                parent: Cow::Borrowed(""),
            };
            w.send(Dest::Conn(conn), self.session, &welcome)
                .map_err(|e| (r, e))?;
            self.welcomed_with[r] = Some(j);
        }
        Ok(())
    }

    /// Rank 0 gives up: tells the ranks still connected which ranks are `missing`.
    pub(crate) fn fail(&mut self, w: &mut impl Wire<C>, missing: &[usize]) {
        for r in 1..self.n {
            if let (Some(conn), Some(j)) = (self.peers[r].as_ref(), self.joiner_of(r)) {
                let fail = Message::JoinFail {
                    joiner: j,
                    missing: missing.to_vec(),
                };
                let _ = w.send(Dest::Conn(conn), self.session, &fail);
            }
        }
    }

    /// Rank 0: the group has formed; the formation's bookkeeping is dropped (not the
    /// endpoints and nonces a rank whose WELCOME died needs).
    pub(crate) fn finish(&mut self) {
        self.formed = true;
        self.formation = Formation::default();
    }

    /// This rank's tree children that have not joined it (or whose connection is gone).
    pub(crate) fn children_missing(&self) -> Vec<usize> {
        self.tree
            .children(self.me)
            .filter(|&c| self.peers[c].is_none())
            .collect()
    }
}
