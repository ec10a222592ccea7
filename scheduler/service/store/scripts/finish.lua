-- ARGV: P, id, attempt, final_state, outcome, reason, now
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if (st ~= 'running' and st ~= 'placed') or
   tonumber(redis.call('HGET', jk, 'attempt') or '-1') ~= tonumber(ARGV[3]) then
  return 'stale'
end
release(job, tonumber(ARGV[3]))
redis.call('ZREM', P .. ':leases', job)
set_state(job, st, ARGV[4])
redis.call('HSET', jk, 'outcome', ARGV[5], 'reason', ARGV[6], 'finished_at', ARGV[7],
           'updated_at', ARGV[7])
redis.call('HDEL', jk, 'cancel')
return 'ok'
