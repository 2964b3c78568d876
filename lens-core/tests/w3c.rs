//! The W3C trace-context test suite's traceparent/tracestate cases, one row each.

use lens_core::Carrier;
use lens_core::backend::w3c::{parse_traceparent, parse_tracestate};

const TID: &str = "12345678901234567890123456789012";
const SID: &str = "1234567890123456";

#[test]
fn traceparent_table() {
    let ok = |s: String| s;
    let rows: Vec<(&str, String, bool)> = vec![
        ("well-formed, sampled", format!("00-{TID}-{SID}-01"), true),
        ("not sampled", format!("00-{TID}-{SID}-00"), true),
        (
            "flags 03: sampled + random, what NeMo Lens emits",
            format!("00-{TID}-{SID}-03"),
            true,
        ),
        (
            "unknown flag bits are accepted",
            format!("00-{TID}-{SID}-ff"),
            true,
        ),
        (
            "leading and trailing OWS are trimmed",
            format!(" \t00-{TID}-{SID}-01\t "),
            true,
        ),
        (
            "version ff is forbidden",
            format!("ff-{TID}-{SID}-01"),
            false,
        ),
        (
            "future version with more fields",
            format!("cc-{TID}-{SID}-01-what-the-future-will-be-like"),
            true,
        ),
        (
            "future version, exactly 55 chars",
            format!("cc-{TID}-{SID}-01"),
            true,
        ),
        (
            "future version, extra data not after '-'",
            format!("cc-{TID}-{SID}-01.what-the-future-will-be-like"),
            false,
        ),
        (
            "version 00 with trailing data",
            format!("00-{TID}-{SID}-01-what-the-future-will-be-like"),
            false,
        ),
        (
            "version 00 with one extra char",
            format!("00-{TID}-{SID}-010"),
            false,
        ),
        (
            "version 00 with trailing '-'",
            format!("00-{TID}-{SID}-01-"),
            false,
        ),
        ("one-digit version", format!("0-{TID}-{SID}-01"), false),
        ("three-digit version", format!("000-{TID}-{SID}-01"), false),
        ("uppercase version", format!("0A-{TID}-{SID}-01"), false),
        ("non-hex version", format!("0x-{TID}-{SID}-01"), false),
        (
            "all-zero trace id",
            format!("00-{}-{SID}-01", "0".repeat(32)),
            false,
        ),
        (
            "trace id of 31 digits",
            format!("00-{}-{SID}-01", &TID[..31]),
            false,
        ),
        (
            "trace id of 33 digits",
            format!("00-{TID}3-{SID}-01"),
            false,
        ),
        (
            "uppercase trace id",
            format!("00-{}-{SID}-01", "ABCDEF78901234567890123456789012"),
            false,
        ),
        (
            "non-hex trace id",
            format!("00-{}-{SID}-01", "z2345678901234567890123456789012"),
            false,
        ),
        (
            "all-zero parent id",
            format!("00-{TID}-{}-01", "0".repeat(16)),
            false,
        ),
        (
            "parent id of 15 digits",
            format!("00-{TID}-{}-01", &SID[..15]),
            false,
        ),
        (
            "parent id of 17 digits",
            format!("00-{TID}-{SID}7-01"),
            false,
        ),
        (
            "uppercase parent id",
            format!("00-{TID}-{}-01", "ABCDEF7890123456"),
            false,
        ),
        ("one-digit flags", format!("00-{TID}-{SID}-1"), false),
        ("three-digit flags", format!("00-{TID}-{SID}-001"), false),
        ("uppercase flags", format!("00-{TID}-{SID}-0A"), false),
        ("non-hex flags", format!("00-{TID}-{SID}-0x"), false),
        (
            "leading '+' (Rust's from_str_radix would take it)",
            format!("00-+{}-{SID}-01", &TID[..31]),
            false,
        ),
        (
            "separator '_' instead of '-'",
            format!("00_{TID}-{SID}-01"),
            false,
        ),
        ("empty", ok(String::new()), false),
        (
            "garbage",
            ok("not a traceparent at all, but quite long enough to reach 55".into()),
            false,
        ),
        (
            "non-ASCII where hex is due",
            format!("00-{}é-{SID}-01", &TID[..30]),
            false,
        ),
    ];
    for (why, header, valid) in rows {
        let got = parse_traceparent(&header);
        assert_eq!(got.is_ok(), valid, "{why}: {header:?} -> {got:?}");
        // The carrier agrees with the parser.
        let carrier: Carrier = [("traceparent", header.as_str())].into_iter().collect();
        assert_eq!(carrier.span_context().is_some(), valid, "carrier: {why}");
    }
}

