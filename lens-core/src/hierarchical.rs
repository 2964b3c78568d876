//! A broadcaster made of two: one among node leaders, one inside each node.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::arrivals::Arrivals;
use crate::backend::check_broadcast_args;
use crate::broadcaster::Broadcaster;
use crate::error::{Error, Result};

/// Which global ranks live on which node.
///
/// `nodes[n]` lists node `n`'s global ranks in local-rank order; local rank 0 is the
/// node's leader. Every global rank `0..world_size` appears exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    nodes: Vec<Vec<usize>>,
    // global rank -> (node, local rank)
    place: Vec<(usize, usize)>,
}

impl NodeLayout {
    /// A layout from explicit per-node rank lists.
    ///
    /// # Errors
    /// [`Error::Config`] when a node is empty or the ranks are not exactly `0..world_size`.
    pub fn new(nodes: Vec<Vec<usize>>) -> Result<Self> {
        let world_size: usize = nodes.iter().map(Vec::len).sum();
        let mut place = vec![None; world_size];
        for (n, ranks) in nodes.iter().enumerate() {
            if ranks.is_empty() {
                return Err(Error::config(format!("node {n} has no ranks")));
            }
            for (local, &global) in ranks.iter().enumerate() {
                match place.get_mut(global) {
                    Some(slot @ None) => *slot = Some((n, local)),
                    Some(Some(_)) => {
                        return Err(Error::config(format!("rank {global} is on two nodes")));
                    }
                    None => {
                        return Err(Error::config(format!(
                            "rank {global} is out of range for {world_size} rank(s)"
                        )));
                    }
                }
            }
        }
        let place = place.into_iter().flatten().collect();
        Ok(NodeLayout { nodes, place })
    }

