"""Cooper: GRPO with a reward model that is trained alongside the policy."""

import os

__version__ = "0.1.0"

# Cooper's processes fork only to exec (subprocess, multiprocessing's spawn and forkserver), which needs no gRPC fork
# handlers. With them on (gRPC core's default in Python wheels, grpc/grpc#41433), a fork while gRPC's pollers run
# can leave a poller on a closed epoll descriptor: seen here once as a verifier aborting at start-up ("epoll_wait
# error: Bad file descriptor") under the full test suite's load. gRPC reads this when it first initializes, which is
# after any `import cooper...`; an explicit setting in the environment wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The tiny preset's model names ("tiny", "tiny-rm", ...) resolve in every process that imports cooper: the preset
# registers them with cooper.runtime.models, and services resolve names there without importing it.
import cooper.pretrained  # noqa: E402, F401
import cooper.tiny  # noqa: E402, F401
