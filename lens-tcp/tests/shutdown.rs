//! At shutdown: dropping a group stops every rank's keeper thread and closes its ports, so
//! a job that makes and drops groups (a test suite, a restart in process) leaks neither
//! threads nor descriptors. In a binary of its own, so that no other test's groups are
//! counted.

mod common;

use std::time::{Duration, Instant};

/// Threads of this process whose name starts like a keeper's (`lens-tcp-keeper-<rank>`,
/// which the kernel cuts to 15 bytes).
fn keepers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with("lens-tcp-keeper"))
                .count()
        })
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

#[test]
fn dropping_a_group_stops_its_keepers_and_frees_its_descriptors() {
    let before = fds();
    for round in 0..3 {
        let group = common::group_at(4, Duration::from_secs(5), Some(2));
        // A new thread names itself once it runs: give the last keeper a moment to.
        let started = Instant::now();
        while keepers() < 4 && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(keepers(), 4, "round {round}: one keeper per rank");
        let addr = group.addr;
        drop(group);
        // Joined in drop: no keeper is left, at once.
        assert_eq!(keepers(), 0, "round {round}: the keepers stopped");
        // The rendezvous port is free again.
        let started = Instant::now();
        while std::net::TcpListener::bind(addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "round {round}: {addr} is still held"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The keeper closes its descriptors as it stops: give it a moment, then nothing is left.
    let started = Instant::now();
    while fds() > before && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        fds() <= before,
        "{} descriptors before, {} after",
        before,
        fds()
    );
}
