# Shorthands for the two README commands; the scripts work without make.
.PHONY: lab test down
lab:
	scripts/lab.sh
test:
	scripts/test.sh
down:
	.venv/bin/llmfleet lab down
