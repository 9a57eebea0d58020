"""What compose and Kubernetes checks share: containers as they would run, Dockerfiles, env names, config runs.

Every check returns a list of problems (strings naming the file, object and key) instead of asserting, so the tests
can assert both "no problems in the real files" and "this planted error is reported".
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel

from cooper.config import ENV_NESTING, ENV_PREFIX, CooperConfig

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("verifier", "reward", "policy", "generator")
# The reward service's read replicas (reward.role=replica): `cooper serve reward` too, serving only, scaled out.
REPLICA = "reward-replica"
GPU_SERVICES = {"reward", "policy", "generator", REPLICA}
REDIS_PORT = 6379
# Image repository name (last path segment, without tag) -> the Dockerfile that builds it.
IMAGES = {"cooper": ROOT / "docker/cpu.Dockerfile", "cooper-gpu": ROOT / "docker/gpu.Dockerfile"}
# COOPER_* variables that are not config fields (they hold no `__`, so the config loader skips them by design).
NON_CONFIG_ENV = {"COOPER_CACHE"}


@dataclass
class Container:
    """One container as it would run: the full argv, its environment, and the files mounted into it."""

    origin: str
    image: str
    argv: list[str]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    """container path -> file text (mounted config files)"""
    volumes: list[str] = field(default_factory=list)
    """mount paths of persistent volumes (named volumes, PVCs)"""
    read_only: list[str] = field(default_factory=list)
    """those of `volumes` mounted read-only"""

    @property
    def cooper_args(self) -> list[str] | None:
        """The arguments after `cooper` (past a `tini --` wrapper, or past `torchrun ... -m cooper.cli`), or None when
        the container runs something else."""
        argv = _unwrapped(self.argv)
        if argv[:1] == ["torchrun"]:
            module = _torchrun_module(argv)
            return argv[module + 2:] if module is not None and argv[module + 1] == "cooper.cli" else None
        return argv[1:] if argv and argv[0] == "cooper" else None

    @property
    def torchrun(self) -> dict[str, str] | None:
        """torchrun's options ({"nnodes": "2", "node-rank": "0", ...}), or None when torchrun does not launch it."""
        argv = _unwrapped(self.argv)
        if argv[:1] != ["torchrun"]:
            return None
        options = {}
        for arg in argv[1:_torchrun_module(argv)]:
            name, _, value = arg.removeprefix("--").partition("=")
            options[name.replace("_", "-")] = value
        return options

    @property
    def role(self) -> str | None:
        """verifier | reward | reward-replica | policy | generator | orchestrator, from the command (and, for a
        replica, COOPER_REWARD__ROLE or a reward.role override)."""
        args = self.cooper_args or []
        if args[:1] == ["serve"] and len(args) > 1:
            if args[1] == "reward" and (self.env.get("COOPER_REWARD__ROLE") == "replica"
                                        or "reward.role=replica" in args):
                return REPLICA
            return args[1]
        return "orchestrator" if args[:1] == ["train"] else None


