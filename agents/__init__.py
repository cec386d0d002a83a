"""Search strategies (agents) that drive altenv: a protocol, a registry and built-ins
(``random``, ``evolution``, ``ppo``, ``heron_cga``, ``mind_mappings``; imported on first
use). Their typed options (:mod:`agents.options`) are checked without importing them."""

from .base import (
    Agent,
    agent_class,
    available,
    build,
    check_options,
    create,
    options_model,
    register,
    validate_options,
)

__all__ = ["Agent", "agent_class", "available", "build", "check_options", "create",
           "options_model", "register", "validate_options"]
