//! `broadcast_trace_context` across in-process ranks.

use std::time::Duration;

use lens_core::{
    Broadcaster, Carrier, Error, blocking, broadcast_context, broadcast_trace_context,
};
use lens_testkit::LocalCluster;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};

fn span_cx(flags: u8) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::new(flags),
        true,
        TraceState::from_key_value([("rojo", "00f067aa0ba902b7")]).expect("state"),
    ))
}

async fn all(
    ranks: &[lens_testkit::LocalBroadcaster],
    src: usize,
    cx: &Context,
) -> Vec<lens_core::Result<Option<Carrier>>> {
    futures::future::join_all(ranks.iter().map(|b| broadcast_context(b, src, cx))).await
}

#[tokio::test]
async fn every_rank_gets_the_source_context_with_baggage() {
    let ranks = LocalCluster::new(4).broadcasters();
    let cx = span_cx(0x03).with_baggage([
        KeyValue::new("job.id", "job-42"),
        KeyValue::new("note", "a b,c"),
    ]);
    for src in 0..4 {
        for got in all(&ranks, src, &cx).await {
            let carrier = got.expect("ok").expect("span context");
            assert_eq!(carrier.source_rank(), Some(src));
            let sc = carrier.span_context().expect("valid");
            assert_eq!(sc.trace_flags().to_u8(), 0x03);
            assert_eq!(sc.trace_state().header(), "rojo=00f067aa0ba902b7");
            let bag = carrier.context();
            assert_eq!(
                bag.baggage().get("job.id").map(|v| v.as_str().to_owned()),
                Some("job-42".into())
            );
            assert_eq!(
                bag.baggage().get("note").map(|v| v.as_str().to_owned()),
                Some("a b,c".into())
            );
        }
    }
}

#[tokio::test]
async fn no_span_context_gives_none_everywhere() {
    let ranks = LocalCluster::new(3).broadcasters();
    let baggage_only = Context::new().with_baggage([KeyValue::new("k", "v")]);
    for cx in [Context::new(), baggage_only] {
        for got in all(&ranks, 1, &cx).await {
            assert!(got.expect("ok").is_none());
        }
    }
}

#[tokio::test]
async fn current_context_is_taken_when_called_not_when_polled() {
    let ranks = LocalCluster::new(2).broadcasters();
    let fut = {
        let _g = span_cx(0x01).attach();
        broadcast_trace_context(&ranks[0], 0)
    };
    // The guard is gone: an implementation that read Context::current() at first poll
    // would broadcast an empty context here.
    let (root, other) = futures::join!(fut, broadcast_trace_context(&ranks[1], 0));
    let want = span_cx(0x01).span().span_context().span_id();
    assert_eq!(
        root.expect("ok")
            .and_then(|c| c.span_context())
            .map(|s| s.span_id()),
        Some(want)
    );
    assert_eq!(
        other
            .expect("ok")
            .and_then(|c| c.span_context())
            .map(|s| s.span_id()),
        Some(want)
    );
}

#[tokio::test]
async fn invalid_source_rank_is_an_error_on_every_rank() {
    let ranks = LocalCluster::new(2).broadcasters();
    for got in all(&ranks, 2, &span_cx(1)).await {
        assert!(
            matches!(
                got,
                Err(Error::InvalidRoot {
                    root: 2,
                    world_size: 2
                })
            ),
            "{got:?}"
        );
    }
}

#[tokio::test]
async fn oversized_carrier_fails_the_source_and_tells_the_others() {
    // A backend that takes at most 80 bytes: the carrier (traceparent + tracestate) is more.
    let ranks = LocalCluster::new(3)
        .timeout(Duration::from_secs(5))
        .max_payload(80)
        .broadcasters();
    let cx = span_cx(1);
    let started = std::time::Instant::now();
    let got = all(&ranks, 0, &cx).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "nobody waited for the timeout"
    );
    assert!(
        matches!(got[0], Err(Error::PayloadTooLarge { .. })),
        "{:?}",
        got[0]
    );
    for g in &got[1..] {
        assert!(matches!(g, Err(Error::SourceFailed { root: 0 })), "{g:?}");
    }
    // The group is still in step afterwards.
    let plain = Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(7u128.to_be_bytes()),
        SpanId::from_bytes(9u64.to_be_bytes()),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    ));
    for g in all(&ranks, 2, &plain).await {
        assert!(g.expect("ok").is_some());
    }
}

