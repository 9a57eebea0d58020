"""The code's layers, held by reading every module's imports (no import runs): services never import the run or each
other, the run engine never imports the launcher or the experiment tooling, evaluation stays plain Python, no module
imports another's private names, and each package's docstring is a current map of its modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cooper"
ABOVE_THE_SERVICES = ("cooper.orchestrator", "cooper.launcher", "cooper.experiments", "cooper.cli",
                      "cooper.annotation", "cooper.eval_rm")
"""What drives the services: none of it may be imported by a service."""
SERVICE_SURFACE = ("client", "inprocess", "messages", "items", "errors")
"""What the run engine may import of a service: its two faces with one interface (the gRPC client, and the core
behind the same calls in this process), the plain data they speak and the refusals they raise; never its core or
server directly."""
PLAIN_EVALUATION = ("cooper.evaluation", "cooper.metric_names", "cooper.jsonl", "cooper.reward_rule", "cooper.tiny.task",
                    "__future__")
"""What the evaluation kits may import of Cooper: pure Python, so the engine and tests use them freely."""
HEAVY = ("torch", "transformers", "grpc", "redis", "vllm", "fastapi")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in the file, at any depth (a function's too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "protos" not in p.parts}


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def service_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "services" else None


def test_the_layers_hold() -> None:
    broken = []
    for module, path in MODULES.items():
        for target, _ in imports(path):
            if not target.startswith("cooper"):
                if under(module, "cooper.evaluation") and under(target, *HEAVY):
                    broken.append(f"{module} imports {target}: evaluation stays plain Python")
                continue
            own, other = service_of(module), service_of(target)
            if own and under(target, *ABOVE_THE_SERVICES):
                broken.append(f"{module} imports {target}: a service never imports what drives it")
            if own and other and other != own and not (
                    own in ("generator", "reward") and other == "verifier"
                    and target.rsplit(".", 1)[-1] in ("client", "inprocess", "messages")):
                broken.append(f"{module} imports {target}: services do not import each other (the generator and "
                              "the reward service's learning mode call the verifier through its client, or its "
                              "in-process face)")
            if under(module, "cooper.orchestrator") and under(target, "cooper.launcher", "cooper.experiments",
                                                              "cooper.cli"):
                broken.append(f"{module} imports {target}: the run engine never imports what launches or studies "
                              "runs")
            if (under(module, "cooper.orchestrator", "cooper.experiments", "cooper.eval_rm") and other
                    and target.rsplit(".", 1)[-1] not in SERVICE_SURFACE):
                broken.append(f"{module} imports {target}: the engine and what studies runs reach a service through "
                              "its client or its in-process face")
            if under(module, "cooper.launcher") and under(target, "cooper.experiments", "cooper.cli"):
                broken.append(f"{module} imports {target}: the launcher never imports the experiment tooling")
            if under(module, "cooper.evaluation") and not under(target, *PLAIN_EVALUATION):
                broken.append(f"{module} imports {target}: evaluation stays plain Python")
    assert not broken, "\n".join(broken)


def test_no_module_imports_another_modules_private_names() -> None:
    broken = [f"{module} imports {name} from {target}"
              for module, path in MODULES.items() for target, names in imports(path)
              if target.startswith("cooper") and target != module
              for name in names if name.startswith("_") and not name.startswith("__")]
    assert not broken, "\n".join(broken)


MAPPED = ["cooper.orchestrator", "cooper.launcher", "cooper.experiments", "cooper.evaluation", "cooper.runtime",
          "cooper.services.generator", "cooper.services.policy", "cooper.services.reward",
          "cooper.services.verifier", "cooper.tiny"]


@pytest.mark.parametrize("package", MAPPED)
def test_each_package_docstring_maps_its_modules(package: str) -> None:
    folder = PACKAGE.parent.joinpath(*package.split("."))
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    present = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    present |= {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
    named = set(re.findall(r"`([a-z_][a-z0-9_]*\.py|[a-z_][a-z0-9_]*/)`", doc))  # `name.py` or `folder/`
    assert present - named == set(), f"{package}'s docstring does not name {sorted(present - named)}"
    assert named - present == set(), f"{package}'s docstring names what is not there: {sorted(named - present)}"
