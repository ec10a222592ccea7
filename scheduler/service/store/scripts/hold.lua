-- ARGV: P, id, now. A pending job leaves P:pending until released (Slurm's scontrol hold).
-- Returns 'held', 'already held', 'missing' or the state that cannot be held.
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if st ~= 'pending' then return st end
if redis.call('HGET', jk, 'hold') == '1' then return 'already held' end
redis.call('HSET', jk, 'hold', '1', 'updated_at', ARGV[3])
redis.call('ZREM', P .. ':pending', job)
ready(job)
emit('held', job, 'held by user', ARGV[3])
return 'held'