    /// `world_size` ranks in blocks of `per_node` consecutive ranks (the last may be short).
    ///
    /// # Errors
    /// [`Error::Config`] when either number is zero.
    pub fn uniform(world_size: usize, per_node: usize) -> Result<Self> {
        if world_size == 0 || per_node == 0 {
            return Err(Error::config(
                "world size and ranks per node must be positive",
            ));
        }
        let nodes = (0..world_size)
            .collect::<Vec<_>>()
            .chunks(per_node)
            .map(<[usize]>::to_vec)
            .collect();
        Self::new(nodes)
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.place.len()
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The global ranks of node `node`.
    pub fn node(&self, node: usize) -> Option<&[usize]> {
        self.nodes.get(node).map(Vec::as_slice)
    }

    /// `(node, local rank)` of a global rank.
    pub fn place(&self, rank: usize) -> Option<(usize, usize)> {
        self.place.get(rank).copied()
    }
}

/// Broadcasts across nodes with `leaders` (one rank per node, say TCP or MPI between hosts)
/// and inside each node with `local` (say NCCL or shared memory).
///
/// Any rank can be the root: the root's node first hands the payload to its leader (when the
/// root is not the leader), the leaders broadcast from the root's node, then every other node
/// broadcasts from its leader. Each sub-group sees its collectives in the same order on all
/// its members, as the trait requires.
///
/// **Arrivals.** Before the leaders' round, the ranks of each node meet in a round of their
/// own (empty, from the leader; on the root's node, when the root is not the leader, the
/// root's round is that meeting): so a leader goes on only once its whole node has come, and
/// it knows which of its ranks came last. Where the leaders' group carries it
/// ([`Broadcaster::stand_for`]: the in-process backend and TCP), each leader stands in the
/// leaders' round for that rank. A root that leads its node then finds in
/// [`Broadcaster::take_arrivals`] its own node's ranks and, for every other node, the rank
/// of it that came last and when: `last_rank` is the rank that held the whole job up, and
/// its node the node-level straggler. Only what names ranks truly is reported: `None` on a
/// root that does not lead its node (it hears its own node only), where the leaders' group
/// does not carry `stand_for` (MPI, NCCL, the Python groups) and where the node's group
/// does not track arrivals (a leader could name only itself). Every node's group is taken
/// to be of one kind: a leader whose node's group tracks nothing stands for itself, as its
/// node had all come. The meeting costs one more round inside each node per broadcast (on
/// shared memory or NCCL, microseconds), and makes every broadcast wait for every rank, as
/// TCP's does.
pub struct Hierarchical<L, G> {
    layout: NodeLayout,
    rank: usize,
    node: usize,
    local: L,
    leaders: Option<G>,
    /// The last round this rank was the root of, where its arrivals can be told.
    stood: Mutex<Option<Stood>>,
}

/// What a root that leads its node stood for in the leaders' round, and when each rank of
/// its node came (global ranks, latest first), to put the other nodes' entries beside.
#[derive(Debug, Clone)]
struct Stood {
    own: (usize, Instant),
    node: Vec<(usize, Instant)>,
}

impl<L, G> std::fmt::Debug for Hierarchical<L, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hierarchical")
            .field("rank", &self.rank)
            .field("node", &self.node)
            .field("leader", &self.leaders.is_some())
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl<L: Broadcaster, G: Broadcaster> Hierarchical<L, G> {
    /// Joins node `node`'s `local` group and, on the node's leader (local rank 0), the
    /// `leaders` group (`None` elsewhere).
    ///
    /// # Errors
    /// [`Error::Config`] when the groups do not match `layout`: the local group's size is
    /// not the node's, a leader without `leaders` (or a non-leader with it), or the leaders
    /// group's size or rank is not the node count or node index.
    pub fn new(layout: NodeLayout, node: usize, local: L, leaders: Option<G>) -> Result<Self> {
        let ranks = layout
            .node(node)
            .ok_or_else(|| Error::config(format!("node {node} is not in the layout")))?;
        if local.world_size() != ranks.len() || local.rank() >= ranks.len() {
            return Err(Error::config(format!(
                "node {node} has {} rank(s) but its local group has {} (this is rank {})",
                ranks.len(),
                local.world_size(),
                local.rank()
            )));
        }
        let is_leader = local.rank() == 0;
        match (&leaders, is_leader) {
            (Some(g), true) => {
                if g.world_size() != layout.node_count() || g.rank() != node {
                    return Err(Error::config(format!(
                        "leaders group is rank {} of {}, expected rank {node} of {}",
                        g.rank(),
                        g.world_size(),
                        layout.node_count()
                    )));
                }
            }
            (None, false) => {}
            (None, true) => {
                return Err(Error::config(
                    "the node leader (local rank 0) needs the leaders group",
                ));
            }
            (Some(_), false) => {
                return Err(Error::config(
                    "only the node leader (local rank 0) joins the leaders group",
                ));
            }
        }
        let rank = ranks[local.rank()];
        Ok(Hierarchical {
            layout,
            rank,
            node,
            local,
            leaders,
            stood: Mutex::new(None),
        })
    }

    /// Every rank of `layout` in one process (tests, simulations): `nodes[i]` is node `i`'s
    /// local group, `leaders` the leaders group; each is matched to its place by its own
    /// rank. Returns the ranks in global rank order.
    ///
    /// ```
    /// use lens_core::{Broadcaster, Hierarchical, NodeLayout};
    /// use lens_testkit::LocalCluster;
    ///
    /// let layout = NodeLayout::new(vec![vec![0, 1], vec![2]])?;
    /// let nodes = vec![
    ///     LocalCluster::new(2).broadcasters(),
    ///     LocalCluster::new(1).broadcasters(),
    /// ];
    /// let ranks = Hierarchical::assemble(&layout, nodes, LocalCluster::new(2).broadcasters())?;
    /// assert_eq!(ranks.iter().map(|r| r.rank()).collect::<Vec<_>>(), [0, 1, 2]);
    /// # Ok::<(), lens_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Config`] when the groups do not match `layout` (as [`Hierarchical::new`]), or
    /// there is not one local group per node and one leader per node.
    pub fn assemble(layout: &NodeLayout, nodes: Vec<Vec<L>>, leaders: Vec<G>) -> Result<Vec<Self>> {
        if nodes.len() != layout.node_count() || leaders.len() != layout.node_count() {
            return Err(Error::config(format!(
                "{} node group(s) and {} leader(s) for a layout of {} node(s)",
                nodes.len(),
                leaders.len(),
                layout.node_count()
            )));
        }
        let mut leaders: Vec<Option<G>> = leaders.into_iter().map(Some).collect();
        let mut by_rank: Vec<Option<Self>> = (0..layout.world_size()).map(|_| None).collect();
        for (node, locals) in nodes.into_iter().enumerate() {
            for local in locals {
                let leader = if local.rank() == 0 {
                    let at = leaders
                        .iter()
                        .position(|l| l.as_ref().is_some_and(|l| l.rank() == node));
                    at.and_then(|i| leaders[i].take())
                } else {
                    None
                };
                let h = Hierarchical::new(layout.clone(), node, local, leader)?;
                let slot = by_rank
                    .get_mut(h.rank)
                    .ok_or_else(|| Error::config("rank outside the layout"))?;
                if slot.replace(h).is_some() {
                    return Err(Error::config(format!(
                        "node {node} has two ranks with the same local rank"
                    )));
                }
            }
        }
        by_rank
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.ok_or_else(|| Error::config(format!("no local group holds rank {r}"))))
            .collect()
    }

    /// The layout.
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// A leader after its node's meeting (its own round: `met`): when each rank of its
    /// node came, latest first, as global ranks and instants on this rank's clock (`came`:
    /// when this rank entered the broadcast); `None` where the node's group does not say.
    fn node_arrivals(&self, came: Instant, met: bool) -> Option<Vec<(usize, Instant)>> {
        if !met {
            return None;
        }
        let a = self.local.take_arrivals()?;
        let ranks = self.layout.node(self.node)?;
        let mine = a.ranks.iter().find(|(r, _)| *r == 0).map(|&(_, ns)| ns)?;
        a.ranks
            .iter()
            .map(|&(r, ns)| Some((*ranks.get(r)?, shifted(came, ns, mine)?)))
            .collect()
    }

