-- ARGV: prefix, now, then a blob of one line per job: queue TAB band TAB attempts TAB due TAB json.
-- (One argument per thousand jobs rather than five per job: packing arguments is
-- most of a bulk push's cost in redis-py. JSON never holds a raw tab or newline,
-- and queue names may not.)
-- needs: push_lib
local P, now, blob = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local seen = {}
local pos, size = 1, #blob
while pos <= size do
  local stop = string.find(blob, '\n', pos, true) or (size + 1)
  local t1 = string.find(blob, '\t', pos, true)
  local t2 = string.find(blob, '\t', t1 + 1, true)
  local t3 = string.find(blob, '\t', t2 + 1, true)
  local t4 = string.find(blob, '\t', t3 + 1, true)
  push(P, string.sub(blob, pos, t1 - 1), string.sub(blob, t1 + 1, t2 - 1), string.sub(blob, t2 + 1, t3 - 1),
       string.sub(blob, t3 + 1, t4 - 1), string.sub(blob, t4 + 1, stop - 1), now, seen)
  pos = stop + 1
end
wake(P)
return 1
