"""The scaler: Alertmanager's webhook in, a policy decision, Ansible out.

Alertmanager posts its webhook (payload version 4) to `POST /alerts`. The
scaling alerts (ScaleOutNeeded, ScaleInPossible) carry `scale_action` (out|in)
and `scale_kind` (workers|engines); the policy (policy.py, pure functions)
turns them into one action at a time within bounds and cooldowns, the runner
runs playbooks/scale_out.yml or scale_in.yml through ansible-runner, and the
state file (state.py) records membership where the inventory plugin
plugins/inventory/llmfleet_scaler.py shows it to every later `site.yml`.
Every decision, taken or declined, is a line in the audit log (audit.py).
"""
