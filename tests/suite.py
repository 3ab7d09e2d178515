"""`make test`'s pytest, in three sessions (tests/conftest.py `PARTS`): the real vLLM servers' module, then the files
holding quiet tests, one after the other; beside them, at a lower CPU priority, every other file.

Why: the quiet tests never run beside the real vLLM servers, so in one session they wait for that module to end,
and they mostly wait on the stand-in server's clock, not the CPU. Here they start the moment the module ends, beside
the rest of the suite rather than after it; and the real servers and the quiet tests, each the end of the suite's
longest chain, are served first when the cores are busy. Every test still runs. The rest's output follows the
others'; the exit status is the first failing session's, else 0.

    python -m tests.suite [PYTEST_ARGS...]   # the arguments go to every session (files, -k, -x, ...)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

SHARED_MODELS_ENV = "RUNINFRA_OPT_TEST_MODELS"
"""Where the three sessions share their converted models (tests/conftest.py `_session_models`)."""

REST_NICENESS = 5
"""How much lower the rest's priority is: served after the real vLLM servers and the quiet tests when the cores are
busy, never starved (a niceness of 5 weighs about a third of the default's)."""

XDIST = ["--dist", "loadfile", "--no-loadscope-reorder"]


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-q", "--durations", "15"]
    with tempfile.TemporaryDirectory(prefix="runinfra-test-models-") as models, tempfile.TemporaryFile("w+") as log:
        env = {**os.environ, SHARED_MODELS_ENV: models}
        rest = subprocess.Popen(
            [*pytest, "-n", "2", *XDIST, "--part", "rest", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.nice(REST_NICENESS),
        )
        try:
            codes = [subprocess.run([*pytest, "--part", "vllm", *args], env=env, check=False).returncode]
            codes.append(subprocess.run([*pytest, "-n", "3", *XDIST, "--part", "quiet", *args], env=env).returncode)
            codes.append(rest.wait())
        finally:
            if rest.poll() is None:
                rest.terminate()
                rest.wait()
        log.seek(0)
        sys.stdout.write("\n---- the rest of the suite ----\n" + log.read())
    # 5: no test selected in that part (a selection of files that holds none of it)
    failed = [code for code in codes if code not in (0, 5)]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
