"""Shared fixtures: hypothesis profiles, the golden folder, and the torch oracle helpers."""

from __future__ import annotations

import os
from pathlib import Path

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
