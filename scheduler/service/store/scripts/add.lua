-- ARGV: P, id, submitted_at, field, value, ... Returns 1 (added), 0 (the id exists) or
-- 'missing:<parent>' (a depends_on parent is unknown; nothing written).
local job = ARGV[2]
local jk = P .. ':job:' .. job
if redis.call('EXISTS', jk) == 1 then return 0 end
local deps, hold = nil, false
for i = 4, #ARGV, 2 do
  if ARGV[i] == 'deps' then deps = ARGV[i + 1] end
  if ARGV[i] == 'hold' and ARGV[i + 1] == '1' then hold = true end
end
local dep_state, parent, pst = 'ok', nil, nil
if deps then
  for _, d in ipairs(decode_deps(deps)) do
    local st = redis.call('HGET', P .. ':job:' .. d, 'state')
    if not st then return 'missing:' .. d end
    if DEP_FAILED[st] and not parent then parent, pst = d, st end
  end
end
for i = 4, #ARGV, 2 do redis.call('HSET', jk, ARGV[i], ARGV[i + 1]) end
redis.call('ZADD', P .. ':jobs', ARGV[3], job)
if parent then
  -- A parent that already failed can never be satisfied: the job fails at once, with why.
  local why = 'DependencyNeverSatisfied: parent job ' .. parent .. ' ' .. pst
  redis.call('HSET', jk, 'state', 'failed', 'reason', why, 'finished_at', ARGV[3])
  redis.call('HDEL', jk, 'hold')
  redis.call('SADD', P .. ':state:failed', job)
  emit('dependency_failed', job, why, ARGV[3])
  return 1
end
redis.call('HSET', jk, 'state', 'pending')
redis.call('SADD', P .. ':state:pending', job)
if not deps and not hold then
  redis.call('ZADD', P .. ':pending', ARGV[3], job)
  return 1
end
if deps then register_deps(job, deps) end
ready(job)
return 1
