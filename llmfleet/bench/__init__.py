"""Measuring the stack: the load generator (`llmfleet bench`) and the CPU accounting it reports."""
