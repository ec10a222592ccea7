-- ARGV: P, id, token, expected_attempt, now, alloc, placement, decision, kind, used, mask, gpus...
local job = ARGV[2]
if ARGV[3] ~= '' and redis.call('GET', P .. ':leader') ~= ARGV[3] then
  return 'err:not the leader'
end
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if st ~= 'pending' then return 'err:job is ' .. tostring(st) end
if tonumber(redis.call('HGET', jk, 'attempt') or '0') ~= tonumber(ARGV[4]) then
  return 'err:stale attempt'
end
if redis.call('HEXISTS', P .. ':allocs', job) == 1 then return 'err:already holds capacity' end
local gk = P .. ':gpu'
local kind = tonumber(ARGV[9])
local used = tonumber(ARGV[10])
local mask = tonumber(ARGV[11])
for i = 12, #ARGV do
  local p = ARGV[i] .. ':'
  local cap = tonumber(redis.call('HGET', gk, p .. 'cap') or '-1')
  if cap < 0 then return 'err:unknown GPU ' .. ARGV[i] end
  if tonumber(redis.call('HGET', gk, p .. 'mode')) ~= kind then
    return 'err:GPU ' .. ARGV[i] .. ' is not in this mode'
  end
  local u = tonumber(redis.call('HGET', gk, p .. 'used') or '0')
  if kind == 0 then
    if u ~= 0 or used > cap then return 'err:GPU ' .. ARGV[i] .. ' is taken' end
  elseif kind == 1 then
    local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
    if bit.band(m, mask) ~= 0 or u + used > cap then
      return 'err:MIG slices on GPU ' .. ARGV[i] .. ' are taken'
    end
  else
    local n = tonumber(redis.call('HGET', gk, p .. 'shared') or '0')
    local mx = tonumber(redis.call('HGET', gk, p .. 'max_shared') or '0')
    if n >= mx or cap - u < used then
      return 'err:shared GPU ' .. ARGV[i] .. ' is full'
    end
  end
end
for i = 12, #ARGV do
  local p = ARGV[i] .. ':'
  redis.call('HINCRBY', gk, p .. 'used', used)
  if kind == 1 then
    local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
    redis.call('HSET', gk, p .. 'mig', bit.bor(m, mask))
  elseif kind == 2 then
    redis.call('HINCRBY', gk, p .. 'shared', 1)
  end
end
redis.call('HSET', P .. ':allocs', job, ARGV[6])
redis.call('HSET', jk, 'attempt', tonumber(ARGV[4]) + 1, 'placement', ARGV[7],
           'decision', ARGV[8], 'updated_at', ARGV[5])
redis.call('ZREM', P .. ':pending', job)
set_state(job, 'pending', 'placed')
return 'ok:' .. redis.call('INCR', P .. ':capver')