def _unwrapped(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    return argv[2:] if argv[:2] == ["tini", "--"] else argv


def _torchrun_module(argv: Sequence[str]) -> int | None:
    """The index of `-m` in a torchrun command line (its options are all --name=value before it)."""
    return next((i for i, a in enumerate(argv) if a == "-m" and i + 1 < len(argv)), None)


def default_ports() -> dict[str, dict[str, int]]:
    """{service: {"grpc", "metrics"[, "http"]}} from the config defaults."""
    c = CooperConfig()
    ports = {s: {"grpc": getattr(c, s).server.port, "metrics": getattr(c, s).server.metrics_port} for s in SERVICES}
    ports["reward"]["http"] = c.reward.http.port
    ports[REPLICA] = dict(ports["reward"])  # the same server, other role
    return ports


def image_repo(image: str) -> str:
    """ghcr.io/org/cooper-gpu:0.1.0 -> cooper-gpu."""
    last = image.rsplit("/", 1)[-1]
    return last.split("@")[0].split(":")[0]


# --- Dockerfiles -----------------------------------------------------------------------------------------------

def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += " " + line[:-1] if line.endswith("\\") else " " + line
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def exec_form(text: str) -> list[str]:
    return json.loads(text) if text.startswith("[") else shlex.split(text)


def image_entrypoint(image: str) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of the Dockerfile that builds `image`."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for word, rest in dockerfile_instructions(IMAGES[image_repo(image)]):
        if word == "ENTRYPOINT":
            entrypoint = exec_form(rest)
        elif word == "CMD":
            cmd = exec_form(rest)
    return entrypoint, cmd


def dockerfile_problems(path: Path, gpu: bool) -> list[str]:
    """Non-root user, a healthcheck through cooper.runtime.healthcheck, `cooper` as entry point, existing COPY sources,
    the right base and torch build."""
    problems = []
    steps = dockerfile_instructions(path)
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for w, rest in steps if w == "ARG" and "=" in rest}
    users = [rest for w, rest in steps if w == "USER"]
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        problems.append(f"{path.name}: the last USER must be a non-root user (got {users[-1:] or 'none'})")
    health = [rest for w, rest in steps if w == "HEALTHCHECK"]
    if not health or "cooper.runtime.healthcheck" not in health[-1]:
        problems.append(f"{path.name}: no HEALTHCHECK running cooper.runtime.healthcheck")
    entry = [exec_form(rest) for w, rest in steps if w == "ENTRYPOINT"]
    if not entry or entry[-1][-1:] != ["cooper"]:
        problems.append(f"{path.name}: ENTRYPOINT must end with the `cooper` command (got {entry[-1:]})")
    for w, rest in steps:
        if w == "COPY" and "--from" not in rest:
            for source in exec_form(rest)[:-1]:
                # A wildcard may match nothing (BuildKit allows it beside a source that exists): the optional
                # wheelhouse .whl* of cpu.Dockerfile.
                if not any(c in source for c in "*?[") and not (ROOT / source).exists():
                    problems.append(f"{path.name}: COPY source {source} does not exist")
    base = [rest for w, rest in steps if w == "FROM"][-1]
    # FROM ${ARG}: the argument's default, the base a plain `docker build` gets (BASE_IMAGE).
    base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), base)
    if "-slim" not in base:
        problems.append(f"{path.name}: the image must build FROM a slim base (got {base})")
    # The locks are made for CPython 3.11 (requirements/lock.sh); a base with another Python resolves differently
    # (vLLM asks for setuptools<81 and six under 3.12).
    if not base.startswith("python:3.11-"):
        problems.append(f"{path.name}: the base must be Python 3.11, the Python the locks are made for (got {base})")
    if gpu:
        text = path.read_text()
        if not all(tool in text for tool in ("gcc", "python3-dev")):
            problems.append(f"{path.name}: the GPU image needs a C compiler and Python's headers (Triton, torch.compile)")
        if "NVIDIA_VISIBLE_DEVICES" not in text:
            problems.append(f"{path.name}: the GPU image must ask the NVIDIA runtime for the driver (NVIDIA_ variables)")
    lock = "requirements/gpu.txt" if gpu else "requirements/cpu.txt"
    if not any(w == "COPY" and exec_form(rest)[:1] == [lock] for w, rest in steps):
        problems.append(f"{path.name}: the image must install the lock of exact versions, {lock}")
    if gpu:  # the GPU lock pins torch's CUDA build along with vLLM
        return problems
    torch = [rest for w, rest in steps if w == "RUN" and '"torch==${TORCH_VERSION}"' in rest]
    if args.get("TORCH_VERSION") != "2.13.0" or not torch:
        problems.append(f"{path.name}: torch must be installed as torch==${{TORCH_VERSION}} with TORCH_VERSION=2.13.0")
    elif "download.pytorch.org/whl/cpu" not in torch[0].replace("${TORCH_INDEX_URL}", args.get("TORCH_INDEX_URL", "")):
        problems.append(f"{path.name}: the CPU image must take torch from the CPU index (by default)")
    return problems


# --- environment and config ------------------------------------------------------------------------------------

def _config_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        model = _config_model(arg)
        if model is not None:
            return model
    return None


def config_field_exists(dotted: str) -> bool:
    """Whether `reward.http.token` names a field of CooperConfig (keys under a dict field are free-form)."""
    parts = dotted.split(".")
    model: type[BaseModel] = CooperConfig
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return False
        if i == len(parts) - 1:
            return True
        sub = _config_model(info.annotation)
        if sub is None:  # a value: only a dict-valued field (data.test_paths) has keys below it
            return get_origin(info.annotation) is dict
        model = sub
    return True


def env_name_problems(env: Mapping[str, str], origin: str) -> list[str]:
    """Every COOPER_* variable must be COOPER_<SECTION>__<KEY> naming a real config field (a single `_` between
    section and key is silently ignored by the loader, which is exactly the mistake to catch)."""
    problems = []
    for name in env:
        if not name.startswith(ENV_PREFIX) or name in NON_CONFIG_ENV:
            continue
        if ENV_NESTING not in name:
            problems.append(f"{origin}: {name} is ignored by the config loader: config variables are "
                            f"COOPER_<SECTION>__<KEY>, with double underscores")
            continue
        dotted = name[len(ENV_PREFIX):].lower().replace(ENV_NESTING, ".")
        if not config_field_exists(dotted):
            problems.append(f"{origin}: {name} names no config field ('{dotted}')")
    return problems


@dataclass
class ConfigRun:
    """The result of running a container's command with `--check-config`."""

    container: Container
    returncode: int
    stdout: str
    stderr: str

    @property
    def config(self) -> dict[str, Any]:
        return yaml.safe_load(self.stdout)


