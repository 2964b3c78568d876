//! A guard made global flushes a hang report before the timeout error returns: the receiver
//! already holds the `lens.hang` span when the caller sees the error, though the batch
//! processor would otherwise hold it for seconds. (Its own process: it sets the global
//! tracer provider.)

use std::time::Duration;

use lens_core::hang::keys;
use lens_core::{Error, RankInfo, blocking};
use lens_otlp::OtlpBuilder;
use lens_testkit::LocalCluster;
use lens_testkit::otlp::Receiver;
use opentelemetry::trace::{Span as _, Tracer as _};

#[test]
fn the_hang_report_reaches_the_receiver_before_the_error_returns() {
    let receiver = Receiver::start().expect("receiver");
    let guard = OtlpBuilder::new(RankInfo::single())
        .endpoint(receiver.http_endpoint())
        .build()
        .expect("guard");
    guard.set_global();
    let ranks = LocalCluster::new(2)
        .timeout(Duration::from_millis(200))
        .broadcasters();
    let mut step = guard.tracer("t").start("train_step");
    // Rank 1 never comes.
    let got = blocking::broadcast(&ranks[0], 0, Some(b"step"));
    assert!(
        matches!(&got, Err(Error::Timeout { missing, .. }) if missing == &vec![1]),
        "{got:?}"
    );
    let now = receiver.spans();
    let hang = now
        .iter()
        .find(|s| s.name == keys::SPAN)
        .unwrap_or_else(|| {
            panic!(
                "no lens.hang yet: {:?}",
                now.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(hang.int(keys::RANK), Some(0));
    assert_eq!(hang.int(keys::ROUND), Some(1));
    // The step is still open: it was not exported.
    assert!(now.iter().all(|s| s.name != "train_step"));
    step.end();
    guard.shutdown().expect("exported");
}
