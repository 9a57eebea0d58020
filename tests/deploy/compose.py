"""docker-compose.yml as data: loading with compose's variable interpolation, the compose-spec schema, the containers
it would run, and the deployment rules (health-gated start, GPUs, ports, Redis AOF)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .common import (
    GPU_SERVICES,
    IMAGES,
    REDIS_PORT,
    REPLICA,
    ROOT,
    SERVICES,
    Container,
    default_ports,
    env_name_problems,
    image_entrypoint,
    image_repo,
    policy_rank_problems,
    torchrun_problems,
)

# compose-spec.json from github.com/compose-spec/compose-spec (schema/compose-spec.json, commit 170098ba07d9,
# 2025-10-28), Apache-2.0: see tests/deploy/NOTICE.
SCHEMA_PATH = Path(__file__).with_name("compose-spec.json")
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: Any, environ: Mapping[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error} and $$, applied to every string."""
    if isinstance(value, dict):
        return {k: interpolate(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, environ) for v in value]
    if not isinstance(value, str):
        return value

    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        current = environ.get(name)
        unset = current is None or (op is not None and op.startswith(":") and current == "")
        if op in {":?", "?"} and unset:
            raise ValueError(f"compose variable {name} is required: {arg}")
        if op in {":-", "-"} and unset:
            return arg
        return current or ""

    return VARIABLE.sub(replace, value)


# The secrets docker-compose.yml requires (a user keeps them in .env): test values.
SECRETS_ENV = {"COOPER_GRPC_TOKEN": "test-grpc-token", "COOPER_REDIS_PASSWORD": "test-redis-password"}


