"""The environment a job starts with: a short allow-list from the agent's own environment plus
what the scheduler sets for the job (``CUDA_VISIBLE_DEVICES``, ``GPUFLEET_JOB_ID``, ...) and the
job's own ``env``. Nothing else of the agent's environment reaches a job: not its token
(``GPUFLEET_AGENT_TOKEN``), not its cloud or registry credentials.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# What a program needs to run like a login shell's child: where programs and libraries are,
# who and where it is, language and time zone. PYTHONPATH lets the job wrapper (a module of
# the agent's own install) import in a development checkout.
ALLOWED = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "SHELL",
    "TERM",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def job_environment(
    job_env: Mapping[str, str], agent_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A job's environment: the allow-listed variables of ``agent_env`` (default: this
    process's), then ``job_env`` (the scheduler's variables and the job's own) over them."""
    source = os.environ if agent_env is None else agent_env
    env = {k: source[k] for k in ALLOWED if k in source}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(job_env)
    return env
