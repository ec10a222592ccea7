-- Holds and dependencies (afterok), prepended after prelude.lua to the scripts that create
-- jobs or move them into or out of a final state. A pending job is placeable only while it is
-- in P:pending; a held job (field hold = '1') or one whose parents have not all succeeded
-- (deps_left > 0) stays in state pending but out of P:pending, so the leader never sees it.
-- P:children:{parent} is the SET of jobs waiting on that parent; the child's field deps is the
-- JSON list of its parents.
local DEP_FAILED = {failed = true, cancelled = true, rejected = true}
-- An event on the placement log (the stream only: these moves happen inside Redis).
local function emit(kind, job, reason, now)
  local e = {ts = tonumber(now), event = kind, job_id = job, reason = reason}
  -- EVENTS_MAXLEN of keys.py.
  redis.call('XADD', P .. ':events', 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(e))
end
local function decode_deps(raw)
  local okd, deps = pcall(cjson.decode, raw or '[]')
  if not okd or type(deps) ~= 'table' then return {} end
  return deps
end
-- The first parent of a job that has not succeeded yet (its pending reason names it).
local function first_waiting(job)
  local deps = decode_deps(redis.call('HGET', P .. ':job:' .. job, 'deps'))
  for _, d in ipairs(deps) do
    local st = redis.call('HGET', P .. ':job:' .. d, 'state')
    if st ~= 'succeeded' then return d, tostring(st) end
  end
  return nil, nil
end
-- Wait on the parents in raw (JSON list) that have not succeeded. Returns 'ok' with the count,
-- or 'missing' / 'failed' with the parent (and its state); nothing is written unless 'ok'.
local function register_deps(job, raw)
  local deps = decode_deps(raw)
  for _, d in ipairs(deps) do
    local st = redis.call('HGET', P .. ':job:' .. d, 'state')
    if not st then return 'missing', d end
    if DEP_FAILED[st] then return 'failed', d, st end
  end
  local left = 0
  for _, d in ipairs(deps) do
    if redis.call('HGET', P .. ':job:' .. d, 'state') ~= 'succeeded' then
      left = left + 1
      redis.call('SADD', P .. ':children:' .. d, job)
    end
  end
  redis.call('HSET', P .. ':job:' .. job, 'deps_left', left)
  return 'ok', left
end
-- Put a pending job up for placement if nothing holds it, else say why it waits.
local function ready(job)
  local jk = P .. ':job:' .. job
  if redis.call('HGET', jk, 'hold') == '1' then
    redis.call('HSET', jk, 'reason', 'JobHeldUser: held by user; `snugfit release ' .. job ..
               '` lets it run')
    return 'held'
  end
  if tonumber(redis.call('HGET', jk, 'deps_left') or '0') > 0 then
    local d, st = first_waiting(job)
    redis.call('HSET', jk, 'reason', 'Dependency: waiting on job ' .. tostring(d) .. ' (' ..
               tostring(st) .. ') to succeed')
    return 'waiting'
  end
  redis.call('ZADD', P .. ':pending', redis.call('HGET', jk, 'submitted_at') or '0', job)
  redis.call('HDEL', jk, 'reason')
  redis.call('RPUSH', P .. ':wakeup', '1')
  redis.call('LTRIM', P .. ':wakeup', -1, -1)
  return 'queued'
end
-- After job entered final state st: release the children of a success whose parents have
-- all succeeded; fail the children of anything else, and theirs in turn.
local function settle_children(job, st, now)
  local todo, i = {{job, st}}, 1
  while i <= #todo do
    local parent, pst = todo[i][1], todo[i][2]
    i = i + 1
    local ck = P .. ':children:' .. parent
    local kids = redis.call('SMEMBERS', ck)
    redis.call('DEL', ck)
    for _, kid in ipairs(kids) do
      local kk = P .. ':job:' .. kid
      if redis.call('HGET', kk, 'state') == 'pending' then
        if pst == 'succeeded' then
          redis.call('HINCRBY', kk, 'deps_left', -1)
          if ready(kid) == 'queued' then
            emit('released', kid, 'dependencies satisfied: ' .. parent .. ' succeeded', now)
          end
        else
          local why = 'DependencyNeverSatisfied: parent job ' .. parent .. ' ' .. pst
          redis.call('ZREM', P .. ':pending', kid)
          set_state(kid, 'pending', 'failed')
          redis.call('HSET', kk, 'reason', why, 'finished_at', now, 'updated_at', now)
          redis.call('HDEL', kk, 'hold')
          emit('dependency_failed', kid, why, now)
          todo[#todo + 1] = {kid, 'failed'}
        end
      end
    end
  end
end
