"""The Lua scripts that make each queue step atomic, and a holder that registers them.

Each step that reads and then writes runs as one script, so two gateway
processes, two workers, or a worker and its own ghost (a stalled process whose
entry was reclaimed) can never interleave inside it:

- ADMIT (gateway): queue depth cap (the lane's share, lanes.py), token
  budgets (usage.py), rate limits, concurrency cap, then XADD. All or
  nothing: a refused request leaves no trace and uses no quota.
- TAKE (worker): XREADGROUP lane by lane, highest priority first, except the
  fair turns (lanes.py) that go to a lower lane first; within a lane, the
  streams of the models the worker follows, in turn.
- BEGIN (worker): skip a request that is answered, cancelled or gone; count
  the attempt; dead-letter past max_attempts; make this attempt the owner
  (a fencing token) and return what an earlier attempt already streamed.
- CHUNK (worker): only the owning attempt may append streamed text.
- DELIVER (worker): the first result wins (SET NX) and is announced to the
  waiting gateway in the same step, its usage recorded and the estimate held
  for its budgets released; the entry is acknowledged and deleted.
- DEAD_LETTER (worker): XADD to the dead-letter stream, then as DELIVER with
  an error result.
- TOUCH (worker): keep entries this worker still holds from looking idle, or,
  with a large idle, hand them back for immediate reclaim.

Time comes from Redis (TIME), so clocks of different hosts do not matter.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

_NOW = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: 1 target lane stream, 2 job hash, 3 concurrency zset,
#       4..3+L every lane stream (depth), then one hash per rate limit,
#       then the budgets hash, the subject's day and month spend counters (usage.py),
#       then, for a request with an Idempotency-Key, its key (keys.idempotency).
# ARGV: 1 the target lane's depth cap (QueueSettings.depth_cap; all lanes counted), 2 L,
#       3 request id, 4 job json, 5 job ttl s, 6 subject, 7 mode, 8 concurrency cap (0 = none), 9 concurrency lease ms,
#       10 number of limits N, then N x (limit, cost, window ms); limit 0 = none;
#       then the tier, the request's estimated tokens, the day and month counters' ttl s;
#       then the idempotency record to store (with the key above).
# Returns {1, depth, remaining_1, reset_ms_1, ...}            admitted
#         {2, which, retry_after_ms, remaining_1, reset_ms_1, ...}  rate limited
#                   (which: 0 = concurrency cap, i = i-th limit)
#         {3, depth}                                            queue full
#         {4}                                   already queued (a retried call)
#         {5, record}     the Idempotency-Key already stands for a request
#         {6, period, scope, budget, spent}     over a token budget
#                   (period 'daily'|'monthly', scope 'sub'|'tier', spent = used + held)
ADMIT = (
    _NOW
    + """
local now = now_ms()
local b = 3 + tonumber(ARGV[2]) + tonumber(ARGV[10])  -- KEYS[b + 1]: the budgets hash
local a = 10 + 3 * tonumber(ARGV[10])                 -- ARGV[a + 1]: the tier
-- A key already used: the earlier request's record, before any limit is charged.
local idem = KEYS[b + 4]
if idem then
  local record = redis.call('GET', idem)
  if record then return {5, record} end
end
-- A retried call (the reply to the first was lost) must not queue the job twice.
if redis.call('EXISTS', KEYS[2]) == 1 then return {4} end
local lanes = tonumber(ARGV[2])
local depth = 0
for i = 1, lanes do
  depth = depth + redis.call('XLEN', KEYS[3 + i])
end
if depth >= tonumber(ARGV[1]) then
  return {3, depth}
end

-- Token budgets: the subject's own for a period, else its tier's; 0 or none = no budget.
local cost = tonumber(ARGV[a + 2])
local set = redis.call('HMGET', KEYS[b + 1], 'daily:sub:' .. ARGV[6], 'monthly:sub:' .. ARGV[6],
  'daily:tier:' .. ARGV[a + 1], 'monthly:tier:' .. ARGV[a + 1])
