-- Shared by every state-changing script (prepended to each): ARGV[1] is the key prefix.
local P = ARGV[1]
-- Whether the job record at key jk is at `attempt` (a number or its string, as in ARGV): the
-- fence every worker-side call passes.
local function at_attempt(jk, attempt)
  return tonumber(redis.call('HGET', jk, 'attempt') or '-1') == tonumber(attempt)
end
local function set_state(job, old, new)
  redis.call('SREM', P .. ':state:' .. old, job)
  redis.call('SADD', P .. ':state:' .. new, job)
  redis.call('HSET', P .. ':job:' .. job, 'state', new)
end
-- Figures past these are not MiB, masks or GPU indices: a forged or broken record.
local MAX_MIB, MAX_MASK, MAX_GPU = 2 ^ 40, 2 ^ 31 - 1, 2 ^ 24
local function int_in(x, lo, hi)
  return type(x) == 'number' and x == math.floor(x) and x >= lo and x <= hi
end
-- The allocation record decoded and checked, or a string saying what is wrong with it.
local function valid_alloc(raw)
  local okd, a = pcall(cjson.decode, raw or '')
  if not okd or type(a) ~= 'table' then return 'allocation is not a JSON object' end
  if not int_in(a.attempt, 1, MAX_GPU) then return 'allocation attempt is not a number' end
  if not int_in(a.kind, 0, 2) then return 'allocation kind must be 0, 1 or 2' end
  if not int_in(a.used_mib, 0, MAX_MIB) then
    return 'used_mib must be a whole number of MiB in [0, 2^40]'
  end
  if not int_in(a.mig_mask or 0, 0, MAX_MASK) then return 'mig_mask is out of range' end
  a.mig_mask = a.mig_mask or 0
  -- Host resources on the allocation's node; absent in records from before they were counted.
  if not int_in(a.cpu_milli or 0, 0, MAX_MIB) then return 'cpu_milli is out of range' end
  if not int_in(a.host_mib or 0, 0, MAX_MIB) then return 'host_mib is out of range' end
  a.cpu_milli = a.cpu_milli or 0
  a.host_mib = a.host_mib or 0
  if type(a.gpus) ~= 'table' or #a.gpus == 0 then return 'allocation names no GPUs' end
  local seen = {}
  for _, g in ipairs(a.gpus) do
    if not int_in(g, 0, MAX_GPU) then return 'GPU index is not a number' end
    if seen[g] then return 'GPU ' .. g .. ' is listed twice' end
    seen[g] = true
  end
  if a.kind ~= 0 and #a.gpus ~= 1 then return 'a MIG or shared allocation takes one GPU' end
  a.nodes = nil -- only commit.lua sets it, from P:gpu (never from the stored JSON)
  return a
end
-- The distinct nodes of an allocation's GPUs in GPU order: one node, or every node of a
-- multi-node gang, each charged cpu_milli and host_mib (empty for a pool initialised before
-- nodes were stored).
local function alloc_nodes(a)
  local out, seen = {}, {}
  for _, g in ipairs(a.gpus) do
    local node = redis.call('HGET', P .. ':gpu', g .. ':node')
    if node and not seen[node] then
      seen[node] = true
      out[#out + 1] = node
    end
  end
  return out
end
-- Add (sign 1) or take back (sign -1) what a checked allocation holds on its GPUs and nodes
-- (a.nodes when the caller has read them already, as commit.lua does).
local function add_alloc(a, sign)
  local gk = P .. ':gpu'
  for _, node in ipairs(a.nodes or alloc_nodes(a)) do
    redis.call('HINCRBY', gk, 'n' .. node .. ':cpu', string.format('%d', sign * a.cpu_milli))
    redis.call('HINCRBY', gk, 'n' .. node .. ':host', string.format('%d', sign * a.host_mib))
  end
  for _, g in ipairs(a.gpus) do
    local p = g .. ':'
    redis.call('HINCRBY', gk, p .. 'used', string.format('%d', sign * a.used_mib))
    if a.kind == 1 then
      local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
      if sign > 0 then m = bit.bor(m, a.mig_mask) else m = bit.band(m, bit.bnot(a.mig_mask)) end
      redis.call('HSET', gk, p .. 'mig', string.format('%d', m))
    elseif a.kind == 2 then
      redis.call('HINCRBY', gk, p .. 'shared', sign)
    end
  end
end
-- Rebuild P:gpu's counters from the allocations that read: what an unreadable one held is
-- unknown, so taking anything back for it would be a guess.
local function recount()
  local gk = P .. ':gpu'
  local fields = redis.call('HKEYS', gk)
  for _, f in ipairs(fields) do
    local g = string.match(f, '^(%d+):cap$')
    if g then redis.call('HSET', gk, g .. ':used', 0, g .. ':mig', 0, g .. ':shared', 0) end
    local k = string.match(f, '^n(%d+):cpu_cap$')
    if k then redis.call('HSET', gk, 'n' .. k .. ':cpu', 0, 'n' .. k .. ':host', 0) end
  end
  local all = redis.call('HGETALL', P .. ':allocs')
  for i = 1, #all, 2 do
    local a = valid_alloc(all[i + 1])
    if type(a) ~= 'string' then add_alloc(a, 1) end
  end
end
local function release(job, attempt)
  local raw = redis.call('HGET', P .. ':allocs', job)
  if not raw then return 0 end
  local a = valid_alloc(raw)
  if type(a) == 'string' then
    -- Garbage must not wedge finish/requeue/cancel: drop it and recount from the rest.
    redis.call('HDEL', P .. ':allocs', job)
    recount()
    redis.call('INCR', P .. ':capver')
    return 1
  end
  if attempt and a.attempt ~= attempt then return 0 end
  add_alloc(a, -1)
  redis.call('HDEL', P .. ':allocs', job)
  redis.call('INCR', P .. ':capver')
  return 1
end
