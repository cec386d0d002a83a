"""Search strategies (agents) that drive altenv: a protocol, a registry and built-ins."""

from . import random  # noqa: F401  (registers "random")
from .base import Agent, agent_class, available, create, register

__all__ = ["Agent", "agent_class", "available", "create", "register"]
