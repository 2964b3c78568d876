"""Exceptions raised by lens_trace. Every one is a :class:`LensError`.

Each one's message is the Rust error with its whole chain of causes (what lens was
doing, then what the system or library answered), also kept in ``detail``, and a short
``kind``; a :class:`BroadcastTimeout` also says which ranks never arrived.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

__all__ = [
    "LensError",
    "BroadcastTimeout",
    "DecodeError",
    "AuthenticationError",
    "InvalidArgument",
    "ConfigError",
    "UnavailableError",
    "SourceFailed",
    "GroupClosed",
    "TransportError",
]


class LensError(Exception):
    """Base class of every lens_trace error."""

    kind: str
    detail: str

    def __init__(self, message: str, *, kind: str = "error", detail: Optional[str] = None, **extra: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail if detail is not None else message
        for name, value in extra.items():
            setattr(self, name, value)


class BroadcastTimeout(LensError, TimeoutError):
    """Some ranks did not take part in a broadcast (or a join) within the deadline.

    ``missing_ranks`` lists them where the transport can tell (TCP and the in-process
    cluster can; a collective such as torch's cannot, and leaves it empty); ``after`` is
    how many seconds this rank waited. ``last_seen`` maps a missing rank to the last round
    this rank knows it took part in (0: none yet), where the transport knows (TCP's rank 0,
    the in-process cluster): a rank stuck since an earlier step shows an older round.
    ``via`` is how this rank knows of ``missing_ranks`` when another rank found them
    missing: the rank it waited for, then the rank that one waits for, and so on (``[0]``:
    "waiting for rank 0, which is waiting for ``missing_ranks``"); empty when this rank
    found them missing itself.
    """

    missing_ranks: List[int]
    after: Optional[float]
    last_seen: Dict[int, int]
    via: List[int]

    def __init__(
        self,
        message: str,
        *,
        missing_ranks: Optional[List[int]] = None,
        after: Optional[float] = None,
        last_seen: Optional[Dict[int, int]] = None,
        via: Optional[List[int]] = None,
        **kw: Any,
    ) -> None:
        kw.setdefault("kind", "timeout")
        super().__init__(message, **kw)
        self.missing_ranks = list(missing_ranks or [])
        self.after = after
        self.last_seen = dict(last_seen or {})
        self.via = list(via or [])


class DecodeError(LensError, ValueError):
    """Received bytes are not a valid carrier (or a frame was damaged)."""


class AuthenticationError(LensError):
    """A peer or a frame failed authentication (a wrong job key, a replayed frame)."""


class InvalidArgument(LensError, ValueError):
    """A call's arguments are wrong: a root outside the group, a carrier over the limit."""


class ConfigError(LensError, ValueError):
    """The group's settings or the environment are invalid, or ranks disagree about them.

    ``setting`` names the setting at fault where there is one (the environment variable
    that did not parse, such as ``"LENS_TCP_TIMEOUT"``), else ``None``. Where ranks
    disagree, ``disagreement`` says about what: ``"root"`` (the calling code did not call
    the same collective on every rank), ``"slab_size"``, ``"group"`` (world sizes, a group
    formed twice) or ``"format"`` (another program's collective, another lens version);
    ``None`` for a setting's error.
    """

    setting: Optional[str] = None
    disagreement: Optional[str] = None


class UnavailableError(LensError, RuntimeError):
    """The backend cannot run here (torch missing, a process group not initialised)."""


class SourceFailed(LensError):
    """The source rank failed before sending its trace context (``source_rank`` says which)."""

    source_rank: Optional[int] = None


class GroupClosed(LensError):
    """The group was closed, or an earlier failed round left this rank out of step."""


class TransportError(LensError, ConnectionError):
    """The transport failed; ``detail`` holds its own error."""
