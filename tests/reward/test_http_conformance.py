"""The HTTP API against its own OpenAPI spec: schemathesis with every check (`st run --checks all`), through a real
uvicorn on loopback, over the real service and tiny model, with the repository's schemathesis.toml.

Bounded and derandomized (a fixed example budget per operation, the same examples on every run), so that it is
fast and never flaky; a longer random exploration is `st run http://HOST:8000/openapi.json --checks all` from the
repository root.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
import schemathesis.engine
from reward_testkit import Served, make_config, serve_http
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events

from cooper.config import HttpConfig

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "conformance-token-1234"


@pytest.fixture(scope="module")
def reward_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    config = make_config(Path(tmp_path_factory.mktemp("reward-conformance")), http=HttpConfig(port=0, token=TOKEN))
    with serve_http(config) as served:
        yield served


def conformance_failures(url: str, headers: dict[str, str], max_examples: int) -> list[str]:
    """What `st run URL/openapi.json --checks all` reports, through schemathesis's engine (the CLI's own), with
    schemathesis.toml and a fixed seed: one line per failed check, and every error."""
    config = SchemathesisConfig.from_path(ROOT / "schemathesis.toml")
    config.update(seed=1, max_failures=None)
    project = config.projects.override
    project.update(headers=headers)
    project.checks.update(included_check_names=["all"])
    project.generation.update(max_examples=max_examples, deterministic=True, database="none")
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=config)
    failures = []
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, (events.NonFatalError, events.FatalError)):
            failures.append(f"error: {event.info.title if hasattr(event, 'info') else event}: {event.value}")
        recorder = getattr(event, "recorder", None)
        if recorder is None:
            continue
        for case_id, checks in recorder.checks.items():
            for check in checks:
                if check.status == Status.FAILURE:
                    case = recorder.cases[case_id].value
                    failures.append(f"{check.name}: {case.method} {case.path}: {check.failure_info.failure.title}")
    return sorted(set(failures))


def test_every_operation_conforms_to_the_openapi_spec(reward_api: Served) -> None:
    failures = conformance_failures(reward_api.url, {"Authorization": f"Bearer {TOKEN}"}, max_examples=10)
    assert not failures, "\n".join(failures)


def test_an_open_api_documents_no_auth(tmp_path: Path) -> None:
    from cooper.services.reward.serving.http import create_app

    open_spec = create_app(make_config(tmp_path)).openapi()
    assert "securitySchemes" not in open_spec.get("components", {})
    for operations in open_spec["paths"].values():
        for operation in operations.values():
            assert "security" not in operation and "401" not in operation["responses"]
    closed = create_app(make_config(tmp_path, http=HttpConfig(token=TOKEN))).openapi()
    assert closed["paths"]["/v1/score"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "401" in closed["paths"]["/v1/score"]["post"]["responses"]
    assert "text/plain" in closed["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


def test_405_names_the_allowed_methods(reward_api: Served) -> None:
    reply = httpx.request("TRACE", f"{reward_api.url}/v1/score")
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    assert reply.json()["error"]["type"] == "method_not_allowed"
