-- RQ jobs written as rq writes them, replayed from one template rq recorded (_rq_fast.py).
-- ARGV: number of per-queue commands, number of per-job commands, the rq job key prefix, then
-- each command as its token count followed by its tokens, then groups: queue name, queue key,
-- job count, and per job: rq id, data, description, meta. A token equal to a placeholder (NUL
-- then a letter) is swapped: q queue name, Q queue key, k job key, i rq id, d data,
-- s description, m meta. Returns the number of jobs written.
local nq, nj, job_prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local i = 4

-- Each command as {tokens, positions of tokens that start with NUL, those tokens}: a job's
-- command is its tokens with only those positions swapped (each token was looked up per job).
local function read_cmds(n)
  local cmds = {}
  for c = 1, n do
    local argc = tonumber(ARGV[i])
    local toks, at, what = {unpack(ARGV, i + 1, i + argc)}, {}, {}
    for a, tok in ipairs(toks) do
      if string.byte(tok, 1) == 0 then
        at[#at + 1], what[#what + 1] = a, tok
      end
    end
    cmds[c] = {toks, at, what}
    i = i + argc + 1
  end
  return cmds
end

local queue_cmds, job_cmds = read_cmds(nq), read_cmds(nj)
local sub = {}

local function run(cmds)
  for _, cmd in ipairs(cmds) do
    local toks, at, what = cmd[1], cmd[2], cmd[3]
    for k = 1, #at do toks[at[k]] = sub[what[k]] or what[k] end
    redis.call(unpack(toks))
  end
end

local written = 0
while i <= #ARGV do
  sub['\0q'], sub['\0Q'] = ARGV[i], ARGV[i + 1]
  local n = tonumber(ARGV[i + 2])
  i = i + 3
  run(queue_cmds)
  for _ = 1, n do
    sub['\0i'], sub['\0k'] = ARGV[i], job_prefix .. ARGV[i]
    sub['\0d'], sub['\0s'], sub['\0m'] = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    i = i + 4
    run(job_cmds)
    written = written + 1
  end
end
return written
