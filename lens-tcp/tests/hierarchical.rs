//! Hierarchical over real transports: node leaders talk TCP, ranks inside a node use the
//! in-process backend (as NCCL or shared memory would be), every root works.

mod common;

use std::sync::Arc;
use std::time::Duration;

use lens_core::{Broadcaster, Hierarchical, NodeLayout};
use lens_testkit::LocalCluster;
use lens_testkit::conformance::{Options, run_threads};

#[test]
fn tcp_leaders_and_local_nodes_pass_conformance() {
    // Three nodes of 2, 3 and 1 ranks.
    let layout = NodeLayout::new(vec![vec![0, 1], vec![2, 3, 4], vec![5]]).expect("layout");
    let leaders = common::group(layout.node_count(), Duration::from_secs(10));
    let mut ranks: Vec<Option<Arc<dyn Broadcaster>>> =
        (0..layout.world_size()).map(|_| None).collect();
    for (node, leader_rank) in leaders.into_iter().enumerate() {
        let mut leader_rank = Some(leader_rank);
        let members = layout.node(node).expect("node").to_vec();
        let locals = LocalCluster::new(members.len()).broadcasters();
        for (local, global) in locals.into_iter().zip(members) {
            let leader = if local.rank() == 0 {
                leader_rank.take()
            } else {
                None
            };
            let h =
                Hierarchical::new(layout.clone(), node, local, leader).expect("hierarchical rank");
            ranks[global] = Some(Arc::new(h));
        }
    }
    let ranks: Vec<Arc<dyn Broadcaster>> = ranks
        .into_iter()
        .map(|r| r.expect("every rank placed"))
        .collect();
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(300)) {
        panic!("{f:#?}");
    }
}
