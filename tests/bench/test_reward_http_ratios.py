"""bench/reward_http.py's ratios between the service and another server: per round (the rounds pair the servers),
reported as their median with the per-round values and their range; the sweep's settings of the peers; and --model:
the names and directories it takes, what vLLM is told or refused for a model, and a bad one refused before anything
starts."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reward_http(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import reward_http

    return reward_http


def test_the_ratio_is_the_median_of_per_round_ratios_with_their_range(reward_http) -> None:
    ratios = reward_http.per_round_ratios([87.0, 102.0, 117.0], [100.0, 100.0, 100.0])
    assert ratios == pytest.approx([0.87, 1.02, 1.17])
    report = reward_http.ratio_report("ratio_vs_best_peer", ratios)
    assert report == {"ratio_vs_best_peer": 1.02, "ratio_vs_best_peer_per_round": [0.87, 1.02, 1.17],
                      "ratio_vs_best_peer_range": [0.87, 1.17]}


def test_a_round_without_a_reading_of_the_other_server_is_left_out(reward_http) -> None:
    # A ratio of medians would give 200 / 150 = 1.33; paired by round the service is 1.0x and 2.0x the peer.
    assert reward_http.per_round_ratios([100.0, 50.0, 200.0], [100.0, None, 100.0]) == [1.0, 2.0]
    assert reward_http.ratio_report("ratio_vs_vllm", []) == {
        "ratio_vs_vllm": None, "ratio_vs_vllm_per_round": [], "ratio_vs_vllm_range": None}


PROCESSES = {"service": "copies", "mosec": "workers", "litserve": "workers", "naive": "workers"}
"""Each server's count of model processes, each a whole copy of the model. vLLM runs one engine process: its
analogue, the cores its threads are bound to, is swept below."""


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_every_server_is_offered_the_model_processes_the_service_is(reward_http, cores: int) -> None:
    grids = {name: reward_http.settings_grid(name, [16], [2.0], cores=cores) for name in PROCESSES}
    offered = {name: {s[key] for s in grids[name]} for name, key in PROCESSES.items()}
    assert offered["service"] == ({1, 2} if cores >= 2 else {1})
    assert all(counts == offered["service"] for counts in offered.values()), offered


def test_litserve_gets_one_front_or_one_per_worker_and_mosec_a_swept_tokenizing_stage(reward_http) -> None:
    litserve = reward_http.settings_grid("litserve", [16], [2.0], cores=2)
    assert {(s["workers"], s["api_servers"], s["fast_queue"]) for s in litserve} == {
        (1, 1, False), (1, 1, True), (2, 1, False), (2, 1, True), (2, 2, False), (2, 2, True)}
    mosec = reward_http.settings_grid("mosec", [16], [2.0], cores=2)
    assert {(s["tokenizers"], s["tokenize_batched"]) for s in mosec} == {(1, False), (1, True), (2, False), (2, True)}
    assert reward_http.setting_env(mosec[-1])["COOPER_BENCH_TOKENIZE_BATCHED"] == "1"
    assert reward_http.settings_grid("default", [16], [2.0], cores=2) == [{}]  # the default sets nothing
    service = reward_http.settings_grid("service", [16], [2.0], cores=2)
    assert {s["spread"] for s in service} == {False, True}  # the default's way of cutting batches is swept too
    assert {s["tokenize"] for s in service} == {"serving", "model"}  # like mosec's stage, its tokenizing's place


def test_vllm_gets_its_cpu_settings_where_there_are_two_cores(reward_http) -> None:
    vllm = reward_http.settings_grid("vllm", [8, 32], [2.0], cores=2, threads=1)
    assert {s["omp_threads_bind"] for s in vllm} == {"auto", "0", "0-1"}
    assert {s["api_server_count"] for s in vllm} == {1, 2}
    assert {(s["max_num_seqs"], s["max_num_batched_tokens"]) for s in vllm} == {(8, 2048), (8, 8192), (32, 2048),
                                                                                (32, 8192)}
    assert len(vllm) == 3 * 2 * 2 * 2  # every binding x API servers x max-num-seqs x batched tokens
    setting = vllm[-1]
    # The thread binding is vLLM's environment; its API servers and step limits are flags (server_command).
    assert reward_http.setting_env(setting) == {"VLLM_CPU_OMP_THREADS_BIND": setting["omp_threads_bind"]}


@pytest.mark.parametrize(("cores", "copies", "expected"), [(1, (1, 2), {1}), (2, (1,), {1}), (4, (1, 2), {1, 2})])
def test_vllm_gets_a_second_api_server_only_where_the_others_get_a_second_process(
        reward_http, cores: int, copies: tuple[int, ...], expected: set[int]) -> None:
    vllm = reward_http.settings_grid("vllm", [16], [2.0], cores=cores, service_copies=copies)
    service = reward_http.settings_grid("service", [16], [2.0], cores=cores, service_copies=copies)
    assert {s["api_server_count"] for s in vllm} == expected == {s["copies"] for s in service}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A directory with a config.json of SmolLM2-135M's shape (what vLLM reads of it here)."""
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


SMOLLM2 = {"architectures": ["LlamaForSequenceClassification"], "hidden_size": 576, "num_attention_heads": 9,
           "head_dim": 64, "max_position_embeddings": 8192}
TINY = {"architectures": ["Qwen2ForSequenceClassification"], "hidden_size": 64, "num_attention_heads": 4,
        "max_position_embeddings": 2048}
TINY_HD32 = dict(TINY, num_attention_heads=2)


