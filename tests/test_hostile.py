"""Candidates that crash or hang, and a build worker that dies, inside a real
``altenv tune`` run: each is recorded as a failed candidate and the run finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_EVOLUTION

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_run_survives_crashing_and_hanging_candidates_and_a_dying_builder(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "name: hostile\nworkload: 'gmm:M=16,N=16,K=16'\nbudget: {joint: 4, loop_only: 8}\n"
        "search: {batch: 16, top_k: 4, finalists: 2}\n"
        f"agent: {{options: {SMALL_EVOLUTION}}}\n"
        "measure: {number: 1, repeat: 1, min_repeat_ms: 0, run_timeout: 3, build_workers: 1,\n"
        "          builder_preload: [tvm.s_tir.meta_schedule, tvm.s_tir.transform,\n"
        "                            altenv.measure.builder, hostile_build]}\n")
    env = {**os.environ, "ALTENV_HOSTILE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "altenv.cli", "tune", str(config),
                           "--output-dir", str(tmp_path), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p.name for p in tmp_path.iterdir()} >= {"build-crash", "run-crash", "run-hang"}
    lines = [json.loads(line) for line in (tmp_path / "hostile" / "records.jsonl").open()]
    records = [line for line in lines if "final" not in line]
    assert len(records) == 12 and len({r["key"] for r in records}) == 12
    errors = [r["error"] for r in records if r["error"] is not None]
    assert len(errors) == 3, errors
    assert any("PersistentBuilder" in e for e in errors)  # the worker that died building
    assert any("Timeout" in e for e in errors)  # the kernel that hangs, killed
    assert any("LocalRunner: An exception occurred" in e for e in errors)  # the one aborting
    summary = json.loads((tmp_path / "hostile" / "summary.json").read_text())
    assert summary["trials"] == 12 and summary["max_rel_err_vs_torch"] < 1e-3
