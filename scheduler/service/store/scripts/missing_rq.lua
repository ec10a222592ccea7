-- Which of the placed jobs ARGV[2..] may lack their RQ job: every id except those whose
-- current attempt's RQ job (rq_job_id: "<id>-a<attempt>" for plain ids) exists. Conservative:
-- an id that needs sanitising, or an attempt field not in canonical integer form, is returned
-- for the caller's full check. ARGV[1] is the key prefix.
local prefix = ARGV[1]
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local ok = false
  if #id <= 180 and string.find(id, '^[%w_%-]+$') then
    local attempt = redis.call('HGET', prefix .. ':job:' .. id, 'attempt')
    if attempt and string.find(attempt, '^%d+$') and tostring(tonumber(attempt)) == attempt then
      ok = redis.call('EXISTS', 'rq:job:' .. id .. '-a' .. attempt) == 1
    end
  end
  if not ok then
    out[#out + 1] = id
  end
end
return out
