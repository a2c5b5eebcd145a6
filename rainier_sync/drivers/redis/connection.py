"""Redis connections for the driver and the lock store: clients that never retry
on their own, the driver's own retry policy, and the settings' checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from ..._checks import check_number
from ...errors import ConfigurationError, DriverUnavailableError, PayloadError, RedisUnavailableError

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

_SCHEMES = ("redis://", "rediss://", "unix://")


_T = TypeVar("_T")

#: What a connection that is broken, refused or timed out raises.
_BROKEN = (redis.ConnectionError, redis.TimeoutError, OSError)
#: What redis-py raises for a value it cannot send (a lone surrogate, a type it does not know).
_BAD_DATA = (redis.DataError, UnicodeEncodeError)


class _Reconnect(NamedTuple):
    """How a command that met a broken connection is tried again: ``retries`` more
    times, on a new connection, pausing 100 ms, 200 ms, 400 ms... (at most ``cap``
    seconds) in between. No retries: the command fails at once."""

    retries: int = 0
    cap: float = 1.0

    def pause(self, failures: int) -> float:
        return float(min(self.cap, 0.1 * 2 ** (failures - 1)))


def _retrying(
    policy: _Reconnect,
    named: Callable[[], str],
    what: str,
    attempt: Callable[[], _T],
    broken: Callable[[], None] | None = None,
) -> _T:
    """Run ``attempt``, again after a broken connection as ``policy`` allows.

    ``attempt`` builds its command's arguments as it sends it, so the times they
    carry ("now", a reservation's deadline) are those of the try that reaches the
    server, not of one made before a wait for it. Redis out of reach raises
    :class:`RedisUnavailableError`; a value Redis cannot be sent, PayloadError.
    """
    failures = 0
    while True:
        try:
            return attempt()
        except _BROKEN as exc:
            if broken is not None:
                broken()
            failures += 1
            if failures > policy.retries:
                tries = f" ({failures} tries)" if failures > 1 else ""
                raise RedisUnavailableError(f"{named()}: {what} failed{tries}: {type(exc).__name__}: {exc}") from exc
            time.sleep(policy.pause(failures))
        except _BAD_DATA as exc:
            raise PayloadError(f"{named()}: {what}: Redis cannot be sent this: {exc}") from exc


def _positive_ms(owner: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    return float(check_number(f"{owner}: {name}", value, unit="milliseconds")) / 1000.0


def _connection_settings(
    owner: str,
    connect_timeout_ms: float | None,
    response_timeout_ms: float | None,
    reconnect: bool,
    reconnect_attempts: int | None,
    reconnect_max_backoff_ms: float | None,
) -> tuple[float | None, float | None, _Reconnect]:
    """The timeouts (seconds) and reconnect policy the settings ask for; ConfigurationError naming a bad one."""
    connect_timeout = _positive_ms(owner, "connect_timeout_ms", connect_timeout_ms)
    response_timeout = _positive_ms(owner, "response_timeout_ms", response_timeout_ms)
    if not isinstance(reconnect, bool):
        raise ConfigurationError(f"{owner}: reconnect must be true or false, got {reconnect!r}")
    if not reconnect and (reconnect_attempts is not None or reconnect_max_backoff_ms is not None):
        given = "reconnect_attempts" if reconnect_attempts is not None else "reconnect_max_backoff_ms"
        raise ConfigurationError(f"{owner}: {given} has no effect without reconnect = true; set both")
    check_number(f"{owner}: reconnect_attempts", reconnect_attempts, whole=True, none=True)
    max_backoff = _positive_ms(owner, "reconnect_max_backoff_ms", reconnect_max_backoff_ms)
    policy = _Reconnect(reconnect_attempts or 3, max_backoff or 1.0) if reconnect else _Reconnect()
    return connect_timeout, response_timeout, policy


def _client(url: str, connect_timeout: float | None, response_timeout: float | None, name: str | None) -> redis.Redis:
    """A client whose connections never retry on their own: the driver retries, with
    the arguments built again for each try."""
    pool = redis.ConnectionPool.from_url(
        url,
        protocol=2,
        decode_responses=False,
        socket_connect_timeout=connect_timeout,
        socket_timeout=response_timeout,
        retry=Retry(NoBackoff(), 0),
        client_name=name,
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def _where(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
    return f"{where}/{kwargs.get('db', 0)}"


def _ours(old: Any, owner: str) -> bool:
    """After ``SET … NX GET``: set now (nothing was there), or already held by ``owner``."""
    return old is None or (old.decode() if isinstance(old, bytes) else old) == owner


def _check_url(owner: str, url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        raise ConfigurationError(f"{owner} url must start with redis://, rediss:// or unix://, got {url!r}")
    return url
