"""Search strategies (agents) that drive altenv: a protocol, a registry and built-ins
(``random``, ``ppo``; imported on first use)."""

from .base import (
    Agent,
    agent_class,
    available,
    build,
    check_options,
    create,
    options_model,
    register,
)

__all__ = ["Agent", "agent_class", "available", "build", "check_options", "create",
           "options_model", "register"]
