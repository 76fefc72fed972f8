# Shorthands for the two README commands; the scripts work without make.
# `make docs` regenerates the role documentation (docs/roles.md and each
# roles/<role>/README.md) after a role's argument_specs change, and the
# command reference (docs/cli.md) after a command's arguments change.
.PHONY: lab test down docs
lab:
	scripts/lab.sh
test:
	scripts/test.sh
down:
	.venv/bin/llmfleet lab down
docs:
	.venv/bin/llmfleet docs roles
	.venv/bin/llmfleet docs cli
