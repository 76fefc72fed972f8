"""What an operator notices on a host after the python_toolchain role ran.

converge.yml installs the lab's CPU builds (torch 2.13.0+cpu, transformers
5.19.0, peft 0.21.0) from the delivered wheelhouse, on a host whose pip
configuration names an index that does not exist (prepare.yml).
"""

from __future__ import annotations

import json

import pytest

VENV = "/opt/llmfleet/toolchain/lab-cpu"
PYTHON = f"{VENV}/bin/python"
PINS = {"torch": "2.13.0+cpu", "transformers": "5.19.0", "peft": "0.21.0"}
WHEELHOUSES = "/var/cache/llmfleet/wheelhouses"

# A real piece of host-side work: a LoRA adapter on a small module, merged
# into it, must give the same outputs as the unmerged adapter.
LORA = """
import json, torch
from peft import LoraConfig, get_peft_model
torch.manual_seed(0)
base = torch.nn.Sequential()
base.add_module("proj", torch.nn.Linear(16, 16))
model = get_peft_model(base, LoraConfig(r=4, target_modules=["proj"], init_lora_weights=False))
x = torch.randn(3, 16)
adapted = model(x)
merged = model.merge_and_unload()
print(json.dumps({"close": torch.allclose(merged(x), adapted, atol=1e-5), "lora_left": "lora" in str(merged)}))
"""


def test_venv_is_owned_by_root_and_readable(host):
    venv = host.file(VENV)
    assert venv.is_directory
    assert (venv.user, venv.group, venv.mode) == ("root", "root", 0o755)
    assert host.file(PYTHON).exists


@pytest.mark.parametrize(("name", "version"), PINS.items())
def test_each_pin_imports_at_its_version(host, name, version):
    loaded = host.check_output(f"{PYTHON} -c 'import {name}; print({name}.__version__)'")
    assert loaded == version


def test_the_whole_tree_is_the_lock(host):
    frozen = host.check_output(f"{PYTHON} -m pip freeze --all --disable-pip-version-check")
    assert "torch==2.13.0+cpu" in frozen.splitlines()
    assert not any(line.startswith("vllm") for line in frozen.splitlines())


def test_one_wheelhouse_unpacked_and_complete(host):
    entries = host.check_output(f"ls -A {WHEELHOUSES}").split()
    assert len(entries) == 1
    wheelhouse = f"{WHEELHOUSES}/{entries[0]}"
    assert host.file(f"{wheelhouse}/.llmfleet-complete").content_string.strip() == entries[0]
    assert int(host.check_output(f"ls {wheelhouse} | grep -c '\\.whl$'")) > 30


def test_the_host_has_no_usable_index(host):
    # What made the install prove itself air-gapped: any index use fails here.
    result = host.run(f"{PYTHON} -m pip download --no-deps -d /tmp/probe six")
    assert result.rc != 0


def test_a_lora_adapter_merges(host):
    result = json.loads(host.check_output(f"{PYTHON} -c '{LORA}'"))
    assert result == {"close": True, "lora_left": False}
