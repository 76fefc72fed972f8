"""The Redis Streams queue shared by the gateway (producer) and the workers (consumers).

- `config`: the Redis and queue settings both sides read (env + secret files);
- `keys`: every Redis key name, in one place;
- `jobs`: what travels through the queue (a job, a result, a reply event);
- `lanes`: the priority lanes' policy (depth cap headroom, fair turns of the take);
- `scripts`: the Lua scripts that make each step atomic;
- `producer`: the gateway's side (admit, cancel, replies, task lookup);
- `consumer`: the worker's side (take, reclaim, begin, chunk, deliver, hand back);
- `registry`: the live-engine registry workers publish and gateways read;
- `usage`: the usage records DELIVER keeps and the token budgets ADMIT checks.

docs/gateway.md describes the keys and the delivery semantics.
"""
