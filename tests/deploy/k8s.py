"""Assembled Kubernetes objects as data: schemas (JobSet's from its published CRD), the containers they would run,
references between objects, probes and ports, and a small NetworkPolicy evaluator that answers "may pod A reach port
P of pod B"."""

from __future__ import annotations

import base64
import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from .common import (
    GPU_SERVICES,
    IMAGES,
    REDIS_PORT,
    RENDEZVOUS_PORT,
    REPLICA,
    SERVICES,
    Container,
    default_ports,
    env_name_problems,
    image_entrypoint,
    image_repo,
    policy_rank_problems,
    torchrun_problems,
)

Obj = dict[str, Any]
# Native gRPC probes are GA from 1.27: validate against it and against the newest schemas the package ships.
K8S_VERSIONS = ("1.27", kubernetes_validate.utils.latest_version())
WORKLOADS = {"Deployment", "StatefulSet", "Job", "DaemonSet", "CronJob", "Pod", "JobSet"}
# jobset.x-k8s.io_jobsets.yaml from github.com/kubernetes-sigs/jobset (config/components/crd/bases, tag v0.12.0),
# Apache-2.0: see tests/deploy/NOTICE.
JOBSET_CRD = Path(__file__).with_name("jobset-crd.yaml")
# Labels Kubernetes (Indexed Jobs) and JobSet put on each pod they create.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME, REPLICATED_JOB = "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name"
# The kernel's default ephemeral ports, where gloo and NCCL listen for their peers.
COLLECTIVE_PORTS = (32768, 60999)


def pod_template(obj: Obj) -> Obj | None:
    """The pod template (metadata and spec) inside a workload, or None for objects that run no pods. A JobSet's is
    that of its first replicated Job (deploy/k8s has JobSets of one)."""
    kind = obj.get("kind")
    if kind == "Pod":
        return obj
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]
    if kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        return obj["spec"]["template"]
    if kind == "JobSet":
        return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return None


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec inside a workload, or None for objects that run no pods."""
    template = pod_template(obj)
    return None if template is None else template.get("spec")


def _id(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def schema_problems(objs: list[Obj], version: str) -> list[str]:
    """Strict validation (unknown fields are errors) against the Kubernetes OpenAPI schemas of `version`; a JobSet
    against JobSet's CRD schema, and each of its Job templates against `version`'s Job schema as well."""
    problems = []
    for obj in objs:
        if obj.get("kind") == "JobSet":
            problems += jobset_schema_problems(obj)
            for rj in obj.get("spec", {}).get("replicatedJobs") or []:
                job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{obj['metadata']['name']}-{rj.get('name')}"},
                       "spec": (rj.get("template") or {}).get("spec")}
                problems += [f"{_id(obj)} replicatedJob {rj.get('name')}: {p}"
                             for p in schema_problems([job], version)]
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path) or "(top)"
            problems.append(f"{_id(obj)} (Kubernetes {version}): {where}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{_id(obj)}: {err.message}")
    return problems


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with strict field validation: an object that lists its
    properties takes no others, unless it says x-kubernetes-preserve-unknown-fields."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = _strict(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_strict(s) for s in schema[key]]
    if "properties" in schema:
        out["properties"] = {name: _strict(s) for name, s in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


@cache
def _jobset_validator() -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(JOBSET_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # The CRD leaves metadata to the API server's ObjectMeta; check the fields a manifest sets.
    schema["properties"]["metadata"] = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}, "additionalProperties": False}
    schema["properties"]["apiVersion"]["enum"] = [f"{crd['spec']['group']}/{version['name']}"]
    schema["properties"]["kind"]["enum"] = [crd["spec"]["names"]["kind"]]
    return jsonschema.Draft4Validator(schema)


def jobset_schema_problems(obj: Obj) -> list[str]:
    """A JobSet against the openAPIV3Schema of JobSet's published CRD, strictly (unknown fields are errors). The
    CRD's CEL rules (x-kubernetes-validations) are not evaluated; jobset_problems checks what Cooper relies on."""
    return [f"{_id(obj)} (JobSet CRD): {'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in _jobset_validator().iter_errors(obj)]


def _find(objs: list[Obj], kind: str, name: str) -> Obj | None:
    return next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)


