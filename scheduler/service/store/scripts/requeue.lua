-- ARGV: P, id, attempt, reason, reserved_gib|'', counter, max_field, default_max, now,
-- expired_before_ms|'', from_states (comma separated), then field, value pairs written only
-- when the job is requeued (an OOM retry at a higher tensor parallel degree carries its new
-- spec, request and predictions); an empty value deletes the field
local job = ARGV[2]
local jk = P .. ':job:' .. job
local st = redis.call('HGET', jk, 'state')
if not st or not string.find(',' .. ARGV[11] .. ',', ',' .. st .. ',', 1, true) then
  return 'stale'
end
if not at_attempt(jk, ARGV[3]) then
  return 'stale'
end
if ARGV[10] ~= '' then
  local s = redis.call('ZSCORE', P .. ':leases', job)
  if s and tonumber(s) > tonumber(ARGV[10]) then return 'alive' end
end
release(job, tonumber(ARGV[3]))
redis.call('ZREM', P .. ':leases', job)
redis.call('HSET', jk, 'updated_at', ARGV[9])
if redis.call('HGET', jk, 'requeue') == '1' then
  -- A user asked to requeue it; its worker died (or never started it) first: same result.
  redis.call('HDEL', jk, 'cancel', 'requeue', 'started_at', 'worker')
  set_state(job, st, 'pending')
  ready(job)
  return 'requeued'
end
if redis.call('HGET', jk, 'cancel') == '1' then
  set_state(job, st, 'cancelled')
  redis.call('HSET', jk, 'reason', 'cancelled (' .. ARGV[4] .. ')', 'finished_at', ARGV[9])
  redis.call('HDEL', jk, 'cancel')
  settle_children(job, 'cancelled', ARGV[9])
  return 'cancelled'
end
local n = redis.call('HINCRBY', jk, ARGV[6], 1)
local mx = tonumber(redis.call('HGET', jk, ARGV[7]) or ARGV[8])
if n > mx then
  set_state(job, st, 'failed')
  redis.call('HSET', jk, 'reason', ARGV[4] .. '; gave up after ' .. (n - 1) .. ' retries',
             'finished_at', ARGV[9])
  settle_children(job, 'failed', ARGV[9])
  return 'failed'
end
if ARGV[5] ~= '' then
  local old = tonumber(redis.call('HGET', jk, 'reserved_gib') or '0')
  local new = tonumber(ARGV[5])
  if new > old then redis.call('HSET', jk, 'reserved_gib', ARGV[5]) end
end
for i = 12, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', jk, ARGV[i])
  else
    redis.call('HSET', jk, ARGV[i], ARGV[i + 1])
  end
end
set_state(job, st, 'pending')
redis.call('HSET', jk, 'reason', ARGV[4])
local t = tonumber(redis.call('HGET', jk, 'submitted_at') or ARGV[9])
redis.call('ZADD', P .. ':pending', t, job)
redis.call('RPUSH', P .. ':wakeup', '1')
redis.call('LTRIM', P .. ':wakeup', -1, -1)
return 'requeued'
