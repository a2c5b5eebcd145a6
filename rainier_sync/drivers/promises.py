"""What a driver promises about the jobs it accepts: the :class:`Promises` every
driver declares (a shipped one in its spec), and the six shipped drivers
(:class:`QueueDriver`), whose answers are those declarations."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["QueueDriver", "Promises"]


class QueueDriver(enum.Enum):
    """The six drivers. What each promises is read from the driver's own
    declaration (:attr:`promises`, its spec's), not kept here."""

    SYNC = "sync"
    MEMORY = "memory"
    DATABASE = "database"
    REDIS = "redis"
    SQS = "sqs"
    KAFKA = "kafka"

    @property
    def promises(self) -> Promises:
        """What this driver promises, as its own declaration says (its spec's ``promises``)."""
        from .spec import driver_spec

        spec = driver_spec(self.value)
        assert spec is not None, f"the {self.value} driver declares no spec"
        return spec.promises

    def is_deferred(self) -> bool:
        """False only for ``sync``, which runs the job inside ``dispatch``."""
        return self.promises.deferred

    def needs_a_worker(self) -> bool:
        """True when nothing runs unless a ``queue:work`` process is running."""
        return self.promises.needs_a_worker

    def survives_a_restart(self) -> bool:
        """True when queued jobs outlive the process that queued them."""
        return self.promises.survives_a_restart

    def may_lose_an_accepted_job(self) -> bool:
        """True for ``redis`` only: a dispatch that returned can still vanish
        (snapshot persistence, asynchronous replication, eviction)."""
        return self.promises.may_lose_an_accepted_job

    @classmethod
    def parse(cls, value: str) -> QueueDriver:
        try:
            return cls(value.strip().lower())
        except ValueError:
            names = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown queue driver {value!r}; expected one of: {names}") from None


@dataclass(frozen=True)
class Promises:
    """What a driver promises about the jobs it accepts, declared by each driver
    (a driver outside the six declares its own): read by the worker, the
    command line and the dashboard instead of asking which driver it is."""

    #: False only for a driver that runs the job inside ``dispatch`` (``sync``).
    deferred: bool = True
    #: Queued jobs outlive the process that queued them.
    survives_a_restart: bool = True
    #: A dispatch that returned can still vanish (Redis: snapshots, asynchronous replication, eviction).
    may_lose_an_accepted_job: bool = False

    @property
    def needs_a_worker(self) -> bool:
        """Nothing runs unless a ``queue:work`` process is running."""
        return self.deferred

    @classmethod
    def of(cls, driver: QueueDriver) -> Promises:
        """What one of the six drivers promises (:attr:`QueueDriver.promises`)."""
        return driver.promises
