-- ARGV: P, id, now. Back to pending as a new attempt (Slurm's scontrol requeue): a placed job
-- gives its capacity back at once; a running one is stopped by its worker first (flags
-- cancel + requeue; finish.lua or a lease reclaim then requeues it instead of ending it);
-- a finished, failed, cancelled or rejected one starts over with fresh retry counters (the
-- reservation floor an OOM taught it is kept). Its dependencies are waited on again.
-- Returns 'requeued', 'requested' (running), 'pending', 'missing' or
-- 'parent:<id>:<state>' (a parent failed: requeue that first).
local job = ARGV[2]
local jk = P .. ':job:' .. job
local now = ARGV[3]
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if st == 'pending' then return 'pending' end
if st == 'running' then
  redis.call('HSET', jk, 'cancel', '1', 'requeue', '1', 'updated_at', now)
  return 'requested'
end
local deps = redis.call('HGET', jk, 'deps')
if st ~= 'placed' and deps then
  for _, d in ipairs(decode_deps(deps)) do
    local pst = redis.call('HGET', P .. ':job:' .. d, 'state')
    if pst and DEP_FAILED[pst] then return 'parent:' .. d .. ':' .. pst end
  end
end
if st == 'placed' then
  release(job, tonumber(redis.call('HGET', jk, 'attempt') or '0'))
else
  redis.call('HSET', jk, 'lost', 0, 'ooms', 0)
  redis.call('HDEL', jk, 'outcome', 'started_at', 'finished_at', 'worker', 'cancel')
  if deps then register_deps(job, deps) end
end
set_state(job, st, 'pending')
redis.call('HSET', jk, 'updated_at', now)
ready(job)
emit('requeued', job, 'requeued by user (was ' .. st .. ')', now)
return 'requeued'
