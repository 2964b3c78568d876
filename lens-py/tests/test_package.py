"""The installed package says what it is: its README is the long description."""

from importlib import metadata


def test_the_metadata_describes_the_package():
    meta = metadata.metadata("lens-trace")
    assert "drop-in" in meta["Summary"]
    body = meta.get_payload() or meta.get("Description", "")
    assert "from lens_trace.distributed import broadcast_trace_context" in body, "the README is the long description"
    assert "maturin build --release" in body
    assert meta["License"] == "Apache-2.0" or "Apache" in (meta.get("License-Expression") or meta.get("License") or "")
    assert "opentelemetry" in (meta["Keywords"] or "")
