"""The app's lifespan: what it freezes for the garbage collector while it serves, and gives back."""

import gc

from fastapi.testclient import TestClient

from packscope.backend.http.settings import Settings
from packscope.backend.server.app import GC_THRESHOLDS, create_app


def test_the_objects_built_at_start_are_frozen_while_the_app_serves_and_collectable_after(sqlite_url: str) -> None:
    gc.unfreeze()  # whatever an earlier test left frozen
    app = create_app(Settings(database_url=sqlite_url, ingest_token=None, read_token=None))
    assert gc.get_freeze_count() == 0
    with TestClient(app) as client:
        # the modules, the app and its caches: full collections skip them while it serves
        assert gc.get_freeze_count() > 10_000
        assert client.get("/api/v1/catalogue").status_code == 200
    assert gc.get_freeze_count() == 0


def test_the_collector_runs_less_often_while_the_app_serves_and_as_before_after(sqlite_url: str) -> None:
    before = gc.get_threshold()
    app = create_app(Settings(database_url=sqlite_url, ingest_token=None, read_token=None))
    with TestClient(app) as client:
        assert gc.get_threshold() == GC_THRESHOLDS
        assert client.get("/api/v1/catalogue").status_code == 200
    assert gc.get_threshold() == before


def test_apps_whose_lifespans_overlap_give_the_collector_back_once_the_last_stops(sqlite_url: str) -> None:
    # The issue: the first app to stop put the thresholds back (and unfroze) while the second
    # still served, and the second then "restored" the raised thresholds for good.
    gc.set_threshold(700, 10, 10)
    settings = Settings(database_url=sqlite_url, ingest_token=None, read_token=None)
    first, second = TestClient(create_app(settings)), TestClient(create_app(settings))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0  # the second still serves
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
