"""The operator's checks, run from a checkout: stack compatibility, capacity plans, engine flags,
gateway tokens, and model checks and merges. The logic they share with the Ansible modules lives
in plugins/module_utils (llmfleet.module_utils)."""
