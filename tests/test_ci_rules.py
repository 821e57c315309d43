"""tools/ci_rules.py: under CI a skipped test fails the run; elsewhere it stays a skip."""

import os
import subprocess
import sys

from helpers import env

SKIPPING = "import pytest\n\ndef test_skips():\n    pytest.skip('no libaio here')\n\ndef test_passes():\n    pass\n"


def _pytest(tmp_path, ci: str | None):
    (tmp_path / "test_one.py").write_text(SKIPPING)
    child = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        child["CI"] = ci
    child["PYTHONPATH"] = str(env.REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tools.ci_rules", "-p", "no:cacheprovider",
                           "-c", os.devnull, str(tmp_path / "test_one.py")], capture_output=True, text=True,
                          cwd=tmp_path, env=child, timeout=300)


def test_a_skip_fails_the_run_under_ci(tmp_path):
    done = _pytest(tmp_path, "true")
    assert done.returncode == 1, done.stdout
    assert "SKIPPED IN CI:" in done.stdout and "no libaio here" in done.stdout


def test_a_skip_stays_a_skip_outside_ci(tmp_path):
    done = _pytest(tmp_path, None)
    assert done.returncode == 0 and "1 passed, 1 skipped" in done.stdout, done.stdout