def _data(obj: Obj | None) -> dict[str, str]:
    if obj is None:
        return {}
    if obj["kind"] == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()} | \
            dict(obj.get("stringData") or {})
    return dict(obj.get("data") or {})


def _cpu_cores(quantity: str) -> int:
    """limits.cpu as a resourceFieldRef with divisor 1 hands it over: rounded up to whole cores."""
    text = str(quantity)
    return math.ceil(int(text[:-1]) / 1000 if text.endswith("m") else float(text))


def _container_env(objs: list[Obj], container: Obj) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source:
                env.update(_data(_find(objs, kind, source[key]["name"])))
    for item in container.get("env", []):
        value_from = item.get("valueFrom") or {}
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
            kind, ref = ("ConfigMap", value_from["configMapKeyRef"]) if "configMapKeyRef" in value_from \
                else ("Secret", value_from["secretKeyRef"])
            data = _data(_find(objs, kind, ref["name"]))
            if ref["key"] in data:
                env[item["name"]] = data[ref["key"]]
        elif "resourceFieldRef" in value_from and value_from["resourceFieldRef"]["resource"] == "limits.cpu":
            env[item["name"]] = str(_cpu_cores(container["resources"]["limits"]["cpu"]))
        else:
            env[item["name"]] = "node-provided"
        env[item["name"]] = _expand(env[item["name"]], env)
    return env


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) in an env value: replaced by an earlier variable of the container, else left as is."""
    return re.sub(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _secret_ref(container: Obj, name: str) -> tuple[str, str] | None:
    """(Secret name, key) that env variable `name` of the container reads, or None when it is not from a Secret."""
    for item in container.get("env", []):
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if item["name"] == name and ref:
            return ref["name"], ref["key"]
    return None


def secret_problems(objs: list[Obj]) -> list[str]:
    """The secrets are wired: every Cooper container reads the gRPC token from one Secret key (so all hold the same
    token), Redis requires a password from a Secret, and the orchestrator's redis.url carries that password."""
    problems = []
    token_refs = {}
    for obj in objs:
        for c in (pod_spec(obj) or {}).get("containers", []):
            if image_repo(c.get("image", "")) not in IMAGES:
                continue
            where = f"{_id(obj)} container {c['name']}"
            ref = _secret_ref(c, "COOPER_SECURITY__TOKEN")
            if ref is None:
                problems.append(f"{where}: COOPER_SECURITY__TOKEN must come from a Secret (secretKeyRef): without "
                                f"it the services take calls from anyone, or the orchestrator is refused")
            else:
                token_refs[where] = ref
    if len(set(token_refs.values())) > 1:
        problems.append(f"the gRPC token comes from different Secret keys: {token_refs}")
    redis = _find(objs, "StatefulSet", "redis")
    redis_container = redis["spec"]["template"]["spec"]["containers"][0] if redis else {}
    password_ref = _secret_ref(redis_container, "REDIS_PASSWORD")
    command = " ".join(redis_container.get("command", []) + redis_container.get("args", []))
    if password_ref is None or "--requirepass" not in command:
        problems.append("StatefulSet/redis: must run with --requirepass and REDIS_PASSWORD from a Secret")
        return problems
    password = _data(_find(objs, "Secret", password_ref[0])).get(password_ref[1], "")
    for c in containers(objs):
        url = c.env.get("COOPER_REDIS__URL", "")
        if c.role == "orchestrator" and f":{password}@" not in url:
            problems.append(f"{c.origin}: COOPER_REDIS__URL ({url or 'unset'}) must carry Redis's password from "
                            f"Secret {password_ref[0]} key {password_ref[1]} (redis://:$(REDIS_PASSWORD)@redis:6379/0)")
    return problems