local budgeted = false
local periods = {'daily', 'monthly'}
for j = 1, 2 do
  local budget, scope = tonumber(set[j]), 'sub'
  if not budget then budget, scope = tonumber(set[j + 2]), 'tier' end
  if budget and budget > 0 then
    budgeted = true
    local v = redis.call('HMGET', KEYS[b + 1 + j], 'used', 'held')
    local spent = (tonumber(v[1]) or 0) + math.max(tonumber(v[2]) or 0, 0)
    if spent + cost > budget then return {6, periods[j], scope, budget, spent} end
  end
end

local n = tonumber(ARGV[10])
local states = {}
local report = {}
local denied, retry = -1, 0
for i = 1, n do
  local key = KEYS[3 + lanes + i]
  local limit = tonumber(ARGV[8 + 3 * i])
  local cost = tonumber(ARGV[9 + 3 * i])
  local window = tonumber(ARGV[10 + 3 * i])
  local w = math.floor(now / window)
  local v = redis.call('HMGET', key, 'w', 'c', 'p')
  local kw, c, p = tonumber(v[1]), tonumber(v[2]) or 0, tonumber(v[3]) or 0
  local curr, prev = 0, 0
  if kw == w then curr, prev = c, p elseif kw == w - 1 then prev = c end
  local elapsed = now - w * window
  local est = prev * (window - elapsed) / window + curr
  states[i] = {key, w, kw, curr, prev, cost, window}
  -- reset: when the estimate is back to 0, counting this request (it lands in the current window)
  local reset = window - elapsed
  if curr + cost > 0 then reset = reset + window elseif prev == 0 then reset = 0 end
  local remaining = 0
  if limit > 0 then remaining = math.max(0, math.floor(limit - est)) end
  table.insert(report, remaining)
  table.insert(report, math.floor(reset))
  if limit > 0 and denied < 0 and est + cost > limit then
    local t
    if cost > limit then
      t = window
    elseif curr + cost <= limit then
      t = (window - elapsed) - (limit - curr - cost) * window / prev
    else
      t = (window - elapsed) + window * (1 - (limit - cost) / curr)
    end
    denied, retry = i, math.max(1000, math.ceil(t))
  end
end
if denied < 0 and tonumber(ARGV[8]) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[8]) then
    denied, retry = 0, 1000
  end
end
if denied >= 0 then
  local out = {2, denied, retry}
  for _, x in ipairs(report) do table.insert(out, x) end
  return out
end

for i = 1, n do
  local s = states[i]
  if s[3] == s[2] then
    redis.call('HINCRBY', s[1], 'c', s[6])
  else
    -- a new window: the old current count (or nothing) becomes the previous one
    redis.call('HSET', s[1], 'w', s[2], 'c', s[6], 'p', s[5])
  end
  redis.call('PEXPIRE', s[1], 2 * s[7])
