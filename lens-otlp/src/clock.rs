//! Exported spans on the reference clock: each span is moved by this rank's clock offset
//! as it ends, so a span keeps the figure in force when it ended even when the offset is
//! measured again before its batch is sent.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use lens_core::ClockOffset;
use lens_core::clock::keys;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SpanData;

/// This rank's clock offset in force, and the one the resource names.
#[derive(Debug)]
pub(crate) struct ClockShift {
    /// What the resource says (`OtlpBuilder::clock_offset`), fixed for the provider's life.
    in_resource: Option<ClockOffset>,
    now: Mutex<Option<ClockOffset>>,
}

impl ClockShift {
    pub(crate) fn new(in_resource: Option<ClockOffset>) -> Self {
        ClockShift {
            in_resource,
            now: Mutex::new(in_resource),
        }
    }

    fn now(&self) -> MutexGuard<'_, Option<ClockOffset>> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The offset measured again: spans that end from now on are moved by it.
    pub(crate) fn set(&self, clock: ClockOffset) {
        *self.now() = Some(clock);
    }

    /// Moves `span` (start, end, events) onto the reference clock by the offset in force.
    /// A span moved by another figure than the resource's carries that figure as its own
    /// `lens.clock.offset_ns` and `lens.clock.error_ns`, so its own clock's times stay
    /// known: the exported time plus the offset.
    pub(crate) fn apply(&self, span: &mut SpanData) {
        let Some(clock) = *self.now() else {
            return;
        };
        let ns = clock.offset_ns;
        if ns != 0 {
            span.start_time = shifted(span.start_time, ns);
            span.end_time = shifted(span.end_time, ns);
            for e in &mut span.events.events {
                e.timestamp = shifted(e.timestamp, ns);
            }
        }
        if self.in_resource != Some(clock) {
            span.attributes.push(KeyValue::new(keys::OFFSET_NS, ns));
            span.attributes.push(KeyValue::new(
                keys::ERROR_NS,
                i64::try_from(clock.error_ns).unwrap_or(i64::MAX),
            ));
        }
    }
}

/// `t` moved back by `ns` nanoseconds (forward when negative).
fn shifted(t: SystemTime, ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        t.checked_sub(d).unwrap_or(t)
    } else {
        t.checked_add(d).unwrap_or(t)
    }
}
