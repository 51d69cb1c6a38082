"""What every test of the project's own suites shares."""

from __future__ import annotations

import pytest

from fixtures import settings


@pytest.fixture(scope="session", autouse=True)
def started_runs_write_elsewhere(tmp_path_factory):
    """A pytest run that a test starts without ``--results-dir`` writes its run folder under this session's temporary
    folder, so the checkout's ``results/`` keeps the user's runs alone and ``latest.txt`` names the run the user made."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(settings.RESULTS_DIR.name, str(tmp_path_factory.mktemp("started-runs")))
        yield
