"""bench/reward_http.py's ratios between the service and another server: per round (the rounds pair the servers),
reported as their median with the per-round values and their range; and the sweep's settings of the peers."""

from __future__ import annotations

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
    assert {(s["max_num_seqs"], s["max_num_batched_tokens"]) for s in vllm} == {(8, 2048), (8, 8192), (32, 2048),
                                                                                (32, 8192)}
    setting = vllm[-1]
    assert reward_http.setting_env(setting) == {"VLLM_CPU_OMP_THREADS_BIND": setting["omp_threads_bind"]}


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