end
if tonumber(ARGV[8]) > 0 then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[9]), ARGV[3])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[9]))
end
redis.call('HSET', KEYS[2], 'sub', ARGV[6], 'state', 'queued', 'attempts', 0, 'mode', ARGV[7], 'created', now)
if budgeted and cost > 0 then
  -- Held until the answer: concurrent requests cannot all pass the same remainder. DELIVER releases it.
  redis.call('HSET', KEYS[2], 'held', cost)
  for j = 1, 2 do
    redis.call('HINCRBY', KEYS[b + 1 + j], 'held', cost)
    redis.call('EXPIRE', KEYS[b + 1 + j], tonumber(ARGV[a + 2 + j]))
  end
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
redis.call('XADD', KEYS[1], '*', 'id', ARGV[3], 'job', ARGV[4])
if idem then
  -- Kept as long as the answer is (the job's ttl): a retry within it finds the answer.
  redis.call('SET', idem, ARGV[a + 5], 'EX', tonumber(ARGV[5]))
end
local out = {1, depth + 1}
for _, x in ipairs(report) do table.insert(out, x) end
return out
"""
)

# KEYS: the lane streams, lane by lane (highest priority first), each lane holding
#       one stream per model (S streams). ARGV: 1 group, 2 consumer, 3 count,
#       4 S, 5 which model's stream a lane reads first (0-based), 6 fair turns F,
#       7 lanes per turn M, then F x M lane indexes (1-based): for each fair turn
#       (lanes.fair_turns), the lower lanes to try, in order.
# Each fair turn takes one entry from the first of its lanes with work; the
# rest of count is taken highest lane first. A lane's streams are read in turn
# from ARGV[5] on. A stream that gave fewer entries than asked has no more new
# ones until the script ends (nothing else runs meanwhile): it is not read
# again, so a take that finds the lanes empty costs one XREADGROUP per stream,
# not one per fair turn and lane.
# Returns {{lane index, model index (both 1-based), entry id, {field, value, ...}}, ...}.
TAKE = """
local out = {}
local want = tonumber(ARGV[3])
local per_lane, first = tonumber(ARGV[4]), tonumber(ARGV[5])
local drained = {}
local function read(lane, n)
  local got = 0
  for k = 0, per_lane - 1 do
    if got >= n then break end
    local model = (first + k) % per_lane + 1
    local index = (lane - 1) * per_lane + model
    if not drained[index] then
      local asked = n - got
      local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', asked, 'STREAMS', KEYS[index], '>')
      local entries = r and r[1][2] or {}
      for _, e in ipairs(entries) do
        table.insert(out, {lane, model, e[1], e[2]})
      end
      got = got + #entries
      if #entries < asked then drained[index] = true end
    end
  end
  return got
end
local turns, per = tonumber(ARGV[6] or 0), tonumber(ARGV[7] or 0)
for t = 0, turns - 1 do
  if want <= 0 then break end
  for j = 1, per do
    if read(tonumber(ARGV[7 + t * per + j]), 1) > 0 then
      want = want - 1
      break
    end
  end
end
for lane = 1, #KEYS / per_lane do
  if want <= 0 then break end
  want = want - read(lane, want)
end
return out
"""

# KEYS: 1 job hash, 2 result, 3 cancel flag, 4 partial text.
# ARGV: 1 max attempts, 2 worker id.
# Returns {'done'} | {'gone'} | {'cancelled'} | {'dead', attempts, reason}
#       | {'run', attempt, partial text, partial tokens}
BEGIN = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'done'} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'cancelled'} end
local job = redis.call('HMGET', KEYS[1], 'state', 'owner', 'worker')
if job[1] == 'running' then
  redis.call('HSET', KEYS[1], 'last_error',
    'attempt ' .. (job[2] or '?') .. ' on ' .. (job[3] or '?') .. ' did not finish (worker killed, lost or stalled)')
end
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if attempts > tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'state', 'dead')
  return {'dead', attempts, redis.call('HGET', KEYS[1], 'last_error') or 'no reason recorded'}
end
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', attempts, 'worker', ARGV[2], 'started', now_ms())
return {'run', attempts, redis.call('GET', KEYS[4]) or '', redis.call('HGET', KEYS[1], 'partial_tokens') or '0'}
"""
)

# KEYS: 1 job hash, 2 partial text, 3 reply stream.
# ARGV: 1 attempt, 2 request id, 3 text, 4 tokens, 5 data, 6 reply maxlen, 7 ttl s,
#       8 "attempt:n", n counting this attempt's calls (a retried call is applied once).
# Returns the chunk's seq (0: already applied), or -1 when this attempt no longer owns the request.
CHUNK = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[1], 'last_chunk') == ARGV[8] then return 0 end
redis.call('HSET', KEYS[1], 'last_chunk', ARGV[8])
if ARGV[3] ~= '' then
  if redis.call('APPEND', KEYS[2], ARGV[3]) == string.len(ARGV[3]) then
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[7]))
  end
end
redis.call('HINCRBY', KEYS[1], 'partial_tokens', tonumber(ARGV[4]))
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*',
  'id', ARGV[2], 'kind', 'chunk', 'seq', seq, 'text', ARGV[3], 'data', ARGV[5])
