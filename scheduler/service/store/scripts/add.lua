-- A batch of new jobs, in order (a job may depend on an earlier one of the batch). ARGV: P,
-- guard ('1' | '0'), wake ('1' | '0'), the number of jobs n, their n ids, then per job: its
-- submitted_at, a code, and the tokens its code calls for (store/_add_args.py writes them;
-- what repeats from job to job is sent once). The code's first letter: N (the job's field
-- names follow: their count, then the names) or R (the previous job's names). Then one letter
-- per field, in order:
--   v  the value is the next token          =  the previous job's value of this field
--   i  the job's id                         s  the job's submitted_at
--   t  a template: the next token m, then m pieces; the value is the pieces joined by the
--      job's id in double quotes (how the job's JSON records name it)
--   p  the last template of this field, joined likewise
-- With guard '1', if any id exists already nothing is written and the answer is
-- {'exists', spec...}: per job the stored submitted_spec (else spec) of an existing id, false
-- for a new one, so the client can tell a resubmit of the same spec from a clash first.
-- Otherwise one answer per job: 1 (added), 0 (the id exists) or 'missing:<parent>' (a
-- depends_on parent is unknown; nothing written for that job), or 'added' when every job
-- was added; wake '1' then pushes the
-- leader's wake-up list once for the batch. A code that does not fit its tokens is an error
-- reply; the jobs before it are written (flushed first).
local guard, wake = ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])
local C_V, C_SAME, C_ID, C_TS, C_TMPL, C_LAST = 118, 61, 105, 115, 116, 112

if guard == '1' then
  -- One EXISTS per 1,000 keys answers the usual case (every id new).
  local any = false
  for s = 1, n, 1000 do
    local ks = {}
    for j = s, math.min(s + 999, n) do ks[#ks + 1] = P .. ':job:' .. ARGV[4 + j] end
    if redis.call('EXISTS', unpack(ks)) > 0 then
      any = true
      break
    end
  end
  if any then
    local stored = {'exists'}
    for j = 1, n do
      local jk = P .. ':job:' .. ARGV[4 + j]
      if redis.call('EXISTS', jk) == 1 then
        local sub, cur = unpack(redis.call('HMGET', jk, 'submitted_spec', 'spec'))
        -- As Python's `submitted_spec or spec`: an empty submitted_spec falls through.
        if not sub or sub == '' then sub = cur end
        stored[j + 1] = sub or false
      else
        stored[j + 1] = false
      end
    end
    return stored
  end
end

-- With guard '1' no id existed when this script started, so an id is taken exactly when this
-- script wrote it (an id twice in the batch): one table look-up instead of an EXISTS per job.
local written = {}
-- A job without parents or hold joins P:jobs, its state set and P:pending in bulk: one call
-- per set and up to 1,000 jobs. Nothing in this script reads those sets, and the bulk is
-- flushed before any other job's writes, so the sets change in the order they did job by job.
local bulk_z, bulk_s = {}, {}
local function flush()
  if #bulk_s == 0 then return end
  redis.call('ZADD', P .. ':jobs', unpack(bulk_z))
  redis.call('SADD', P .. ':state:pending', unpack(bulk_s))
  redis.call('ZADD', P .. ':pending', unpack(bulk_z))
  bulk_z, bulk_s = {}, {}
end
local function add_job(job, submitted_at, hs, deps, hold)
  local jk = P .. ':job:' .. job
  if written[job] or (guard ~= '1' and redis.call('EXISTS', jk) == 1) then return 0 end
  if not deps and not hold then
    written[job] = true
    redis.call('HSET', jk, unpack(hs))
    bulk_z[#bulk_z + 1] = submitted_at
    bulk_z[#bulk_z + 1] = job
    bulk_s[#bulk_s + 1] = job
    if #bulk_s >= 1000 then flush() end
    return 1
  end
  flush()
  local parent, pst = nil, nil
  if deps then
    for _, d in ipairs(decode_deps(deps)) do
      local st = redis.call('HGET', P .. ':job:' .. d, 'state')
      if not st then return 'missing:' .. d end
      if DEP_FAILED[st] and not parent then parent, pst = d, st end
    end
  end
  written[job] = true
  redis.call('HSET', jk, unpack(hs))
  redis.call('ZADD', P .. ':jobs', submitted_at, job)
  if parent then
    -- A parent that already failed can never be satisfied: the job fails at once, with why.
    local why = 'DependencyNeverSatisfied: parent job ' .. parent .. ' ' .. pst
    redis.call('HSET', jk, 'state', 'failed', 'reason', why, 'finished_at', submitted_at)
    redis.call('HDEL', jk, 'hold')
    redis.call('SADD', P .. ':state:failed', job)
    emit('dependency_failed', job, why, submitted_at)
    return 1
  end
  redis.call('SADD', P .. ':state:pending', job)
  if deps then register_deps(job, deps) end
  ready(job)
  return 1
end

-- Decode and add job by job. hs (the HSET arguments) lives as long as its field names, so a
-- field equal to the previous job's ('=') costs nothing: its value is still in place.
local out, all_added = {}, true
local names, nf, hs, tmpl, deps_at, hold_at = nil, 0, nil, nil, nil, nil
local i = 5 + n
for j = 1, n do
  local job, ts, code = ARGV[4 + j], ARGV[i], ARGV[i + 1]
  i = i + 2
  if string.byte(code, 1) == 78 then -- N
    nf = tonumber(ARGV[i])
    names, hs, tmpl, deps_at, hold_at = {}, {}, {}, nil, nil
    for f = 1, nf do
      local name = ARGV[i + f]
      names[f] = name
      hs[2 * f - 1] = name
      if name == 'deps' then deps_at = f elseif name == 'hold' then hold_at = f end
    end
    -- One HSET with the state: a job that fails on a parent has it overwritten, and either
    -- way 'state' enters the hash after the record's fields, as it did in two calls.
    hs[2 * nf + 1] = 'state'
    hs[2 * nf + 2] = 'pending'
    i = i + 1 + nf
  elseif not names then
    flush()
    return redis.error_reply('add.lua: job ' .. job .. ' reuses field names none sent')
  end
  local q = nil
  for f = 1, nf do
    local c, v = string.byte(code, f + 1), nil
    if c == C_SAME then
      v = hs[2 * f]
    elseif c == C_V then
      v = ARGV[i]
      i = i + 1
    elseif c == C_ID then
      v = job
    elseif c == C_TS then
      v = ts
    elseif c == C_TMPL or c == C_LAST then
      if c == C_TMPL then
        local m = tonumber(ARGV[i])
        tmpl[f] = {unpack(ARGV, i + 1, i + m)}
        i = i + 1 + m
      end
      q = q or ('"' .. job .. '"')
      if tmpl[f] then v = table.concat(tmpl[f], q) end
    end
    if v == nil then
      flush()
      return redis.error_reply('add.lua: job ' .. job .. ': bad code for field ' .. f)
    end
    hs[2 * f] = v
  end
  out[j] = add_job(job, ts, hs, deps_at and hs[2 * deps_at], hold_at and hs[2 * hold_at] == '1')
  all_added = all_added and out[j] == 1
end
flush()
if wake == '1' then
  redis.call('RPUSH', P .. ':wakeup', '1')
  redis.call('LTRIM', P .. ':wakeup', -1, -1)
end
-- The usual answer in one word: a reply of a thousand 1s cost the client more to read.
if all_added then return 'added' end
return out
