"""One writer per run directory and bench cell: a second process is refused naming the
holder's PID; the lock of a process that died is taken over. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from altenv.bench.ops import cell_lock
from altenv.cli import main
from altenv.lock import DirLock, LockedError

HOLD = ("import sys, time\nfrom altenv.lock import DirLock\n"
        "DirLock(sys.argv[1], 'x').acquire()\nprint('held', flush=True)\ntime.sleep(600)\n")


def hold(path: Path) -> subprocess.Popen:
    """Another process holding the lock file ``path``."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
    path = tmp_path / ".lock"
    holder = hold(path)
    try:
        with pytest.raises(LockedError, match=f"run directory r is in use by process "
                                              f"{holder.pid} "):
            DirLock(path, "run directory r").acquire()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert path.read_text().strip() == str(holder.pid)  # what a SIGKILL leaves behind
    with DirLock(path, "run directory r"):
        assert path.read_text().strip() == str(os.getpid())
        with pytest.raises(LockedError, match=f"in use by process {os.getpid()}"):
            DirLock(path, "run directory r").acquire()  # one writer, even in one process
    with DirLock(path, "run directory r"):  # released on exit
        pass


def test_a_bench_cell_is_locked_while_it_is_tuned(tmp_path):
    cell = tmp_path / "gmm" / "altenv-seed0"
    cell.parent.mkdir()
    holder = hold(tmp_path / "gmm" / "altenv-seed0.lock")
    try:
        with pytest.raises(LockedError, match=f"bench cell {cell} is in use by process "
                                              f"{holder.pid}"), cell_lock(cell):
            pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    with cell_lock(cell):
        assert (tmp_path / "gmm" / "altenv-seed0.lock").read_text().strip() == str(os.getpid())


@pytest.mark.slow
def test_two_tunes_of_one_config_the_second_refuses(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"name: twice\nworkload: 'gmm:M=32,N=32,K=32'\noutput_dir: {tmp_path}\n"
                      "budget: 64\nsearch: {batch: 16, top_k: 2}\n")
    first = subprocess.Popen([sys.executable, "-m", "altenv.cli", "tune", str(config),
                              "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        assert first.stdout.readline().startswith(f"new run {tmp_path / 'twice'}")
        assert main(["tune", str(config), "--quiet"]) == 2
        out, err = capsys.readouterr()
        assert err == (f"altenv: run directory {tmp_path / 'twice'} is in use by process "
                       f"{first.pid} (lock file {tmp_path / 'twice' / '.lock'}); wait for it "
                       "to finish or stop it, then run again\n")
        assert out == ""  # neither "new run" nor "resuming": it never opened the records
        assert first.poll() is None  # the first goes on
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        first.stdout.close()
