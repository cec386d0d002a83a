"""Joining (or starting) the Ray instance a run tunes on."""

from __future__ import annotations

import socket

import ray

from ..errors import UserError
from .settings import RaySettings


def reachable(address: str, timeout: float = 5.0) -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) that no socket answers is a
    :class:`~altenv.errors.UserError` (Ray itself retries for half a minute, then aborts
    the process)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not sep:
        return
    if not port.isdigit():
        raise UserError(f"ray.address: {address!r} is not HOST:PORT; allowed: local, auto or "
                        "HOST:PORT of a running cluster's head")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise UserError(f"ray.address: nothing answers at {address!r} ({err.strerror or err}); "
                        "start the head with ray start --head, or use --ray local") from None


def connect(settings: RaySettings) -> None:
    """Join ``settings.address`` (``local`` starts a Ray instance on this machine with one
    device); a cluster without any ``device_resource`` is a :class:`~altenv.errors.UserError`.
    A process that already joined a cluster stays on it; asking it for another address is
    a :class:`~altenv.errors.UserError`."""
    if settings.address != "local":
        reachable(settings.address)
    if ray.is_initialized():
        joined = ray.get_runtime_context().gcs_address
        asked = settings.address.removeprefix("ray://")
        if asked not in ("local", "auto", joined):
            raise UserError(f"ray.address: this process already joined the cluster at "
                            f"{joined!r}; {settings.address!r} needs a new process")
        return
    if settings.address == "local":
        ray.init(resources={settings.device_resource: 1}, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    else:
        try:
            ray.init(address=settings.address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise UserError(f"ray.address: cannot join {settings.address!r} ({err}); "
                              "allowed: local, auto or HOST:PORT of a running cluster") from None
    if ray.cluster_resources().get(settings.device_resource, 0) < 1:
        raise UserError(f"ray.device_resource: no node of the cluster at "
                          f"{settings.address!r} offers {settings.device_resource!r}; start "
                          f"measuring nodes with ray start --resources "
                          f"'{{\"{settings.device_resource}\": 1}}'")
