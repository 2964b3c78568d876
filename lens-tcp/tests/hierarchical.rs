//! Hierarchical over real transports: node leaders talk TCP, ranks inside a node use the
//! in-process backend (as NCCL or shared memory would be), every root works.

mod common;

use std::sync::Arc;
use std::time::Duration;

use lens_core::{Broadcaster, Hierarchical, NodeLayout, blocking};
use lens_testkit::conformance::{Options, run_threads};
use lens_testkit::{LocalCluster, on_each_rank};

/// `nodes` (global ranks per node) with TCP between the node leaders and the in-process
/// backend inside each node.
fn tcp_leaders(nodes: Vec<Vec<usize>>) -> Vec<Arc<dyn Broadcaster>> {
    let layout = NodeLayout::new(nodes).expect("layout");
    let leaders = common::group(layout.node_count(), Duration::from_secs(10));
    let nodes = (0..layout.node_count())
        .map(|n| LocalCluster::new(layout.node(n).expect("node").len()).broadcasters())
        .collect();
    Hierarchical::assemble(&layout, nodes, leaders)
        .expect("hierarchical ranks")
        .into_iter()
        .map(|h| Arc::new(h) as Arc<dyn Broadcaster>)
        .collect()
}

#[test]
fn tcp_leaders_and_local_nodes_pass_conformance() {
    // Three nodes of 2, 3 and 1 ranks.
    let ranks = tcp_leaders(vec![vec![0, 1], vec![2, 3, 4], vec![5]]);
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(300)) {
        panic!("{f:#?}");
    }
}

/// The leaders' TCP round carries, per node, the rank its leader stands for
/// (`Broadcaster::stand_for`): the root names the rank behind a late node, whether the
/// leaders' round is from TCP rank 0 (its acks carry it) or from another (rank 0's DONE
/// does).
#[test]
fn tcp_leaders_carry_the_rank_behind_each_node() {
    let ranks = tcp_leaders(vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]);
    for (root, late) in [(0, 7), (0, 4), (3, 7), (6, 1)] {
        let a = on_each_rank(&ranks, |b| {
            if b.rank() == late {
                std::thread::sleep(Duration::from_millis(80));
            }
            let payload = (b.rank() == root).then_some(&b"step"[..]);
            blocking::broadcast(b.as_ref(), root, payload).expect("round");
            (b.rank() == root).then(|| b.take_arrivals()).flatten()
        })
        .into_iter()
        .flatten()
        .next()
        .expect("arrivals on the root");
        assert_eq!(a.last_rank, late, "root {root}: {a:?}");
        assert!(a.spread_ns >= 60_000_000, "root {root}: {a:?}");
        assert!(a.ranks.iter().all(|&(r, _)| r < 8), "root {root}: {a:?}");
    }
}
