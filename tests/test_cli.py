"""The command line: the demo runs end to end and checks its own numbers."""

from altenv.cli import main


def test_demo_runs_and_matches_torch(capsys):
    assert main(["demo", "--layouts"]) == 0
    out = capsys.readouterr().out
    assert "Layout(N:1 O0:4 H:56 W:56 O1:16)" in out
    assert "round trip exact: True" in out
    assert "max abs error vs torch" in out
