//! A round's waits poll before they sleep, for at most the spin, and a rank whose waits
//! keep outlasting it stops polling until one ends sooner. Measured on the member's own
//! CPU clock: polling spends it, sleeping does not. Waits outside a round (the join) never
//! poll.

use std::sync::{Barrier, Mutex};
use std::time::Duration;

use lens_core::blocking::broadcast;
use lens_tcp::{TcpBroadcaster, loopback_group};
use lens_testkit::thread_cpu;

const KEY: &[u8] = b"a test job key, 32 bytes long!!!";

/// One test at a time: the two would poll on each other's cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Two ranks that poll (one rank counted on this host, so whatever its CPUs) for `spin`.
fn pair(spin: Duration) -> Vec<TcpBroadcaster> {
    loopback_group(2, |b| {
        b.key(KEY)
            .timeout(Duration::from_secs(10))
            .join_timeout(Duration::from_secs(20))
            .local_world_size(1)
            .spin(spin)
    })
    .expect("two ranks form a group on loopback")
    .ranks
}

/// Rounds from rank 0, each sent `delays[i]` after both ranks began it; the CPU time the
/// member spent in each.
fn member_cpu(ranks: &[TcpBroadcaster], delays: &[Duration]) -> Vec<Duration> {
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            for d in delays {
                start.wait();
                std::thread::sleep(*d);
                broadcast(&ranks[0], 0, Some(b"ctx")).expect("rank 0's round completes");
            }
        });
        delays
            .iter()
            .map(|_| {
                start.wait();
                let before = thread_cpu();
                let got = broadcast(&ranks[1], 0, None).expect("the member's round completes");
                assert_eq!(got, b"ctx");
                thread_cpu().saturating_sub(before)
            })
            .collect()
    })
}

#[test]
fn a_members_wait_polls_for_its_spin_and_no_longer_and_not_at_all_at_zero() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let late = [Duration::from_millis(80)];
    let polled = member_cpu(&pair(Duration::from_millis(5)), &late)[0];
    // Polling runs on the wall clock: a thread descheduled meanwhile spends less of it.
    assert!(
        polled >= Duration::from_millis(2),
        "a member that waited 80 ms with a spin of 5 ms spent {polled:?} of CPU: it did not poll"
    );
    assert!(
        polled < Duration::from_millis(20),
        "a member that waited 80 ms with a spin of 5 ms spent {polled:?} of CPU: it polled past its spin"
    );
    let slept = member_cpu(&pair(Duration::ZERO), &late)[0];
    assert!(
        slept < Duration::from_millis(2),
        "a member with a spin of 0 spent {slept:?} of CPU in an 80 ms wait: it polled"
    );
}

#[test]
fn a_rank_whose_waits_outlast_its_spin_stops_polling_until_one_ends_sooner() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let ranks = pair(Duration::from_millis(4));
    let slow = Duration::from_millis(25);
    // Four slow rounds take its four points; then one with no delay, then a slow one.
    let delays = [slow, slow, slow, slow, slow, slow, Duration::ZERO, slow];
    let cpu = member_cpu(&ranks, &delays);
    assert!(
        cpu[0] >= Duration::from_micros(1500),
        "the first slow round polled: {cpu:?}"
    );
    for (i, c) in cpu.iter().enumerate().take(6).skip(4) {
        assert!(
            *c < Duration::from_millis(1),
            "round {i}, after four long waits, slept without polling: {cpu:?}"
        );
    }
    assert!(
        cpu[7] >= Duration::from_micros(1500),
        "a wait that ended soon (round 6) gave the points back, so round 7 polled: {cpu:?}"
    );
}

#[test]
fn waits_outside_a_round_do_not_poll_the_join() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let config = |rank: usize, addr: &str| {
        lens_tcp::TcpConfig::builder()
            .rank(rank)
            .world_size(2)
            .addr(addr)
            .key(KEY)
            .join_timeout(Duration::from_secs(20))
            .local_world_size(1)
            .spin(Duration::from_millis(8))
            .build()
            .expect("every setting is given and valid")
    };
    let hub = TcpBroadcaster::start(config(0, "127.0.0.1:0")).expect("rank 0 binds loopback");
    let addr = hub.local_addr().expect("rank 0 is bound").to_string();
    let member = TcpBroadcaster::start(config(1, &addr)).expect("the member dials rank 0");
    std::thread::scope(|s| {
        s.spawn(|| {
            // Rank 0 admits the member only once it runs its own join, 150 ms from now.
            std::thread::sleep(Duration::from_millis(150));
            hub.finish().expect("rank 0 forms the group");
        });
        let before = thread_cpu();
        member.finish().expect("the member is admitted");
        let spent = thread_cpu().saturating_sub(before);
        assert!(
            spent < Duration::from_millis(3),
            "a member that waited 150 ms to join spent {spent:?} of CPU: the join polled"
        );
    });
}

#[test]
fn no_rank_polls_where_the_hosts_ranks_outnumber_its_cpus() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // One rank more than this process's CPUs, every one of them counted on this host (no
    // launcher variable: the whole world is local).
    let n = std::thread::available_parallelism().map_or(1, usize::from) + 1;
    let ranks = loopback_group(n, |b| {
        b.key(KEY)
            .timeout(Duration::from_secs(10))
            .join_timeout(Duration::from_secs(30))
            .spin(Duration::from_millis(5))
    })
    .expect("the ranks form a group on loopback")
    .ranks;
    let start = Barrier::new(n);
    let spent = std::thread::scope(|s| {
        let members: Vec<_> = ranks[1..]
            .iter()
            .map(|r| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let before = thread_cpu();
                    broadcast(r, 0, None).expect("a member's round completes");
                    thread_cpu().saturating_sub(before)
                })
            })
            .collect();
        start.wait();
        std::thread::sleep(Duration::from_millis(80));
        broadcast(&ranks[0], 0, Some(b"ctx")).expect("rank 0's round completes");
        members
            .into_iter()
            .map(|m| m.join().expect("a member thread does not panic"))
            .collect::<Vec<_>>()
    });
    for (i, cpu) in spent.iter().enumerate() {
        assert!(
            *cpu < Duration::from_millis(2),
            "rank {} of {n} ranks on this host spent {cpu:?} of CPU in an 80 ms wait with a spin of 5 ms: it polled",
            i + 1
        );
    }
}

#[test]
fn a_polling_source_still_names_the_rank_that_came_late() {
    use lens_core::Broadcaster as _;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let ranks = pair(Duration::from_millis(5));
    let late = Duration::from_millis(40);
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            std::thread::sleep(late);
            broadcast(&ranks[1], 0, None).expect("the member's round completes");
        });
        start.wait();
        broadcast(&ranks[0], 0, Some(b"ctx")).expect("rank 0's round completes");
    });
    let a = ranks[0]
        .take_arrivals()
        .expect("the source knows how the ranks came");
    assert_eq!(a.last_rank, 1, "{a:?}");
    let spread = Duration::from_nanos(a.spread_ns);
    assert!(
        spread >= late - Duration::from_millis(5) && spread < Duration::from_secs(5),
        "the member came 40 ms after the source, the spread says {spread:?}"
    );
}
