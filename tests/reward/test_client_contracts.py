"""The frameworks that call a remote reward model, their own client code unmodified, against the real service:
verl's reward loop (`RewardLoopWorker.compute_score`, a vLLM `/classify` request per sample) and OpenRLHF's
single-turn rollout (`SingleTurnAgentExecutor.execute` with `--remote_rm_url`, a `/get_reward` request). For each:
what the client gets back equals, float for float, what `/v1/score` answers for the same (question, reference,
completion) triples; and a refused request (401, 413, a malformed input, 503) ends as that framework's code says.

How the clients are loaded: each framework's wheel, at the version pinned in PINNED, is downloaded from PyPI (once;
then from the cache under COOPER_CACHE) and only the file that holds the client is loaded from it, never the
package: verl and OpenRLHF import ray, torch.distributed, vLLM and DeepSpeed on the way in. What those files import
at top level and their client code never calls is stubbed (`Unused`, which fails the test if called); what the
client code does call is real: aiohttp (pinned with what it needs, installed beside the wheels), the tiny models'
tokenizers. A machine without PyPI fails here with a message saying so; these tests never skip.

Left out: verl's SGLang path (its `/v1/embeddings` request; the service serves vLLM's API), verl's router in front
of its own vLLM servers (a plain proxy), OpenRLHF's reward function files (`--remote_rm_url x.py`, no HTTP).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import types
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from reward_testkit import Served, make_config, serve_http, tiny_items
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cooper.config import BatchingConfig, HttpConfig, LearnOnlineConfig
from cooper.runtime.models import cache_root, resolve_model
from cooper.services.reward.items import ScoreItem
from cooper.services.reward.serving.http import HttpServer, ScoringFastPath, create_app, start_http
from cooper.tiny.task import make_split, wrong_solution

PINNED = {
    "verl": "0.9.1",  # verl/experimental/reward_loop/reward_loop.py
    "openrlhf": "0.11.2",  # openrlhf/utils/agent.py
    # what both clients send with, and what it needs that requirements/dev.txt lacks (attrs, idna and
    # typing-extensions are there, at the versions aiohttp accepts)
    "aiohttp": "3.14.5", "aiohappyeyeballs": "2.7.1", "aiosignal": "1.4.0", "frozenlist": "1.8.0",
    "multidict": "7.2.1", "propcache": "0.5.4", "yarl": "1.25.1",
}
FRAMEWORKS = ("verl", "openrlhf")  # wheels, one file read from each; the rest is installed as it is
TOKEN = "contract-token-1234"
MAX_CHARS = 2000
MAX_BODY_MB = 0.05
MAX_QUEUE = 4


# ----- the pinned client code -----


@pytest.fixture(scope="module")
def pinned_packages() -> Path:
    """PINNED in a folder of the cache: `site/` the installed packages, `wheels/` the frameworks' wheels."""
    key = hashlib.sha256(repr((sorted(PINNED.items()), sys.version_info[:2], sys.platform)).encode()).hexdigest()
    cache = cache_root() / "client-contracts" / key[:16]
    if (cache / "complete").exists():
        return cache
    staging = cache.with_name(f"{cache.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    runtime = [f"{name}=={version}" for name, version in PINNED.items() if name not in FRAMEWORKS]
    frameworks = [f"{name}=={PINNED[name]}" for name in FRAMEWORKS]
    for command in ([*pip, "install", "--no-deps", "--only-binary=:all:", "--target", str(staging / "site"), *runtime],
                    # any platform's wheel will do: only Python files are read from it
                    [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
                     "--platform", "manylinux1_x86_64", "--dest", str(staging / "wheels"), *frameworks]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            pytest.fail(f"could not fetch the pinned client packages from PyPI (pip {' '.join(command[5:])}): "
                        f"these tests need PyPI once, then use {cache}:\n{done.stderr[-2000:]}", pytrace=False)
    (staging / "complete").touch()
    with contextlib.suppress(OSError):  # another session may have finished first: either copy is whole
        staging.rename(cache)
    shutil.rmtree(staging, ignore_errors=True)
    return cache


class Unused:
    """A stub of what a client file imports at top level and its client code never calls: calling or reading it
    fails the test, so a stub can never stand in for something the client does."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the client called {self._name}, stubbed by this test as unused: load it for real")

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):  # Python's own probes (typing's, copy's): an object without them
            raise AttributeError(attribute)
        raise AssertionError(f"the client read {self._name}.{attribute}, stubbed by this test as unused")


def load_from_wheel(cache: Path, framework: str, member: str, name: str,
                    stubs: dict[str, list[str]], real: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    """The file `member` of the framework's pinned wheel, unmodified, as module `name`: each module in `stubs` holds
    an Unused per listed name while the file is executed, `real` modules are given as they are, and the pinned
    packages come first on sys.path (for the rest of the session: the client imports aiohttp when it runs)."""
    wheel = next((cache / "wheels").glob(f"{framework}-{PINNED[framework]}-*.whl"))
    source = cache / "source" / framework / member
    if not source.exists():
        with zipfile.ZipFile(wheel) as archive:
            # OpenRLHF's wheel keeps its package under openrlhf-<version>.data/purelib/
            found = [path for path in archive.namelist() if path == member or path.endswith(f"/purelib/{member}")]
            assert len(found) == 1, f"{wheel.name} has no single {member}: {found}"
            source.parent.mkdir(parents=True, exist_ok=True)
            partial = source.with_name(f"{source.name}.{os.getpid()}")
            partial.write_bytes(archive.read(found[0]))
            partial.replace(source)
    if str(cache / "site") not in sys.path:
        sys.path.insert(0, str(cache / "site"))
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        for stub_name, names in stubs.items():
            stub = types.ModuleType(stub_name)
            stub.__path__ = []  # a package, so that its submodules (also stubbed) import
            for attribute in names:
                setattr(stub, attribute, Unused(f"{stub_name}.{attribute}"))
            patch.setitem(sys.modules, stub_name, stub)
        for real_name, real_module in (real or {}).items():
            patch.setitem(sys.modules, real_name, real_module)
        patch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verl_reward_loop(pinned_packages: Path) -> types.ModuleType:
    """verl's reward loop. Stubbed: ray, omegaconf, tensordict, verl.protocol, the single controller, the reward
    manager loader, the tokenizer and file system helpers and the reward model manager (which launches vLLM servers):
    they serve RewardLoopManager and RewardLoopWorker.__init__, not the request path under test."""
    return load_from_wheel(pinned_packages, "verl", "verl/experimental/reward_loop/reward_loop.py",
                           "verl.experimental.reward_loop.reward_loop", stubs={
                               "ray": [], "ray.actor": ["ActorHandle"], "omegaconf": ["DictConfig", "open_dict"],
                               "tensordict": ["TensorDict"], "verl": [],
                               "verl.protocol": ["DataProto", "pad_dataproto_to_divisor"],
                               "verl.single_controller": [], "verl.single_controller.ray": [],
                               "verl.single_controller.ray.base": ["RayResourcePool"],
                               "verl.trainer": [], "verl.trainer.ppo": [],
                               "verl.trainer.ppo.reward": ["load_reward_manager", "resolve_reward_manager_cls"],
                               "verl.utils": ["hf_tokenizer"], "verl.utils.fs": ["copy_to_local"],
                               "verl.utils.ray_utils": ["get_event_loop"], "verl.experimental": [],
                               "verl.experimental.reward_loop": [],
                               "verl.experimental.reward_loop.reward_model": ["RewardModelManager"]})


@pytest.fixture(scope="module")
def openrlhf_agent(pinned_packages: Path) -> types.ModuleType:
    """OpenRLHF's rollout executors. Nothing stubbed but the packages `openrlhf` and `openrlhf.utils`, whose
    __init__ imports DeepSpeed; its logging module is loaded from the wheel too."""
    packages = {"openrlhf": [], "openrlhf.utils": []}
    logging_utils = load_from_wheel(pinned_packages, "openrlhf", "openrlhf/utils/logging_utils.py",
                                    "openrlhf.utils.logging_utils", stubs=packages)
    return load_from_wheel(pinned_packages, "openrlhf", "openrlhf/utils/agent.py", "openrlhf.utils.agent",
                           stubs=packages, real={"openrlhf.utils.logging_utils": logging_utils})


# ----- the service, and what it answered -----


@dataclass
class Fronts:
    """One service behind two HTTP APIs: open (the clients send no token) and with reward.http.token."""

    served: Served
    open_address: str  # host:port
    token_address: str


@pytest.fixture(scope="module")
def fronts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronts]:
    tmp = Path(tmp_path_factory.mktemp("reward-clients"))
    http = {"port": 0, "max_items": 4, "max_chars": MAX_CHARS, "max_body_mb": MAX_BODY_MB}
    with serve_http(make_config(tmp, http=HttpConfig(**http), batching=BatchingConfig(max_queue=MAX_QUEUE,
                                                                                      max_wait_ms=5))) as served:
        with_token = make_config(tmp, http=HttpConfig(**http, token=TOKEN))
        second: HttpServer = served.run(start_http(create_app(with_token, served.service), "127.0.0.1", 0))
        try:
            yield Fronts(served, served.url.removeprefix("http://"), f"127.0.0.1:{second.port}")
        finally:
            served.run(second.stop())


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(path, status) of every HTTP answer either front gives during the test: how often a client tried. Every
    request passes ScoringFastPath, uvicorn's outermost app, once."""
    answers: list[tuple[str, int]] = []
    unspied = ScoringFastPath.__call__

    async def spied(self: ScoringFastPath, scope: Any, receive: Any, send: Any) -> None:
        async def recording(message: Any) -> None:
            if message["type"] == "http.response.start":
                answers.append((scope["path"], message["status"]))
            await send(message)

        await unspied(self, scope, receive, recording if scope["type"] == "http" else send)

    monkeypatch.setattr(ScoringFastPath, "__call__", spied)
    return answers


def v1_score(fronts: Fronts, items: list[ScoreItem]) -> list[dict[str, float]]:
    """/v1/score's {"score", "logit"} per item, each scored alone, as the clients send them."""
    scores = []
    for item in items:
        reply = httpx.post(f"http://{fronts.open_address}/v1/score", json={"items": [
            {"question": item.question, "reference": item.reference, "completion": item.completion}]})
        assert reply.status_code == 200, reply.text
        scores.append(reply.json()["scores"][0])
    return scores


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextlib.contextmanager
def full_queue(served: Served) -> Iterator[Callable[[], None]]:
    """The model held and MAX_QUEUE items waiting, so that the next scoring request is refused with 503; yields
    `release`, which lets the model go and waits for the waiting items (called on exit too)."""
    gate = threading.Event()
    held = served.service.batcher.run_exclusive(lambda: served.service.runner.run(gate.wait, 20))
    blocker = asyncio.run_coroutine_threadsafe(held, served.loop)
    waiting = asyncio.run_coroutine_threadsafe(served.service.score(tiny_items(MAX_QUEUE, seed=99)), served.loop)
    wait_until(lambda: served.service.batcher.queued_items == MAX_QUEUE, "the queue to fill")

    def release() -> None:
        gate.set()
        blocker.result(20)
        waiting.result(20)

    try:
        yield release
    finally:
        release()


def refused_then_served(answers: list[tuple[str, int]], path: str) -> bool:
    """One or more 503s (the queue stays full until the test lets the model go), then a 200."""
    statuses = [status for answer_path, status in answers if answer_path == path]
    return len(statuses) >= 2 and set(statuses[:-1]) == {503} and statuses[-1] == 200


# ----- verl -----


@pytest.fixture(scope="module")
def policy_tokenizer() -> PreTrainedTokenizerBase:
    """The tiny policy's tokenizer (ChatML; eos <|im_end|>)."""
    return AutoTokenizer.from_pretrained(resolve_model("tiny", "causal"))


# verl's reward loop sends the conversation as the reward model's tokenizer renders it (apply_chat_template): for
# VerifyRM that rendering must be the VerifyRM template, so the reward model's chat template is this one, and the
# user turn carries the question and reference ("<question>Q</question>\n<reference_answer>R</reference_answer>\n").
VERIFY_RM_CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<completion>{{ m['content'] }}"
                           "</completion>{% else %}{{ m['content'] }}{% endif %}{% endfor %}")


class VerlData:
    """verl.protocol.DataProto as the reward loop reads it (len, slices, rows with `batch` and `non_tensor_batch`):
    the real one needs tensordict, ray and torch.distributed."""

    def __init__(self, rows: list[types.SimpleNamespace]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int | slice) -> Any:
        return VerlData(self.rows[index]) if isinstance(index, slice) else self.rows[index]


def verl_sample(policy_tokenizer: PreTrainedTokenizerBase, item: ScoreItem) -> VerlData:
    """One rollout as verl's agent loop leaves it: the chat prompt, and the response ids (eos, then padding) with
    their attention mask."""
    prompt = [{"role": "user", "content": f"<question>{item.question}</question>\n<reference_answer>"
                                          f"{item.reference}</reference_answer>\n"}]
    prompt_ids = policy_tokenizer.encode(prompt[0]["content"], add_special_tokens=False)
    response = policy_tokenizer.encode(item.completion, add_special_tokens=False) + [policy_tokenizer.eos_token_id]
    padding = 3
    row = types.SimpleNamespace(
        batch={"responses": torch.tensor(response + [policy_tokenizer.pad_token_id] * padding),
               "attention_mask": torch.tensor([1] * (len(prompt_ids) + len(response)) + [0] * padding)},
        non_tensor_batch={"raw_prompt": prompt})
    return VerlData([row])


def verl_worker(reward_loop: types.ModuleType, address: str, policy: PreTrainedTokenizerBase,
                chat_template: str | None = VERIFY_RM_CHAT_TEMPLATE) -> Any:
    """A RewardLoopWorker with its router address the service's, and a discriminative reward model served by vLLM.
    Built without __init__, which loads the tokenizers through verl's helpers (stubbed) and sets exactly these;
    `chat_template` None keeps the reward model tokenizer's own."""
    worker = reward_loop.RewardLoopWorker.__new__(reward_loop.RewardLoopWorker)
    worker.config = types.SimpleNamespace(reward=types.SimpleNamespace(
        custom_reward_function=types.SimpleNamespace(path=None),
        reward_model=types.SimpleNamespace(enable=True, model_path="verify-rm",
                                           rollout=types.SimpleNamespace(name="vllm"))))
    worker.reward_router_address = address
    worker.input_tokenizer = policy
    worker.reward_model_tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny", "reward"))
    if chat_template is not None:
        worker.reward_model_tokenizer.chat_template = chat_template
    return worker


def test_verl_reward_loop_gets_the_logit_that_v1_score_gives(
        verl_reward_loop: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase, answered: list[tuple[str, int]]) -> None:
    items = tiny_items(3, seed=21)
    worker = verl_worker(verl_reward_loop, fronts.open_address, policy_tokenizer)
    # one sample at a time, as /v1/score below, so that each is scored alone: the same batch, the same floats
    got = [asyncio.run(worker.compute_score(verl_sample(policy_tokenizer, item))) for item in items]
    # verl asks for use_activation=false: its reward is the raw logit
    assert got == [{"reward_score": score["logit"]} for score in v1_score(fronts, items)]
    assert answered == [("/classify", 200)] * 3 + [("/v1/score", 200)] * 3


def test_verl_reward_loop_drives_the_learning_mode(verl_reward_loop: types.ModuleType,
                                                    policy_tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    """verl's reward loop, unmodified, against a service that learns from what it scores (reward.learn_online with
    every_requests = one step's samples, as docs/reward-api.md tells a verl user): the question and the reference
    (verl's ground_truth) reach the learner through /classify's VerifyRM template, and one step's samples make one
    update."""
    rng, items = random.Random(5), []
    for problem in make_split(3, 5, "verl-learn"):  # per question: right, then wrong
        items += [ScoreItem(problem.question, problem.answer, problem.solution),
                  ScoreItem(problem.question, problem.answer, wrong_solution(problem, rng))]
    config = make_config(tmp_path, learn_online=LearnOnlineConfig(enabled=True, every_requests=len(items)))
    with serve_http(config) as served:
        worker = verl_worker(verl_reward_loop, served.url.removeprefix("http://"), policy_tokenizer)
        step = [asyncio.run(worker.compute_score(verl_sample(policy_tokenizer, item))) for item in items]
        wait_until(lambda: httpx.get(f"{served.url}/v1/model").json()["version"] == 1,
                   "a learning step after one step's samples", timeout_s=120)
        again = [asyncio.run(worker.compute_score(verl_sample(policy_tokenizer, item))) for item in items]

    def margin(scores: list[dict[str, float]]) -> float:  # right minus wrong, mean over the questions
        logits = [s["reward_score"] for s in scores]
        return sum(logits[0::2]) / 3 - sum(logits[1::2]) / 3

    assert margin(again) > margin(step)  # VerifyRM learnt from the very pairs verl's samples made


def test_verl_reward_loop_raises_a_refusal_at_once(
        verl_reward_loop: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase, answered: list[tuple[str, int]]) -> None:
    """verl does not retry a 4xx: aiohttp's ClientResponseError with the status, after one request. /classify
    refuses a malformed input with 400, as vLLM does (the other routes answer 422)."""
    item = tiny_items(1, seed=22)[0]
    long = ScoreItem(item.question, item.reference, "x" * (MAX_CHARS + 1))
    # refused on its Content-Length, before the body is read (while aiohttp may still be sending it)
    huge = ScoreItem(item.question, item.reference, "x" * int(MAX_BODY_MB * 1024 * 1024 * 1.2))
    cases = [
        (401, verl_worker(verl_reward_loop, fronts.token_address, policy_tokenizer), item),  # verl sends no token
        (413, verl_worker(verl_reward_loop, fronts.open_address, policy_tokenizer), long),
        (413, verl_worker(verl_reward_loop, fronts.open_address, policy_tokenizer), huge),
        # the reward model's own chat template (ChatML): not the VerifyRM template
        (400, verl_worker(verl_reward_loop, fronts.open_address, policy_tokenizer, chat_template=None), item),
    ]
    for status, worker, sample in cases:
        answered.clear()
        with pytest.raises(verl_reward_loop.aiohttp.ClientResponseError) as refused:
            asyncio.run(worker.compute_score(verl_sample(policy_tokenizer, sample)))
        assert refused.value.status == status
        assert answered == [("/classify", status)]


def test_verl_reward_loop_retries_a_503_and_gets_the_score(
        verl_reward_loop: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase, answered: list[tuple[str, int]]) -> None:
    """verl retries a 5xx after its own backoff (1 s, 2 s, ...; Retry-After is not read), up to 16 times."""
    item = tiny_items(1, seed=23)[0]
    want = v1_score(fronts, [item])[0]["logit"]
    worker = verl_worker(verl_reward_loop, fronts.open_address, policy_tokenizer)
    answered.clear()
    with ThreadPoolExecutor(1) as pool, full_queue(fronts.served) as release:  # released before the join
        scoring = pool.submit(asyncio.run, worker.compute_score(verl_sample(policy_tokenizer, item)))
        wait_until(lambda: ("/classify", 503) in answered, "verl's request to be refused")
        release()
        assert scoring.result(60) == {"reward_score": want}
    assert refused_then_served(answered, "/classify"), answered


# ----- OpenRLHF -----


class ScriptedPolicy:
    """vLLM's engine as OpenRLHF's rollout actor calls it (`generate(prompt_token_ids, sampling_params)`), answering
    every prompt with one completion, finished by eos (whose id vLLM keeps in token_ids)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, completion: str):
        self.token_ids = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.completion = completion

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        output = types.SimpleNamespace(token_ids=self.token_ids, text=self.completion, finish_reason="stop",
                                       logprobs=None)
        return types.SimpleNamespace(outputs=[output])


def chat_prompt(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


async def openrlhf_rollout(agent: types.ModuleType, address: str, tokenizer: PreTrainedTokenizerBase,
                           item: ScoreItem, max_length: int = 1024) -> dict[str, Any]:
    """One prompt through OpenRLHF's single-turn executor with --remote_rm_url at the service, --label_key giving
    the reference: the executor tokenizes, generates and asks the remote reward model."""
    executor = agent.SingleTurnAgentExecutor(f"http://{address}/get_reward")
    sampling = types.SimpleNamespace(max_tokens=64, logprobs=None)  # the fields of vLLM's SamplingParams it reads
    return await executor.execute(chat_prompt(item.question), item.reference, sampling, max_length, tokenizer,
                                  ScriptedPolicy(tokenizer, item.completion))


def test_openrlhf_gets_the_scores_that_v1_score_gives(
        openrlhf_agent: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase, answered: list[tuple[str, int]]) -> None:
    items = tiny_items(3, seed=31)
    got = [asyncio.run(openrlhf_rollout(openrlhf_agent, fronts.open_address, policy_tokenizer, item)) for item in items]
    # the service takes the prompt as the question and what follows it in the query, less eos, as the completion
    want = v1_score(fronts, [ScoreItem(chat_prompt(i.question), i.reference, i.completion) for i in items])
    version = fronts.served.service.version
    for rollout, score in zip(got, want, strict=True):
        # OpenRLHF trains on `reward` and filters on `scores`; both are sigmoid(logit) (reward.discrete is off)
        assert (rollout["reward"], rollout["scores"]) == ([score["score"]], [score["score"]])
        assert rollout["extra_logs"] == {"reward_version": [float(version)]}
    assert answered == [("/get_reward", 200)] * 3 + [("/v1/score", 200)] * 3


def test_openrlhf_retries_a_refusal_five_times_then_has_no_reward(
        openrlhf_agent: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase, answered: list[tuple[str, int]]) -> None:
    """OpenRLHF retries every error, 4xx too, 5 times 1 s apart, then logs it and leaves the rollout without a
    reward (None), which its trainer then leaves out of the rollout's info."""
    item = tiny_items(1, seed=32)[0]

    async def refused() -> list[dict[str, Any]]:
        return await asyncio.gather(
            openrlhf_rollout(openrlhf_agent, fronts.token_address, policy_tokenizer, item),  # 401: OpenRLHF sends no token
            openrlhf_rollout(openrlhf_agent, fronts.open_address, policy_tokenizer,  # 413
                             ScoreItem(item.question, "1" * (MAX_CHARS + 1), item.completion)),
            # 422: a prompt over max_length - max_tokens is cut from the left, so the query no longer starts with it
            openrlhf_rollout(openrlhf_agent, fronts.open_address, policy_tokenizer, item, max_length=64 + 3))

    for rollout in asyncio.run(refused()):
        assert (rollout["reward"], rollout["scores"], rollout["extra_logs"]) == (None, None, {})
    assert collections.Counter(answered) == {("/get_reward", 401): 5, ("/get_reward", 413): 5,
                                             ("/get_reward", 422): 5}


def test_openrlhf_retries_a_503_and_gets_the_score(
        openrlhf_agent: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase, answered: list[tuple[str, int]]) -> None:
    item = tiny_items(1, seed=33)[0]
    want = v1_score(fronts, [ScoreItem(chat_prompt(item.question), item.reference, item.completion)])[0]["score"]
    answered.clear()
    with ThreadPoolExecutor(1) as pool, full_queue(fronts.served) as release:  # released before the join
        rollout = pool.submit(asyncio.run, openrlhf_rollout(openrlhf_agent, fronts.open_address, policy_tokenizer, item))
        wait_until(lambda: ("/get_reward", 503) in answered, "OpenRLHF's request to be refused")
        release()
        assert rollout.result(60)["reward"] == [want]
    assert refused_then_served(answered, "/get_reward"), answered


def test_openrlhf_without_a_label_key_scores_the_template_its_prompts_carry(
        openrlhf_agent: types.ModuleType, fronts: Fronts, policy_tokenizer: PreTrainedTokenizerBase,
        answered: list[tuple[str, int]]) -> None:
    """Without --label_key OpenRLHF sends each label as "": the reference then comes from the VerifyRM template that
    the prompt ends with (docs/reward-api.md, OpenRLHF's remote reward model), not from the empty label."""
    items = tiny_items(2, seed=34)
    executor = openrlhf_agent.SingleTurnAgentExecutor(f"http://{fronts.open_address}/get_reward")
    sampling = types.SimpleNamespace(max_tokens=64, logprobs=None)

    async def rollouts() -> list[dict[str, Any]]:
        return [await executor.execute(template_prompt(item), "", sampling, 1024, policy_tokenizer,
                                       ScriptedPolicy(policy_tokenizer, item.completion)) for item in items]

    got = asyncio.run(rollouts())
    assert [rollout["reward"] for rollout in got] == [[score["score"]] for score in v1_score(fronts, items)]
    assert answered == [("/get_reward", 200)] * 2 + [("/v1/score", 200)] * 2


def template_prompt(item: ScoreItem) -> str:
    """A prompt that carries its reference: the VerifyRM template up to the completion, after the chat markup."""
    return (f"<|im_start|>user\n<question>{item.question}</question>\n<reference_answer>{item.reference}"
            "</reference_answer>\n<completion>")


def test_an_empty_label_takes_the_reference_from_the_query_or_is_refused(fronts: Fronts) -> None:
    """/get_reward itself, without a client: an empty label is no reference (the template in the query gives it,
    else 422 naming the fix), and a label beside it is read as before."""
    templated, labelled = tiny_items(2, seed=35)
    prompts = [template_prompt(templated), chat_prompt(labelled.question)]
    request = {"query": [prompts[0] + templated.completion, prompts[1] + labelled.completion],
               "prompts": prompts, "labels": ["", labelled.reference]}
    reply = httpx.post(f"http://{fronts.open_address}/get_reward", json=request)
    assert reply.status_code == 200, reply.text
    # both in one /v1/score request too: the same batch, the same floats
    want = httpx.post(f"http://{fronts.open_address}/v1/score", json={"items": [
        {"question": templated.question, "reference": templated.reference, "completion": templated.completion},
        {"question": prompts[1], "reference": labelled.reference, "completion": labelled.completion}]}).json()
    assert reply.json()["rewards"] == [score["score"] for score in want["scores"]]
    untemplated = {"query": [prompts[1] + labelled.completion], "prompts": [prompts[1]], "labels": [" "]}
    reply = httpx.post(f"http://{fronts.open_address}/get_reward", json=untemplated)
    assert reply.status_code == 422, reply.text
    assert "labels[0] is empty" in reply.json()["error"]["message"]
    assert "--label_key" in reply.json()["error"]["message"]