return seq
"""

# The part DELIVER and DEAD_LETTER share.
# KEYS: 1 result, 2 job hash, 3 reply stream, 4 lane stream, 5 concurrency zset, 6 partial text,
#       7 usage record, 8 the day's usage index, 9 day spend, 10 month spend (usage.py).
# ARGV: 1 result json, 2 retention s, 3 group, 4 entry id, 5 request id,
#       6 attempt, 7 fenced ('1': only the owner may deliver), 8 reply maxlen,
#       9 status, 10 has reply ('1'/'0'),
#       11 record usage ('1'/'0'), 12 index member, 13 prompt tokens, 14 completion tokens,
#       15 usage ttl s, 16 day spend ttl s, 17 month spend ttl s.
_DELIVER = """
local function record()
  local prompt, completion = tonumber(ARGV[13]), tonumber(ARGV[14])
  redis.call('HINCRBY', KEYS[7], 'requests', 1)
  redis.call('HINCRBY', KEYS[7], 'errors', ARGV[9] == '200' and 0 or 1)
  redis.call('HINCRBY', KEYS[7], 'prompt_tokens', prompt)
  redis.call('HINCRBY', KEYS[7], 'completion_tokens', completion)
  redis.call('EXPIRE', KEYS[7], tonumber(ARGV[15]))
  redis.call('SADD', KEYS[8], ARGV[12])
  redis.call('EXPIRE', KEYS[8], tonumber(ARGV[15]))
  local held = tonumber(redis.call('HGET', KEYS[2], 'held') or '0')
  for j = 9, 10 do
    redis.call('HINCRBY', KEYS[j], 'used', prompt + completion)
    if held > 0 then redis.call('HINCRBY', KEYS[j], 'held', -held) end
    redis.call('EXPIRE', KEYS[j], tonumber(ARGV[7 + j]))
  end
end

local function deliver()
  if ARGV[7] == '1' and redis.call('HGET', KEYS[2], 'owner') ~= ARGV[6] then return -1 end
  local first = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', tonumber(ARGV[2]))
  if first then
    if ARGV[11] == '1' then record() end
    redis.call('HSET', KEYS[2], 'state', 'done', 'status', ARGV[9])
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
    if ARGV[10] == '1' then
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'id', ARGV[5], 'kind', 'final', 'data', ARGV[1])
      if redis.call('TTL', KEYS[3]) < 0 then redis.call('EXPIRE', KEYS[3], 86400) end
    end
    redis.call('DEL', KEYS[6])
  end
  redis.call('ZREM', KEYS[5], ARGV[5])
  redis.call('XACK', KEYS[4], ARGV[3], ARGV[4])
  redis.call('XDEL', KEYS[4], ARGV[4])
  if first then return 1 end
  return 0
end
"""

# Returns 1 (this result is the answer), 0 (an earlier result was), -1 (fenced off).
DELIVER = _DELIVER + "\nreturn deliver()\n"

# KEYS: as DELIVER, then 11 dead-letter stream.
# ARGV: as DELIVER, then 18 reason, 19 attempts, 20 job json, 21 dead-letter maxlen, 22 lane.
DEAD_LETTER = (
    _DELIVER
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[11], 'MAXLEN', '~', ARGV[21], '*', 'id', ARGV[5], 'reason', ARGV[18],
    'attempts', ARGV[19], 'lane', ARGV[22], 'entry', ARGV[4], 'job', ARGV[20])
end
return deliver()
"""
)

# KEYS: 1 lane stream. ARGV: 1 group, 2 consumer, 3 idle ms to set, 4.. entry ids.
# Resets (idle 0) or raises (hand back) the idle time of the entries this
# consumer still holds; entries reclaimed by another worker are left alone.
TOUCH = """
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', tonumber(ARGV[3]), 'JUSTID')
    n = n + 1
  end
end
return n
"""


@dataclass(frozen=True)
class Scripts:
    admit: AsyncScript
    take: AsyncScript
    begin: AsyncScript
    chunk: AsyncScript
    deliver: AsyncScript
    dead_letter: AsyncScript
    touch: AsyncScript

    @classmethod
    def register(cls, client: aioredis.Redis) -> Scripts:
        """Scripts run by SHA; after a Redis restart they are loaded again on first use."""
        return cls(
            admit=client.register_script(ADMIT),
            take=client.register_script(TAKE),
            begin=client.register_script(BEGIN),
            chunk=client.register_script(CHUNK),
            deliver=client.register_script(DELIVER),
            dead_letter=client.register_script(DEAD_LETTER),
            touch=client.register_script(TOUCH),
        )
