//! The shared slab round (`lens_core::backend::slab`) over an in-process transport: the
//! conformance suite at several slab sizes, and the refusal after a failed round.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lens_core::backend::slab::{
    HEADER_LEN, Round, Slab, SlabBroadcaster, SlabOptions, SlabTransport,
};
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
        slab: &mut Slab,
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

    /// A gather made of one broadcast from each rank in turn.
    fn gather_i64(&mut self, round: &Round, value: i64) -> Result<Option<Vec<i64>>> {
        let n = self.group.world_size();
        let me = self.group.rank();
        let mut all = Vec::with_capacity(n);
        for r in 0..n {
            let mut buf = value.to_le_bytes();
            self.collective(
                &Round::new(r, Duration::from_secs(5)),
                &mut buf,
                (r == me).then_some(8),
            )?;
            all.push(i64::from_le_bytes(buf));
        }
        Ok(Some(if me == round.root { all } else { Vec::new() }))
    }
}

fn group(
    n: usize,
    opts: &SlabOptions,
    fail_at: &[Option<usize>],
) -> (Vec<SlabBroadcaster<Local>>, Arc<AtomicUsize>) {
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
            SlabBroadcaster::new("test", *b"TEST", t, (rank, n), opts).expect("a slab group")
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
    let r = SlabBroadcaster::new(
        "test",
        *b"TEST",
        transport(),
        (0, 1),
        &SlabOptions::default().slab_size(HEADER_LEN),
    );
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
    let r = SlabBroadcaster::new(
        "test",
        *b"TEST",
        transport(),
        (1, 1),
        &SlabOptions::default(),
    );
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
}

/// What the source starts from in a case of `the_blocking_twins_agree_with_the_async_functions`.
#[derive(Clone, Copy)]
enum Input<'a> {
    Context(&'a opentelemetry::Context),
    Carrier(&'a lens_core::Carrier),
    Current(&'a opentelemetry::Context),
}

fn run_case(b: &dyn Broadcaster, src: usize, input: Input<'_>, blocking_twin: bool) -> String {
    use lens_core::Carrier;
    let mine = b.rank() == src;
    let got: lens_core::Result<Option<Carrier>> = match (input, blocking_twin) {
        (Input::Context(cx), true) => blocking::broadcast_context(b, src, cx),
        (Input::Context(cx), false) => {
            futures::executor::block_on(lens_core::broadcast_context(b, src, cx))
        }
        (Input::Carrier(c), true) => blocking::broadcast_carrier(b, src, mine.then_some(c)),
        (Input::Carrier(c), false) => {
            futures::executor::block_on(lens_core::broadcast_carrier(b, src, mine.then_some(c)))
        }
        (Input::Current(cx), twin) => {
            let _g = mine.then(|| cx.clone().attach());
            if twin {
                blocking::broadcast_trace_context(b, src)
            } else {
                futures::executor::block_on(lens_core::broadcast_trace_context(b, src))
            }
        }
    };
    // In a few words: the trace id and source rank, or the error.
    match got {
        Ok(Some(c)) => format!(
            "{} from {:?}",
            c.span_context()
                .map_or("no span".into(), |s| s.trace_id().to_string()),
            c.source_rank()
        ),
        Ok(None) => "none".into(),
        Err(Error::InvalidRoot { root, .. }) => format!("invalid root {root}"),
        Err(Error::PayloadTooLarge { .. }) => "too large".into(),
        Err(Error::SourceFailed { root }) => format!("source {root} failed"),
        Err(Error::Config { .. }) => "config".into(),
        Err(e) => format!("other: {e}"),
    }
}

/// The blocking twins run their own code where the backend has `broadcast_sync` (as the
/// slab group does): in every case each rank gets what the async functions give it, and no
/// case leaves the ranks out of step.
#[test]
fn the_blocking_twins_agree_with_the_async_functions() {
    use lens_core::Carrier;
    use lens_core::carrier::TRACEPARENT;
    use opentelemetry::baggage::BaggageExt;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{Context, KeyValue};

    let cx = Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    ));
    // Over the group's 300-byte payload limit (the SDK keeps baggage under 8 KiB, so the
    // codec's own 16 KiB limit cannot be reached from a context).
    let huge = cx.with_baggage([KeyValue::new("big", "x".repeat(400))]);
    let mut bad = Carrier::new();
    bad.insert(TRACEPARENT, "00-not-a-traceparent");
    let good = Carrier::from_context(&cx);
    let empty = Context::new();
    let id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let all = |s: String| [s.clone(), s.clone(), s];
    // (why, source rank, what it starts from, what ranks 0, 1 and 2 get)
    let rows: Vec<(&str, usize, Input<'_>, [String; 3])> = vec![
        (
            "a span context",
            1,
            Input::Context(&cx),
            all(format!("{id} from Some(1)")),
        ),
        (
            "no span context",
            0,
            Input::Context(&empty),
            all("none".into()),
        ),
        (
            "a root outside the group",
            3,
            Input::Context(&cx),
            all("invalid root 3".into()),
        ),
        (
            "a carrier over the limit: the others are told",
            2,
            Input::Context(&huge),
            [
                "source 2 failed".into(),
                "source 2 failed".into(),
                "too large".into(),
            ],
        ),
        (
            "a foreign carrier with a bad traceparent: the others are told",
            0,
            Input::Carrier(&bad),
            [
                "config".into(),
                "source 0 failed".into(),
                "source 0 failed".into(),
            ],
        ),
        (
            "a foreign carrier",
            2,
            Input::Carrier(&good),
            all(format!("{id} from Some(2)")),
        ),
        (
            "the source's current context",
            0,
            Input::Current(&cx),
            all(format!("{id} from Some(0)")),
        ),
    ];
    let (ranks, stops) = group(3, &SlabOptions::default().max_payload(300), &[]);
    for twin in [true, false] {
        for (why, src, input, want) in &rows {
            let got = lens_testkit::on_each_rank(&ranks, |b| run_case(b, *src, *input, twin));
            assert_eq!(&got[..], &want[..], "{why} (blocking twin: {twin})");
        }
    }
    assert_eq!(stops.load(Ordering::SeqCst), 0, "no round failed");
}

