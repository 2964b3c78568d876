"""Type stubs of the Rust extension module lens_trace._native."""

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

MAX_CARRIER_LEN: int
__version__: str

class Group:
    """One rank of a lens group; every wait is bounded and releases the GIL."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def timeout(self) -> Optional[float]: ...
    def take_arrivals(
        self, later_than_ns: Optional[int] = None, most: Optional[int] = None
    ) -> Optional[Tuple[int, int, List[Tuple[int, int]]]]:
        """How the ranks came to the last round this rank was the source of, where the
        transport knows: ``(last_rank, spread_ns, [(rank, ns_after_first), ...])``, latest
        first, only those later than ``later_than_ns`` and at most ``most`` where given;
        taken (asked once)."""
    def rounds_started(self) -> Optional[int]:
        """How many rounds this rank has started, where the transport counts them."""
    def clock_offsets(self, reference: int = 0, repetitions: int = 4) -> List[Tuple[int, int]]:
        """Every rank's ``(offset_ns, error_ns)`` from ``reference``'s clock; collective."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def broadcast(self, root: int, payload: Optional[bytes] = None) -> bytes: ...
    def broadcast_carrier(
        self, src_rank: int, carrier: Optional[Dict[str, str]] = None
    ) -> Optional[Dict[str, str]]: ...
    def broadcast_map(self, src_rank: int, carrier: Optional[Dict[str, str]] = None) -> Dict[str, str]: ...
    def broadcast_w3c(
        self,
        src_rank: int,
        ids: Optional[Tuple[int, int, int]] = None,
        tracestate: Optional[str] = None,
        baggage: Optional[str] = None,
        into: Optional[Dict[str, str]] = None,
    ) -> Dict[str, str]:
        """``broadcast_map`` for the default W3C pair, the source's carrier written from
        its span context's parts and headers; the result put into ``into`` where given."""
    def sample(self, rules: Optional[str] = None) -> None:
        """Decides this rank's steps with lens's step sampler (rules as ``LENS_SAMPLE``
        takes them; ``None``: that variable's); ``lens_trace.StepSampler`` holds the spans."""
    def sample_step(self) -> Optional[int]:
        """The current step in the source's count, or ``None`` where the group does not sample."""
    def sample_decisions(self, since: int = 0) -> List[Tuple[int, Optional[str], str]]:
        """The steps decided after ``since``: ``(step, reason or None when dropped, th)``."""
    def sample_vote(self) -> None:
        """Votes to keep this rank's current step on every rank."""
    def flush(self) -> None:
        """A TCP group with ``source_returns="queued"``: waits until the last round this rank
        was the source of has reached every rank and raises its failure; else returns."""
    def close(self) -> None:
        """Leaves the group (flushing a queued TCP group first, raising its failure)."""
    def __enter__(self) -> "Group": ...
    def __exit__(self, *args: Any) -> None: ...

def tcp_group(
    *,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    addr: Optional[str] = None,
    key: Union[str, bytes, None] = None,
    timeout: Optional[float] = None,
    join_timeout: Optional[float] = None,
    fan_out: Optional[int] = None,
    source_returns: Optional[str] = None,
    spin_us: Optional[int] = None,
) -> Group: ...
def local_cluster(world_size: int, *, timeout: Optional[float] = None) -> List[Group]: ...
def callback_group(
    collective: Callable[[bytearray, int, float], Any],
    rank: int,
    world_size: int,
    *,
    timeout: Optional[float] = None,
    slab_size: Optional[int] = None,
    gather: Optional[Callable[[int, int, float], List[int]]] = None,
    arrivals_every: int = 0,
) -> Group: ...
def encode_carrier(carrier: Dict[str, str]) -> bytes: ...
def decode_carrier(data: bytes) -> Dict[str, str]: ...
