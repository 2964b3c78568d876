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
