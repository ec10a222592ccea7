-- ARGV: P, id, attempt, lease_until_ms
local job = ARGV[2]
local jk = P .. ':job:' .. job
if redis.call('HGET', jk, 'state') ~= 'running' or not at_attempt(jk, ARGV[3]) then
  return 'lost'
end
redis.call('ZADD', P .. ':leases', ARGV[4], job)
if redis.call('HGET', jk, 'cancel') == '1' then return 'cancel' end
return 'ok'
