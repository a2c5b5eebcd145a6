"""What configuration knows of the SQS driver."""

from __future__ import annotations

import json
from typing import Any, Mapping

from ...errors import ConfigurationError
from ..promises import Promises
from ..spec import OUTBOX, QUEUE_DECOY, Bad, Declared, DriverSpec, Kind, Setting, seconds, text, url

__all__ = ["SPEC", "PROMISES"]

_HTTP = url(("http", "https"), "https://sqs.us-east-1.amazonaws.com/123456789012/jobs")
_WHOLE_URL = ("it composes a queue URL out of parts", "SQS_QUEUE_URL (the whole URL)")


def _check_url_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise Bad(f"must map queue names to queue URLs, got {value!r}")
    result: dict[str, str] = {}
    for queue, address in value.items():
        if not isinstance(queue, str) or not queue:
            raise Bad(f"must map queue names to queue URLs; {queue!r} is not a queue name")
        try:
            result[queue] = _HTTP.check(address)
        except Bad as exc:
            raise Bad(f"[{queue!r}] {exc}") from None
    return result


def _check(declared: Declared) -> None:
    """Each queue, and the failed jobs, need an SQS queue of their own; credentials come whole, with a region."""
    settings, label, where = declared.settings, declared.label, declared.where
    owners: dict[str, str] = {settings["queue_url"]: "default"}
    for queue, address in settings.get("queue_urls", {}).items():
        if queue == "default":
            if address != settings["queue_url"]:
                raise ConfigurationError(
                    f"{where('queue_urls')}: queue_urls['default'] differs from {label('queue_url')}, "
                    "which is the default queue's URL; remove it from queue_urls"
                )
            continue
        if address in owners:
            raise ConfigurationError(
                f"{where('queue_urls')}: queues {owners[address]!r} and {queue!r} share one URL; "
                "each queue needs an SQS queue of its own"
            )
        owners[address] = queue
    failed = settings["failed_queue_url"]
    if failed in owners:
        raise ConfigurationError(
            f"{where('failed_queue_url')}: {label('failed_queue_url')} is also queue {owners[failed]!r}'s "
            "URL; failed jobs need an SQS queue of their own"
        )
    has_key, has_secret = "key" in settings, "secret" in settings
    if has_key != has_secret:
        given, missing = ("key", "secret") if has_key else ("secret", "key")
        raise ConfigurationError(
            f"{where(given)}: {label(given)} without {label(missing)} would sign every request with half "
            f"a credential; write {label(missing)} too, or neither to use the AWS credential chain"
        )
    if has_key and "region" not in settings:
        raise ConfigurationError(
            f"{where('key')}: {label('key')} and {label('secret')} without {label('region')} "
            f"leave the queue's region to whatever default the machine has; write {label('region')}"
        )


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> Any:
    from .queue import SqsQueue

    return SqsQueue(**settings)


#: What the sqs driver promises about the jobs it accepts.
PROMISES = Promises()

SPEC = DriverSpec(
    promises=PROMISES,
    name="sqs",
    rank=4,
    build=_build,
    check=_check,
    extra="sqs",
    settings={
        "queue_url": Setting(_HTTP, env=("SQS_QUEUE_URL",), required=""),
        "queue_urls": Setting(Kind(_check_url_map, json.loads)),
        "region": Setting(text(), env=("AWS_REGION", "AWS_DEFAULT_REGION")),
        "endpoint": Setting(url(("http", "https"), "http://127.0.0.1:5000"), env=("SQS_ENDPOINT",)),
        "visibility_timeout": Setting(seconds(1, 43_200), env=("QUEUE_RESERVATION",)),
        "wait_time": Setting(seconds(0, 20)),
        "outbox": OUTBOX,
        "timeout": Setting(seconds(1, 3600), env=("SQS_TIMEOUT",)),
        "key": Setting(text(), env=("AWS_ACCESS_KEY_ID",)),
        "secret": Setting(text(), env=("AWS_SECRET_ACCESS_KEY",)),
        "failed_queue_url": Setting(
            _HTTP,
            env=("SQS_FAILED_QUEUE_URL",),
            required=" (SQS keeps no failed jobs itself: a job that used up its attempts goes to this queue, "
            "and without one it would be lost)",
        ),
    },
    period="visibility_timeout",
    default_period=30,
    refusals={
        "prefix": (
            "they compose a queue URL out of parts, and an sqs connection is given the whole URL",
            "queue_url (and queue_urls for other queues)",
        ),
        "suffix": (
            "they compose a queue URL out of parts, and an sqs connection is given the whole URL",
            "queue_url (and queue_urls for other queues)",
        ),
        "url": ("an sqs connection is addressed by its queue's URL, not a service URL", "queue_url"),
    },
    env_refused={"SQS_PREFIX": _WHOLE_URL, "SQS_SUFFIX": _WHOLE_URL, "SQS_QUEUE": QUEUE_DECOY},
)
