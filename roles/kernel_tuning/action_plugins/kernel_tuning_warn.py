"""Action kernel_tuning_warn: show `msg` as an Ansible warning, change nothing.

Ansible has no built-in task that warns: `debug` prints in the colour of an
ordinary result, `fail` stops the play. The role uses this for what it must
never do silently (a sysctl persisted but not applied) yet must not refuse
(a container cannot apply it). Runs on the controller only.

It stays in the role (roles/kernel_tuning/action_plugins) rather than plugins/:
only the kernel_tuning role calls it (tasks/configure.yml), and its name says
so (docs/layout.md, "Plugins and shared code").
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("msg",))

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        message = self._task.args.get("msg")
        if not message:
            raise AnsibleActionFail("kernel_tuning_warn needs `msg`: the warning to show")
        result["changed"] = False
        result["warnings"] = [" ".join(str(message).split())]
        return result
