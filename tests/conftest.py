"""Shared fixtures: hypothesis profiles, the golden folder, and the torch oracle helpers.

Also the check that a run cleans up after itself: pyproject's
``tmp_path_retention_policy = "failed"`` removes a passing test's ``tmp_path`` at its
teardown (and a passing run's whole basetemp at its end); what is left once every
fixture is torn down, the folders of failed tests aside, must stay under
:data:`LEFT_BEHIND_LIMIT`, or the run fails naming the biggest.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=30)
settings.register_profile("nightly", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def golden() -> Path:
    """The folder of small committed checkpoints (see golden/README.md)."""
    return GOLDEN


#: What a whole run may leave in its basetemp, besides the folders of failed tests (kept
#: to look at): module fixtures' ``tmp_path_factory.mktemp`` folders, a few MB.
LEFT_BEHIND_LIMIT = 16 << 20
_FAILED_TMP_PATHS: set[Path] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                        pytest.TestReport]:
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp, Path):
        _FAILED_TMP_PATHS.add(tmp)
    return report


def _disk_bytes(path: Path) -> int:
    """The disk space under ``path`` (a sparse file counts its blocks; links are not followed)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _left_behind(session: pytest.Session) -> dict[str, int]:
    """What this process's tests left in its basetemp (path -> bytes), failed tests aside."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if not isinstance(basetemp, Path) or not basetemp.is_dir():
        return {}  # no tmp_path used
    return {str(entry): _disk_bytes(entry) for entry in basetemp.iterdir()
            if entry not in _FAILED_TMP_PATHS and not entry.is_symlink()}


#: Under pytest-xdist, in the controller: what each worker left (worker id -> path -> bytes),
#: sent back at the worker's end.
_WORKERS_LEFT: dict[str, dict[str, int]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller: a worker finished; keep what it says its tests left behind."""
    worker = str(getattr(getattr(node, "gateway", None), "id", len(_WORKERS_LEFT)))
    _WORKERS_LEFT[worker] = getattr(node, "workeroutput", {}).get("ptfile_left_behind", {})


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail a complete run that leaves more than :data:`LEFT_BEHIND_LIMIT` in its basetemp
    (this runs before pytest removes it, after the last test tore every fixture down).

    Under pytest-xdist each worker measures its own basetemp (a folder of the controller's)
    and hands the figures to the controller, which decides: a worker's exit status is not
    the run's."""
    if session.shouldstop or session.shouldfail:
        return  # an interrupted run (its fixtures are still up)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller judges
        workeroutput["ptfile_left_behind"] = _left_behind(session)
        return
    # the controller's basetemp holds the workers' (one folder each): count them once
    left = ({p: n for worker in _WORKERS_LEFT.values() for p, n in worker.items()}
            if _WORKERS_LEFT else _left_behind(session))
    if sum(left.values()) <= LEFT_BEHIND_LIMIT:
        return
    biggest = sorted(left.items(), key=lambda kv: -kv[1])[:5]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(
            f"tests left {sum(left.values()) >> 20} MiB (limit {LEFT_BEHIND_LIMIT >> 20} MiB; "
            "clean up what a test writes): "
            + ", ".join(f"{p} {n >> 20} MiB" for p, n in biggest), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
