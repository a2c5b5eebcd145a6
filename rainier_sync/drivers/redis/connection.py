"""Redis connections for the driver and the lock store: the driver's own retry
policy (its clients never retry on their own), the settings' checks, and the
bounds every connection has unless its settings give others."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..._checks import check_number
from ...errors import ConfigurationError, DriverUnavailableError, PayloadError, RedisUnavailableError

try:
    import redis
    from redis.exceptions import (
        AskError,
        ClusterDownError,
        MovedError,
        ReadOnlyError,
        SlotNotCoveredError,
        TryAgainError,
    )
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

if TYPE_CHECKING:
    from .topology import _Topology

_T = TypeVar("_T")

#: The longest a connection may take to open, unless ``connect_timeout_ms`` says.
CONNECT_TIMEOUT_MS = 5000
#: The longest one reply may take, unless ``response_timeout_ms`` says: well above
#: :data:`LONGEST_BLOCK`, so an idle blocking read is never taken for an outage.
RESPONSE_TIMEOUT_MS = 5000
#: Seconds the driver's own blocking commands block at most (an idle worker's
#: ``XREADGROUP … BLOCK``, the lock store's ``BLPOP``).
LONGEST_BLOCK = 1.0

#: What a connection that is broken, refused or timed out raises; also a server
#: that is no longer the master (READONLY), and a cluster between two slot maps.
_BROKEN = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    SlotNotCoveredError,
)
#: A cluster node saying another serves the key: nothing ran.
_REDIRECTED = (MovedError, AskError)
#: Redirections followed before a command is given up.
_REDIRECTS = 8
#: Redis answered and refused the connection's credentials (a ConnectionError to redis-py).
_REFUSED = (redis.AuthenticationError, redis.exceptions.AuthorizationError)
#: Replies that refuse the connection's settings: a database number the server does not have.
_REFUSED_REPLIES = ("DB index is out of range", "invalid DB index")
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
    topology: _Topology | None = None,
) -> _T:
    """Run ``attempt``, again after a broken connection as ``policy`` allows.

    ``attempt`` builds its command's arguments as it sends it, so the times they
    carry ("now", a reservation's deadline) are those of the try that reaches the
    server, not of one made before a wait for it. Redis out of reach raises
    :class:`RedisUnavailableError`; a value Redis cannot be sent, PayloadError;
    a database index the server does not have (SELECT refused as a connection
    opens), or credentials or permissions it refuses, ConfigurationError: it
    answered, and no try would find it otherwise.

    A server that answers READONLY (a master demoted under us) counts as a broken
    connection: the next try resolves the master again. A cluster's redirection
    (MOVED, ASK) ran nothing: the slot map is read again and the command sent to
    the node now named, a few times whatever ``policy`` says.
    """
    failures = redirects = 0
    while True:
        if topology is not None:
            topology.check()
        try:
            return attempt()
        except _REFUSED as exc:  # ConnectionErrors too: caught first, they are never retried
            if broken is not None:
                broken()
            raise ConfigurationError(
                f"{named()}: {what}: Redis refused the URL's credentials or its user's permissions ({exc}); "
                "check its user and password"
            ) from exc
        except _REDIRECTED as exc:
            if broken is not None:
                broken()
            redirects += 1
            if redirects > _REDIRECTS:
                raise RedisUnavailableError(
                    f"{named()}: {what} failed: redirected {redirects} times, the last: {exc}"
                ) from exc
            if topology is not None:
                topology.refresh()
            time.sleep(0.0 if redirects == 1 else min(0.5, 0.025 * 2**redirects))
        except _BROKEN as exc:
            if broken is not None:
                broken()
            if topology is not None:
                if isinstance(exc, ReadOnlyError):
                    topology.readonly()
                topology.refresh()
            failures += 1
            if failures > policy.retries:
                tries = f" ({failures} tries)" if failures > 1 else ""
                bound = _bound(exc, topology)
                raise RedisUnavailableError(
                    f"{named()}: {what} failed{tries}: {type(exc).__name__}: {exc}{bound}"
                ) from exc
            time.sleep(policy.pause(failures))
        except redis.ResponseError as exc:  # after _BROKEN and _REDIRECTED: READONLY, MOVED... are ResponseErrors too
            if not any(reply in str(exc) for reply in _REFUSED_REPLIES):
                raise
            if broken is not None:
                broken()
            raise _no_such_database(named(), what, exc, topology) from exc
        except _BAD_DATA as exc:
            raise PayloadError(f"{named()}: {what}: Redis cannot be sent this: {exc}") from exc


def _bound(exc: BaseException, topology: _Topology | None) -> str:
    """For a timeout, the setting that cut it off and its value."""
    if not isinstance(exc, redis.TimeoutError) or topology is None:
        return ""
    connect_timeout, response_timeout = topology.timeouts()
    if "connecting" in str(exc):
        waited, setting, what = connect_timeout, "connect_timeout_ms", "connection"
    else:
        waited, setting, what = response_timeout, "response_timeout_ms", "reply"
    return "" if waited is None else f" (no {what} within {waited * 1000:g} ms ({setting}))"


def _no_such_database(named: str, what: str, exc: BaseException, topology: _Topology | None) -> ConfigurationError:
    """Redis refused the URL's database index: a mistake in the configuration, not an outage."""
    index = topology.database() if topology is not None else None
    which, select = ("database index", "SELECT") if index is None else (f"database index {index}", f"SELECT {index}")
    return ConfigurationError(
        f"{named}: {what}: the URL's {which} does not exist on that server (Redis answered {select}: {exc}); "
        "name an index below the server's 'databases' setting (16 unless configured)"
    )


def _positive_ms(owner: str, name: str, value: Any, default: float) -> float:
    """``value`` (``default`` when None) in seconds; ConfigurationError naming ``name`` unless positive."""
    if value is None:
        value = default
    return float(check_number(f"{owner}: {name}", value, unit="milliseconds")) / 1000.0


def _connection_settings(
    owner: str,
    connect_timeout_ms: float | None,
    response_timeout_ms: float | None,
    reconnect: bool,
    reconnect_attempts: int | None,
    reconnect_max_backoff_ms: float | None,
) -> tuple[float, float, _Reconnect]:
    """The timeouts (seconds; :data:`CONNECT_TIMEOUT_MS` and :data:`RESPONSE_TIMEOUT_MS`
    unless given) and reconnect policy the settings ask for; ConfigurationError naming a bad one."""
    connect_timeout = _positive_ms(owner, "connect_timeout_ms", connect_timeout_ms, CONNECT_TIMEOUT_MS)
    response_timeout = _positive_ms(owner, "response_timeout_ms", response_timeout_ms, RESPONSE_TIMEOUT_MS)
    if not isinstance(reconnect, bool):
        raise ConfigurationError(f"{owner}: reconnect must be true or false, got {reconnect!r}")
    if not reconnect and (reconnect_attempts is not None or reconnect_max_backoff_ms is not None):
        given = "reconnect_attempts" if reconnect_attempts is not None else "reconnect_max_backoff_ms"
        raise ConfigurationError(f"{owner}: {given} has no effect without reconnect = true; set both")
    check_number(f"{owner}: reconnect_attempts", reconnect_attempts, whole=True, none=True)
    max_backoff = _positive_ms(owner, "reconnect_max_backoff_ms", reconnect_max_backoff_ms, 1000)
    policy = _Reconnect(reconnect_attempts or 3, max_backoff) if reconnect else _Reconnect()
    return connect_timeout, response_timeout, policy


def _ours(old: Any, owner: str) -> bool:
    """After ``SET … NX GET``: set now (nothing was there), or already held by ``owner``."""
    return old is None or (old.decode() if isinstance(old, bytes) else old) == owner
