//! The guide's export page promises that the standard `OTEL_BSP_*` variables set the batch processor.
//! They are read from the process environment, so the check runs in a child process of this
//! test binary with the variables set (changing the environment of a threaded test is
//! unsound), under a deadline.

use std::process::Command;
use std::time::{Duration, Instant};

use lens_core::RankInfo;
use lens_otlp::{OtlpBuilder, Protocol};
use lens_testkit::otlp::Receiver;
use opentelemetry::trace::{Span as _, Tracer as _};

const CHILD: &str = "LENS_TEST_BSP_CHILD";
const SPANS: u64 = 10;

#[test]
fn bsp_variables_set_the_batch_processor() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let mut proc = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "bsp_variables_set_the_batch_processor",
            "--nocapture",
        ])
        .env(CHILD, "1")
        // Batches of at most 3, and no timed export before shutdown: ten spans ended at once
        // reach the receiver in four requests only if the size variable was read.
        .env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "3")
        .env("OTEL_BSP_SCHEDULE_DELAY", "60000")
        .spawn()
        .expect("spawn the child");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = proc.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = proc.kill();
            let _ = proc.wait();
            panic!("the child did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the child failed: {status}");
}

fn child() {
    let receiver = Receiver::start().expect("receiver");
    let guard = OtlpBuilder::new(RankInfo::new(0, 1).expect("rank"))
        .protocol(Protocol::Grpc)
        .endpoint(receiver.grpc_endpoint())
        .build()
        .expect("guard");
    let tracer = guard.tracer("bsp");
    for _ in 0..SPANS {
        tracer.start("step").end();
    }
    let stats = guard.shutdown().expect("nothing lost");
    assert_eq!(stats.exported, SPANS);
    assert_eq!(receiver.spans().len() as u64, SPANS);
    assert_eq!(
        receiver.requests(),
        SPANS.div_ceil(3),
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=3 should split {SPANS} spans into batches of 3"
    );
}
