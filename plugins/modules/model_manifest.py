#!/usr/bin/python
# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: the checksum manifest of a model directory, which names its staged version."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_manifest
short_description: Checksum every file of a model directory
description:
  - Reads a model directory and returns its manifest, the SHA-256 and size of every file by relative path,
    with the rules in C(plugins/module_utils/model_staging.py).
  - The manifest names the version C(model_release) stages, so identical files always make the same
    version and any changed byte makes a new one.
  - Names starting with a dot (C(.git), C(.cache)) are left out; symlinks to files are followed.
  - Runs on the controller (C(delegate_to) localhost) for models staged from there, or on the host for a
    model store mounted there. Reads only.
version_added: "0.1.0"
author:
  - llmfleet contributors
options:
  path:
    description:
      - The model directory.
    type: path
    required: true
attributes:
  check_mode:
    support: full
    description: Reads only, so it runs the same in check mode.
seealso:
  - module: model_release
"""

EXAMPLES = r"""
- name: Checksum the model on the controller
  model_manifest:
    path: /data/exports/qwen2-1.5b-sft
  delegate_to: localhost
  register: __model_staging_manifest
"""

RETURN = r"""
manifest:
  description: Format number and, per relative path, C(sha256) and C(size) in bytes.
  returned: always
  type: dict
  sample: {"format": 1, "files": {"config.json": {"sha256": "9f2c...", "size": 712}}}
version:
  description: The version name the manifest gives, 16 hex digits of its digest.
  returned: always
  type: str
  sample: 3b9d0c2a41f7e6d5
files:
  description: How many files the manifest lists.
  returned: always
  type: int
bytes:
  description: Their total size.
  returned: always
  type: int
"""

# Ansible's module layout puts DOCUMENTATION, EXAMPLES and RETURN before the imports
# (ansible-doc reads them without importing); hence the E402 exemptions.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.model_staging import StagingError, build_manifest, manifest_version  # noqa: E402


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    try:
        manifest = build_manifest(module.params["path"])
    except (StagingError, OSError) as error:
        module.fail_json(msg=f"model_manifest: {error}", changed=False)
    files = manifest["files"]
    module.exit_json(
        changed=False,
        manifest=manifest,
        version=manifest_version(manifest),
        files=len(files),
        bytes=sum(entry["size"] for entry in files.values()),
    )


if __name__ == "__main__":
    main()