def test_vllm_is_started_through_its_serve_command_with_the_swept_api_servers(reward_http, model_dir: Path) -> None:
    setting = {"omp_threads_bind": "0", "api_server_count": 2, "max_num_seqs": 16, "max_num_batched_tokens": 2048}
    args = argparse.Namespace(model=str(model_dir), device="cpu", loop="auto")
    command = reward_http.server_command("vllm", 8000, args, {"vllm": "/peer/bin/python"}, "/tmp", setting,
                                         str(model_dir))
    # Not `-m vllm.entrypoints.openai.api_server`: it serves from one process whatever --api-server-count says.
    assert command[:2] == ["/peer/bin/python", str(reward_http.ROOT / "bench/peers/vllm_server.py")]
    assert command[2] == str(model_dir) and "--model" not in command  # `vllm serve MODEL`: --model is deprecated
    assert (reward_http.ROOT / "bench/peers/vllm_server.py").is_file()
    assert {"--api-server-count=2", "--max-num-seqs=16", "--max-num-batched-tokens=2048"} <= set(command)
    # SmolLM2's context is 8192: vLLM is held to the 2048 tokens the service takes, which 2048 per step can hold.
    assert "--max-model-len=2048" in command


def test_vllm_takes_prompts_as_long_as_the_service_does_or_the_models_context_where_shorter(reward_http) -> None:
    assert reward_http.MAX_LENGTH == 2048
    assert reward_http.vllm_max_model_len(SMOLLM2) == 2048
    assert reward_http.vllm_max_model_len(TINY) == 2048
    short = dict(SMOLLM2, max_position_embeddings=512)
    assert reward_http.vllm_max_model_len(short) == 512
    vllm = reward_http.settings_grid("vllm", [16], [2.0], cores=1, max_model_len=512)
    assert {s["max_num_batched_tokens"] for s in vllm} == {512, 8192}  # a step holds a whole prompt, or 32 clients'


def test_vllm_is_left_out_for_a_model_of_a_head_size_its_cpu_attention_refuses(reward_http) -> None:
    refusal = reward_http.vllm_refusal(TINY)  # 64 / 4 = 16
    assert refusal is not None and "head_dim 16" in refusal
    assert reward_http.vllm_refusal(TINY_HD32) is None  # 64 / 2 = 32
    assert reward_http.vllm_refusal(SMOLLM2) is None  # 64, as its config says
    assert reward_http.vllm_refusal(dict(SMOLLM2, head_dim=48)) is not None  # the config's head_dim comes first
    assert reward_http.vllm_refusal({"architectures": ["Unknown"]}) is None  # nothing to judge by: vLLM will say


def test_model_takes_the_bench_models_and_model_directories(reward_http, model_dir: Path, tmp_path: Path,
                                                            monkeypatch) -> None:
    for name in ("tiny-hd32", "tiny", "small", "smollm2-135m-instruct"):
        assert reward_http.model_argument(name) == name
    monkeypatch.chdir(model_dir.parent)
    # A directory goes to every server as an absolute path: --baseline's servers run in another checkout.
    assert reward_http.model_argument(model_dir.name) == str(model_dir.resolve())
    with pytest.raises(argparse.ArgumentTypeError, match="neither a model of the bench"):
        reward_http.model_argument("tiny-rm-nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(argparse.ArgumentTypeError, match="no config.json"):
        reward_http.model_argument(str(tmp_path / "empty"))


def test_a_bad_model_is_refused_with_exit_code_2_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "reward_http.py"), "--model", "no-such-model"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "argument --model: 'no-such-model' is neither a model of the bench" in result.stderr
    # Refused while parsing: the bench's own lines (a peer skipped, a setting of the sweep) never came.
    assert "reward_http:" not in result.stderr


def test_the_best_settings_of_the_sweep_are_read_again_and_a_server_with_one_setting_is_not(reward_http) -> None:
    sweep = [{"setting": {"max_batch": b}, "items_per_s": rate, "readings": [rate]}
             for b, rate in [(8, 900.0), (16, 1200.0), (32, 1000.0), (64, 400.0)]]
    assert [e["setting"]["max_batch"] for e in reward_http.top_settings(sweep, 3)] == [16, 32, 8]
    assert reward_http.top_settings(sweep[:1], 3) == []


def test_the_best_setting_is_the_best_mean_among_the_settings_read_twice(reward_http) -> None:
    # 16 read 1200 then 900 (mean 1050); 32 read once at 1100: a lucky minute has not been ruled out for 32.
    sweep = [{"setting": {"max_batch": 8}, "items_per_s": 1000.0, "readings": [1000.0, 1000.0]},
             {"setting": {"max_batch": 16}, "items_per_s": 1050.0, "readings": [1200.0, 900.0]},
             {"setting": {"max_batch": 32}, "items_per_s": 1100.0, "readings": [1100.0]}]
    assert reward_http.best_setting(sweep) == {"max_batch": 16}
    assert reward_http.best_setting(sweep[2:]) == {"max_batch": 32}  # nothing confirmed: the best single reading


def test_a_connection_the_server_closed_while_idle_is_opened_again(reward_http) -> None:
    # A server's keep-alive timeout ends a connection that sat idle (on a real model, through the other clients'
    # warm-up): the next request on it goes out again on a new connection and gets its answer.
    import asyncio

    async def scenario() -> tuple[bytes, int]:
        accepted = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            if accepted == 1:  # the idle connection, closed before any request arrives
                writer.close()
                return
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await reward_http.Connection.open("127.0.0.1", port)
        await asyncio.sleep(0.2)
        answer = await connection.request("GET", "/metrics")
        connection.close()
        server.close()
        return answer, accepted

    answer, accepted = asyncio.run(scenario())
    assert (answer, accepted) == (b"ok", 2)
