"""Every exception rainier_sync raises on purpose, under one root::

RainierError
├── JobDefinitionError (TypeError)       a job class cannot be registered or dispatched
├── PayloadError (ValueError)            a payload or stored job cannot cross the wire
├── UnknownJobError (LookupError)        no job class under a name met on the wire
├── UnknownConnectionError (LookupError) a connection nobody declared
├── UnknownQueueError (LookupError)      a queue a connection has no address for (SQS)
├── ConfigurationError (ValueError)      a configuration mistake, raised at boot
│   └── SchemaMissingError               the queue's tables are not there: run the migrations
├── BindingError (LookupError)           the container has no binding for a key
├── NoQueueConfiguredError               nowhere to dispatch
├── DriverUnavailableError (ImportError) a driver's optional dependency is missing
├── CapabilityError (NotImplementedError) a driver asked for what it does not declare
├── JobTimeoutError                      an attempt overran its time limit
├── JobCrashedError                      the process running an attempt died, or its worker was lost
├── UniqueLockHeldError                  a failed unique job's lock is held by a live copy
├── SqsBatchError                        entries of an SQS batch call failed
├── KafkaQueueError                      the broker refused or lost a write
└── QueueUnavailableError                the backend cannot be reached
    ├── DatabaseUnavailableError
    ├── RedisUnavailableError
    ├── SqsUnavailableError
    └── KafkaUnavailableError (also a KafkaQueueError)
"""

from __future__ import annotations

from typing import Iterable

__all__ = [
    "RainierError",
    "JobDefinitionError",
    "PayloadError",
    "UnknownJobError",
    "UnknownConnectionError",
    "UnknownQueueError",
    "ConfigurationError",
    "SchemaMissingError",
    "BindingError",
    "NoQueueConfiguredError",
    "DriverUnavailableError",
    "CapabilityError",
    "JobTimeoutError",
    "JobCrashedError",
    "UniqueLockHeldError",
    "SqsBatchError",
    "KafkaQueueError",
    "QueueUnavailableError",
    "DatabaseUnavailableError",
    "RedisUnavailableError",
    "SqsUnavailableError",
    "KafkaUnavailableError",
]


class RainierError(Exception):
    """Base class of every error the library raises on purpose."""


class JobDefinitionError(RainierError, TypeError):
    """A job class cannot be registered (no ``NAME``, a duplicate ``NAME``, ...)."""


class PayloadError(RainierError, ValueError):
    """A job's payload cannot cross the wire (not JSON, or not this job's shape)."""


class UnknownJobError(RainierError, LookupError):
    """No job class is registered under a name met on the wire."""


class UnknownConnectionError(RainierError, LookupError):
    """A connection name nobody declared."""


class UnknownQueueError(RainierError, LookupError):
    """A queue name with no SQS URL on this connection."""


class ConfigurationError(RainierError, ValueError):
    """The queue configuration is wrong; raised at boot."""


class SchemaMissingError(ConfigurationError):
    """The queue's tables are not there: run the migrations."""


class BindingError(RainierError, LookupError):
    """The container has no binding for a key."""


class NoQueueConfiguredError(RainierError):
    """Nothing configured a queue, so there is nowhere to dispatch."""


class DriverUnavailableError(RainierError, ImportError):
    """A driver's optional dependency is not installed."""


class CapabilityError(RainierError, NotImplementedError):
    """A driver was asked for something it does not declare it can do."""


class JobTimeoutError(RainierError):
    """An attempt overran its time limit and was killed."""


class JobCrashedError(RainierError):
    """The process running an attempt died (signal, ``os._exit``, OOM kill), or the
    worker running it was lost and its reservation lapsed."""


class UniqueLockHeldError(RainierError):
    """A failed unique job cannot be retried: a live copy of it holds its lock."""


class SqsBatchError(RainierError):
    """Some entries of a batch call failed even after retrying.

    ``done`` lists the job ids that went through, ``failed`` maps each job id
    that did not to SQS's reason, and ``sender_fault`` holds those of them SQS
    called the sender's fault (sent again, they fail again).
    """

    def __init__(
        self, operation: str, done: list[str], failed: dict[str, str], *, sender_fault: Iterable[str] = ()
    ) -> None:
        self.operation = operation
        self.done = done
        self.failed = failed
        self.sender_fault = frozenset(sender_fault)
        reasons = "; ".join(f"{job_id}: {reason}" for job_id, reason in list(failed.items())[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        super().__init__(
            f"{operation}: {len(failed)} of {len(done) + len(failed)} job(s) failed: {reasons}{more}"
            + (f"; these went through: {', '.join(done[:10])}" if done else "")
        )


class KafkaQueueError(RainierError):
    """The broker refused or lost a write (the job was not accepted)."""


class QueueUnavailableError(RainierError):
    """The backend cannot be reached (a ``once`` worker gives up rather than hang)."""


class DatabaseUnavailableError(QueueUnavailableError):
    """The database cannot be reached: the connection was refused, the server did
    not answer within ``response_timeout``, or a lost connection could not be
    reopened within ``reconnect_for``. The message names the server."""


class RedisUnavailableError(QueueUnavailableError):
    """Redis could not be reached (refused, dropped, timed out) within the
    connection's timeouts and reconnect settings; names the connection."""


class SqsUnavailableError(QueueUnavailableError):
    """SQS could not be reached (connection refused or cut, no answer in time)
    through every try of one call; names the connection and endpoint."""


class KafkaUnavailableError(KafkaQueueError, QueueUnavailableError):
    """The brokers could not be reached within the driver's ``timeout``."""
