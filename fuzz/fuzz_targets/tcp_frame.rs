//! Any bytes offered to a TCP rank: decoding never panics and never accepts a frame
//! without the key.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    assert!(!lens_tcp::fuzzing::accepts(
        b"fuzzing key, sixteen bytes+",
        data
    ));
});
