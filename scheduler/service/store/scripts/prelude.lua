-- Shared by every state-changing script (prepended to each): ARGV[1] is the key prefix.
local P = ARGV[1]
local function set_state(job, old, new)
  redis.call('SREM', P .. ':state:' .. old, job)
  redis.call('SADD', P .. ':state:' .. new, job)
  redis.call('HSET', P .. ':job:' .. job, 'state', new)
end
local function release(job, attempt)
  local raw = redis.call('HGET', P .. ':allocs', job)
  if not raw then return 0 end
  local a = cjson.decode(raw)
  if attempt and tonumber(a['attempt']) ~= attempt then return 0 end
  local gk = P .. ':gpu'
  for _, g in ipairs(a['gpus']) do
    local p = tostring(g) .. ':'
    redis.call('HINCRBY', gk, p .. 'used', -tonumber(a['used_mib']))
    if tonumber(a['kind']) == 1 then
      local m = tonumber(redis.call('HGET', gk, p .. 'mig') or '0')
      redis.call('HSET', gk, p .. 'mig', bit.band(m, bit.bnot(tonumber(a['mig_mask']))))
    elseif tonumber(a['kind']) == 2 then
      redis.call('HINCRBY', gk, p .. 'shared', -1)
    end
  end
  redis.call('HDEL', P .. ':allocs', job)
  redis.call('INCR', P .. ':capver')
  return 1
end
