//! The testkit conformance suite over loopback TCP, one thread per rank.

mod common;

use std::time::Duration;

use lens_testkit::conformance::{Options, run_rank};

#[test]
fn tcp_group_passes_conformance() {
    for n in [1, 2, 3, 5] {
        let ranks = common::group(n, Duration::from_secs(10));
        let results = common::on_each(&ranks, |b| {
            futures::executor::block_on(run_rank(b, &Options::default()))
        });
        for (rank, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                panic!("n={n}, rank {rank}: {e}");
            }
        }
    }
}

#[test]
fn tcp_tree_passes_conformance() {
    for (n, k) in [(7, 2), (10, 3), (4, 1)] {
        let ranks = common::group_with(n, Duration::from_secs(10), Some(k));
        let results = common::on_each(&ranks, |b| {
            futures::executor::block_on(run_rank(b, &Options::default().rounds(300)))
        });
        for (rank, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                panic!("n={n}, fan-out {k}, rank {rank}: {e}");
            }
        }
    }
}
