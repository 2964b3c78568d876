"""The carrier: the Python SDK's W3C propagators on one side, NeMo Lens's bytes on the wire."""

import json

import pytest
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import lens_trace
from conftest import TESTDATA

ROWS = json.loads(TESTDATA.read_text())
W3C = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_carriers_made_by_the_python_stack_round_trip_byte_for_byte(row):
    wire = bytes.fromhex(row["bytes_hex"])
    assert lens_trace.encode_carrier(row["carrier"]) == wire, f"{row['name']}: encode differs from NeMo Lens's bytes"
    assert lens_trace.decode_carrier(wire) == row["carrier"], f"{row['name']}: decode"
    # What lens_trace's source injects from that context is the same carrier again.
    if "traceparent" in row["carrier"]:
        again = lens_trace.inject_carrier(W3C.extract(row["carrier"]))
        assert lens_trace.encode_carrier(again) == wire, f"{row['name']}: re-injected carrier {again}"


@pytest.mark.parametrize(
    "data, why",
    [
        (b"", "empty"),
        (b"[1, 2]", "not an object"),
        (b'{"traceparent": 1}', "a value that is not a string"),
        (b'{"a": "b"', "truncated"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"a": "' + b"x" * (lens_trace.MAX_CARRIER_LEN + 1) + b'"}', "over the size limit"),
    ],
)
def test_bad_bytes_raise_decode_error(data, why):
    with pytest.raises(lens_trace.DecodeError) as e:
        lens_trace.decode_carrier(data)
    assert isinstance(e.value, ValueError), why
    assert e.value.kind == "decode", why


@pytest.mark.parametrize("carrier", [{"traceparent": 1}, {1: "x"}, {"a": None}])
def test_a_carrier_maps_str_to_str(carrier):
    with pytest.raises(TypeError):
        lens_trace.encode_carrier(carrier)
