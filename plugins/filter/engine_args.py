"""Filters that render and check the vLLM server's flags against the pinned engine's real list.

``options | vllm_args(version)`` turns a mapping of typed values into the argv
of ``python -m vllm.entrypoints.openai.api_server``, and fails the play with
every problem when a flag is not one that release has (with the closest real
flag: "unknown flag --gpu-memory-utilization-gpu0: did you mean
--gpu-memory-utilization?"), a value is missing, of the wrong type or outside
the choices::

    - name: Render the engine's flags from typed variables
      ansible.builtin.set_fact:
        __vllm_argv: "{{ {'model': '/models/current', 'tensor_parallel_size': 2,
                          'gpu_memory_utilization': 0.9, 'enable_prefix_caching': true}
                         | vllm_args(gpu_stacks[gpu_stack].vllm.version) }}"

``options | vllm_prefix_caching(version, wanted)`` adds the
``enable_prefix_caching`` value that release needs to cache prompt prefixes
(vLLM 0.4.2: ``--enable-prefix-caching``, off otherwise; 0.8 and later: on by
default, so nothing), or not to (``false`` where the default is on). An engine
that sets the flag itself keeps its choice. The workers' ``prefix_affinity``
policy only pays where the engines cache prefixes.

``argv | vllm_args_problems(version)`` returns the problems of an argv given as
a list (an operator's extra flags), empty when it is valid, for an
``ansible.builtin.assert`` before deploy.

Values: None leaves a flag out; true gives ``--flag`` and false ``--no-flag``
where the release has one; lists give several values or a repeated flag; a
dict gives JSON with sorted keys, so the rendered argv is the same every run.

The logic is plugins/module_utils/engine_args.py, shared with ``llmfleet engine
check-args``; the lists are files/engine_flags/vllm-<version>.json. Filter
plugins run on the controller, where ``ansible.module_utils`` holds only
Ansible's own module_utils, so they import it from the installed llmfleet
package (``llmfleet.module_utils``, a link to plugins/module_utils; docs/layout.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

# Controller-side plugins import the shared code from the installed llmfleet package
# (llmfleet/module_utils is a link to plugins/module_utils): one import path, one module.
# Without llmfleet in the Python that runs ansible-playbook, say how to get it.
try:
    from llmfleet.module_utils import engine_args
except ImportError as error:  # pragma: no cover (every venv that runs Ansible here installs llmfleet)
    raise AnsibleFilterError(
        f"engine_args: {error}; run ansible-playbook from the README's venv, or pip install -e '.[ops]' in yours"
    ) from error


def _flags(version: Any, filter_name: str) -> dict[str, Any]:
    try:
        flags: dict[str, Any] = engine_args.load_flags(str(version))
    except ValueError as error:
        raise AnsibleFilterError(f"{filter_name}: {error}") from error
    return flags


def vllm_args(options: Mapping[str, Any], version: Any) -> list[str]:
    """The engine's argv for typed options; AnsibleFilterError naming every bad flag."""
    if not isinstance(options, Mapping):
        raise AnsibleFilterError(f"vllm_args expects a mapping of flag -> value, got {type(options).__name__}")
    flags = _flags(version, "vllm_args")
    try:
        argv: list[str] = engine_args.render_args(dict(options), flags)
    except engine_args.EngineArgsError as error:
        raise AnsibleFilterError(f"vllm_args refused for vLLM {version}: " + " | ".join(error.problems)) from error
    return argv


def vllm_prefix_caching(options: Mapping[str, Any], version: Any, wanted: Any = True) -> dict[str, Any]:
    """options with prefix caching set for that release as wanted; AnsibleFilterError if it cannot be."""
    if not isinstance(options, Mapping):
        raise AnsibleFilterError(
            f"vllm_prefix_caching expects a mapping of flag -> value, got {type(options).__name__}"
        )
    if not isinstance(wanted, bool):
        raise AnsibleFilterError(f"vllm_prefix_caching: wanted must be true or false, not {wanted!r}")
    try:
        chosen: dict[str, Any] = engine_args.with_prefix_caching(
            options, _flags(version, "vllm_prefix_caching"), wanted
        )
    except engine_args.EngineArgsError as error:
        raise AnsibleFilterError("vllm_prefix_caching: " + " | ".join(error.problems)) from error
    return chosen


def vllm_args_problems(argv: Sequence[Any], version: Any) -> list[str]:
    """Every problem of an argv list for that engine version; empty when it is valid."""
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence):
        raise AnsibleFilterError("vllm_args_problems expects a list of arguments, one item per argument")
    _, problems = engine_args.check_args([str(item) for item in argv], _flags(version, "vllm_args_problems"))
    return list(problems)


class FilterModule:
    """llmfleet vLLM flag filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "vllm_args": vllm_args,
            "vllm_args_problems": vllm_args_problems,
            "vllm_prefix_caching": vllm_prefix_caching,
        }