    fn note_stood(&self, stood: Option<Stood>) {
        *self.stood.lock().unwrap_or_else(|e| e.into_inner()) = stood;
    }
}

/// The instant `ns` after the first arrival, given that `anchor` came `anchor_ns` after it.
fn shifted(anchor: Instant, ns: u64, anchor_ns: u64) -> Option<Instant> {
    if ns >= anchor_ns {
        anchor.checked_add(Duration::from_nanos(ns - anchor_ns))
    } else {
        anchor.checked_sub(Duration::from_nanos(anchor_ns - ns))
    }
}

#[async_trait::async_trait]
impl<L: Broadcaster, G: Broadcaster> Broadcaster for Hierarchical<L, G> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.layout.world_size()
    }

    fn local_rank(&self) -> Option<usize> {
        self.layout.place(self.rank).map(|(_, local)| local)
    }

    fn max_payload(&self) -> usize {
        let leaders = self
            .leaders
            .as_ref()
            .map_or(usize::MAX, Broadcaster::max_payload);
        self.local.max_payload().min(leaders)
    }

    /// On a root that leads its node, where every group says it (see the type's docs).
    fn take_arrivals(&self) -> Option<Arrivals> {
        let Stood { own, node } = self
            .stood
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        let leaders = self.leaders.as_ref()?;
        if leaders.world_size() == 1 {
            // One node: its leaders' round is no round, and the node is the whole job.
            return Arrivals::from_instants(node);
        }
        let a = leaders.take_arrivals()?;
        let n = self.layout.world_size();
        // The ranks the leaders stood for are global already; votes are the leaders' own.
        let leader = |node: usize| self.layout.node(node)?.first().copied();
        let voted: Vec<usize> = a.voted.iter().filter_map(|&r| leader(r)).collect();
        // On this rank's clock through its own entry: its node's ranks in full, and the
        // other nodes' last ranks.
        let own_ns = a.ranks.iter().find(|(r, _)| *r == own.0).map(|e| e.1)?;
        let mine = |r: usize| self.layout.place(r).map(|(node, _)| node) == Some(self.node);
        let others = a
            .ranks
            .iter()
            .filter(|&&(r, _)| r < n && !mine(r))
            .filter_map(|&(r, ns)| Some((r, shifted(own.1, ns, own_ns)?)));
        Arrivals::from_instants(node.into_iter().chain(others)).map(|a| a.with_voted(voted))
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        let came = Instant::now();
        let (root_node, root_local) = self.layout.place(root).ok_or(Error::InvalidRoot {
            root,
            world_size: self.world_size(),
        })?;
        let on_root_node = self.node == root_node;
        let mut data: Option<Vec<u8>> = payload.map(<[u8]>::to_vec);
        let is_root = self.rank == root;
        if is_root {
            self.note_stood(None);
        }

        // 1. Inside the root's node, the root hands the payload to everyone there (its
        //    leader included) when it is not the leader itself; elsewhere, and when the
        //    root leads its node, the node's ranks meet (an empty round from the leader).
        //    Either way the leader goes on once its whole node has come.
        let root_hands_over = on_root_node && root_local != 0;
        if root_hands_over {
            data = Some(self.local.broadcast(root_local, data.as_deref()).await?);
        } else {
            let leads = self.local.rank() == 0;
            self.local.broadcast(0, leads.then_some(&[][..])).await?;
        }
        // 2. Among leaders, from the root's node; each stands for its node's last rank.
        if let Some(leaders) = &self.leaders {
            let node = self.node_arrivals(came, !root_hands_over);
            // Without its node's arrivals a leader stands for itself: on the root's node
            // as it came (the root's round told it nothing), elsewhere as its node had all
            // come (the meeting's end).
            let own = node.as_ref().and_then(|v| v.first().copied()).unwrap_or((
                self.rank,
                if root_hands_over {
                    came
                } else {
                    Instant::now()
                },
            ));
            let stood = leaders.stand_for(own.0, own.1);
            let out = leaders.broadcast(root_node, data.as_deref()).await?;
            data = Some(out);
            // The root's node tells whether the nodes' groups track arrivals (one rank
            // alone tracks nothing and needs nothing).
            let node = node.or_else(|| (self.local.world_size() == 1).then(|| vec![own]));
            if is_root && stood {
                self.note_stood(node.map(|node| Stood { own, node }));
            }
        }
        // 3. Every other node spreads it from its leader. On the root's node everyone has
        //    it already: from step 1, or the root was the leader and step 3 runs there.
        if !on_root_node || root_local == 0 {
            let payload = (self.local.rank() == 0).then_some(()).and(data.as_deref());
            data = Some(self.local.broadcast(0, payload).await?);
        }
        data.ok_or_else(|| Error::Corrupt {
            reason: "hierarchical broadcast produced no payload".into(),
        })
    }
}