#[tokio::test]
async fn missing_source_is_a_timeout_naming_it() {
    let ranks = LocalCluster::new(3)
        .timeout(Duration::from_millis(200))
        .broadcasters();
    let got =
        futures::future::join_all(ranks[1..].iter().map(|b| broadcast_trace_context(b, 0))).await;
    for g in got {
        match g {
            Err(Error::Timeout { missing, after, .. }) => {
                assert_eq!(missing, vec![0]);
                assert!(
                    after >= Duration::from_millis(200) && after < Duration::from_secs(2),
                    "{after:?}"
                );
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}

#[test]
fn blocking_twins_work_across_threads() {
    let ranks = LocalCluster::new(4).broadcasters();
    let cx = span_cx(1);
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|b| {
                let cx = cx.clone();
                s.spawn(move || {
                    if b.rank() == 2 {
                        let _g = cx.attach();
                        blocking::broadcast_trace_context(b, 2)
                    } else {
                        blocking::broadcast_context(b, 2, &Context::new())
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for r in results {
        assert_eq!(
            r.expect("ok")
                .expect("some")
                .span_context()
                .map(|s| s.trace_id()),
            Some(cx.span().span_context().trace_id())
        );
    }
}

#[test]
fn forwarding_impls_and_dyn() {
    let ranks = LocalCluster::new(1).broadcasters();
    let b = &ranks[0];
    let boxed: Box<dyn Broadcaster> = Box::new(LocalCluster::new(1).broadcasters().remove(0));
    let arc: std::sync::Arc<dyn Broadcaster> =
        std::sync::Arc::new(LocalCluster::new(1).broadcasters().remove(0));
    assert_eq!(blocking::broadcast(&b, 0, Some(b"a")).expect("ok"), b"a");
    assert_eq!(
        blocking::broadcast(&boxed, 0, Some(b"b")).expect("ok"),
        b"b"
    );
    assert_eq!(blocking::broadcast(&arc, 0, Some(b"c")).expect("ok"), b"c");
    assert_eq!(boxed.world_size(), 1);
}

/// `broadcast_carrier`: a carrier made elsewhere (the Python package's propagators) goes out
/// as it is; one without a traceparent gives `None` everywhere; a damaged traceparent is
/// the source's error, and the others hear that the source failed instead of waiting.
#[tokio::test]
async fn a_carrier_made_elsewhere_is_broadcast_as_it_is() {
    let ranks = LocalCluster::new(3).broadcasters();
    let wire = br#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "k=v"}"#;
    let made = Carrier::decode(wire).expect("decodes");
    let cases: [(&str, Option<Carrier>); 3] = [
        ("a valid carrier", Some(made.clone())),
        (
            "no traceparent",
            Some(Carrier::decode(br#"{"baggage": "k=v"}"#).expect("ok")),
        ),
        ("no carrier at all", None),
    ];
    for (why, carrier) in cases {
        let got = futures::future::join_all(ranks.iter().map(|b| {
            let mine = (b.rank() == 1).then_some(carrier.as_ref()).flatten();
            lens_core::broadcast_carrier(b, 1, mine)
        }))
        .await;
        for (rank, r) in got.into_iter().enumerate() {
            let r = r.unwrap_or_else(|e| panic!("{why}, rank {rank}: {e}"));
            match (&carrier, r) {
                (Some(c), Some(out)) if c.get("traceparent").is_some() => {
                    assert_eq!(out.encode(), wire, "{why}, rank {rank}: bytes changed");
                    assert_eq!(out.source_rank(), Some(1), "{why}");
                }
                (_, None)
                    if carrier
                        .as_ref()
                        .is_none_or(|c| c.get("traceparent").is_none()) => {}
                (_, other) => panic!("{why}, rank {rank}: unexpected {other:?}"),
            }
        }
    }
    let mut bad = Carrier::new();
    bad.insert("traceparent", "00-not-a-traceparent");
    let got = futures::future::join_all(ranks.iter().map(|b| {
        let mine = (b.rank() == 0).then_some(&bad);
        lens_core::broadcast_carrier(b, 0, mine)
    }))
    .await;
    assert!(matches!(got[0], Err(Error::Config { .. })), "{:?}", got[0]);
    for r in &got[1..] {
        assert!(matches!(r, Err(Error::SourceFailed { root: 0 })), "{r:?}");
    }
}
