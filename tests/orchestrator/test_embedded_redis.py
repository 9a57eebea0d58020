"""The embedded Redis: a real redis-server child, its files in the run directory, one server per directory."""

from __future__ import annotations

import os

import pytest

from cooper.launcher.embedded_redis import SOCKET_PATH_MAX, EmbeddedRedis


def test_state_survives_a_stop_and_nothing_is_left_but_the_aof(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    server.hset("state", "logged_through", 7)
    assert server.stop() == 0  # SIGTERM: the AOF written out, a clean exit
    assert sorted(os.listdir(tmp_path / "redis")) == ["appendonly.aof", "lock", "redis.log"]  # socket removed
    again = EmbeddedRedis(tmp_path / "redis")
    try:
        assert again.hget("state", "logged_through") == "7"
    finally:
        again.stop()


def test_a_second_server_on_one_directory_is_refused(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    try:
        with pytest.raises(RuntimeError, match="is in use by another process"):
            EmbeddedRedis(tmp_path / "redis", lock_timeout_s=0.2)
        assert server.ping()  # untouched
    finally:
        server.stop()


def test_a_run_directory_too_long_for_a_socket_path_still_works(tmp_path):
    redis_dir = tmp_path / ("d" * 120) / "redis"
    assert len(os.fsencode(redis_dir / "redis.sock")) > SOCKET_PATH_MAX
    server = EmbeddedRedis(redis_dir)
    try:
        assert str(server.socket_path).startswith("/proc/self/fd/")
        assert server.set("k", "v") and server.get("k") == "v"
    finally:
        server.stop()
    assert not (redis_dir / "redis.sock").exists()