def containers(objs: list[Obj]) -> list[Container]:
    """Every container that runs a Cooper image, with the argv, environment and mounted files it would get."""
    out = []
    for obj in objs:
        spec = pod_spec(obj)
        if spec is None:
            continue
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("containers", []):
            if image_repo(c.get("image", "")) not in IMAGES:
                continue
            entrypoint, cmd = image_entrypoint(c["image"])
            argv = [*c.get("command", entrypoint), *c.get("args", [] if "command" in c else cmd)]
            files, persistent, read_only = {}, [], []
            for mount in c.get("volumeMounts", []):
                volume = volumes.get(mount["name"], {})
                if "configMap" in volume:
                    data = _data(_find(objs, "ConfigMap", volume["configMap"]["name"]))
                    if "subPath" in mount:
                        files[mount["mountPath"]] = data.get(mount["subPath"], "")
                    else:
                        files.update({f"{mount['mountPath'].rstrip('/')}/{k}": v for k, v in data.items()})
                elif "persistentVolumeClaim" in volume:
                    persistent.append(mount["mountPath"])
                    if mount.get("readOnly") or volume["persistentVolumeClaim"].get("readOnly"):
                        read_only.append(mount["mountPath"])
            out.append(Container(f"{_id(obj)} container {c['name']}", c["image"], argv,
                                 _container_env(objs, c), files, persistent, read_only))
    return out


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions); an empty selector selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@dataclass
class Pod:
    role: str
    labels: dict[str, str]
    namespace: str
    ports: dict[str, int]
    """container port name (or number as text) -> port"""


def pods(objs: list[Obj]) -> list[Pod]:
    """One pod per workload, but a JobSet's as many as its Jobs run, each with the labels Kubernetes and JobSet add
    (the completion index, which the Service `policy` selects on)."""
    out = []
    for obj in objs:
        spec = pod_spec(obj)
        if spec is None:
            continue
        labels = pod_template(obj).get("metadata", {}).get("labels", {})
        ports = {p.get("name", str(p["containerPort"])): p["containerPort"]
                 for c in spec.get("containers", []) for p in c.get("ports", [])}
        role = labels.get("app.kubernetes.io/component", obj["metadata"]["name"])
        namespace = obj["metadata"].get("namespace", "default")
        if obj["kind"] != "JobSet":
            out.append(Pod(role, labels, namespace, ports))
            continue
        rj = obj["spec"]["replicatedJobs"][0]
        for index in range(int(rj["template"]["spec"].get("parallelism", 1))):
            added = {COMPLETION_INDEX: str(index), JOBSET_NAME: obj["metadata"]["name"], REPLICATED_JOB: rj["name"]}
            out.append(Pod(role, {**labels, **added}, namespace, ports))
    return out


def claimed_gpus(objs: list[Obj], spec: Obj, container: Obj) -> int:
    """The GPUs a container takes through Dynamic Resource Allocation: the devices of every ResourceClaim its pod
    names and it lists in `resources.claims` (a claim the build does not define counts none; reference_problems
    names it)."""
    by_name = {claim["name"]: claim.get("resourceClaimName") for claim in spec.get("resourceClaims", [])}
    count = 0
    for used in (container.get("resources") or {}).get("claims", []):
        claim = _find(objs, "ResourceClaim", by_name.get(used["name"]) or "")
        for request in ((claim or {}).get("spec", {}).get("devices") or {}).get("requests", []):
            exactly = request.get("exactly") or {}
            if exactly.get("deviceClassName", "").startswith("gpu."):
                count += int(exactly.get("count", 1))
    return count


