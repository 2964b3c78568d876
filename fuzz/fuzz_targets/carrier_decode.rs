//! Any bytes: decoding never panics; whatever decodes re-encodes to bytes that decode to
//! the same carrier; the W3C parsers never panic on any value.
#![no_main]

use lens_core::Carrier;
use lens_core::carrier::w3c::{parse_traceparent, parse_tracestate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(carrier) = Carrier::decode(data) {
        let again = Carrier::decode_with_limit(&carrier.encode(), usize::MAX)
            .expect("re-encoded carrier decodes");
        assert_eq!(again, carrier);
        let _ = carrier.span_context();
        let _ = carrier.context();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_traceparent(text);
        let _ = parse_tracestate(text);
    }
});
