"""docker-compose.yml for a CPU-only smoke run: the same file with the GPU reservations dropped, every Cooper service
on the CPU image, images that were built here instead of pulled, smoke settings in the environment and a CPU cap.

    python deploy/smoke/cpu_compose.py docker-compose.yml -o /tmp/smoke.yml --env COOPER_RUN__STEPS=12 --cpus 1
    docker-compose --project-directory . -f /tmp/smoke.yml up -d

Why a rewritten file and not an override file: compose merges an override's `devices` into the base's list (1.29
always, v2 unless given `!reset`, which 1.29 cannot parse), so no override can drop a GPU reservation. Everything
else is left as the file says (ports, healthchecks, volumes, depends_on, `${...}` variables, which compose still
interpolates), so the smoke run checks the real file. Left out: the `replicas` profile's service stays in but does
not start, as in a plain `up`.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

COOPER_IMAGES = ("cooper", "cooper-gpu")  # the CPU and the GPU image of docker/


def _image_repo(image: str) -> str:
    """`cooper-gpu:0.1.0` -> `cooper-gpu` (a registry prefix is kept: `ghcr.io/x/cooper-gpu` stays itself)."""
    return image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image


def _drop_gpu_devices(service: dict[str, Any]) -> None:
    """Remove device reservations that ask for a GPU, and the `deploy` keys they leave empty."""
    deploy = service.get("deploy") or {}
    reservations = (deploy.get("resources") or {}).get("reservations") or {}
    devices = [d for d in reservations.get("devices") or [] if "gpu" not in (d.get("capabilities") or [])]
    if devices:
        reservations["devices"] = devices
    else:
        reservations.pop("devices", None)
    for parent, key in ((deploy.get("resources") or {}, "reservations"), (deploy, "resources"), (service, "deploy")):
        if key in parent and not parent[key]:
            del parent[key]


def smoke_compose(compose: dict[str, Any], cpu_image: str, redis_image: str, environment: dict[str, str],
                  cpus: float | None) -> dict[str, Any]:
    """A copy of `compose` (the YAML as loaded: anchors merged, variables not yet interpolated) for a CPU machine.

    Every service of the GPU image runs `cpu_image` instead, the Redis service runs `redis_image`, no service builds
    (the images exist: compose 1.29 would build with the classic builder, which cannot build docker/cpu.Dockerfile),
    and every Cooper service gets `environment` on top of its own and, when given, a cap of `cpus` CPUs."""
    # The x- extension blocks were only anchors, merged into the services on load.
    out = {k: copy.deepcopy(v) for k, v in compose.items() if not k.startswith("x-")}
    for service in out["services"].values():
        image = str(service.get("image", ""))
        repo = _image_repo(image)
        _drop_gpu_devices(service)
        service.pop("build", None)
        if repo == "redis" or repo.endswith("/redis"):
            service["image"] = redis_image
            continue
        if repo in COOPER_IMAGES:
            service["image"] = cpu_image
            service["environment"] = {**(service.get("environment") or {}), **environment}
            if cpus is not None:
                service["cpus"] = cpus
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("compose_file", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--cpu-image", default="cooper:0.1.0")
    parser.add_argument("--redis-image", default="cooper-redis:bookworm")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="added to every Cooper service's environment (repeatable)")
    parser.add_argument("--cpus", type=float, default=None, help="CPU cap of each Cooper container")
    args = parser.parse_args(argv)
    bad = [e for e in args.env if "=" not in e]
    if bad:
        parser.error(f"--env takes NAME=VALUE, got {bad[0]!r}")
    environment = dict(e.split("=", 1) for e in args.env)
    compose = yaml.safe_load(args.compose_file.read_text())
    result = smoke_compose(compose, args.cpu_image, args.redis_image, environment, args.cpus)
    # Anchors were merged on load; dumped without aliases, the file reads as compose's own `config` would print it.
    text = yaml.dump(result, Dumper=_NoAliases, sort_keys=False, width=120)
    args.output.write_text(f"# Made by deploy/smoke/cpu_compose.py from {args.compose_file}; do not edit.\n{text}")
    return 0


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


if __name__ == "__main__":
    sys.exit(main())
