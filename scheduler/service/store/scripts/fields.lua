-- HMGET of the same fields on many job records, as one JSON array of rows (false: no such
-- field): one reply to parse instead of one per job. ARGV[1] is the key prefix, ARGV[2] the
-- number of fields, then the fields, then the job ids.
local prefix = ARGV[1]
local nf = tonumber(ARGV[2])
local fields = {}
for i = 1, nf do
  fields[i] = ARGV[2 + i]
end
local rows = {}
for i = 3 + nf, #ARGV do
  local row = redis.call('HMGET', prefix .. ':job:' .. ARGV[i], unpack(fields))
  for k = 1, nf do
    if row[k] == nil then
      row[k] = false
    end
  end
  rows[#rows + 1] = row
end
return cjson.encode(rows)
