-- ARGV: P, id, reason, decision, now
local job = ARGV[2]
local jk = P .. ':job:' .. job
redis.call('ZREM', P .. ':pending', job)
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if st ~= 'pending' then return st end
set_state(job, 'pending', 'rejected')
redis.call('HSET', jk, 'reason', ARGV[3], 'decision', ARGV[4], 'finished_at', ARGV[5],
           'updated_at', ARGV[5])
settle_children(job, 'rejected', ARGV[5])
return 'rejected'