/// A collective that never completes and whose roll call says rank 3 is missing, as
/// rank 0 found: `named` times its timeout names ranks itself (then no roll call is due).
struct Stuck {
    named: bool,
    calls: Arc<AtomicUsize>,
}

impl SlabTransport for Stuck {
    fn broadcast_slab(&mut self, round: &Round, _: &mut Slab, _: Option<usize>) -> Result<()> {
        if self.named {
            return Err(Error::timeout(Duration::from_millis(1), vec![2]));
        }
        Err(round.timed_out())
    }

    fn broadcast_rest(&mut self, round: &Round, _: &mut [u8]) -> Result<()> {
        Err(round.timed_out())
    }

    fn roll_call(
        &mut self,
        round: u64,
        wait: Duration,
    ) -> Option<lens_core::backend::slab::RollCall> {
        assert_eq!((round, wait), (1, Duration::from_millis(50)));
        self.calls.fetch_add(1, Ordering::SeqCst);
        Some(lens_core::backend::slab::RollCall::new(vec![3], vec![0]))
    }
}

#[test]
fn a_timeout_that_names_no_rank_asks_the_transport_once() {
    for (why, named, calls, missing, via) in [
        ("the collective cannot tell", false, 1, vec![3], vec![0]),
        ("the transport named them itself", true, 0, vec![2], vec![]),
    ] {
        let count = Arc::new(AtomicUsize::new(0));
        let t = Stuck {
            named,
            calls: Arc::clone(&count),
        };
        let opts = SlabOptions::default().timeout(Duration::from_millis(50));
        let b = SlabBroadcaster::new("test", *b"TEST", t, (1, 4), &opts).expect("a slab group");
        let got = blocking::broadcast(&b, 0, None);
        match &got {
            Err(Error::Timeout {
                missing: m, via: v, ..
            }) => assert_eq!((m, v), (&missing, &via), "{why}: {got:?}"),
            other => panic!("{why}: expected a timeout, got {other:?}"),
        }
        // Refused afterwards, with no second roll call.
        assert!(matches!(
            blocking::broadcast(&b, 0, None),
            Err(Error::Closed { .. })
        ));
        assert_eq!(count.load(Ordering::SeqCst), calls, "{why}");
    }
}

/// Where every round gathers arrivals, a rank's vote (the step sampler's) rides in the
/// gather, and every rank keeps the step it voted for; gathering only every other round,
/// the slab group says it cannot carry votes.
#[test]
fn votes_ride_in_the_gather_of_arrivals() {
    use lens_core::sample::{Reason, SampleRules, StepSampler};
    let rules = SampleRules::parse("slower-than=60s").expect("rules");
    let (ranks, _) = group(
        3,
        &SlabOptions::default().slab_size(256).arrivals_every(1),
        &[],
    );
    let decided = lens_testkit::on_each_rank(&ranks, |b| {
        let sampler = StepSampler::deciding_only(rules.clone());
        let g = sampler.group(b);
        for step in 1..=6u64 {
            blocking::broadcast_trace_context(&g, 0).expect("round");
            if b.rank() == 2 && step == 3 {
                sampler.keep_this_step();
            }
        }
        sampler.decisions()
    });
    for (rank, d) in decided.iter().enumerate() {
        assert!(d.contains(&(3, Some(Reason::Vote))), "rank {rank}: {d:?}");
        assert!(
            d.contains(&(2, None)),
            "rank {rank}: an ordinary step dropped: {d:?}"
        );
    }
    let (every_other, _) = group(
        2,
        &SlabOptions::default().slab_size(256).arrivals_every(2),
        &[],
    );
    assert!(!every_other[1].carry_vote(true));
}
