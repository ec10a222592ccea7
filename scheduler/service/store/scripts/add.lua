-- ARGV: P, id, submitted_at, field, value, ...
local jk = P .. ':job:' .. ARGV[2]
if redis.call('EXISTS', jk) == 1 then return 0 end
for i = 4, #ARGV, 2 do redis.call('HSET', jk, ARGV[i], ARGV[i + 1]) end
redis.call('HSET', jk, 'state', 'pending')
redis.call('ZADD', P .. ':jobs', ARGV[3], ARGV[2])
redis.call('ZADD', P .. ':pending', ARGV[3], ARGV[2])
redis.call('SADD', P .. ':state:pending', ARGV[2])
return 1