def check_config_runs(containers: Sequence[Container], workdir: Path) -> list[ConfigRun]:
    """Run each container's cooper command plus `--check-config`, in parallel, with only the container's environment
    and its mounted files (written under workdir, container paths in the arguments pointed at them)."""
    procs = []
    for i, container in enumerate(containers):
        args = container.cooper_args
        assert args is not None, f"{container.origin} does not run cooper"
        home = workdir / f"c{i}"
        mapped = {}
        for target, text in container.files.items():
            host = home / "mnt" / target.lstrip("/")
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_text(text)
            mapped[target] = str(host)
        argv = [mapped.get(a, a) for a in args]
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "PYTHONPATH": str(ROOT), **container.env}
        procs.append((container, subprocess.Popen(
            [sys.executable, "-m", "cooper.cli", *argv, "--check-config"], cwd=home, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )))
    runs = []
    for container, proc in procs:
        out, err = proc.communicate(timeout=120)
        runs.append(ConfigRun(container, proc.returncode, out, err))
    return runs


def train_command_exists() -> bool:
    """`cooper train` is being written in parallel with this deployment; the orchestrator checks wait for it."""
    proc = subprocess.run([sys.executable, "-m", "cooper.cli", "train", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return proc.returncode == 0


def service_config_problems(role: str, config: Mapping[str, Any], origin: str) -> list[str]:
    """A service in a container must bind every interface, on the default ports that compose, Kubernetes and the
    clients all assume."""
    problems = []
    defaults = default_ports()
    if role == REPLICA:
        if config["reward"]["role"] != "replica":
            problems.append(f"{origin}: reward.role is {config['reward']['role']!r}; a replica needs 'replica'")
        role = "reward"  # and everything else as for the reward service
    elif role == "reward" and config["reward"]["role"] != "trainer":
        problems.append(f"{origin}: reward.role is {config['reward']['role']!r}; Deployment/reward is the trainer")
    if role in SERVICES:
        server = config[role]["server"]
        if server["host"] != "0.0.0.0":
            problems.append(f"{origin}: {role}.server.host is {server['host']}; it must be 0.0.0.0 in a container")
        for key, want in (("port", defaults[role]["grpc"]), ("metrics_port", defaults[role]["metrics"])):
            if server[key] != want:
                problems.append(f"{origin}: {role}.server.{key} is {server[key]}, but the deployment expects {want}")
    if role == "reward":
        http = config["reward"]["http"]
        if http["host"] != "0.0.0.0" or http["port"] != defaults["reward"]["http"] or not http["enabled"]:
            problems.append(f"{origin}: reward.http must be enabled on 0.0.0.0:{defaults['reward']['http']}, "
                            f"got {http['host']}:{http['port']} enabled={http['enabled']}")
    return problems


# Who calls whom: the orchestrator drives every service and Redis; the generator checks negatives with the verifier.
CLIENT_OF = {"orchestrator": (*SERVICES, "redis"), "generator": ("verifier",)}


def address_problems(config: Mapping[str, Any], origin: str, reachable: Mapping[str, set[int]],
                     role: str = "orchestrator") -> list[str]:
    """The addresses a role calls (services, Redis URL) must name a host the deployment defines, on the port it
    serves."""
    problems = []
    defaults = default_ports()
    calls = CLIENT_OF.get(role, ())
    for service in (s for s in SERVICES if s in calls):
        address = config[service]["server"]["address"]
        host, _, port = (address or "").rpartition(":")
        want = defaults[service]["grpc"]
        if host != service or port != str(want) or want not in reachable.get(host, set()):
            problems.append(f"{origin}: {service}.server.address is {address!r}; expected '{service}:{want}', "
                            f"served by the deployment's {service}")
    if "redis" not in calls:
        return problems
    url = config["redis"]["url"] or ""
    hostport = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]  # past a user:password@
    host, _, port = hostport.rpartition(":")
    if not url.startswith("redis://") or port != str(REDIS_PORT) or REDIS_PORT not in reachable.get(host, set()):
        problems.append(f"{origin}: redis.url is {url!r}; expected redis://[:password@]<redis host>:{REDIS_PORT}/N")
    return problems


def persistence_problems(role: str, config: Mapping[str, Any], container: Container) -> list[str]:
    """What must survive a restart (checkpoints, the run directory) must be written under a persistent volume; a
    reward replica reads the trainer's checkpoints from one mounted read-only (it must never write there)."""
    paths = {"reward": [("reward.checkpoint_dir", config["reward"]["checkpoint_dir"])],
             REPLICA: [("reward.checkpoint_dir", config["reward"]["checkpoint_dir"])],
             "policy": [("policy.checkpoint_dir", config["policy"]["checkpoint_dir"])],
             "orchestrator": [("run.output_dir", config["run"]["output_dir"])]}.get(role, [])
    problems = []
    for key, path in paths:
        mounts = [mount for mount in container.volumes if Path(path).is_relative_to(mount)]
        if not mounts:
            problems.append(f"{container.origin}: {key} is {path}, which is on no persistent volume "
                            f"(volumes at {container.volumes})")
        elif (mounts[-1] in container.read_only) != (role == REPLICA):
            problems.append(f"{container.origin}: {key} is on a volume mounted "
                            f"{'read-write' if role == REPLICA else 'read-only'}; a reward replica mounts the "
                            "trainer's checkpoints read-only, everything else writes there")
    return problems


def config_run_problems(runs: Sequence[ConfigRun], reachable: Mapping[str, set[int]]) -> list[str]:
    """Each command accepted its config, and the config it resolved fits the deployment."""
    problems = []
    for run in runs:
        origin = run.container.origin
        if run.returncode != 0:
            problems.append(f"{origin}: `cooper {' '.join(run.container.cooper_args or [])} --check-config` exited "
                            f"{run.returncode}: {run.stderr.strip().splitlines()[-1:]}")
            continue
        role = run.container.role or "?"
        config = run.config
        problems += service_config_problems(role, config, origin)
        problems += address_problems(config, origin, reachable, role)
        problems += persistence_problems(role, config, run.container)
    return problems


# torchrun's rendezvous on node 0 (--master-port) and the longest a lost node may go unnoticed.
RENDEZVOUS_PORT = 29400
MAX_DISTRIBUTED_TIMEOUT_S = 300.0


def torchrun_problems(container: Container, gpus: int, where: str) -> list[str]:
    """A policy launched by torchrun across nodes: a static rendezvous on node 0, no restarts inside torchrun (the
    launcher around it restarts the whole group), one rank per GPU, the launcher's world size, and a collective
    timeout short enough that a lost node is noticed in seconds."""
    options = container.torchrun or {}
    problems = []
    if container.role != "policy":
        problems.append(f"{where}: torchrun launches `{' '.join(container.cooper_args or container.argv)}`; only "
                        "`-m cooper.cli serve policy` runs under torchrun")
    required = {"nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port", "max-restarts"}
    if required - set(options):
        problems.append(f"{where}: torchrun needs --{', --'.join(sorted(required - set(options)))}")
    if not options.get("nnodes", "").isdigit() or ":" in options.get("nnodes", ""):
        problems.append(f"{where}: --nnodes={options.get('nnodes')}: a fixed node count (static rendezvous)")
    if options.get("rdzv-backend", "static") != "static" or "rdzv-endpoint" in options:
        problems.append(f"{where}: the rendezvous must be static (--master-addr and --master-port, no --rdzv-*)")
    if options.get("master-port") != str(RENDEZVOUS_PORT):
        problems.append(f"{where}: --master-port={options.get('master-port')}; the deployment opens {RENDEZVOUS_PORT}")
    if options.get("max-restarts") != "0":
        problems.append(f"{where}: --max-restarts={options.get('max-restarts')}; torchrun must not restart ranks on "
                        "one node alone: the launcher around it restarts the whole group")
    if options.get("nproc-per-node") != str(gpus):
        problems.append(f"{where}: --nproc-per-node={options.get('nproc-per-node')} but the node gets {gpus} GPUs; "
                        "one rank per GPU")
    if container.env.get("COOPER_POLICY__WORLD_SIZE") != "auto":
        problems.append(f"{where}: COOPER_POLICY__WORLD_SIZE is {container.env.get('COOPER_POLICY__WORLD_SIZE')!r}; "
                        "under torchrun it must be auto (the launcher's WORLD_SIZE)")
    timeout = container.env.get("COOPER_POLICY__DISTRIBUTED__TIMEOUT_S")
    try:
        too_long = timeout is None or float(timeout) > MAX_DISTRIBUTED_TIMEOUT_S
    except ValueError:
        too_long = True
    if too_long:
        problems.append(f"{where}: COOPER_POLICY__DISTRIBUTED__TIMEOUT_S is {timeout!r}; set it to at most "
                        f"{MAX_DISTRIBUTED_TIMEOUT_S:.0f} so that a lost node is noticed in seconds")
    return problems


def policy_rank_problems(world_size: str | None, gpus: int, where: str) -> list[str]:
    """The policy's ranks must match its GPUs: policy.world_size auto (one rank per GPU) or exactly the count."""
    if world_size in (None, "", "1") and gpus == 1:
        return []
    if world_size == "auto" or world_size == str(gpus):
        return []
    return [f"{where}: policy.world_size is {world_size or 'unset (1)'} but it gets {gpus} GPUs; set "
            "COOPER_POLICY__WORLD_SIZE=auto (one rank per GPU)"]