def reference_problems(objs: list[Obj]) -> list[str]:
    """Every name one object uses for another resolves in the build (generated names included)."""
    problems = []
    for obj in objs:
        spec = pod_spec(obj)
        if spec is None:
            continue
        for volume in spec.get("volumes", []):
            for kind, key, field in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName"),
                                     ("PersistentVolumeClaim", "persistentVolumeClaim", "claimName")):
                if key in volume and _find(objs, kind, volume[key][field]) is None:
                    problems.append(f"{_id(obj)}: volume {volume['name']} uses {kind} {volume[key][field]}, "
                                    f"which the build does not define")
        claims = {claim["name"] for claim in spec.get("resourceClaims", [])}
        for claim in spec.get("resourceClaims", []):
            if "resourceClaimName" in claim and _find(objs, "ResourceClaim", claim["resourceClaimName"]) is None:
                problems.append(f"{_id(obj)}: resource claim {claim['name']} uses ResourceClaim "
                                f"{claim['resourceClaimName']}, which the build does not define")
        for c in spec.get("containers", []):
            unknown = {used["name"] for used in (c.get("resources") or {}).get("claims", [])} - claims
            if unknown:
                problems.append(f"{_id(obj)}: container {c['name']} uses resource claims {sorted(unknown)}, which "
                                f"its pod does not name")
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            missing = mounts - {v["name"] for v in spec.get("volumes", [])} - \
                {t["metadata"]["name"] for t in obj.get("spec", {}).get("volumeClaimTemplates", [])}
            if missing:
                problems.append(f"{_id(obj)}: container {c['name']} mounts undefined volumes {sorted(missing)}")
            for source in c.get("envFrom", []):
                for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if key in source and _find(objs, kind, source[key]["name"]) is None:
                        problems.append(f"{_id(obj)}: envFrom uses {kind} {source[key]['name']}, not defined")
            for item in c.get("env", []):
                for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    ref = (item.get("valueFrom") or {}).get(key)
                    if ref and not ref.get("optional") and ref["key"] not in _data(_find(objs, kind, ref["name"])):
                        problems.append(f"{_id(obj)}: env {item['name']} reads key {ref['key']} of {kind} "
                                        f"{ref['name']}, which does not exist")
    all_pods = pods(objs)
    for obj in objs:
        namespace = obj["metadata"].get("namespace", "default")
        if obj["kind"] == "Service":
            matched = [p for p in all_pods if p.namespace == namespace
                       and _selects({"matchLabels": obj["spec"].get("selector", {})}, p.labels)]
            if not matched:
                problems.append(f"{_id(obj)}: its selector matches no pod")
            for port in obj["spec"].get("ports", []):
                target = port.get("targetPort", port["port"])
                if matched and not any(target in p.ports.values() or target in p.ports for p in matched):
                    problems.append(f"{_id(obj)}: port {port['port']} targets {target}, which no selected pod serves")
        elif obj["kind"] == "NetworkPolicy":
            if not any(p.namespace == namespace and _selects(obj["spec"]["podSelector"], p.labels) for p in all_pods):
                problems.append(f"{_id(obj)}: its podSelector matches no pod")
        elif obj["kind"] == "HorizontalPodAutoscaler":
            ref = obj["spec"]["scaleTargetRef"]
            target = _find(objs, ref["kind"], ref["name"])
            if target is None:
                problems.append(f"{_id(obj)}: scales {ref['kind']}/{ref['name']}, which is not defined")
            elif "replicas" in target["spec"]:
                problems.append(f"{_id(obj)}: {ref['kind']}/{ref['name']} sets spec.replicas, which would reset "
                                f"the autoscaler's choice on every apply")
    return problems


def reachable(objs: list[Obj]) -> dict[str, set[int]]:
    """Service DNS name -> its ports."""
    return {o["metadata"]["name"]: {p["port"] for p in o["spec"].get("ports", [])}
            for o in objs if o["kind"] == "Service"}


def _probe_port(container: Obj, probe: str) -> int | None:
    """The port a gRPC probe asks, or the one an exec probe's `cooper.runtime.healthcheck 127.0.0.1:PORT` does."""
    spec = container.get(probe) or {}
    if "exec" in spec:
        command = " ".join(spec["exec"].get("command", []))
        match = re.search(r"cooper\.runtime\.healthcheck\s+127\.0\.0\.1:(\d+)", command)
        return int(match.group(1)) if match else None
    return (spec.get("grpc") or {}).get("port")


def _health_port(role: str, env: Mapping[str, str]) -> int | None:
    """The plaintext health port a service serves (server.health_port), from its environment."""
    value = env.get(f"COOPER_{role.upper()}__SERVER__HEALTH_PORT")
    return int(value) if value not in (None, "", "null") else None


