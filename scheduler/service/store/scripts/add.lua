-- A batch of new jobs, in order (a job may depend on an earlier one of the batch). ARGV: P,
-- guard ('1' | '0'), wake ('1' | '0'), then per job: id, submitted_at, the number of field
-- tokens, field, value, ...
-- With guard '1', if any id exists already nothing is written and the answer is
-- {'exists', spec...}: per job the stored submitted_spec (else spec) of an existing id, false
-- for a new one, so the client can tell a resubmit of the same spec from a clash first.
-- Otherwise one answer per job: 1 (added), 0 (the id exists) or 'missing:<parent>' (a
-- depends_on parent is unknown; nothing written for that job); wake '1' then pushes the
-- leader's wake-up list once for the batch.
local guard, wake = ARGV[2], ARGV[3]

local function add_job(job, submitted_at, first, last)
  local jk = P .. ':job:' .. job
  if redis.call('EXISTS', jk) == 1 then return 0 end
  local deps, hold = nil, false
  for i = first, last, 2 do
    if ARGV[i] == 'deps' then deps = ARGV[i + 1] end
    if ARGV[i] == 'hold' and ARGV[i + 1] == '1' then hold = true end
  end
  local parent, pst = nil, nil
  if deps then
    for _, d in ipairs(decode_deps(deps)) do
      local st = redis.call('HGET', P .. ':job:' .. d, 'state')
      if not st then return 'missing:' .. d end
      if DEP_FAILED[st] and not parent then parent, pst = d, st end
    end
  end
  if last >= first then redis.call('HSET', jk, unpack(ARGV, first, last)) end
  redis.call('ZADD', P .. ':jobs', submitted_at, job)
  if parent then
    -- A parent that already failed can never be satisfied: the job fails at once, with why.
    local why = 'DependencyNeverSatisfied: parent job ' .. parent .. ' ' .. pst
    redis.call('HSET', jk, 'state', 'failed', 'reason', why, 'finished_at', submitted_at)
    redis.call('HDEL', jk, 'hold')
    redis.call('SADD', P .. ':state:failed', job)
    emit('dependency_failed', job, why, submitted_at)
    return 1
  end
  redis.call('HSET', jk, 'state', 'pending')
  redis.call('SADD', P .. ':state:pending', job)
  if not deps and not hold then
    redis.call('ZADD', P .. ':pending', submitted_at, job)
    return 1
  end
  if deps then register_deps(job, deps) end
  ready(job)
  return 1
end

-- (id, submitted_at, first field token, last field token) per job.
local jobs = {}
local i = 4
while i <= #ARGV do
  local nf = tonumber(ARGV[i + 2])
  jobs[#jobs + 1] = {ARGV[i], ARGV[i + 1], i + 3, i + 2 + nf}
  i = i + 3 + nf
end

if guard == '1' then
  local stored, any = {'exists'}, false
  for j, x in ipairs(jobs) do
    local jk = P .. ':job:' .. x[1]
    if redis.call('EXISTS', jk) == 1 then
      any = true
      local sub, cur = unpack(redis.call('HMGET', jk, 'submitted_spec', 'spec'))
      -- As Python's `submitted_spec or spec`: an empty submitted_spec falls through.
      if not sub or sub == '' then sub = cur end
      stored[j + 1] = sub or false
    else
      stored[j + 1] = false
    end
  end
  if any then return stored end
end

local out = {}
for j, x in ipairs(jobs) do out[j] = add_job(x[1], x[2], x[3], x[4]) end
if wake == '1' then
  redis.call('RPUSH', P .. ':wakeup', '1')
  redis.call('LTRIM', P .. ':wakeup', -1, -1)
end
return out
