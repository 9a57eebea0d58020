"""Kustomize-style assembly in Python, for tests: no kustomize binary (nor kubectl) is available here.

Covers what deploy/k8s uses, the way kustomize does it: `resources` (files and directories), `configMapGenerator`
and `secretGenerator` (files, envs, literals; behavior create/replace/merge), strategic-merge `patches` (targets
named by the patch's kind and name; lists merged by their Kubernetes merge keys; a patch of only `$patch: delete`
removes its target), `images`, `namespace`, `configurations` (nameReference field specs, which kustomize needs to
rename generated ConfigMaps and Secrets inside a custom resource such as a JobSet), a content-hash suffix on
generated names with every reference to them rewritten, and an error on duplicate objects. Anything else in a
kustomization.yaml is an error rather than silently ignored. Left out: JSON 6902 patches, other `$patch` directives,
labels/commonLabels transformers, components, remote bases; the hash is kustomize-like (content digest, 10
characters), not byte-identical to kustomize's.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KNOWN_KEYS = {"apiVersion", "kind", "resources", "namespace", "images", "configMapGenerator", "secretGenerator",
              "patches", "configurations"}
GENERATOR_KEYS = {"name", "behavior", "files", "envs", "literals", "type"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding",
                  "CustomResourceDefinition", "PriorityClass"}
# Strategic merge keys of the list fields deploy/k8s patches (from the Kubernetes API's patchMergeKey tags).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath", "imagePullSecrets": "name", "volumeClaimTemplates": None}
GENERATED = "_generated"  # marker key on generated objects until their names get the hash suffix
# Workloads kustomize knows: it rewrites generated names in their pod templates by itself. In any other kind it
# rewrites only the paths a `configurations` file names (nameReference), as here.
BUILT_IN_WORKLOADS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}


class KustomizeError(ValueError):
    """A kustomization that kustomize would refuse; the message names the file and the problem."""


def build(directory: str | Path) -> list[Obj]:
    """The objects `kustomize build DIRECTORY` would print (generated names carry their hash suffix)."""
    name_references: list[Obj] = []
    objs = _assemble(Path(directory), name_references)
    _add_hash_suffixes(objs, name_references)
    return objs


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


def _assemble(directory: Path, name_references: list[Obj]) -> list[Obj]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    k = yaml.safe_load(path.read_text()) or {}
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{path}: unknown or unsupported fields {sorted(unknown)}")
    objs: list[Obj] = []
    for entry in k.get("resources", []):
        target = directory / entry
        if target.is_dir():
            objs += _assemble(target, name_references)
        elif target.is_file():
            objs += [d for d in yaml.safe_load_all(target.read_text()) if d]
        else:
            raise KustomizeError(f"{path}: resource {entry} does not exist")
    for gen in k.get("configMapGenerator", []):
        _apply_generator(objs, gen, "ConfigMap", directory, path)
    for gen in k.get("secretGenerator", []):
        _apply_generator(objs, gen, "Secret", directory, path)
    for patch in k.get("patches", []):
        _apply_patch(objs, patch, directory, path)
    for entry in k.get("configurations", []):
        name_references += _read_configuration(directory / entry, path)
    if "namespace" in k:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = k["namespace"]
    for image in k.get("images", []):
        _set_image(objs, image)
    _check_unique(objs, path)
    return objs


def _read_env_file(path: Path) -> dict[str, str]:
    data = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise KustomizeError(f"{path}: line '{line}' is not KEY=VALUE")
        data[key.strip()] = value
    return data


def _generator_data(gen: Obj, directory: Path, where: Path) -> dict[str, str]:
    data: dict[str, str] = {}
    for literal in gen.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for entry in gen.get("files", []):
        key, sep, rel = entry.partition("=")
        rel = rel if sep else key
        key = key if sep else Path(rel).name
        source = directory / rel
        if not source.is_file():
            raise KustomizeError(f"{where}: generator {gen['name']}: file {source} does not exist")
        data[key] = source.read_text()
    for rel in gen.get("envs", []):
        source = directory / rel
        if not source.is_file():
            example = source.with_name(source.name + ".example")
            hint = f" (copy {example.name} to {source.name} and fill it in)" if example.is_file() else ""
            raise KustomizeError(f"{where}: generator {gen['name']}: env file {source} does not exist{hint}")
        data.update(_read_env_file(source))
    return data


def _apply_generator(objs: list[Obj], gen: Obj, kind: str, directory: Path, where: Path) -> None:
    unknown = set(gen) - GENERATOR_KEYS
    if unknown:
        raise KustomizeError(f"{where}: {kind} generator {gen.get('name')}: unknown fields {sorted(unknown)}")
    data = _generator_data(gen, directory, where)
    behavior = gen.get("behavior", "create")
    existing = [o for o in objs if o["kind"] == kind and o.get(GENERATED) == gen["name"]]
    if behavior == "create":
        if existing:
            raise KustomizeError(f"{where}: {kind} {gen['name']} already generated; use behavior replace or merge")
        obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": gen["name"]}, GENERATED: gen["name"]}
        if kind == "Secret":
            obj["type"] = gen.get("type", "Opaque")
        objs.append(obj)
        existing = [obj]
    elif behavior not in {"replace", "merge"}:
        raise KustomizeError(f"{where}: {kind} {gen['name']}: behavior {behavior!r} is not create, replace or merge")
    elif not existing:
        raise KustomizeError(f"{where}: {kind} {gen['name']}: behavior {behavior} but no base generates it")
    target = existing[0]
    if kind == "Secret":
        data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    target["data"] = {**target.get("data", {}), **data} if behavior == "merge" else data


def _strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        if any(k.startswith("$") for k in patch):
            raise KustomizeError(f"patch directive {[k for k in patch if k.startswith('$')]} is not supported here")
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)  # null deletes the field, as in a strategic merge patch
            else:
                out[key] = _strategic_merge(base.get(key), value, key) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if field == "ports":  # container ports merge on containerPort, Service ports on port
            key = "containerPort" if all("containerPort" in p for p in [*base, *patch]) else "port"
        if key is None or not all(isinstance(p, dict) and key in p for p in [*base, *patch]):
            return patch
        out = list(base)
        for item in patch:
            index = next((i for i, b in enumerate(out) if b[key] == item[key]), None)
            if index is None:
                out.append(item)
            else:
                out[index] = _strategic_merge(out[index], item, field)
        return out
    return patch


def _apply_patch(objs: list[Obj], entry: Obj, directory: Path, where: Path) -> None:
    if set(entry) - {"path"}:
        raise KustomizeError(f"{where}: only `patches: - path: FILE` entries are supported, not {entry}")
    source = directory / entry["path"]
    if not source.is_file():
        raise KustomizeError(f"{where}: patch {source} does not exist")
    for patch in (d for d in yaml.safe_load_all(source.read_text()) if d):
        name = patch.get("metadata", {}).get("name")
        matches = [i for i, o in enumerate(objs) if o["kind"] == patch.get("kind") and o["metadata"]["name"] == name]
        if len(matches) != 1:
            raise KustomizeError(f"{source}: patch target {patch.get('kind')}/{name} matches {len(matches)} objects")
        if patch.get("$patch") == "delete":
            del objs[matches[0]]
            continue
        objs[matches[0]] = _strategic_merge(objs[matches[0]], patch)


def _read_configuration(source: Path, where: Path) -> list[Obj]:
    """The nameReference entries of a `configurations` file: [{kind, fieldSpecs: [{kind, path}]}]."""
    if not source.is_file():
        raise KustomizeError(f"{where}: configuration {source} does not exist")
    config = yaml.safe_load(source.read_text()) or {}
    if set(config) - {"nameReference"}:
        raise KustomizeError(f"{source}: only nameReference is supported, not {sorted(set(config) - {'nameReference'})}")
    for entry in config.get("nameReference", []):
        for spec in entry.get("fieldSpecs", []):
            if set(spec) - {"kind", "path"} or not spec.get("path"):
                raise KustomizeError(f"{source}: a fieldSpec has kind and path only, got {spec}")
    return list(config.get("nameReference", []))


def _containers(obj: Obj) -> list[Obj]:
    spec = pod_spec(obj)
    return [*spec.get("initContainers", []), *spec.get("containers", [])] if spec else []


def _set_image(objs: list[Obj], image: Obj) -> None:
    for obj in objs:
        for container in _containers(obj):
            ref = container.get("image", "")
            name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}".rstrip(":")


def _check_unique(objs: list[Obj], where: Path) -> None:
    seen = set()
    for obj in objs:
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in seen:
            raise KustomizeError(f"{where}: {key[0]}/{key[2]} is defined twice")
        seen.add(key)


def _add_hash_suffixes(objs: list[Obj], name_references: list[Obj]) -> None:
    renamed: dict[tuple[str, str], str] = {}
    for obj in objs:
        original = obj.pop(GENERATED, None)
        if original is None:
            continue
        content = json.dumps({k: obj.get(k) for k in ("kind", "type", "data")}, sort_keys=True)
        obj["metadata"]["name"] = f"{original}-{hashlib.sha256(content.encode()).hexdigest()[:10]}"
        renamed[(obj["kind"], original)] = obj["metadata"]["name"]
    # A changed config gets a new name, so the pods that mount it are rolled: rewrite every reference.
    for obj in objs:
        spec = pod_spec(obj)
        if spec is not None and obj["kind"] in BUILT_IN_WORKLOADS:
            for ref, kind, field in _name_references(spec):
                ref[field] = renamed.get((kind, ref[field]), ref[field])
        for entry in name_references:
            for field_spec in entry.get("fieldSpecs", []):
                if field_spec.get("kind", obj["kind"]) == obj["kind"]:
                    _rename_at(obj, field_spec["path"].split("/"), entry["kind"], renamed)


def _rename_at(node: Any, path: list[str], kind: str, renamed: dict[tuple[str, str], str]) -> None:
    """Rewrite the name at `path` (slash-separated keys; lists on the way are walked item by item)."""
    if isinstance(node, list):
        for item in node:
            _rename_at(item, path, kind, renamed)
        return
    if not isinstance(node, dict) or path[0] not in node:
        return
    if len(path) == 1:
        node[path[0]] = renamed.get((kind, node[path[0]]), node[path[0]])
    else:
        _rename_at(node[path[0]], path[1:], kind, renamed)


def _name_references(spec: Obj) -> list[tuple[Obj, str, str]]:
    refs: list[tuple[Obj, str, str]] = []
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            refs.append((volume["configMap"], "ConfigMap", "name"))
        if "secret" in volume:
            refs.append((volume["secret"], "Secret", "secretName"))
        for source in volume.get("projected", {}).get("sources", []):
            for kind, key in (("ConfigMap", "configMap"), ("Secret", "secret")):
                if key in source:
                    refs.append((source[key], kind, "name"))
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for source in container.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in source:
                    refs.append((source[key], kind, "name"))
        for env in container.get("env", []):
            value_from = env.get("valueFrom", {})
            for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                if key in value_from:
                    refs.append((value_from[key], kind, "name"))
    return refs

