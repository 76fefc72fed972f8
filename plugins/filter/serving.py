"""Filters that read the serving layer out of the inventory: which engines run where, and what they serve.

The gateway and the workers are told about the engines through these, so the
engines are listed once (each GPU host's vllm_engines) and never repeated in
the gateway layer's variables:

    worker_engines: "{{ groups[llmfleet_engine_group] | engine_urls(hostvars) }}"
    gateway_models: "{{ groups[llmfleet_engine_group] | served_models(hostvars) }}"

and the drain (playbooks/tasks/engine_rotation.yml) picks the worker container
it asks from what the gateway hosts run:

    __worker_containers.results | rotation_worker
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def _host_vars(hostvars: Mapping[str, Any], host: str) -> Mapping[str, Any]:
    if host not in hostvars:
        raise AnsibleFilterError(f"host '{host}' is not in the inventory")
    variables: Mapping[str, Any] = hostvars[host]
    return variables


def _engines(variables: Mapping[str, Any], host: str) -> list[Mapping[str, Any]]:
    engines = variables.get("vllm_engines") or []
    if not isinstance(engines, list) or not all(isinstance(engine, Mapping) for engine in engines):
        raise AnsibleFilterError(f"{host}: vllm_engines must be a list of engines (dicts)")
    for engine in engines:
        if "name" not in engine or "port" not in engine or "model" not in engine:
            raise AnsibleFilterError(f"{host}: every entry of vllm_engines needs name, model and port")
    return engines


def _address(variables: Mapping[str, Any], host: str) -> str:
    """Where the host's engines are published: vllm_publish_address, else the inventory's address for it."""
    for key in ("vllm_publish_address", "llmfleet_address", "ansible_host"):
        value = variables.get(key)
        if value:
            return str(value)
    return host


def engine_urls(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """`http://ADDRESS:PORT` of every engine on the hosts, in inventory order, each once."""
    if isinstance(hosts, (str, bytes)):
        raise AnsibleFilterError("engine_urls expects a list of host names, e.g. groups['gpu_nodes']")
    urls: list[str] = []
    for host in hosts:
        variables = _host_vars(hostvars, host)
        for engine in _engines(variables, host):
            url = f"http://{_address(variables, host)}:{int(engine['port'])}"
            if url not in urls:
                urls.append(url)
    return urls


def served_models(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each served model name once, with the controller directory its engine's model was staged from.

    An engine's model is a staged model's name (model_staging_models lists its
    src on the controller) or an absolute path on the host; the gateway needs
    the model's tokenizer.json and config.json, so a model with no src on the
    controller is refused with what to set instead.
    """
    if isinstance(hosts, (str, bytes)):
        raise AnsibleFilterError("served_models expects a list of host names, e.g. groups['gpu_nodes']")
    models: dict[str, str] = {}
    for host in hosts:
        variables = _host_vars(hostvars, host)
        staged = {
            str(entry.get("name")): str(entry.get("src"))
            for entry in variables.get("model_staging_models") or []
            if isinstance(entry, Mapping) and entry.get("src") and not entry.get("host_src", False)
        }
        for engine in _engines(variables, host):
            model = str(engine["model"])
            served = str(engine.get("served_model_name") or model.rstrip("/").rsplit("/", 1)[-1])
            if model not in staged:
                raise AnsibleFilterError(
                    f"{host}: engine {engine['name']} serves {model}, which model_staging_models does not stage from"
                    f" the controller, so its tokenizer is not at hand; set gateway_models to"
                    f" [{{name: {served}, src: <a directory with its tokenizer.json and config.json>}}]"
                )
            if models.setdefault(served, staged[model]) != staged[model]:
                raise AnsibleFilterError(
                    f"served model {served} comes from {models[served]} on one host and {staged[model]} on {host}:"
                    " one served name must be one model"
                )
    return [{"name": name, "src": src} for name, src in models.items()]


WORKER_CONTAINER = re.compile(r"^/?(llmfleet-worker-(\d+))$")


def rotation_worker(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The running worker container to drain through, from docker_host_info run on each gateway host.

    `results` are a loop's results over the gateway hosts (each with `item`, the
    host, and `containers`, listed with containers_all). The drained set lives
    in Redis, where every worker reads it, so any running worker will do: the
    first running one, by host order and worker number. Returns `host` and
    `container` ('' when none runs) and `stopped`, the worker containers that
    exist but do not run ("gw1/llmfleet-worker-1"): workers there but none
    running means the site has workers that cannot confirm a drain, unlike a
    first deploy, which has none at all.
    """
    running: list[tuple[str, str]] = []
    stopped: list[str] = []
    for result in results:
        host = str(result.get("item", ""))
        workers = []
        for container in result.get("containers") or []:
            for name in container.get("Names") or []:
                match = WORKER_CONTAINER.match(str(name))
                if match:
                    workers.append((int(match.group(2)), match.group(1), str(container.get("State", ""))))
        for _, name, state in sorted(workers):
            if state == "running":
                running.append((host, name))
            else:
                stopped.append(f"{host}/{name}")
    host, container = running[0] if running else ("", "")
    return {"host": host, "container": container, "stopped": stopped}


class FilterModule:
    """llmfleet serving-layer filters."""

    def filters(self) -> dict[str, Any]:
        return {"engine_urls": engine_urls, "served_models": served_models, "rotation_worker": rotation_worker}
