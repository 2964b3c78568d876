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
    let nodes = (0..layout.node_count())
        .map(|n| LocalCluster::new(layout.node(n).expect("node").len()).broadcasters())
        .collect();
    let ranks: Vec<Arc<dyn Broadcaster>> = Hierarchical::assemble(&layout, nodes, leaders)
        .expect("hierarchical ranks")
        .into_iter()
        .map(|h| Arc::new(h) as Arc<dyn Broadcaster>)
        .collect();
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(300)) {
        panic!("{f:#?}");
    }
}
