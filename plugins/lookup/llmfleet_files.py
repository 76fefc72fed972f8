"""Lookup llmfleet_files: the path of shared data under the repository's files/ directory.

files/ holds data that several roles and the llmfleet package read alike: the
engine metric catalogs (files/engine_metrics, read by the prometheus role's
rules and by ``llmfleet.ops.metrics_catalog``) and the generated dashboards
(files/dashboards, provisioned by the grafana role). Roles name it through this
lookup instead of climbing out of their own directory
(``{{ role_path }}/../../files``), so the one place is this file, and a run finds it
wherever Ansible finds plugins/ (ansible.cfg's lookup_plugins, Molecule's
ANSIBLE_LOOKUP_PLUGINS in molecule/config.yml, the scaler's checkout).

It returns a path only; read the file with ``ansible.builtin.file`` or test it
with ``is file``. docs/layout.md describes files/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: llmfleet_files
short_description: The path of shared data under the repository's files/ directory
description:
  - Returns, for each term, the absolute path of that entry under the files/ directory of the
    checkout this plugin belongs to (this file is plugins/lookup/llmfleet_files.py, files/ is its
    sibling at the repository root). It does not read the file or require it to exist.
options:
  _terms:
    description: Paths relative to files/, such as C(engine_metrics) or C(dashboards/vllm-0.32.0).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Read the catalog of the metrics llmfleet exports
  ansible.builtin.set_fact:
    catalog: "{{ lookup('ansible.builtin.file', lookup('llmfleet_files', 'engine_metrics/llmfleet.json')) }}"
"""

RETURN = r"""
_raw:
  description: One absolute path per term.
  type: list
  elements: str
"""

# plugins/lookup/llmfleet_files.py -> the repository root -> files/
FILES_DIR = Path(__file__).resolve().parents[2] / "files"


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        self.set_options(var_options=variables, direct=kwargs)
        paths = []
        for term in terms:
            relative = Path(str(term))
            if relative.is_absolute() or ".." in relative.parts:
                raise AnsibleLookupError(f"llmfleet_files takes a path inside files/, not {term!r}")
            paths.append(str(FILES_DIR / relative))
        return paths
