"""Where a Redis connection points: ``redis+sentinel://`` and ``redis+cluster://``
URLs and the ``sentinels``/``service_name`` settings, checked at boot without
connecting. Malformed or contradictory ones are refused naming the setting."""

from __future__ import annotations

from typing import Any

import pytest

from rainier_sync import ConfigurationError, QueueManager
from rainier_sync.config import Connections
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.redis.targets import _target
from rainier_sync.errors import RedisUnavailableError
from rainier_sync.locks import RedisLockStore
from tests.support import free_port

from .test_driver import job

SENTINELS = ["10.0.0.1:26379", "10.0.0.2:26379"]


def refused(**settings: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        Connections.from_dict({"connections": {"fast": {"driver": "redis", **settings}}})
    return str(caught.value)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"sentinels": SENTINELS}, "sentinels is given without service_name"),
        ({"service_name": "mymaster"}, "service_name is given without sentinels"),
        ({"sentinels": [], "service_name": "m"}, "sentinels must be a list of host:port"),
        ({"sentinels": ["10.0.0.1:99999"], "service_name": "m"}, "'10.0.0.1:99999' has no valid port"),
        ({"sentinels": [26379], "service_name": "m"}, "26379 is not one"),
        ({"sentinels": ["a:1", "a:1"], "service_name": "m"}, "sentinel a:1 is named twice"),
        ({"sentinels": SENTINELS, "service_name": " "}, "service_name must name the service"),
        ({"sentinels": SENTINELS, "service_name": "a/b"}, "service_name must name the service"),
        (
            {"sentinels": SENTINELS, "service_name": "m", "url": "redis+sentinel://h:26379/m"},
            "contradicts sentinels: name the servers once",
        ),
        ({"sentinels": SENTINELS, "service_name": "m", "url": "redis://10.0.0.9:6379/1"}, "names a server"),
        ({"sentinels": SENTINELS, "service_name": "m", "url": "unix:///tmp/r.sock"}, "contradicts sentinels"),
        ({}, "url is required and not set (or give sentinels and service_name)"),
        ({"url": "redis+sentinel://10.0.0.1:26379"}, "must name the service the sentinels watch"),
        ({"url": "redis+sentinel://10.0.0.1:26379/m/one"}, "database index in 'redis+sentinel"),
        ({"url": "redis+sentinel://10.0.0.1:26379/m/1/2"}, "must name the service"),
        ({"url": "redis+sentinel://a:1,a:1/m"}, "is named twice"),
        ({"url": "redis+sentinel:///m/1"}, "no sentinel given in"),
        ({"url": "redis+cluster://10.0.0.1:7000/1"}, "Redis Cluster has only database 0"),
        ({"url": "redis+cluster://"}, "no cluster node given in"),
        ({"url": "redis+cluster://10.0.0.1:x"}, "node '10.0.0.1:x' in 'redis+cluster://10.0.0.1:x' has no valid"),
        ({"url": "redis+cluster://10.0.0.1:7000,,10.0.0.2"}, "must be host:port, got ''"),
        ({"url": "redis+cluster://10.0.0.1:7000?ssl=true"}, "options in the URL are not read"),
    ],
)
def test_a_malformed_or_contradictory_target_is_refused_at_boot(settings: dict[str, Any], says: str) -> None:
    message = refused(**settings)
    assert says in message, message
    assert "connection 'fast' (redis)" in message


def test_the_environment_names_sentinels_too() -> None:
    environ = {"QUEUE_DRIVER": "redis", "REDIS_SENTINELS": "10.0.0.1:26379, 10.0.0.2", "REDIS_SENTINEL_SERVICE": "m"}
    connections = Connections.from_env(environ)
    (config,) = connections._connections.values()
    assert config.settings["sentinels"] == ["10.0.0.1:26379", "10.0.0.2"]
    with pytest.raises(ConfigurationError, match="REDIS_SENTINEL_SERVICE is given without REDIS_SENTINELS"):
        Connections.from_env({"QUEUE_DRIVER": "redis", "REDIS_SENTINEL_SERVICE": "m"})
    with pytest.raises(ConfigurationError, match="REDIS_URL is required and not set"):
        Connections.from_env({"QUEUE_DRIVER": "redis"})


def test_urls_and_settings_read_into_targets() -> None:
    sentinel = _target("t", "redis+sentinel://:s%40cret@10.0.0.1,[::1]:26380/mymaster/4")
    assert sentinel == ("sentinel", None, (("10.0.0.1", 26379), ("::1", 26380)), "mymaster", 4, None, "s@cret")
    assert _target("t", "redis+sentinel://10.0.0.1:26379/mymaster/").db == 0
    cluster = _target("t", "redis+cluster://u:p@10.0.0.1:7000,10.0.0.2/0")
    assert (cluster.kind, cluster.hosts, cluster.username) == ("cluster", (("10.0.0.1", 7000), ("10.0.0.2", 6379)), "u")
    settings = _target("t", "redis://:pw@/2", "10.0.0.1:26379,10.0.0.2:26379", "m")
    assert (settings.kind, settings.db, settings.password, len(settings.hosts)) == ("sentinel", 2, "pw", 2)
    assert _target("t", "redis://127.0.0.1:6379/1")[:2] == ("server", "redis://127.0.0.1:6379/1")


def test_nothing_connects_at_construction_and_an_unreachable_cluster_is_reported_naming_the_connection() -> None:
    port = free_port()
    queue = RedisQueue.from_url(f"redis+cluster://127.0.0.1:{port}", connect_timeout_ms=200)
    store = RedisLockStore.from_url(f"redis+sentinel://127.0.0.1:{port}/m", connect_timeout_ms=200)
    manager = QueueManager({"fast": queue})
    try:
        with pytest.raises(RedisUnavailableError, match=f"redis connection 'fast' \\(redis cluster 127.0.0.1:{port}"):
            queue.push(job())
        with pytest.raises(RedisUnavailableError, match=f"redis lock store \\(sentinel m@127.0.0.1:{port}/0\\)"):
            store.acquire("a", "me", 10)
    finally:
        manager.close()
        store.close()
