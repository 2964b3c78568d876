//! The shared slab round (`lens_core::backend::slab`) over an in-process transport: the
//! conformance suite at several slab sizes, and the refusal after a failed round.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lens_core::backend::slab::{HEADER_LEN, Round, SlabGroup, SlabOptions, SlabTransport};
use lens_core::{Broadcaster, Error, Result, blocking};
use lens_testkit::conformance::{Options, run_threads};
use lens_testkit::{LocalBroadcaster, LocalCluster};

/// A blocking collective made of the test kit's broadcast; fails its `fail_at`-th call if set.
struct Local {
    group: LocalBroadcaster,
    calls: usize,
    fail_at: Option<usize>,
    stops: Arc<AtomicUsize>,
}

impl Local {
    fn collective(&mut self, round: &Round, buf: &mut [u8], send: Option<usize>) -> Result<()> {
        self.calls += 1;
        if self.fail_at == Some(self.calls) {
            return Err(Error::Transport {
                backend: "test",
                message: "the wire broke".into(),
                source: None,
            });
        }
        let payload = send.map(|n| &buf[..n]);
        // On a thread of its own: the slab group runs the transport inside the caller's
        // executor, where another `block_on` may not start.
        let (group, root) = (&self.group, round.root);
        let got = std::thread::scope(|s| {
            s.spawn(|| blocking::broadcast(group, root, payload))
                .join()
                .expect("collective thread")
        })?;
        buf[..got.len()].copy_from_slice(&got);
        Ok(())
    }
}

impl SlabTransport for Local {
    fn broadcast_slab(
        &mut self,
        round: &Round,
        slab: &mut [u8],
        sent: Option<usize>,
    ) -> Result<()> {
        self.collective(round, slab, sent)
    }

    fn broadcast_rest(&mut self, round: &Round, rest: &mut [u8]) -> Result<()> {
        let send = (self.group.rank() == round.root).then_some(rest.len());
        self.collective(round, rest, send)
    }

    fn stop(&mut self) {
        self.stops.fetch_add(1, Ordering::SeqCst);
    }
}

fn group(
    n: usize,
    opts: &SlabOptions,
    fail_at: &[Option<usize>],
) -> (Vec<SlabGroup<Local>>, Arc<AtomicUsize>) {
    let stops = Arc::new(AtomicUsize::new(0));
    let ranks = LocalCluster::new(n)
        .timeout(Duration::from_millis(500))
        .broadcasters()
        .into_iter()
        .enumerate()
        .map(|(rank, group)| {
            let t = Local {
                group,
                calls: 0,
                fail_at: fail_at.get(rank).copied().flatten(),
                stops: Arc::clone(&stops),
            };
            SlabGroup::new("test", *b"TEST", t, (rank, n), opts).expect("a slab group")
        })
        .collect();
    (ranks, stops)
}

#[test]
fn the_slab_round_passes_conformance_at_every_slab_size() {
    // (why, slab size)
    for (why, slab) in [
        ("nearly every payload spills", HEADER_LEN + 1),
        ("the default", 256),
        ("nothing below 4 KiB spills", HEADER_LEN + 4096),
    ] {
        let (ranks, stops) = group(3, &SlabOptions::default().slab_size(slab), &[]);
        if let Err(f) = run_threads(&ranks, &Options::default().rounds(100)) {
            panic!("{why}: {f:#?}");
        }
        assert_eq!(stops.load(Ordering::SeqCst), 0, "{why}: nothing stops");
    }
}

#[test]
fn a_failed_round_stops_the_transport_once_and_refuses_later_rounds() {
    // Rank 1's first collective fails before it reaches the wire; rank 0, the root, then
    // misses its deadline. Each stops its transport once and refuses every later round.
    let (ranks, stops) = group(2, &SlabOptions::default(), &[None, Some(1)]);
    let got = lens_testkit::on_each_rank(&ranks, |b| {
        blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]))
    });
    assert!(matches!(got[0], Err(Error::Timeout { .. })), "{:?}", got[0]);
    assert!(
        matches!(got[1], Err(Error::Transport { .. })),
        "{:?}",
        got[1]
    );
    for (rank, first) in [(0, "timed out"), (1, "the wire broke")] {
        for _ in 0..2 {
            match blocking::broadcast(&ranks[rank], 0, (rank == 0).then_some(&b"x"[..])) {
                Err(Error::Closed { reason, .. }) => assert!(reason.contains(first), "{reason}"),
                other => {
                    panic!("rank {rank}: expected Closed naming the first failure, got {other:?}")
                }
            }
        }
    }
    assert_eq!(stops.load(Ordering::SeqCst), 2, "each rank stopped once");
    // A call rejected before any communication does not break the group.
    assert!(matches!(
        blocking::broadcast(&ranks[0], 5, Some(b"x")),
        Err(Error::InvalidRoot { .. })
    ));
}

#[test]
fn bad_options_and_ranks_are_refused() {
    let transport = || Local {
        group: LocalCluster::new(1).broadcasters().remove(0),
        calls: 0,
        fail_at: None,
        stops: Arc::default(),
    };
    let r = SlabGroup::new(
        "test",
        *b"TEST",
        transport(),
        (0, 1),
        &SlabOptions::default().slab_size(HEADER_LEN),
    );
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
    let r = SlabGroup::new(
        "test",
        *b"TEST",
        transport(),
        (1, 1),
        &SlabOptions::default(),
    );
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
}
