"""lens for Python: a distributed job as one OpenTelemetry trace.

One rank's W3C trace context is broadcast to every rank in one collective, with a deadline,
over lens's transports: the TCP group that Rust ranks join too (:func:`tcp_group`), an
in-process cluster for tests (:func:`local_cluster`), or an existing ``torch.distributed``
group (:func:`torch_group`). :mod:`lens_trace.distributed` is a drop-in for
``nemo.lens.distributed``.
"""

from ._native import (
    MAX_CARRIER_LEN,
    Group,
    __version__,
    callback_group,
    decode_carrier,
    encode_carrier,
    local_cluster,
    tcp_group,
)
from .distributed import (
    RemoteCarrier,
    broadcast_trace_context,
    create_linked_span,
    get_group,
    inject_carrier,
    set_group,
)
from .errors import (
    AuthenticationError,
    BroadcastTimeout,
    ConfigError,
    DecodeError,
    GroupClosed,
    InvalidArgument,
    LensError,
    SourceFailed,
    TransportError,
    UnavailableError,
)
from .local import run_local
from .observe import OpenSpans, set_hang_provider, set_late_threshold
from .provider import RankIdGenerator, rank_resource, tracer_provider
from .sample import StepSampler
from .torch_group import torch_group

__all__ = [
    "MAX_CARRIER_LEN",
    "Group",
    "__version__",
    "callback_group",
    "decode_carrier",
    "encode_carrier",
    "local_cluster",
    "tcp_group",
    "run_local",
    "OpenSpans",
    "StepSampler",
    "set_late_threshold",
    "set_hang_provider",
    "torch_group",
    "RemoteCarrier",
    "broadcast_trace_context",
    "create_linked_span",
    "get_group",
    "inject_carrier",
    "set_group",
    "RankIdGenerator",
    "rank_resource",
    "tracer_provider",
    "AuthenticationError",
    "BroadcastTimeout",
    "ConfigError",
    "DecodeError",
    "GroupClosed",
    "InvalidArgument",
    "LensError",
    "SourceFailed",
    "TransportError",
    "UnavailableError",
]
