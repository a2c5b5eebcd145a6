"""What a Redis URL (or the ``sentinels`` and ``service_name`` settings) points
at: one server, the master a group of Sentinels watches, or a Redis Cluster.
Read without connecting and without redis-py, so configuration checks it at boot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import unquote

from ...errors import ConfigurationError

__all__ = ["_Target", "_target"]

_SERVER = ("redis://", "rediss://", "unix://")
SENTINEL_SCHEME = "redis+sentinel://"
CLUSTER_SCHEME = "redis+cluster://"


class _Target(NamedTuple):
    """What a URL (or the ``sentinels`` and ``service_name`` settings) points at."""

    kind: str  # "server", "sentinel" or "cluster"
    url: str | None = None
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None


def _host_port(owner: str, what: str, written: Any, default_port: int, where: str = "") -> tuple[str, int]:
    if not isinstance(written, str) or not written.strip():
        raise ConfigurationError(f"{owner}: {what}{where} must be host:port, got {written!r}")
    text = written.strip()
    if text.startswith("["):  # [::1]:26379
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            host, port_text = text, ""
    if not host or port_text is None or any(c in host for c in "/@,? "):
        raise ConfigurationError(f"{owner}: {what}{where} must be host:port, got {written!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigurationError(f"{owner}: {what} {written!r}{where} has no valid port (1 to 65535)")
    return host, int(port_text)


def _host_list(
    owner: str, what: str, entries: Sequence[Any], default_port: int, where: str = ""
) -> tuple[tuple[str, int], ...]:
    hosts = tuple(_host_port(owner, what, entry, default_port, where) for entry in entries)
    if not hosts:
        raise ConfigurationError(f"{owner}: no {what} given{where}")
    seen: set[tuple[str, int]] = set()
    for host in hosts:
        if host in seen:
            raise ConfigurationError(f"{owner}: {what} {host[0]}:{host[1]} is named twice{where}")
        seen.add(host)
    return hosts


def _credentials(written: str) -> tuple[str | None, str | None]:
    if not written:
        return None, None
    user, colon, password = written.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _database(owner: str, url: str, written: str) -> int:
    if not written.isdigit() or len(written) > 5:
        raise ConfigurationError(f"{owner}: the database index in {url!r} must be a whole number, got {written!r}")
    return int(written)


def _parse_multi(owner: str, url: str, scheme: str, default_port: int) -> tuple[Any, ...]:
    rest = url[len(scheme) :]
    if "?" in rest or "#" in rest:
        raise ConfigurationError(
            f"{owner}: options in the URL are not read ({url!r}); write the connection's settings instead"
        )
    netloc, _, path = rest.partition("/")
    creds, _, hostlist = netloc.rpartition("@")
    what = "sentinel" if scheme == SENTINEL_SCHEME else "cluster node"
    hosts = _host_list(owner, what, hostlist.split(",") if hostlist else [], default_port, f" in {url!r}")
    return hosts, _credentials(creds), [segment for segment in path.split("/")] if path else []


def _target(owner: str, url: Any, sentinels: Any = None, service_name: Any = None) -> _Target:
    """Read ``url`` (and the ``sentinels``/``service_name`` settings); ConfigurationError naming what is wrong."""
    if sentinels is not None or service_name is not None:
        return _sentinel_settings(owner, url, sentinels, service_name)
    if not isinstance(url, str) or not url.startswith((*_SERVER, SENTINEL_SCHEME, CLUSTER_SCHEME)):
        raise ConfigurationError(
            f"{owner} url must start with redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://, "
            f"got {url!r}"
        )
    if url.startswith(_SERVER):
        return _Target("server", url=url)
    if url.startswith(CLUSTER_SCHEME):
        hosts, (user, password), path = _parse_multi(owner, url, CLUSTER_SCHEME, 6379)
        if [segment for segment in path if segment] not in ([], ["0"]):
            raise ConfigurationError(
                f"{owner}: {url!r} names a database; Redis Cluster has only database 0 (write no path, or /0)"
            )
        return _Target("cluster", hosts=hosts, username=user, password=password)
    hosts, (user, password), path = _parse_multi(owner, url, SENTINEL_SCHEME, 26379)
    if path and path[-1] == "":
        path.pop()
    if not path or not path[0] or len(path) > 2:
        raise ConfigurationError(
            f"{owner}: {url!r} must name the service the sentinels watch and, if not 0, the database: "
            "redis+sentinel://h1:26379,h2:26379/mymaster/1"
        )
    db = _database(owner, url, path[1]) if len(path) == 2 else 0
    return _Target("sentinel", hosts=hosts, service=unquote(path[0]), db=db, username=user, password=password)


def _sentinel_settings(owner: str, url: Any, sentinels: Any, service_name: Any) -> _Target:
    """``sentinels`` and ``service_name`` given as settings; ``url`` then holds at most
    the database and the credentials (``redis:///1``, ``redis://:secret@/1``)."""
    if sentinels is None or service_name is None:
        given, missing = ("sentinels", "service_name") if service_name is None else ("service_name", "sentinels")
        raise ConfigurationError(f"{owner}: {given} is given without {missing}; the sentinels need both")
    if isinstance(sentinels, str):
        sentinels = [part for part in sentinels.split(",")]
    if not isinstance(sentinels, (list, tuple)):
        raise ConfigurationError(f"{owner}: sentinels must be a list of host:port, got {sentinels!r}")
    hosts = _host_list(owner, "sentinel", sentinels, 26379)
    if not isinstance(service_name, str) or not service_name.strip() or "/" in service_name:
        raise ConfigurationError(
            f"{owner}: service_name must name the service the sentinels watch, got {service_name!r}"
        )
    target = _Target("sentinel", hosts=hosts, service=service_name.strip())
    if url is None:
        return target
    if not isinstance(url, str) or not url.startswith("redis://"):
        raise ConfigurationError(
            f"{owner}: url {url!r} contradicts sentinels: with sentinels, url may only give the database "
            "and credentials (redis:///1, redis://:secret@/1), or be left out"
        )
    creds, _, host = url[len("redis://") :].partition("/")[0].rpartition("@")
    if host:
        raise ConfigurationError(
            f"{owner}: url {url!r} names a server, and so do the sentinels; write it without the host "
            "(redis:///1), or leave it out"
        )
    path = url[len("redis://") :].partition("/")[2]
    if "?" in path or "#" in path:
        raise ConfigurationError(f"{owner}: options in the URL are not read ({url!r})")
    user, password = _credentials(creds)
    db = _database(owner, url, path.strip("/")) if path.strip("/") else 0
    return target._replace(db=db, username=user, password=password)
