"""A builder preload (``measure.builder_preload``) that sabotages three builds of a run, to
test that a tuning run survives them: the first build it sees kills its builder worker,
the next one builds a kernel that aborts the runner when it runs, the one after a kernel
that sleeps for an hour. Marker files in ``$ALTENV_HOSTILE_DIR`` (created exclusively, so
each role goes to exactly one build of the run, over all workers and restarts) record which
roles were played.
"""

from __future__ import annotations

import os

import tvm
from tvm import tirx

DIR = os.environ["ALTENV_HOSTILE_DIR"]
_build = tvm.driver.build


def _claim(role: str) -> bool:
    try:
        os.close(os.open(os.path.join(DIR, role), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _replaced(mod: tvm.IRModule, body: tirx.Stmt) -> tvm.IRModule:
    """``mod`` with ``main``'s body replaced (same arguments)."""
    out = tvm.IRModule(dict(mod.functions))
    out["main"] = mod["main"].with_body(body)
    return out


def build(mod: tvm.IRModule, target: object = None, **kwargs: object) -> object:
    if _claim("build-crash"):
        os._exit(3)
    if _claim("run-crash"):
        mod = _replaced(mod, tirx.Evaluate(tirx.call_extern("int32", "abort")))
    elif _claim("run-hang"):
        mod = _replaced(mod, tirx.Evaluate(tirx.call_extern("int32", "sleep", 3600)))
    return _build(mod, target=target, **kwargs)


tvm.driver.build = build
