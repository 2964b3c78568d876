//! What a steady round allocates on each rank (Rust's allocator: everything lens-tcp
//! allocates, since it no longer runs on libzmq). At hundreds of processes on few cores every wake-up runs from a cold
//! cache, and allocations were the largest part of what a lens member costs over a bare
//! ZeroMQ one (docs/SCALING.md), so their number is held here.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use lens_core::{Broadcaster as _, blocking};

/// Counts the allocations of the threads that ask for it.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

#[allow(unsafe_code)]
// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations per round on each rank of an `n`-rank group (fan-out `k`), over `rounds`
/// rounds of the 116-byte carrier from rank 0 after a warm-up.
fn per_round(n: usize, k: Option<usize>, rounds: u64) -> Vec<f64> {
    let ranks = common::group_with(n, Duration::from_secs(10), k);
    let payload = vec![7u8; 116];
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|b| {
                let payload = &payload;
                s.spawn(move || {
                    let mine = (b.rank() == 0).then_some(&payload[..]);
                    for _ in 0..50 {
                        blocking::broadcast(b, 0, mine).expect("warm-up round");
                    }
                    COUNT.with(|c| c.set(0));
                    COUNTING.with(|on| on.set(true));
                    for _ in 0..rounds {
                        let got = blocking::broadcast(b, 0, mine).expect("round");
                        std::hint::black_box(got);
                    }
                    COUNTING.with(|on| on.set(false));
                    COUNT.with(Cell::get) as f64 / rounds as f64
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

#[test]
#[allow(clippy::print_stderr)] // the counts, for whoever changes the bounds
fn a_steady_round_allocates_little_on_every_rank() {
    // (layout, ranks, fan-out, most allocations per round on each rank). A leaf (a rank
    // with no children, not the root) runs its round without the round machine
    // (`round/leaf.rs`): the data it returns is its one allocation; its ack reuses the
    // last one's list of arrivals and every frame is signed into a kept buffer. Rank 0 and
    // a rank with children run the machine: its state, the arrivals, the answers kept to
    // say again, one arrival list read per child's ack. Measured 10 / 1 (star) and
    // 9 / 9 / 1 (tree) on 6 December 2026 (11 / 5 and 10 / 11 / 5 before the leaf's round,
    // 32 and 16 before that); one more is allowed for rounds that grow a buffer.
    let rows: [(&str, usize, Option<usize>, &[f64]); 2] = [
        ("star", 4, None, &[10.0, 1.0, 1.0, 1.0]),
        ("tree", 7, Some(2), &[9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0]),
    ];
    for (layout, n, k, most) in rows {
        let got = per_round(n, k, 200);
        eprintln!("{layout} of {n}: allocations per round by rank {got:?}");
        for (r, (&a, &m)) in got.iter().zip(most).enumerate() {
            assert!(
                a > 0.0,
                "{layout}: rank {r} counted none: the counting allocator is not counting"
            );
            assert!(
                a <= m + 1.0,
                "{layout} of {n}: rank {r} allocates {a} times a round, more than {m} + 1"
            );
        }
    }
}
