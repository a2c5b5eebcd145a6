"""Building an SqsQueue: every mistake fails at construction, naming the setting."""

from __future__ import annotations

import pytest

import rainier_sync.drivers.sqs.queue as sqs_module
from rainier_sync.drivers import SqsQueue
from rainier_sync.errors import ConfigurationError, DriverUnavailableError

pytestmark = pytest.mark.sqs

URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"
FAILED = "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs-failed"


def test_the_lazy_export_is_the_driver() -> None:
    assert SqsQueue is sqs_module.SqsQueue


def test_a_failed_queue_is_required() -> None:
    with pytest.raises(ConfigurationError, match="failed_queue_url"):
        SqsQueue(URL)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"key": "AKIAEXAMPLE"}, "key was given without secret"),
        ({"secret": "hush"}, "secret was given without key"),
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"visibility_timeout": "30"}, "visibility_timeout"),
        ({"wait_time": 21}, "wait_time"),
        ({"wait_time": -1}, "wait_time"),
        ({"endpoint": "127.0.0.1:5000"}, "endpoint"),
        ({"queue_urls": {"mail": "mail"}}, r"queue_urls\['mail'\]"),
        ({"queue_urls": {"mail": URL}}, "share one URL"),
        ({"queue_urls": {"default": FAILED + "x"}}, r"queue_urls\['default'\]"),
        ({"failed_queue_url": URL}, "failed jobs need a queue of their own"),
        ({"client": object(), "region": "eu-west-1"}, "either client"),
        ({"client": object(), "timeout": 3}, "either client"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": True}, "timeout"),
    ],
)
def test_bad_settings_fail_naming_the_setting(kwargs: dict[str, object], named: str) -> None:
    kwargs.setdefault("failed_queue_url", FAILED)
    with pytest.raises(ConfigurationError, match=named):
        SqsQueue(URL, **kwargs)  # type: ignore[arg-type]


def test_a_queue_url_must_be_a_whole_url() -> None:
    with pytest.raises(ConfigurationError, match="queue_url must be a queue's whole URL"):
        SqsQueue("jobs", failed_queue_url=FAILED)


def test_the_region_is_read_from_an_aws_queue_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    queue = SqsQueue(URL, failed_queue_url=FAILED, key="AKIAEXAMPLE", secret="hush")
    assert queue.region == "eu-west-1"
    queue.close()


def test_no_region_at_all_fails_at_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    with pytest.raises(ConfigurationError, match="needs a region"):
        SqsQueue("http://127.0.0.1:1/123456789012/jobs", failed_queue_url="http://127.0.0.1:1/123456789012/f")


def test_credentials_never_show_in_repr_or_describe() -> None:
    queue = SqsQueue(URL, failed_queue_url=FAILED, key="AKIASECRETKEYID", secret="very-secret-value")
    shown = repr(queue) + queue.describe() + str(vars(queue).keys())
    assert "AKIASECRETKEYID" not in shown and "very-secret-value" not in shown
    assert "very-secret-value" not in repr(vars(queue))
    assert URL in repr(queue)
    queue.close()


def test_a_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # boto3 is installed here; taking the module's handle on it away is how to see the error.
    monkeypatch.setattr(sqs_module, "boto3", None)
    with pytest.raises(DriverUnavailableError, match=r"pip install 'rainier_sync\[sqs\]'"):
        SqsQueue(URL, failed_queue_url=FAILED)


def test_visibility_timeout_is_the_reservation() -> None:
    queue = SqsQueue(URL, failed_queue_url=FAILED, visibility_timeout=90.5, region="eu-west-1")
    assert queue.reservation == 91
    assert queue.wait_time == 20
    queue.close()


def test_timeout_bounds_every_call_and_long_polls_wait_longer() -> None:
    queue = SqsQueue(URL, failed_queue_url=FAILED, timeout=2, wait_time=10, region="eu-west-1")
    calls, polls = queue.client.meta.config, queue._poll_client.meta.config
    assert (calls.connect_timeout, calls.read_timeout) == (2, 2)
    assert (polls.connect_timeout, polls.read_timeout) == (2, 12)
    assert calls.retries["total_max_attempts"] == 3
    queue.close()
