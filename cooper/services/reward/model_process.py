"""Starting VerifyRM's model process (runner.ProcessRunner's child), in a module light enough to do it first.

`cooper serve reward` starts the model process before it imports the rest of the service (torch, transformers for
the tokenizer, FastAPI, uvicorn: 4-5 s of CPU on 2 cores), so that the child's own start-up (the same imports and
the model's load) runs beside them instead of after them: `start_early` from the CLI, then the first
ProcessRunner.start with the same config takes that process (`take_early`) instead of starting another. Nothing
here imports torch; the child imports runner.py, and with it the core, itself.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.process
import os
import socket
from dataclasses import dataclass
from typing import Any

from cooper.config import RewardConfig
from cooper.services.reward.serving_defaults import with_model_copies


@dataclass
class ModelProcess:
    """A started model process and the parent's end of its socket pair (runner.ProcessRunner connects to it)."""

    process: multiprocessing.process.BaseProcess
    link: socket.socket


def spawn(config: RewardConfig, writes: bool) -> ModelProcess:
    """Start the child (`spawn`: never fork a process that runs gRPC and torch threads), which loads the core and
    then serves calls on its end of the pair (runner.serve_model_process). `writes`: it journals and checkpoints."""
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = socket.socketpair()
    process = context.Process(
        target=_main, name="verify-rm",
        args=(child_end, config, writes, os.getpid(), logging.getLogger().getEffectiveLevel()), daemon=True,
    )
    try:
        process.start()
    except BaseException:
        parent_end.close()
        raise
    finally:
        child_end.close()  # the child holds its own copy; ours would hide the child's exit from the reader
    return ModelProcess(process, parent_end)


_early: tuple[RewardConfig, ModelProcess] | None = None


def start_early(config: RewardConfig) -> None:
    """Start the model process the service will ask for, when it runs one (reward.model_process, one copy)."""
    global _early
    config, _ = with_model_copies(config)  # as RewardService.create will: take_early compares the two
    if config.model_process and config.model_copies == 1 and _early is None:
        _early = (config, spawn(config, writes=True))


def take_early(config: RewardConfig, writes: bool) -> ModelProcess | None:
    """The process start_early started for this very config, once; None when there is none."""
    global _early
    if _early is None or not writes or _early[0] != config:
        return None
    started, _early = _early[1], None
    return started


def _main(*args: Any) -> None:
    from cooper.services.reward.runner import serve_model_process

    serve_model_process(*args)
