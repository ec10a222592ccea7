-- ARGV: P, id, now. Lifts a user hold; the job is placeable again unless a dependency still
-- holds it. Returns 'released', 'not held' or 'missing'.
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st then return 'missing' end
if redis.call('HGET', jk, 'hold') ~= '1' then return 'not held' end
redis.call('HDEL', jk, 'hold')
redis.call('HSET', jk, 'updated_at', ARGV[3])
local got = 'queued'
if st == 'pending' then got = ready(job) end
emit('released', job, 'released by user' .. (got == 'waiting' and '; still waits on a dependency' or ''), ARGV[3])
return 'released'
