"""Configuration and boot: ``QUEUE_DRIVER`` or a ``queues`` section, never both.

A section is a dict, a JSON file or a TOML file shaped
``{"default": "primary", "connections": {"primary": {"driver": ...}, ...}}``;
:class:`Connections` builds the same thing in Python. Every declaration is
checked before any connection is opened: a setting another framework's queue
honours and this one cannot is refused by name with what to write instead, an
unknown key is refused with the nearest known one, and a wrong type, unit or
sign is refused naming the key (and, from a file, the file and line).
"""

from __future__ import annotations

from .boot import Booted, QueueResources, build_from_config, build_from_env
from .connections import ConnectionConfig, Connections

__all__ = ["QueueResources", "Connections", "ConnectionConfig", "Booted", "build_from_env", "build_from_config"]
