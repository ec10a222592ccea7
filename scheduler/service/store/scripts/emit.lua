-- Append events ARGV[3..] (JSON) to the stream ARGV[1]:events, trimmed to about ARGV[2]
-- entries: one call for a step's events instead of one XADD reply per event.
local key = ARGV[1] .. ':events'
for i = 3, #ARGV do
  redis.call('XADD', key, 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[i])
end
return #ARGV - 2
