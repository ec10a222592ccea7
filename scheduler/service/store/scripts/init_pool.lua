-- ARGV: P, fingerprint, config, name, (g, cap, mode, max_shared)...
local pk = P .. ':pool'
if redis.call('HGET', pk, 'fingerprint') == ARGV[2] then return 'same' end
if redis.call('HLEN', P .. ':allocs') > 0 then return 'busy' end
local gk = P .. ':gpu'
redis.call('DEL', gk)
for i = 5, #ARGV, 4 do
  local p = ARGV[i] .. ':'
  redis.call('HSET', gk, p .. 'cap', ARGV[i + 1], p .. 'mode', ARGV[i + 2],
             p .. 'max_shared', ARGV[i + 3], p .. 'used', 0, p .. 'mig', 0, p .. 'shared', 0)
end
redis.call('HSET', pk, 'fingerprint', ARGV[2], 'config', ARGV[3], 'name', ARGV[4])
redis.call('INCR', P .. ':capver')
return 'init'
