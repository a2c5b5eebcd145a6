"""The Redis driver's wake-up notifications: a subscription to ``P + "wake"``.

A push, release, retry or reclaim publishes there (once per idle spell); the
waiting loops read the subscription themselves, whichever finds it readable
first, and every waiting loop hears of a notification. On Redis Cluster it is
the cluster's ordinary pub/sub (one subscription on any node hears every
queue); under Sentinel it moves to the new master after a failover.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ... import _clock
from ...errors import DriverUnavailableError
from ..base import Waker
from .core import _RedisCore

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

log = logging.getLogger("rainier_sync")


class _WakeUps(_RedisCore):
    """The wake-up subscription and the loops waiting on it."""

    def __init__(
        self,
        client: Any,
        prefix: str = "rainier:queue:",
        reservation: float = 90,
        *,
        consumer: str | None = None,
        reconnect: bool = False,
    ) -> None:
        super().__init__(client, prefix, reservation, consumer=consumer, reconnect=reconnect)
        # The subscription bumps ``_wake_seq`` and sets every waiting waker; a wait
        # returns at once when a notification came after the last reserve began.
        self._mutex = threading.Lock()
        self._waiters: set[Waker] = set()
        self._wake_seq = 0
        self._pubsub: Any = None
        self._pubsub_generation = 0
        self._listen_lock = threading.Lock()
        self._subscribe_failures = 0
        self._subscribe_after = 0.0
        self._closed = threading.Event()

    def _forked(self) -> None:
        super()._forked()
        self._pubsub = None
        self._listen_lock = threading.Lock()
        self._mutex = threading.Lock()
        self._waiters = set()

    def _subscription(self) -> Any:
        """The wake-up subscription, opened on first use (None while Redis refuses it)."""
        self._after_fork()
        if self._pubsub is not None:
            return self._pubsub
        with self._listen_lock:
            if self._pubsub is None and not self._closed.is_set() and _clock.monotonic() >= self._subscribe_after:
                generation = self._topology.generation
                pubsub: Any = None
                try:
                    pubsub = self._client.pubsub()
                    pubsub.subscribe(self.keys.channel())
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    self._subscription_lost(pubsub, exc)
                else:
                    self._subscribe_failures = 0
                    self._pubsub, self._pubsub_generation = pubsub, generation
            return self._pubsub

    def _subscription_lost(self, pubsub: Any, exc: BaseException) -> None:
        """Drop a broken subscription; waits fall back to their timeout until it reopens."""
        self._subscribe_failures += 1
        self._subscribe_after = _clock.monotonic() + min(0.05 * 2**self._subscribe_failures, 2.0)
        log.debug("redis wake-up subscription: %s; subscribing again shortly", exc)
        if self._pubsub is pubsub:
            self._pubsub = None
        self._topology.refresh()  # on a cluster, its node may have gone
        if pubsub is None:
            return
        try:
            pubsub.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass

    def _drain(self, pubsub: Any) -> bool:
        """Read every message already arrived; True (and every waiting loop woken) if
        any did, or if the subscription broke, since a notification may be lost then.
        The subscription's own confirmation counts: before it, nothing was heard."""
        with self._listen_lock:
            if self._pubsub is not pubsub:
                got = True  # replaced or dropped meanwhile
            else:
                got = False
                try:
                    while pubsub.get_message(timeout=0.0) is not None:
                        got = True
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    self._subscription_lost(pubsub, exc)
                    got = True
        if got:
            self._notify()
        return got

    def _notify(self) -> None:
        with self._mutex:
            self._wake_seq += 1
            waiters = list(self._waiters)
        for waker in waiters:
            waker.set()

    def _follow_subscription(self) -> None:
        """After the sentinels announced a new master: leave the old one's subscription."""
        if self._pubsub is not None and self._pubsub_generation != self._topology.generation:
            with self._listen_lock:
                pubsub, self._pubsub = self._pubsub, None
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - the old master's
                    pass

    def _close_subscription(self) -> None:
        with self._listen_lock:
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
