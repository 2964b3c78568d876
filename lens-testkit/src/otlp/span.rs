//! A received span, flattened with its resource, in types a test can compare.

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, Span};

/// How a batch reached the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP protobuf at `/v1/traces`.
    Http,
}

/// A link as received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedLink {
    /// The linked span's trace.
    pub trace_id: TraceId,
    /// The linked span.
    pub span_id: SpanId,
    /// The link's attributes.
    pub attributes: Vec<(String, Value)>,
}

impl ReceivedLink {
    /// An integer attribute.
    pub fn int(&self, key: &str) -> Option<i64> {
        find(&self.attributes, key).and_then(Value::as_int)
    }

    /// A string attribute.
    pub fn str(&self, key: &str) -> Option<String> {
        find(&self.attributes, key).and_then(Value::as_str)
    }
}

/// An attribute value as received (the kinds lens writes; others as their debug text).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// An array of integers (an empty array is one too).
    Ints(Vec<i64>),
    /// Anything else, as text.
    Other(String),
}

impl Value {
    fn from_proto(v: Option<&AnyValue>) -> Self {
        match v.and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => Value::Str(s.clone()),
            Some(any_value::Value::IntValue(i)) => Value::Int(*i),
            Some(any_value::Value::DoubleValue(d)) => Value::Double(*d),
            Some(any_value::Value::BoolValue(b)) => Value::Bool(*b),
            Some(any_value::Value::ArrayValue(a)) => {
                let ints: Option<Vec<i64>> = a
                    .values
                    .iter()
                    .map(|v| match v.value {
                        Some(any_value::Value::IntValue(i)) => Some(i),
                        _ => None,
                    })
                    .collect();
                ints.map_or_else(|| Value::Other(format!("{a:?}")), Value::Ints)
            }
            other => Value::Other(format!("{other:?}")),
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<String> {
        match self {
            Value::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// The integers, if this is an array of them.
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Value::Ints(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// One span as the receiver decoded it, with its resource and scope.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// How it arrived.
    pub via: Via,
    /// The resource's attributes.
    pub resource: Vec<(String, Value)>,
    /// The instrumentation scope's name.
    pub scope: String,
    /// The span's name.
    pub name: String,
    /// Its trace.
    pub trace_id: TraceId,
    /// Its id.
    pub span_id: SpanId,
    /// Its parent (`SpanId::INVALID` for a root).
    pub parent_span_id: SpanId,
    /// Its attributes.
    pub attributes: Vec<(String, Value)>,
    /// Its links.
    pub links: Vec<ReceivedLink>,
    /// Links the SDK dropped (over its limit).
    pub dropped_links_count: u32,
    /// The OTLP span kind number (1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    /// Its start, in nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// Its end, in nanoseconds since the Unix epoch.
    pub end_unix_nano: u64,
    /// Its W3C tracestate, as sent (empty when it had none).
    pub trace_state: String,
}

impl ReceivedSpan {
    /// An integer resource attribute.
    pub fn resource_int(&self, key: &str) -> Option<i64> {
        find(&self.resource, key).and_then(Value::as_int)
    }

    /// A string resource attribute.
    pub fn resource_str(&self, key: &str) -> Option<String> {
        find(&self.resource, key).and_then(Value::as_str)
    }

    /// An integer span attribute.
    pub fn int(&self, key: &str) -> Option<i64> {
        find(&self.attributes, key).and_then(Value::as_int)
    }

    /// A string span attribute.
    pub fn str(&self, key: &str) -> Option<String> {
        find(&self.attributes, key).and_then(Value::as_str)
    }

    /// An integer-array span attribute.
    pub fn ints(&self, key: &str) -> Option<Vec<i64>> {
        find(&self.attributes, key).and_then(Value::as_ints)
    }

    /// The rank of the resource (`nv.dl.rank`).
    pub fn rank(&self) -> Option<usize> {
        self.resource_int("nv.dl.rank")
            .and_then(|r| usize::try_from(r).ok())
    }
}

fn find<'a>(attrs: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn pairs(kvs: &[KeyValue]) -> Vec<(String, Value)> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), Value::from_proto(kv.value.as_ref())))
        .collect()
}

fn trace_id(bytes: &[u8]) -> TraceId {
    <[u8; 16]>::try_from(bytes).map_or(TraceId::INVALID, TraceId::from_bytes)
}

fn span_id(bytes: &[u8]) -> SpanId {
    <[u8; 8]>::try_from(bytes).map_or(SpanId::INVALID, SpanId::from_bytes)
}

fn flatten_span(via: Via, resource: &[(String, Value)], scope: &str, s: &Span) -> ReceivedSpan {
    ReceivedSpan {
        via,
        resource: resource.to_vec(),
        scope: scope.to_owned(),
        name: s.name.clone(),
        trace_id: trace_id(&s.trace_id),
        span_id: span_id(&s.span_id),
        parent_span_id: span_id(&s.parent_span_id),
        attributes: pairs(&s.attributes),
        links: s
            .links
            .iter()
            .map(|l| ReceivedLink {
                trace_id: trace_id(&l.trace_id),
                span_id: span_id(&l.span_id),
                attributes: pairs(&l.attributes),
            })
            .collect(),
        dropped_links_count: s.dropped_links_count,
        kind: s.kind,
        start_unix_nano: s.start_time_unix_nano,
        end_unix_nano: s.end_time_unix_nano,
        trace_state: s.trace_state.clone(),
    }
}

/// Every span of an export request, flattened.
pub(crate) fn flatten(via: Via, request: &[ResourceSpans]) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in request {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| pairs(&r.attributes))
            .unwrap_or_default();
        for ss in &rs.scope_spans {
            let scope = ss
                .scope
                .as_ref()
                .map(|s| s.name.as_str())
                .unwrap_or_default();
            for s in &ss.spans {
                out.push(flatten_span(via, &resource, scope, s));
            }
        }
    }
    out
}