#[test]
fn traceparent_fields_are_kept() {
    let tp = parse_traceparent(&format!("00-{TID}-{SID}-03")).expect("valid");
    assert_eq!(tp.trace_id.to_string(), TID);
    assert_eq!(tp.span_id.to_string(), SID);
    assert_eq!(tp.flags.to_u8(), 3);
    assert_eq!(tp.version, 0);
}

fn members(n: usize) -> String {
    (0..n)
        .map(|i| format!("k{i}=v{i}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn tracestate_table() {
    let rows: Vec<(&str, String, bool)> = vec![
        ("one member", "foo=1".into(), true),
        ("two members", "foo=1,bar=2".into(), true),
        ("OWS around members", "foo=1 , \tbar=2 ".into(), true),
        ("empty members are allowed", "foo=1,,bar=2,".into(), true),
        ("32 members", members(32), true),
        ("33 members", members(33), false),
        (
            "32 members plus empty ones",
            format!("{},,,", members(32)),
            true,
        ),
        ("duplicate keys", "foo=1,foo=2".into(), false),
        ("multi-tenant key", "tenant@system=1".into(), true),
        (
            "tenant id may start with a digit",
            "1tenant@sys=1".into(),
            true,
        ),
        ("system id of 13 chars", "t@abcdefghijklm=1".into(), true),
        ("system id of 15 chars", "t@abcdefghijklmno=1".into(), false),
        ("system id starting with a digit", "t@1sys=1".into(), false),
        ("two '@' in a key", "a@b@c=1".into(), false),
        ("key chars _ - * /", "a_-*/z=1".into(), true),
        ("key of 256 chars", format!("{}=1", "a".repeat(256)), true),
        ("key of 257 chars", format!("{}=1", "a".repeat(257)), false),
        ("uppercase key", "Foo=1".into(), false),
        ("key starting with a digit", "1foo=1".into(), false),
        ("key with a dot", "foo.bar=1".into(), false),
        ("empty key", "=1".into(), false),
        ("no '='", "foo".into(), false),
        ("empty value", "foo=".into(), false),
        ("value with '='", "foo=a=b".into(), false),
        ("value with inner space", "foo=a b".into(), true),
        (
            "value of 256 chars",
            format!("foo={}", "v".repeat(256)),
            true,
        ),
        (
            "value of 257 chars",
            format!("foo={}", "v".repeat(257)),
            false,
        ),
        ("value with a control char", "foo=a\u{1}b".into(), false),
        ("value with non-ASCII", "foo=é".into(), false),
        (
            "printable punctuation in value",
            "foo=!\"#$%&'()*+-./:;<>?@[]^_`{|}~".into(),
            true,
        ),
    ];
    for (why, header, valid) in rows {
        let got = parse_tracestate(&header);
        assert_eq!(got.is_ok(), valid, "{why}: {header:?} -> {got:?}");
    }
}

#[test]
fn invalid_tracestate_is_dropped_but_traceparent_kept() {
    let tp = format!("00-{TID}-{SID}-01");
    let carrier: Carrier = [("traceparent", tp.as_str()), ("tracestate", "foo=1,foo=2")]
        .into_iter()
        .collect();
    let sc = carrier.span_context().expect("traceparent is valid");
    assert_eq!(sc.trace_state().header(), "");
    let carrier: Carrier = [
        ("traceparent", tp.as_str()),
        ("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    ]
    .into_iter()
    .collect();
    let sc = carrier.span_context().expect("valid");
    assert_eq!(sc.trace_state().get("congo"), Some("t61rcWkgMzE"));
    assert_eq!(
        sc.trace_state().header(),
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    );
}
