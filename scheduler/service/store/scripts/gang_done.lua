-- ARGV: P, id, attempt, node_rank, n_ranks. One rank of a running multi-node gang ended well:
-- 'last' when every rank has (the caller then finishes the job), 'waiting' before that,
-- 'stale' when the attempt is no longer running (another rank failed and requeued the gang).
local job = ARGV[2]
local jk = P .. ':job:' .. job
if redis.call('HGET', jk, 'state') ~= 'running' or not at_attempt(jk, ARGV[3]) then
  return 'stale'
end
redis.call('HSET', jk, 'done:' .. ARGV[3] .. ':' .. ARGV[4], '1')
local n = 0
for r = 0, tonumber(ARGV[5]) - 1 do
  if redis.call('HGET', jk, 'done:' .. ARGV[3] .. ':' .. r) == '1' then n = n + 1 end
end
if n >= tonumber(ARGV[5]) then return 'last' end
return 'waiting'
