-- A chunk of placements, atomically. ARGV: P, token, fenced ('1' | '0'), now, then per job:
-- id, expected_attempt, alloc, placement. Returns one reply per job:
-- 'ok:<capver>', 'err:<conflict>' (capacity or job taken: retry after a resync) or
-- 'bad:<reason>' (a malformed value: reject the job). Every job is checked, against Redis and
-- against the chunk's earlier jobs, before anything is written, so no error can strike halfway
-- and leave a job holding capacity that its scheduler never hears about.
-- The allocation JSON is the one source of the figures: the add here and every release read it.
-- The job's decision (kilobytes, which nothing here checks) is not passed through Lua: the
-- caller writes it to the job record of each job answered 'ok' (RedisStore.commit_send).
local token, fenced, now = ARGV[2], ARGV[3], ARGV[4]
local n = (#ARGV - 4) / 4
local out = {}
if fenced ~= '0' and (token == '' or redis.call('GET', P .. ':leader') ~= token) then
  for j = 1, n do out[j] = 'err:not the leader' end
  return out
end
local gk = P .. ':gpu'
local d_used, d_mig, d_shared, seen_job = {}, {}, {}, {}
local d_cpu, d_host = {}, {}
-- P:gpu's counters of each GPU and node as read by the first job of the chunk that touches
-- it: nothing writes P:gpu before every job is checked, so a later job of the chunk reads
-- the same values (the chunk's own earlier jobs are counted by the d_ tables); a dense
-- chunk puts several jobs on one GPU and many on one node.
local gpu_rows, node_rows = {}, {}

-- 'err:...' when `need` more of node counter `what` ('cpu' or 'host'; Redis holds `used_raw` of
-- `cap_raw`) than Redis and the chunk's earlier jobs (`earlier`) hold does not fit; nil when it
-- does.
local function node_short(node, what, earlier, need, unit, used_raw, cap_raw)
  local used = tonumber(used_raw or '0') + (earlier[node] or 0)
  local cap = tonumber(cap_raw or '0')
  if used + need > cap then
    return 'err:node ' .. node .. ' has ' .. (cap - used) .. ' ' .. unit .. ' free, needs ' .. need
  end
  return nil
end

-- Every node of the allocation (one, or each node of a multi-node gang) has its CPUs and host
-- memory free; a gang takes an equal share of GPUs on each of its nodes.
local function check_host(a)
  local nodes = a.nodes
  if #nodes == 0 then return nil end
  if #a.gpus % #nodes ~= 0 then
    return 'bad:allocation spans ' .. #nodes .. ' nodes with unequal shares of ' .. #a.gpus ..
      ' GPUs'
  end
  if #nodes > 1 and a.kind ~= 0 then return 'bad:only whole GPUs span nodes' end
  for _, node in ipairs(nodes) do
    local row = node_rows[node]
    if row == nil then
      local p = 'n' .. node .. ':'
      row = redis.call('HMGET', gk, p .. 'cpu', p .. 'cpu_cap', p .. 'host', p .. 'host_cap')
      node_rows[node] = row
    end
    local cpu, cpu_cap, host, host_cap = row[1], row[2], row[3], row[4]
    local short = node_short(node, 'cpu', d_cpu, a.cpu_milli, 'millicores', cpu, cpu_cap) or
      node_short(node, 'host', d_host, a.host_mib, 'MiB host memory', host, host_cap)
    if short then return short end
  end
  return nil
end

local function check(job, expected, raw)
  if seen_job[job] then return 'bad:job listed twice in one commit' end
  local jk = P .. ':job:' .. job
  local st, hold, left, attempt = unpack(redis.call('HMGET', jk, 'state', 'hold', 'deps_left',
                                                   'attempt'))
  if st ~= 'pending' then return 'err:job is ' .. tostring(st) end
  -- Held or waiting on a parent since the scheduler read it (workflow.lua).
  if hold == '1' or tonumber(left or '0') > 0 then return 'err:job is held' end
  local exp = tonumber(expected)
  if exp == nil or tonumber(attempt or '0') ~= exp then
    return 'err:stale attempt'
  end
  if redis.call('HEXISTS', P .. ':allocs', job) == 1 then return 'err:already holds capacity' end
  local a = valid_alloc(raw)
  if type(a) == 'string' then return 'bad:' .. a end
  if a.attempt ~= exp + 1 then return 'bad:allocation attempt is not the next attempt' end
  -- The distinct nodes of the GPUs in GPU order (prelude's alloc_nodes, read with the GPUs'
  -- counters: one HMGET per GPU), kept on the allocation for the writes.
  local nodes, seen_node = {}, {}
  for _, g in ipairs(a.gpus) do
    local row = gpu_rows[g]
    if row == nil then
      local p = g .. ':'
      row = redis.call('HMGET', gk, p .. 'cap', p .. 'mode', p .. 'used', p .. 'mig',
        p .. 'shared', p .. 'max_shared', p .. 'node')
      gpu_rows[g] = row
    end
    local cap_raw, mode, used, mig, shared, max_shared, node = unpack(row)
    local cap = tonumber(cap_raw or '-1')
    if cap < 0 then return 'err:unknown GPU ' .. g end
    if tonumber(mode) ~= a.kind then
      return 'err:GPU ' .. g .. ' is not in this mode'
    end
    local u = tonumber(used or '0') + (d_used[g] or 0)
    if a.kind == 0 then
      if u ~= 0 or a.used_mib > cap then return 'err:GPU ' .. g .. ' is taken' end
    elseif a.kind == 1 then
      local m = bit.bor(tonumber(mig or '0'), d_mig[g] or 0)
      if bit.band(m, a.mig_mask) ~= 0 or u + a.used_mib > cap then
        return 'err:MIG slices on GPU ' .. g .. ' are taken'
      end
    else
      local k = tonumber(shared or '0') + (d_shared[g] or 0)
      local mx = tonumber(max_shared or '0')
      if k >= mx or cap - u < a.used_mib then return 'err:shared GPU ' .. g .. ' is full' end
    end
    if node and not seen_node[node] then
      seen_node[node] = true
      nodes[#nodes + 1] = node
    end
  end
  a.nodes = nodes
  local why = check_host(a)
  if why then return why end
  return a
end

local ok = {}
-- Touched GPUs and nodes in first-touch order (the chunk's counters are written once each).
local gpu_order, node_order = {}, {}
for j = 1, n do
  local b = 4 + (j - 1) * 4
  local job = ARGV[b + 1]
  local a = check(job, ARGV[b + 2], ARGV[b + 3])
  if type(a) == 'string' then
    out[j] = a
  else
    seen_job[job] = true
    for _, node in ipairs(a.nodes) do
      if d_cpu[node] == nil then node_order[#node_order + 1] = node end
      d_cpu[node] = (d_cpu[node] or 0) + a.cpu_milli
      d_host[node] = (d_host[node] or 0) + a.host_mib
    end
    for _, g in ipairs(a.gpus) do
      if d_used[g] == nil then gpu_order[#gpu_order + 1] = {g, a.kind} end
      d_used[g] = (d_used[g] or 0) + a.used_mib
      if a.kind == 1 then d_mig[g] = bit.bor(d_mig[g] or 0, a.mig_mask) end
      if a.kind == 2 then d_shared[g] = (d_shared[g] or 0) + 1 end
    end
    ok[#ok + 1] = {j, b, a}
  end
end
if #ok == 0 then return out end
-- What add_alloc(a, 1) of every committed job adds, summed per counter: the same counters
-- (every figure was checked in range above, so no sum overflows), one write each.
for _, node in ipairs(node_order) do
  redis.call('HINCRBY', gk, 'n' .. node .. ':cpu', string.format('%d', d_cpu[node]))
  redis.call('HINCRBY', gk, 'n' .. node .. ':host', string.format('%d', d_host[node]))
end
for _, entry in ipairs(gpu_order) do
  local g, kind = entry[1], entry[2]
  local p = g .. ':'
  redis.call('HINCRBY', gk, p .. 'used', string.format('%d', d_used[g]))
  if kind == 1 then
    local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
    redis.call('HSET', gk, p .. 'mig', string.format('%d', bit.bor(m, d_mig[g])))
  elseif kind == 2 then
    redis.call('HINCRBY', gk, p .. 'shared', d_shared[g])
  end
end
local jobs = {}
for k, item in ipairs(ok) do
  local b, a = item[2], item[3]
  local job = ARGV[b + 1]
  jobs[k] = job
  redis.call('HSET', P .. ':allocs', job, ARGV[b + 3])
  redis.call('HSET', P .. ':job:' .. job, 'attempt', a.attempt, 'placement', ARGV[b + 4],
             'updated_at', now, 'state', 'placed')
end
-- set_state(job, 'pending', 'placed') and the pending index, for the chunk at once.
for s = 1, #jobs, 1000 do
  local part = {unpack(jobs, s, math.min(s + 999, #jobs))}
  redis.call('ZREM', P .. ':pending', unpack(part))
  redis.call('SREM', P .. ':state:pending', unpack(part))
  redis.call('SADD', P .. ':state:placed', unpack(part))
end
-- One capacity version per committed job, in chunk order, as one INCR each would number them.
local last = redis.call('INCRBY', P .. ':capver', #ok)
for k, item in ipairs(ok) do
  out[item[1]] = 'ok:' .. (last - #ok + k)
end
return out