def load_compose(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file after YAML anchors/merge keys and variable interpolation (with `environ`, by default only
    the required secrets, SECRETS_ENV)."""
    return interpolate(yaml.safe_load(path.read_text()), SECRETS_ENV if environ is None else environ)


@cache
def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(SCHEMA_PATH.read_text()))


def schema_problems(compose: dict[str, Any]) -> list[str]:
    return [f"docker-compose.yml: {'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in _validator().iter_errors(compose)]


def _environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}


def _mounts(service: Mapping[str, Any], directory: Path,
            named: set[str]) -> tuple[dict[str, str], list[str], list[str]]:
    files, volumes, read_only = {}, [], []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume.get("source", ""), volume["target"]
            ro = bool(volume.get("read_only"))
        else:
            source, target, mode = (volume.split(":") + ["", ""])[:3]
            ro = "ro" in mode.split(",")
        if source in named:
            volumes.append(target)
            if ro:
                read_only.append(target)
        elif (directory / source).is_file():
            files[target] = (directory / source).read_text()
    return files, volumes, read_only


def containers(compose: dict[str, Any], directory: Path) -> dict[str, Container]:
    """Compose service name -> the container it runs, for the services that run a Cooper image."""
    out = {}
    named = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        image = service.get("image", "")
        if image_repo(image) not in IMAGES:
            continue
        entrypoint, cmd = image_entrypoint(image)
        entrypoint = service.get("entrypoint", entrypoint)
        command = service.get("command", cmd)
        files, volumes, read_only = _mounts(service, directory, named)
        out[name] = Container(f"compose service {name}", image, [*entrypoint, *command], _environment(service),
                              files, volumes, read_only)
    return out


def _aliases(service: Mapping[str, Any]) -> list[str]:
    networks = service.get("networks") or {}
    return [a for n in (networks.values() if isinstance(networks, dict) else []) for a in (n or {}).get("aliases", [])]


def _node_rank(container: Container) -> str | None:
    """torchrun's --node-rank of a container, None when torchrun does not launch it."""
    return None if container.torchrun is None else container.torchrun.get("node-rank")


def reachable(compose: dict[str, Any], directory: Path | None = None) -> dict[str, set[int]]:
    """Host name (service name or network alias) on the compose network -> the ports served there. A torchrun node
    other than node 0 serves nothing."""
    ports = default_ports()
    hosts: dict[str, set[int]] = {}
    cooper = containers(compose, directory or ROOT)
    for name, service in compose["services"].items():
        if image_repo(service.get("image", "")) == "redis":
            hosts[name] = {REDIS_PORT}
        elif name in cooper and cooper[name].role in (*SERVICES, REPLICA) and _node_rank(cooper[name]) in (None, "0"):
            for host in (name, *_aliases(service)):
                hosts[host] = set(ports[cooper[name].role].values())
    return hosts


def _published_host_ips(service: Mapping[str, Any]) -> list[str]:
    """The host address each published port binds ("" = every interface)."""
    ips = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ips.append(str(port.get("host_ip", "")))
        else:
            parts = str(port).split("/")[0].split(":")
            ips.append(":".join(parts[:-2]) if len(parts) > 2 else "")
    return ips


def secret_problems(compose: dict[str, Any], directory: Path) -> list[str]:
    """The secrets are wired: every Cooper container has the same non-empty gRPC token, Redis requires a password
    that every container's redis.url carries, and the reward HTTP API is published beyond loopback only with its
    token set."""
    problems = []
    services = compose["services"]
    cooper = containers(compose, directory)
    tokens = {name: c.env.get("COOPER_SECURITY__TOKEN", "") for name, c in cooper.items()}
    for name, token in tokens.items():
        if not token:
            problems.append(f"compose service {name}: COOPER_SECURITY__TOKEN is unset or empty: the services would "
                            f"take calls from anyone on the network")
    if len(set(tokens.values())) > 1:
        problems.append("docker-compose.yml: the containers get different COOPER_SECURITY__TOKEN values")
    for name, service in services.items():
        if image_repo(service.get("image", "")) != "redis":
            continue
        command = [str(a) for a in service.get("command") or []]
        password = command[command.index("--requirepass") + 1] if "--requirepass" in command[:-1] else ""
        if not password:
            problems.append(f"compose service {name}: Redis must run with --requirepass")
            continue
        for cname, c in cooper.items():
            if f":{password}@" not in c.env.get("COOPER_REDIS__URL", ""):
                problems.append(f"compose service {cname}: COOPER_REDIS__URL must carry Redis's password "
                                f"(redis://:${{COOPER_REDIS_PASSWORD}}@redis:6379/0)")
    for name, c in cooper.items():
        open_ips = [ip or "every interface" for ip in _published_host_ips(services[name])
                    if ip not in ("127.0.0.1", "::1", "localhost")]
        if open_ips and not c.env.get("COOPER_REWARD__HTTP__TOKEN"):
            problems.append(f"compose service {name}: publishes on {open_ips} without "
                            f"COOPER_REWARD__HTTP__TOKEN; bind 127.0.0.1 unless a token is set")
    return problems


def _published(service: Mapping[str, Any]) -> list[int]:
    targets = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            targets.append(int(port["target"]))
        else:
            targets.append(int(str(port).split("/")[0].rsplit(":", 1)[-1]))
    return targets


def _healthcheck_port(service: Mapping[str, Any]) -> int | None:
    test = (service.get("healthcheck") or {}).get("test") or []
    if "cooper.runtime.healthcheck" not in test:
        return None
    address = next((a for a in test if re.fullmatch(r"[\w.-]+:\d+", str(a))), None)
    return int(address.rsplit(":", 1)[1]) if address else None


def _gpu_reserved(service: Mapping[str, Any]) -> bool:
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    return any("gpu" in (d.get("capabilities") or []) for d in devices)


def _gpu_ids(service: Mapping[str, Any]) -> list[str]:
    """The GPU indexes a service reserves; an entry "0,1,2,3" is four (the daemon joins the ids with commas)."""
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    return [i.strip() for d in devices if "gpu" in (d.get("capabilities") or [])
            for entry in d.get("device_ids") or [] for i in str(entry).split(",") if i.strip()]


def rule_problems(compose: dict[str, Any], directory: Path) -> list[str]:
    """The deployment rules of the compose file (the schema says it is a compose file; these say it is ours)."""
    problems = []
    services = compose["services"]
    ports = default_ports()
    # The service that runs a role by default (no profile), else the first that does (the replicas' profile).
    by_role: dict[str | None, tuple[str, Container]] = {}
    for name, c in containers(compose, directory).items():
        if c.role not in by_role or (not services[name].get("profiles") and services[by_role[c.role][0]].get("profiles")):
            by_role[c.role] = (name, c)
    for role in (*SERVICES, REPLICA, "orchestrator"):
        if role not in by_role:
            command = {"orchestrator": "train", REPLICA: "serve reward` with reward.role=replica`"}.get(role, f"serve {role}")
            problems.append(f"docker-compose.yml: no service runs `cooper {command}`")
    for name, container in containers(compose, directory).items():
        service, role = services[name], container.role
        problems += env_name_problems(container.env, container.origin)
        want_repo = "cooper-gpu" if role in GPU_SERVICES else "cooper"
        if image_repo(container.image) != want_repo:
            problems.append(f"{container.origin}: runs image {container.image}, expected the {want_repo} image")
        build = service.get("build") or {}
        if build and (directory / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve() != \
                IMAGES[image_repo(container.image)].resolve():
            problems.append(f"{container.origin}: builds {build} but image {container.image} comes from "
                            f"{IMAGES[image_repo(container.image)].name}")
        if _gpu_reserved(service) != (role in GPU_SERVICES):
            problems.append(f"{container.origin}: a GPU reservation is {'missing' if role in GPU_SERVICES else 'not wanted'}")
        if container.torchrun is not None:
            problems += torchrun_problems(container, len(_gpu_ids(service)), container.origin)
            if service.get("restart") != "on-failure":
                problems.append(f"{container.origin}: restart is {service.get('restart')}; a torchrun node must be "
                                "restarted on-failure (a lost peer makes it exit non-zero; a clean stop stays down)")
        elif role == "policy":
            problems += policy_rank_problems(container.env.get("COOPER_POLICY__WORLD_SIZE"), len(_gpu_ids(service)),
                                             container.origin)
        published = _published(service)
        want_published = [ports["reward"]["http"]] if role in ("reward", REPLICA) else []
        if published != want_published:
            problems.append(f"{container.origin}: publishes container ports {published}; only the reward HTTP port "
                            f"{ports['reward']['http']} may be published, on the reward service and its replicas")
        if role == REPLICA:
            if "container_name" in service:
                problems.append(f"{container.origin}: has a container_name, so `--scale` cannot start a second one")
            for port in service.get("ports", []):
                host = str(port.get("published", "") if isinstance(port, dict) else str(port).rsplit(":", 1)[0])
                if host and "-" not in host:
                    problems.append(f"{container.origin}: publishes the fixed host port {host}, which `--scale` "
                                    "cannot bind twice; publish a range (8100-8115:8000)")
        if _node_rank(container) not in (None, "0"):
            if not (service.get("healthcheck") or {}).get("disable"):
                problems.append(f"{container.origin}: torchrun node {_node_rank(container)} serves no gRPC; its "
                                "healthcheck must be disabled (`healthcheck: disable: true`)")
        elif role in (*SERVICES, REPLICA):
            port = _healthcheck_port(service)
            if port != ports[role]["grpc"]:
                problems.append(f"{container.origin}: healthcheck checks port {port}, but {role} serves gRPC on "
                                f"{ports[role]['grpc']}")
    problems += node_group_problems(compose, directory)
    if "orchestrator" in by_role:
        name, _ = by_role["orchestrator"]
        depends = services[name].get("depends_on") or {}
        needed = [by_role[r][0] for r in SERVICES if r in by_role] + [n for n in services if "redis" in n]
        for dep in needed:
            condition = depends.get(dep, {}).get("condition") if isinstance(depends, dict) else None
            if condition != "service_healthy":
                problems.append(f"compose service {name}: must depend on {dep} with condition service_healthy")
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items() if isinstance(service.get("depends_on"), dict) else []:
            health = services.get(dep, {}).get("healthcheck") or {}
            if spec.get("condition") == "service_healthy" and (health.get("disable") or not health.get("test")):
                problems.append(f"compose service {name}: waits for {dep} to be healthy, but {dep} has no healthcheck")
    redis = [s for s in services.values() if image_repo(s.get("image", "")) == "redis"]
    if len(redis) != 1:
        problems.append("docker-compose.yml: expected one redis service")
    else:
        command = " ".join(redis[0].get("command") or [])
        mounts = [str(v).split(":")[1] for v in redis[0].get("volumes", []) if ":" in str(v)]
        if "--appendonly yes" not in command or "/data" not in mounts:
            problems.append("compose service redis: needs `--appendonly yes` and a volume at /data")
    return problems


def node_group_problems(compose: dict[str, Any], directory: Path) -> list[str]:
    """The torchrun nodes of each profile form one group: node ranks 0..M-1 for --nnodes=M, the same launcher
    options, config and environment on every node, --master-addr naming node 0, and node 0 answering to the host the
    orchestrator calls for the policy."""
    services = compose["services"]
    cooper = containers(compose, directory)
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, c in cooper.items():
        if c.torchrun is not None:
            groups.setdefault(tuple(services[name].get("profiles") or ()), []).append(name)
    orchestrator = next((c for c in cooper.values() if c.role == "orchestrator"), None)
    policy_host = ((orchestrator.env if orchestrator else {}).get("COOPER_POLICY__SERVER__ADDRESS") or "").rpartition(":")[0]
    problems = []
    for profiles, names in groups.items():
        where = f"docker-compose.yml: the torchrun nodes {names} (profile {', '.join(profiles) or 'none'})"
        nodes = {name: cooper[name] for name in names}
        ranks = sorted(str(c.torchrun.get("node-rank")) for c in nodes.values())  # type: ignore[union-attr]
        counts = {c.torchrun.get("nnodes") for c in nodes.values()}  # type: ignore[union-attr]
        if len(counts) != 1 or ranks != [str(i) for i in range(len(names))] or counts != {str(len(names))}:
            problems.append(f"{where}: node ranks {ranks} with --nnodes {sorted(map(str, counts))}; expected ranks "
                            f"0..{len(names) - 1} and --nnodes={len(names)}")
        shared = {(tuple(sorted((k, v) for k, v in c.torchrun.items() if k != "node-rank")),  # type: ignore[union-attr]
                   tuple(c.cooper_args or []), tuple(sorted(c.env.items())), tuple(sorted(c.files.items())))
                  for c in nodes.values()}
        if len(shared) != 1:
            problems.append(f"{where}: must run the same command (but --node-rank), config and environment")
        first = next(iter(nodes))
        zero = next((name for name, c in nodes.items() if c.torchrun.get("node-rank") == "0"), first)  # type: ignore[union-attr]
        master = nodes[first].torchrun.get("master-addr")  # type: ignore[union-attr]
        if master != zero:
            problems.append(f"{where}: --master-addr={master}; node 0 is the service {zero}")
        if policy_host and policy_host not in (zero, *_aliases(services[zero])):
            problems.append(f"compose service {zero}: node 0 serves the policy's gRPC, but the orchestrator calls "
                            f"{policy_host}; give {zero} the network alias {policy_host}")
    return problems
