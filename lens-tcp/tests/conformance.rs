//! The testkit conformance suite over loopback TCP, one thread per rank.

mod common;

use std::time::Duration;

use lens_testkit::conformance::{Options, run_threads};

#[test]
fn tcp_group_passes_conformance() {
    for n in [1, 2, 3, 5] {
        let ranks = common::group(n, Duration::from_secs(10));
        if let Err(f) = run_threads(&ranks, &Options::default()) {
            panic!("n={n}: {f:#?}");
        }
    }
}

#[test]
fn tcp_tree_passes_conformance() {
    for (n, k) in [(7, 2), (10, 3), (4, 1)] {
        let ranks = common::group_with(n, Duration::from_secs(10), Some(k));
        if let Err(f) = run_threads(&ranks, &Options::default().rounds(300)) {
            panic!("n={n}, fan-out {k}: {f:#?}");
        }
    }
}
