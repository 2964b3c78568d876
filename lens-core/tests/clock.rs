//! Clock offsets measured over a group's broadcasts: ranks of one clock agree within the
//! bound; simulated offsets are found within the bound; bad arguments are refused.

use std::time::Duration;

use lens_core::Error;
use lens_core::clock::{
    ClockOffset, measure_clock_offsets, measure_clock_offsets_with, system_now_ns,
};
use lens_testkit::LocalCluster;

fn on_threads<T: Send>(n: usize, f: impl Fn(&dyn lens_core::Broadcaster) -> T + Sync) -> Vec<T> {
    let ranks = LocalCluster::new(n)
        .timeout(Duration::from_secs(10))
        .broadcasters();
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|b| s.spawn(|| f(b))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

fn within(got: ClockOffset, truth: i64) -> bool {
    got.offset_ns.abs_diff(truth) <= got.error_ns + 1
}

#[test]
fn ranks_of_one_clock_agree_within_the_bound_and_every_rank_gets_the_table() {
    let tables = on_threads(4, |b| measure_clock_offsets(b, 0, 5).expect("measured"));
    for t in &tables {
        assert_eq!(t, &tables[0], "every rank has the same table");
    }
    let t = &tables[0];
    assert_eq!(
        t[0],
        ClockOffset {
            offset_ns: 0,
            error_ns: 0
        },
        "the reference itself"
    );
    for (r, c) in t.iter().enumerate().skip(1) {
        assert!(within(*c, 0), "rank {r}: {c:?}");
        assert!(
            c.error_ns < 1_000_000_000,
            "rank {r}: a bound was measured: {c:?}"
        );
    }
}

#[test]
fn simulated_offsets_are_found_within_the_bound() {
    // (why, reference rank) — each rank's clock is 1.5 s × rank ahead, and a few ns more.
    for (why, reference) in [("reference 0", 0), ("reference 2", 2)] {
        let tables = on_threads(4, |b| {
            let ahead = 1_500_000_000_i128 * b.rank() as i128 + 7 * b.rank() as i128;
            let now = move || system_now_ns() + ahead;
            measure_clock_offsets_with(b, reference, 3, &now).expect("measured")
        });
        let t = &tables[0];
        for (r, c) in t.iter().enumerate() {
            let truth = 1_500_000_007_i64 * (r as i64 - reference as i64);
            assert!(within(*c, truth), "{why}: rank {r}: {c:?} against {truth}");
        }
    }
}

#[test]
fn bad_arguments_are_refused_on_every_rank() {
    for (reference, reps) in [(4, 1), (0, 0)] {
        let got = on_threads(2, |b| measure_clock_offsets(b, reference, reps));
        for g in got {
            assert!(
                matches!(g, Err(Error::Config { .. })),
                "{reference}, {reps}: {g:?}"
            );
        }
    }
}

/// Through `Hierarchical` (two nodes of three ranks): the same table, simulated offsets
/// found within the bound, whichever node the reference is on.
#[test]
fn offsets_are_measured_through_a_hierarchical_group() {
    let layout = lens_core::NodeLayout::uniform(6, 3).expect("layout");
    let ranks = LocalCluster::new(6)
        .timeout(Duration::from_secs(10))
        .hierarchical(&layout)
        .expect("hierarchical");
    let tables: Vec<Vec<ClockOffset>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|b| {
                s.spawn(move || {
                    let ahead = 1_000_000_i128 * lens_core::Broadcaster::rank(b) as i128;
                    let now = move || system_now_ns() + ahead;
                    measure_clock_offsets_with(b, 4, 2, &now).expect("measured")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for t in &tables {
        assert_eq!(t, &tables[0]);
    }
    for (r, c) in tables[0].iter().enumerate() {
        let truth = 1_000_000_i64 * (r as i64 - 4);
        assert!(within(*c, truth), "rank {r}: {c:?} against {truth}");
    }
}
