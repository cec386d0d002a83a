"""Joining (or starting) the Ray instance a run tunes on."""

from __future__ import annotations

import ray

from ..errors import UserError
from .settings import RaySettings


def connect(settings: RaySettings) -> None:
    """Join ``settings.address`` (``local`` starts a Ray instance on this machine with one
    device); a cluster without any ``device_resource`` is a :class:`~altenv.errors.UserError`."""
    if ray.is_initialized():
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
