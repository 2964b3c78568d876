//! Carrier codec: Python vectors, table-driven encode/decode cases, and property tests.

use lens_core::{Carrier, CarrierError};
use proptest::prelude::*;

fn vectors() -> Vec<serde_json::Value> {
    let text = include_str!("data/python-lens-carriers.json");
    serde_json::from_str::<Vec<serde_json::Value>>(text).expect("test vectors parse")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The vendored copy must stay the same as the project's shared test data, where a checkout
/// has it beside the repository (CI and developers do).
#[test]
fn vendored_vectors_match_shared_testdata() {
    let shared = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/testdata/python-lens-carriers.json"
    );
    if let Ok(text) = std::fs::read_to_string(shared) {
        assert_eq!(
            text,
            include_str!("data/python-lens-carriers.json"),
            "vendored copy is stale"
        );
    }
}

#[test]
fn python_vectors_decode_and_reencode_byte_for_byte() {
    let vectors = vectors();
    assert!(vectors.len() >= 8);
    for v in vectors {
        let name = v["name"].as_str().expect("name");
        let bytes = hex(v["bytes_hex"].as_str().expect("bytes_hex"));
        let carrier =
            Carrier::decode(&bytes).unwrap_or_else(|e| panic!("{name}: decode failed: {e}"));
        let want = v["carrier"].as_object().expect("carrier object");
        let got: Vec<(&str, &str)> = carrier.iter().collect();
        let want: Vec<(&str, &str)> = want
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().expect("str")))
            .collect();
        assert_eq!(got, want, "{name}: entries (in order)");
        assert_eq!(
            carrier.encode(),
            bytes,
            "{name}: re-encoding must give Python's bytes"
        );
        let has_tp = carrier.get("traceparent").is_some();
        assert_eq!(
            carrier.span_context().is_some(),
            has_tp,
            "{name}: span context validity"
        );
    }
}

#[test]
fn flags_03_survive_decode_and_context() {
    let bytes = br#"{"traceparent": "00-a730702c5da0407868fceec263d12fa8-61c3575a070a00f5-03"}"#;
    let carrier = Carrier::decode(bytes).expect("decode");
    let sc = carrier.span_context().expect("valid");
    assert_eq!(sc.trace_flags().to_u8(), 0x03, "random bit kept");
    assert!(sc.is_sampled() && sc.is_remote());
    // Re-injecting the extracted context keeps all flag bits (the SDK propagator would not).
    let again = Carrier::from_context(&carrier.context());
    assert_eq!(again.encode(), bytes.to_vec());
}

