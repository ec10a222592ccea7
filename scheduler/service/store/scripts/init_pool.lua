-- ARGV: P, fingerprint, config, name, n_gpus, (g, cap, mode, max_shared, node) x n_gpus,
-- then (node, cpu_cap_milli, host_cap_mib) per node.
local pk = P .. ':pool'
if redis.call('HGET', pk, 'fingerprint') == ARGV[2] then return 'same' end
if redis.call('HLEN', P .. ':allocs') > 0 then return 'busy' end
local gk = P .. ':gpu'
redis.call('DEL', gk)
local n_gpus = tonumber(ARGV[5])
local last = 5 + 5 * n_gpus
for i = 6, last, 5 do
  local p = ARGV[i] .. ':'
  redis.call('HSET', gk, p .. 'cap', ARGV[i + 1], p .. 'mode', ARGV[i + 2],
             p .. 'max_shared', ARGV[i + 3], p .. 'node', ARGV[i + 4], p .. 'used', 0,
             p .. 'mig', 0, p .. 'shared', 0)
end
for i = last + 1, #ARGV, 3 do
  local p = 'n' .. ARGV[i] .. ':'
  redis.call('HSET', gk, p .. 'cpu_cap', ARGV[i + 1], p .. 'host_cap', ARGV[i + 2],
             p .. 'cpu', 0, p .. 'host', 0)
end
redis.call('HSET', pk, 'fingerprint', ARGV[2], 'config', ARGV[3], 'name', ARGV[4])
redis.call('INCR', P .. ':capver')
return 'init'
