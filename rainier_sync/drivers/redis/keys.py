"""Where the Redis driver keeps a queue's data: the key names, on one server and on Redis Cluster.

On one server (or a master Sentinel watches) every key is ``P<queue>:…`` under
the prefix ``P``, with ``Pqueues``, ``Pfailed``, ``Pfailed:index`` and
``Pwake:sent`` shared by every queue: the layout stored jobs already have.

On Redis Cluster a script may only touch keys of one hash slot, so each queue's
keys carry its name as a hash tag, ``P{<queue>}:…``: a queue lives in one slot,
and different queues spread over the slots. The failed store and the wake-up
flag are then per queue (``P{<queue>}:failed``, ``P{<queue>}:wake:sent``);
``Pqueues`` stays one set, written by the client rather than by a script.
"""

from __future__ import annotations

from ...errors import ConfigurationError, PayloadError

__all__ = ["_Keys"]


class _Keys:
    """Key names under ``prefix``, tagged per queue when ``cluster``."""

    __slots__ = ("prefix", "cluster")

    def __init__(self, prefix: str, cluster: bool = False) -> None:
        if cluster and ("{" in prefix or "}" in prefix):
            raise ConfigurationError(
                f"redis connection: prefix {prefix!r} holds a brace; on Redis Cluster the driver puts each "
                "queue's name in braces (a hash tag), and a brace in the prefix would put every queue in one slot"
            )
        self.prefix = prefix
        self.cluster = cluster

    def base(self, queue: str) -> str:
        """What every key of ``queue`` starts with."""
        if not self.cluster:
            return f"{self.prefix}{queue}:"
        if "{" in queue or "}" in queue:
            raise PayloadError(
                f"queue {queue!r}: a queue name on Redis Cluster may not hold {{ or }} "
                "(the driver makes the name the hash tag of the queue's keys)"
            )
        return f"{self.prefix}{{{queue}}}:"

    def stream(self, queue: str, band: str | bytes) -> str:
        """The stream of one priority band of ``queue``."""
        return f"{self.base(queue)}ready:{band.decode() if isinstance(band, bytes) else band}"

    def bands(self, queue: str) -> str:
        return self.base(queue) + "bands"

    def delayed(self, queue: str) -> str:
        return self.base(queue) + "delayed"

    def reserved(self, queue: str) -> str:
        return self.base(queue) + "reserved"

    def queue_keys(self, queue: str) -> list[str]:
        """``bands``, ``delayed`` and ``reserved``: the keys the scripts take per queue."""
        base = self.base(queue)
        return [base + "bands", base + "delayed", base + "reserved"]

    def queues(self) -> str:
        """The set of every queue that has held jobs."""
        return self.prefix + "queues"

    def failed(self, queue: str) -> str:
        """The failed store's records (one hash for every queue on one server)."""
        return self.base(queue) + "failed" if self.cluster else self.prefix + "failed"

    def failed_index(self, queue: str) -> str:
        """The failed store's ids by when they failed."""
        return self.base(queue) + "failed:index" if self.cluster else self.prefix + "failed:index"

    def wake_sent(self, queue: str) -> str:
        """Set by a push that notified, cleared by a reserve: one notification per idle spell."""
        return self.base(queue) + "wake:sent" if self.cluster else self.prefix + "wake:sent"

    def channel(self) -> str:
        """The wake-up channel (ordinary pub/sub, also on Redis Cluster)."""
        return self.prefix + "wake"

    def slot(self, queue: str) -> str:
        """What groups script calls that may run together: every queue on one server, one queue on a cluster."""
        return queue if self.cluster else ""