/// One row per encoding case: (why, entries, Python's `json.dumps(...)` output).
#[test]
fn encode_table() {
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let rows: &[Row<'_>] = &[
        ("empty object", &[], "{}"),
        ("one entry", &[("a", "b")], r#"{"a": "b"}"#),
        (
            "order kept, Python separators",
            &[("z", "1"), ("a", "2")],
            r#"{"z": "1", "a": "2"}"#,
        ),
        (
            "quote and backslash",
            &[("k", "a\"b\\c")],
            r#"{"k": "a\"b\\c"}"#,
        ),
        (
            "short escapes",
            &[("k", "\n\r\t\u{8}\u{c}")],
            r#"{"k": "\n\r\t\b\f"}"#,
        ),
        (
            "other control chars",
            &[("k", "\u{1}\u{1f}")],
            r#"{"k": "\u0001\u001f"}"#,
        ),
        (
            "DEL is escaped by ensure_ascii",
            &[("k", "\u{7f}")],
            r#"{"k": "\u007f"}"#,
        ),
        ("slash is not escaped", &[("k", "a/b")], r#"{"k": "a/b"}"#),
        ("latin-1", &[("k", "é")], r#"{"k": "\u00e9"}"#),
        ("BMP char", &[("k", "€")], r#"{"k": "\u20ac"}"#),
        (
            "astral char as surrogate pair",
            &[("k", "😀")],
            r#"{"k": "\ud83d\ude00"}"#,
        ),
        (
            "non-ASCII key",
            &[("ключ", "v")],
            r#"{"\u043a\u043b\u044e\u0447": "v"}"#,
        ),
        ("mixed", &[("k", "a€b\nc")], r#"{"k": "a\u20acb\nc"}"#),
    ];
    for (why, entries, want) in rows {
        let carrier: Carrier = entries.iter().copied().collect();
        let got = String::from_utf8(carrier.encode()).expect("ascii");
        assert_eq!(&got, want, "encode: {why}");
        let back = Carrier::decode(want.as_bytes()).unwrap_or_else(|e| panic!("decode {why}: {e}"));
        assert_eq!(back, carrier, "round trip: {why}");
    }
}

/// One row per decoding case: (why, input, expected result).
#[test]
fn decode_table() {
    type Want = Result<Vec<(&'static str, &'static str)>, CarrierError>;
    let big = format!(r#"{{"k": "{}"}}"#, "x".repeat(Carrier::DEFAULT_MAX_LEN));
    let rows: Vec<(&str, &[u8], Want)> = vec![
        ("compact JSON", br#"{"a":"b"}"#, Ok(vec![("a", "b")])),
        (
            "whitespace everywhere",
            b" \n{ \"a\" :\t\"b\" ,\r\"c\":\"d\" } \n",
            Ok(vec![("a", "b"), ("c", "d")]),
        ),
        (
            "escaped slash and unicode",
            br#"{"a": "\/\u00e9\ud83d\ude00"}"#,
            Ok(vec![("a", "/é😀")]),
        ),
        (
            "raw UTF-8 accepted",
            "{\"a\": \"é\"}".as_bytes(),
            Ok(vec![("a", "é")]),
        ),
        ("empty input", b"", Err(CarrierError::UnexpectedEnd)),
        ("only whitespace", b"  ", Err(CarrierError::UnexpectedEnd)),
        (
            "array is not an object",
            b"[]",
            Err(CarrierError::NotAnObject),
        ),
        (
            "string is not an object",
            br#""a""#,
            Err(CarrierError::NotAnObject),
        ),
        (
            "null is not an object",
            b"null",
            Err(CarrierError::NotAnObject),
        ),
        (
            "number value",
            br#"{"a": 1}"#,
            Err(CarrierError::NonStringValue { key: "a".into() }),
        ),
        (
            "null value",
            br#"{"a": null}"#,
            Err(CarrierError::NonStringValue { key: "a".into() }),
        ),
        (
            "nested object value",
            br#"{"a": {"b": "c"}}"#,
            Err(CarrierError::NonStringValue { key: "a".into() }),
        ),
        (
            "array value",
            br#"{"a": ["b"]}"#,
            Err(CarrierError::NonStringValue { key: "a".into() }),
        ),
        (
            "truncated after brace",
            b"{",
            Err(CarrierError::UnexpectedEnd),
        ),
        (
            "truncated in key",
            br#"{"a"#,
            Err(CarrierError::UnexpectedEnd),
        ),
        (
            "truncated in value",
            br#"{"a": "b"#,
            Err(CarrierError::UnexpectedEnd),
        ),
        (
            "truncated before close",
            br#"{"a": "b""#,
            Err(CarrierError::UnexpectedEnd),
        ),
        (
            "truncated escape",
            br#"{"a": "\u00"#,
            Err(CarrierError::UnexpectedEnd),
        ),
        (
            "invalid UTF-8",
            b"{\"a\": \"\xff\"}",
            Err(CarrierError::InvalidUtf8 { offset: 7 }),
        ),
        (
            "overlong UTF-8",
            b"{\"a\": \"\xc0\xaf\"}",
            Err(CarrierError::InvalidUtf8 { offset: 7 }),
        ),
        (
            "trailing data",
            br#"{"a": "b"} x"#,
            Err(CarrierError::TrailingData { offset: 11 }),
        ),
        (
            "two objects",
            br#"{}{}"#,
            Err(CarrierError::TrailingData { offset: 2 }),
        ),
        (
            "trailing comma",
            br#"{"a": "b",}"#,
            Err(CarrierError::Syntax {
                offset: 10,
                expected: "a string key",
            }),
        ),
        (
            "missing colon",
            br#"{"a" "b"}"#,
            Err(CarrierError::Syntax {
                offset: 5,
                expected: "':' after a key",
            }),
        ),
        (
            "unquoted key",
            br#"{a: "b"}"#,
            Err(CarrierError::Syntax {
                offset: 1,
                expected: "a string key",
            }),
        ),
        (
            "single quotes",
            br#"{'a': 'b'}"#,
            Err(CarrierError::Syntax {
                offset: 1,
                expected: "a string key",
            }),
        ),
        (
            "raw newline in string",
            b"{\"a\": \"b\nc\"}",
            Err(CarrierError::Syntax {
                offset: 8,
                expected: "no raw control character inside a string",
            }),
        ),
        (
            "unknown escape",
            br#"{"a": "\x"}"#,
            Err(CarrierError::InvalidEscape { offset: 7 }),
        ),
        (
            "lone high surrogate",
            br#"{"a": "\ud83d"}"#,
            Err(CarrierError::InvalidEscape { offset: 7 }),
        ),
        (
            "lone low surrogate",
            br#"{"a": "\ude00"}"#,
            Err(CarrierError::InvalidEscape { offset: 7 }),
        ),
        (
            "non-hex unicode escape",
            br#"{"a": "\u00zz"}"#,
            Err(CarrierError::InvalidEscape { offset: 9 }),
        ),
        (
            "duplicate key",
            br#"{"a": "1", "a": "2"}"#,
            Err(CarrierError::DuplicateKey { key: "a".into() }),
        ),
        (
            "oversized",
            big.as_bytes(),
            Err(CarrierError::TooLarge {
                len: big.len(),
                limit: Carrier::DEFAULT_MAX_LEN,
            }),
        ),
    ];
    for (why, input, want) in rows {
        let got = Carrier::decode(input).map(|c| {
            c.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect::<Vec<_>>()
        });
        let want = want.map(|v| {
            v.into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect::<Vec<_>>()
        });
        assert_eq!(
            got,
            want,
            "decode: {why} (input {:?})",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn limit_is_configurable() {
    let bytes = br#"{"a": "bcdef"}"#;
    assert!(Carrier::decode_with_limit(bytes, bytes.len()).is_ok());
    assert_eq!(
        Carrier::decode_with_limit(bytes, bytes.len() - 1),
        Err(CarrierError::TooLarge {
            len: bytes.len(),
            limit: bytes.len() - 1
        })
    );
}

#[test]
fn carrier_map_operations() {
    let mut c = Carrier::new();
    c.insert("traceparent", "a");
    c.insert("baggage", "b");
    c.insert("traceparent", "c");
    assert_eq!(
        c.iter().collect::<Vec<_>>(),
        vec![("traceparent", "c"), ("baggage", "b")]
    );
    assert_eq!(
        c.get("TraceParent"),
        Some("c"),
        "header names are case-insensitive"
    );
    assert_eq!(c.remove("baggage"), Some("b".to_owned()));
    assert_eq!(c.len(), 1);
}

fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::collection::vec((any::<String>(), any::<String>()), 0..6).prop_map(|v| {
        let mut seen = std::collections::HashSet::new();
        v.into_iter()
            .filter(|(k, _)| seen.insert(k.clone()))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Carrier::decode(&bytes);
    }

    #[test]
    fn encode_decode_round_trips(entries in entries()) {
        let carrier: Carrier = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bytes = carrier.encode();
        prop_assert!(bytes.is_ascii(), "ensure_ascii output");
        prop_assert_eq!(Carrier::decode_with_limit(&bytes, usize::MAX).expect("decodes"), carrier);
    }

    #[test]
    fn encode_matches_serde_json_semantics(entries in entries()) {
        // serde_json reads back the same map: the output is valid JSON with the same strings.
        let carrier: Carrier = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&carrier.encode()).expect("valid JSON");
        prop_assert_eq!(parsed.len(), entries.len());
        for (k, v) in &entries {
            prop_assert_eq!(parsed.get(k).and_then(|x| x.as_str()), Some(v.as_str()));
        }
    }

    #[test]
    fn mutated_valid_input_never_panics(entries in entries(), at in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
        let carrier: Carrier = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut bytes = carrier.encode();
        let i = at % bytes.len();
        bytes[i] = byte;
        let _ = Carrier::decode(&bytes);
        bytes.truncate(cut % (bytes.len() + 1));
        let _ = Carrier::decode(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// Any baggage name/value survives inject -> encode -> decode -> extract.
    #[test]
    fn baggage_round_trips(pairs in proptest::collection::vec(("[a-z][a-z0-9._-]{0,12}", "\\PC{1,24}"), 1..6)) {
        use opentelemetry::baggage::BaggageExt;
        use opentelemetry::{Context, KeyValue};
        let mut want = std::collections::BTreeMap::new();
        for (k, v) in &pairs {
            // Leading/trailing spaces are not significant in W3C baggage values.
            want.insert(k.clone(), v.trim().to_owned());
        }
        want.retain(|_, v| !v.is_empty());
        let cx = Context::new().with_baggage(want.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
        let bytes = Carrier::from_context(&cx).encode();
        let back = Carrier::decode(&bytes).expect("decodes").context();
        let got: std::collections::BTreeMap<String, String> =
            back.baggage().iter().map(|(k, (v, _))| (k.to_string(), v.to_string())).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn compact_and_general_forms_behave_the_same() {
    // Canonical bytes (kept as they are) and the same entries written with other spacing
    // (decoded into separate strings) give equal carriers with equal behaviour.
    let canonical = br#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "k=v"}"#;
    let spaced = b"{ \"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\",\n \"baggage\" : \"k=v\" }";
    let a = Carrier::decode(canonical).expect("canonical");
    let b = Carrier::decode(spaced).expect("spaced");
    assert_eq!(a, b);
    assert_eq!(a.encode(), b.encode());
    assert_eq!(
        a.to_bytes().as_ref(),
        canonical.as_slice(),
        "canonical bytes are kept as received"
    );
    assert_eq!(a.get("BAGGAGE"), Some("k=v"));
    assert_eq!(a.span_context(), b.span_context());

    // Editing a compact carrier works and invalidates the cached span context.
    let mut c = a.clone();
    assert!(c.span_context().is_some());
    c.insert("traceparent", "not valid");
    assert!(c.span_context().is_none());
    c.insert("tracestate", "x=1");
    assert_eq!(
        c.iter().collect::<Vec<_>>(),
        vec![
            ("traceparent", "not valid"),
            ("baggage", "k=v"),
            ("tracestate", "x=1")
        ]
    );
    assert_eq!(c.remove("baggage"), Some("k=v".to_owned()));
    assert_eq!(c.len(), 2);
    let mut d = a.clone();
    assert_eq!(
        d.remove("traceparent").as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    assert!(d.span_context().is_none());
    assert_eq!(a.len(), 2, "clones are independent");
}

#[test]
fn canonical_edge_cases() {
    let rows: &[(&str, &[u8], Result<usize, ()>)] = &[
        ("empty object", b"{}", Ok(0)),
        (
            "five entries (more than kept inline)",
            br#"{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}"#,
            Ok(5),
        ),
        (
            "escaped quote falls back to the general decoder",
            br#"{"a": "x\"y"}"#,
            Ok(1),
        ),
        ("non-ASCII falls back", "{\"a\": \"é\"}".as_bytes(), Ok(1)),
        (
            "duplicate in canonical form",
            br#"{"a": "1", "a": "2"}"#,
            Err(()),
        ),
        ("canonical prefix, trailing bytes", br#"{"a": "1"} "#, Ok(1)),
        (
            "canonical prefix, garbage after",
            br#"{"a": "1"}x"#,
            Err(()),
        ),
        ("missing close", br#"{"a": "1""#, Err(())),
        ("one space too few", br#"{"a":"1"}"#, Ok(1)),
    ];
    for (why, input, want) in rows {
        let got = Carrier::decode(input).map(|c| c.len()).map_err(|_| ());
        assert_eq!(&got, want, "{why}");
        if let Ok(c) = Carrier::decode(input) {
            assert_eq!(
                Carrier::decode(&c.encode()).expect("re-encoded decodes"),
                c,
                "{why}: round trip"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Canonical bytes and a re-spaced copy decode to the same carrier.
    #[test]
    fn spacing_does_not_change_the_carrier(entries in entries()) {
        let carrier: Carrier = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let canonical = carrier.encode();
        let text = String::from_utf8(canonical.clone()).expect("ascii");
        // Whitespace only where it cannot fall inside a string: after '{' and before '}'.
        let spaced = format!("{{ \n{}\t}}", &text[1..text.len() - 1]);
        let a = Carrier::decode_with_limit(&canonical, usize::MAX).expect("canonical decodes");
        let b = Carrier::decode_with_limit(spaced.as_bytes(), usize::MAX).expect("spaced decodes");
        prop_assert_eq!(&a, &carrier);
        prop_assert_eq!(a.encode(), canonical);
        prop_assert_eq!(&b, &carrier);
    }
}