def rule_problems(objs: list[Obj]) -> list[str]:
    """The deployment rules: a Deployment per service with gRPC probes on its port, Services on the same ports, GPUs
    where needed, an HPA for the verifier and for the reward replicas, the orchestrator as a Job, Redis with AOF on
    a PVC. The reward replicas' Service exposes the HTTP API, not gRPC (the orchestrator talks to the trainer)."""
    problems = []
    ports = default_ports()
    cooper = {c.role: c for c in containers(objs)}
    for role in (*SERVICES, REPLICA, "orchestrator"):
        if role not in cooper:
            problems.append(f"no container runs the {role}")
    for container in cooper.values():
        problems += env_name_problems(container.env, container.origin)
    roles = [c.role for c in containers(objs)]
    for role in (*SERVICES, "orchestrator"):
        if roles.count(role) > 1:  # two trainers of one model would write the same checkpoints
            problems.append(f"the {role} runs in {roles.count(role)} workloads; one runs it")
    for obj in objs:
        spec = pod_spec(obj)
        for c in (spec or {}).get("containers", []):
            role = next((r for r, cc in cooper.items() if cc.origin == f"{_id(obj)} container {c['name']}"), None)
            if role is None:
                continue
            where = f"{_id(obj)} container {c['name']}"
            want_repo = "cooper-gpu" if role in GPU_SERVICES else "cooper"
            if image_repo(c["image"]) != want_repo:
                problems.append(f"{where}: runs image {c['image']}, expected the {want_repo} image")
            gpus = int((c.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu", 0))
            claimed = claimed_gpus(objs, spec, c)
            if gpus and claimed:
                problems.append(f"{where}: takes GPUs both from the device plugin and from a ResourceClaim")
            if (gpus + claimed >= 1) != (role in GPU_SERVICES):
                problems.append(f"{where}: nvidia.com/gpu limit is {gpus} and {claimed} GPUs claimed; the GPU "
                                f"services need one, others none")
            requested = int((c.get("resources", {}).get("requests") or {}).get("nvidia.com/gpu", gpus))
            if requested != gpus:
                problems.append(f"{where}: requests {requested} nvidia.com/gpu but limits {gpus}; they must be equal")
            if cooper[role].torchrun is not None:
                problems += torchrun_problems(cooper[role], gpus, where)
            elif role == "policy":
                problems += policy_rank_problems(cooper[role].env.get("COOPER_POLICY__WORLD_SIZE"), gpus, where)
            if role == "orchestrator":
                if obj["kind"] != "Job" or spec.get("restartPolicy") not in {"OnFailure", "Never"}:
                    problems.append(f"{where}: the orchestrator runs as a Job that retries failures")
                continue
            if obj["kind"] == "JobSet" and role == "policy":
                problems += jobset_problems(objs, obj, cooper[role])
            elif obj["kind"] != "Deployment":
                problems.append(f"{where}: service {role} should be a Deployment, not a {obj['kind']}")
            served = {p["containerPort"] for p in c.get("ports", [])}
            if not set(ports[role].values()) <= served:
                problems.append(f"{where}: declares ports {sorted(served)}; {role} serves {sorted(ports[role].values())}")
            # Kubernetes' grpc probes speak no TLS: with TLS on they must use the plaintext health port.
            env = cooper[role].env
            tls = bool(env.get("COOPER_SECURITY__TLS_CERT"))
            probe_port = _health_port(role, env) if tls else ports[role]["grpc"]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = _probe_port(c, probe)
                if (port is None and probe != "startupProbe") or (port is not None and port != probe_port):
                    why = " (TLS is on: the plaintext server.health_port)" if tls else ""
                    problems.append(f"{where}: {probe} must be a gRPC probe on port {probe_port}{why}, got {port}")
                # Every node of a JobSet gets the same probes, but only node 0 serves: the others must pass.
                guarded = "JOB_COMPLETION_INDEX" in " ".join((c.get(probe) or {}).get("exec", {}).get("command", []))
                if obj["kind"] == "JobSet" and port is not None and not guarded:
                    problems.append(f"{where}: {probe} asks port {port} on every node, but only node 0 serves it; "
                                    "make it an exec probe that passes where JOB_COMPLETION_INDEX is not 0")
            service = _find(objs, "Service", role)
            service_ports = {(p["port"], p.get("targetPort", p["port"])) for p in (service or {"spec": {}})["spec"].get("ports", [])}
            kind, port = ("HTTP", ports[role]["http"]) if role == REPLICA else ("gRPC", ports[role]["grpc"])
            if (port, port) not in service_ports:
                problems.append(f"Service/{role}: must expose {kind} port {port} (got {sorted(service_ports)})")
    for scaled in ("verifier", REPLICA):
        if not any(o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == scaled
                   for o in objs):
            problems.append(f"no HorizontalPodAutoscaler scales the {scaled}")
    redis = _find(objs, "StatefulSet", "redis")
    if redis is None:
        problems.append("no Redis StatefulSet")
    else:
        c = redis["spec"]["template"]["spec"]["containers"][0]
        if "--appendonly yes" not in " ".join(c.get("command", []) + c.get("args", [])) or \
                not redis["spec"].get("volumeClaimTemplates"):
            problems.append("StatefulSet/redis: needs `--appendonly yes` and a volumeClaimTemplate")
        if REDIS_PORT not in reachable(objs).get("redis", set()):
            problems.append(f"Service/redis: must expose {REDIS_PORT}")
    return problems


def jobset_problems(objs: list[Obj], jobset: Obj, container: Container) -> list[str]:
    """The policy's JobSet: one replicated Job of M indexed pods (M = torchrun's --nnodes) that restarts as a group,
    stable host names, node rank from the completion index, node 0's host name as the rendezvous, and the Service
    `policy` on node 0 alone."""
    where = _id(jobset)
    problems = []
    spec = jobset["spec"]
    options = container.torchrun or {}
    if container.torchrun is None:
        problems.append(f"{where}: the policy's nodes must run torchrun (every node the same command)")
    jobs = spec.get("replicatedJobs", [])
    if len(jobs) != 1 or jobs[0].get("replicas", 1) != 1:
        problems.append(f"{where}: expected one replicatedJob with one Job (replicas: 1), got {len(jobs)}")
        return problems
    rj, job = jobs[0], jobs[0]["template"]["spec"]
    nodes = options.get("nnodes", "")
    if job.get("completionMode") != "Indexed" or str(job.get("parallelism")) != nodes or \
            str(job.get("completions")) != nodes:
        problems.append(f"{where}: the Job must be Indexed with parallelism = completions = --nnodes ({nodes}), got "
                        f"{job.get('completionMode')} {job.get('parallelism')}/{job.get('completions')}")
    if job.get("backoffLimit") != 0 or job["template"]["spec"].get("restartPolicy") != "Never":
        problems.append(f"{where}: a failed pod must fail its Job (backoffLimit 0, restartPolicy Never), so that "
                        "JobSet restarts the whole group")
    if int((spec.get("failurePolicy") or {}).get("maxRestarts", 0)) < 1:
        problems.append(f"{where}: failurePolicy.maxRestarts must be at least 1: a lost node restarts the group")
    network = spec.get("network") or {}
    subdomain = network.get("subdomain", jobset["metadata"]["name"])
    if not network.get("enableDNSHostnames"):
        problems.append(f"{where}: network.enableDNSHostnames must be true (the nodes meet by host name)")
    if network.get("publishNotReadyAddresses") is False:
        problems.append(f"{where}: network.publishNotReadyAddresses false hides the nodes until they are ready, "
                        "which is after the rendezvous")
    if _find(objs, "Service", subdomain) is not None:
        problems.append(f"{where}: subdomain {subdomain} is the name of a Service of the build; JobSet creates its "
                        "own headless Service by that name")
    want_master = f"{jobset['metadata']['name']}-{rj['name']}-0-0.{subdomain}"
    if options.get("master-addr") != want_master:
        problems.append(f"{where}: --master-addr={options.get('master-addr')}; node 0's host name is {want_master}")
    rank_env = next((e for e in container_spec(jobset).get("env", []) if e["name"] == "JOB_COMPLETION_INDEX"), {})
    field_path = ((rank_env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if options.get("node-rank") != "$(JOB_COMPLETION_INDEX)" or \
            field_path != f"metadata.annotations['{COMPLETION_INDEX}']":
        problems.append(f"{where}: --node-rank must be $(JOB_COMPLETION_INDEX), with JOB_COMPLETION_INDEX from "
                        f"the fieldRef metadata.annotations['{COMPLETION_INDEX}'] (got {options.get('node-rank')}, "
                        f"{field_path})")
    service = _find(objs, "Service", "policy")
    group = [p for p in pods(objs) if p.labels.get(JOBSET_NAME) == jobset["metadata"]["name"]]
    selected = [p.labels.get(COMPLETION_INDEX) for p in group
                if service and _selects({"matchLabels": service["spec"].get("selector", {})}, p.labels)]
    if selected != ["0"]:
        problems.append(f"Service/policy: must select node 0 of {where} alone (only rank 0 serves gRPC), selects "
                        f"the pods with completion index {selected}")
    return problems


def container_spec(workload: Obj) -> Obj:
    """The first container of a workload's pod template."""
    return (pod_spec(workload) or {}).get("containers", [{}])[0]


# --- NetworkPolicy --------------------------------------------------------------------------------------------

def _namespace_labels(namespace: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace}  # set by Kubernetes on every namespace


def allowed(objs: list[Obj], source: Pod, target: Pod, port: int) -> bool:
    """Whether ingress NetworkPolicies let `source` open a TCP connection to `port` of `target`."""
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"
                and o["metadata"].get("namespace", "default") == target.namespace
                and _selects(o["spec"].get("podSelector"), target.labels)
                and "Ingress" in o["spec"].get("policyTypes", ["Ingress"])]
    if not policies:
        return True  # a pod no policy selects is not isolated
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            rule_ports = rule.get("ports")
            if rule_ports and not any(_port_matches(p, target, port) for p in rule_ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(peer, source, policy["metadata"].get("namespace", "default"))
                                for peer in peers):
                return True
    return False


def _port_matches(entry: Obj, target: Pod, port: int) -> bool:
    if entry.get("protocol", "TCP") != "TCP":
        return False
    if "port" not in entry:
        return True
    start = target.ports.get(entry["port"]) if isinstance(entry["port"], str) else entry["port"]
    return start is not None and start <= port <= entry.get("endPort", start)


def _peer_matches(peer: Obj, source: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod traffic is judged by pod and namespace selectors
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], _namespace_labels(source.namespace)):
            return False
    elif source.namespace != policy_namespace:
        return False
    return _selects(peer.get("podSelector"), source.labels)


def network_problems(objs: list[Obj], metrics_from_monitoring: bool) -> list[str]:
    """Every (source, target pod, target port) is allowed exactly when the deployment means it to be: gRPC only from
    the orchestrator (and the verifier from the generator; a reward replica's from nobody), Redis only from the
    orchestrator, the reward HTTP port (trainer and replicas) from anywhere in the cluster, metrics from the monitoring
    namespace when `metrics_from_monitoring`, and torch.distributed's ports (rendezvous, collectives) between the
    policy's nodes when a JobSet runs it, from nobody otherwise."""
    ports = default_ports()
    targets = pods(objs)
    namespace = targets[0].namespace if targets else "default"
    sources = [*targets, Pod("stranger", {"app": "other"}, namespace, {}),
               Pod("outsider", {"app": "other"}, "elsewhere", {}),
               Pod("prometheus", {"app": "prometheus"}, "monitoring", {})]
    # The policy's nodes talk torch.distributed on the rendezvous port and on ephemeral ports: probe those (and
    # their neighbours) on every pod, so that they are open exactly between the nodes of a multi-node policy.
    multi_node = any(o["kind"] == "JobSet" for o in objs)
    low, high = COLLECTIVE_PORTS
    collective = {RENDEZVOUS_PORT, low, (low + high) // 2, high}
    problems = []
    for target in targets:
        for port in sorted(set(target.ports.values()) | collective | {RENDEZVOUS_PORT + 1, low - 1, high + 1}):
            for source in sources:
                role = target.role
                if multi_node and role == source.role == "policy" and (port == RENDEZVOUS_PORT or low <= port <= high):
                    want = True  # the ephemeral range holds 50053 too: a node may listen there for a peer
                elif role == REPLICA and port == ports[REPLICA]["grpc"]:
                    want = False  # its gRPC port only answers the kubelet's probes
                elif role in SERVICES and port == ports[role]["grpc"]:
                    want = source.role == "orchestrator" or (role == "verifier" and source.role == "generator")
                elif role in ("reward", REPLICA) and port == ports["reward"]["http"]:
                    want = True
                elif role == "redis" and port == REDIS_PORT:
                    want = source.role == "orchestrator"
                elif role in (*SERVICES, REPLICA) and port == ports[role]["metrics"]:
                    want = metrics_from_monitoring and source.role == "prometheus"
                else:
                    want = False
                if allowed(objs, source, target, port) != want:
                    problems.append(f"NetworkPolicy: {source.role} ({source.namespace}) -> {role}:{port} is "
                                    f"{'denied' if want else 'allowed'}, expected {'allowed' if want else 'denied'}")
    return problems
