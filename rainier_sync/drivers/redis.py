"""The Redis driver (streams with one consumer group) and the Redis lock store."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError, DriverUnavailableError
from ..locks.base import LockStore

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

__all__ = ["RedisLockStore"]

_RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_RENEW_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def _ttl_ms(ttl: float, key: str) -> int:
    if ttl <= 0:
        raise ValueError(f"lock {key!r}: ttl must be positive seconds, got {ttl!r}")
    return max(1, int(round(ttl * 1000)))


class RedisLockStore(LockStore):
    """Locks in Redis: ``SET key owner NX PX ttl``; released and renewed only by their owner token.

    Expiry is Redis's own clock (``PX``), so a lock outlives a dead holder by at most its ttl.
    """

    def __init__(self, client: redis.Redis, prefix: str = "rainier:lock:") -> None:
        self._client = client
        self._prefix = prefix
        self._release = client.register_script(_RELEASE_LOCK)
        self._renew = client.register_script(_RENEW_LOCK)

    @classmethod
    def from_url(cls, url: str, prefix: str = "rainier:lock:") -> RedisLockStore:
        """Connect to ``url`` (``redis://host:port/db``)."""
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(f"RedisLockStore url must start with redis://, rediss:// or unix://, got {url!r}")
        return cls(redis.Redis.from_url(url, protocol=2, decode_responses=False), prefix=prefix)

    def _key(self, key: str) -> str:
        return self._prefix + key

    def acquire(self, key: str, owner: str, ttl: float) -> bool:
        return bool(self._client.set(self._key(key), owner, nx=True, px=_ttl_ms(ttl, key)))

    def release(self, key: str, owner: str) -> bool:
        return bool(self._release(keys=[self._key(key)], args=[owner]))

    def renew(self, key: str, owner: str, ttl: float) -> bool:
        return bool(self._renew(keys=[self._key(key)], args=[owner, _ttl_ms(ttl, key)]))

    def owner(self, key: str) -> str | None:
        value: Any = self._client.get(self._key(key))
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def close(self) -> None:
        self._client.close()
