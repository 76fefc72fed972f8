#!/usr/bin/python
# Copyright: llmfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: stage a model version beside the served one and switch `current` atomically."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_release
short_description: Versioned model directories with an atomic current link
description:
  - Manages one model's staging directory on the host with the rules in
    C(plugins/module_utils/model_staging.py) C(versions/<version>/) holds complete copies,
    C(versions/.<version>.partial/) a copy in progress, and C(current) links to the served version.
  - O(state=prepared) makes the partial directory for O(manifest) and hard-links every file an older
    version already holds with the same checksum; it returns the files still to transfer in RV(needed).
    Files of an interrupted earlier transfer that match the manifest are kept, so a rerun resumes.
  - O(state=released) checks the partial copy file by file against O(manifest), renames it into
    C(versions/<version>), moves C(current) by renaming a new symlink over it, then deletes all but the
    O(keep) newest versions and stale partial copies. It never deletes the served version.
  - A copy that does not match its manifest is never released, so a failed transfer leaves the served
    model untouched.
version_added: "0.1.0"
author:
  - llmfleet contributors
options:
  root:
    description:
      - The model's staging directory on the host, holding C(versions/) and C(current).
    type: path
    required: true
  manifest:
    description:
      - The manifest C(model_manifest) returned for the source.
    type: dict
    required: true
  state:
    description:
      - C(prepared) readies the partial copy; C(released) seals it and serves it.
    type: str
    choices: [prepared, released]
    required: true
  keep:
    description:
      - Complete versions to keep, the served one included, for a quick rollback. Used with O(state=released).
    type: int
    default: 2
attributes:
  check_mode:
    support: full
    description: Reports what would be linked, transferred, released and pruned, and writes nothing.
seealso:
  - module: model_manifest
"""

EXAMPLES = r"""
- name: Ready the copy, linking files older versions already have
  model_release:
    root: /srv/llmfleet/models/qwen2-sft
    manifest: "{{ __model_staging_manifest.manifest }}"
    state: prepared
  register: __model_staging_prepared

- name: Transfer what the host lacks
  ansible.builtin.copy:
    src: "/data/exports/qwen2-sft/{{ item }}"
    dest: "{{ __model_staging_prepared.partial }}/{{ item }}"
    mode: "0644"
  loop: "{{ __model_staging_prepared.needed }}"

- name: Serve it
  model_release:
    root: /srv/llmfleet/models/qwen2-sft
    manifest: "{{ __model_staging_manifest.manifest }}"
    state: released
"""

RETURN = r"""
version:
  description: The version the manifest names.
  returned: always
  type: str
path:
  description: Where that version lives (or will) once released.
  returned: always
  type: str
partial:
  description: The directory the transfer writes into.
  returned: when state is prepared
  type: str
complete:
  description: Whether the version is already staged, so nothing needs transferring.
  returned: when state is prepared
  type: bool
needed:
  description: Relative paths to transfer into RV(partial).
  returned: when state is prepared
  type: list
  elements: str
linked:
  description: Relative paths taken from older versions by hard link instead of transfer.
  returned: when state is prepared
  type: list
  elements: str
previous:
  description: The version C(current) pointed to before, or null.
  returned: when state is released
  type: str
pruned:
  description: The versions and partial copies deleted.
  returned: when state is released
  type: list
  elements: str
"""

# Ansible's module layout puts DOCUMENTATION, EXAMPLES and RETURN before the imports
# (ansible-doc reads them without importing); hence the E402 exemptions.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.model_staging import StagingError, prepare, release  # noqa: E402

ARGUMENT_SPEC = {
    "root": {"type": "path", "required": True},
    "manifest": {"type": "dict", "required": True},
    "state": {"type": "str", "choices": ["prepared", "released"], "required": True},
    "keep": {"type": "int", "default": 2},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        if params["state"] == "prepared":
            result = prepare(params["root"], params["manifest"], module.check_mode)
        else:
            result = release(params["root"], params["manifest"], params["keep"], module.check_mode)
    except (StagingError, OSError) as error:
        module.fail_json(msg=f"model_release: {error}", changed=False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
