-- Jobs in bulk. KEYS: wake:sent, the queues set when ARGV[3] is '1' (one server),
-- then per queue named its bands and delayed keys. ARGV: now, wake channel, '1'/'0',
-- the queues' names, then last a blob of one line per job:
-- queue TAB band TAB attempts TAB due TAB json.
-- (One argument per thousand jobs rather than five per job: packing arguments is
-- most of a bulk push's cost in redis-py. JSON never holds a raw tab or newline,
-- and queue names may not.)
-- needs: push_lib
local now, blob = tonumber(ARGV[1]), ARGV[#ARGV]
local first = ARGV[3] == '1' and 3 or 2
local of, seen = {}, {}
for i = 4, #ARGV - 1 do
  of[ARGV[i]] = first + 2 * (i - 4)
  if first == 3 then
    index_whole(base_of_bands(KEYS[of[ARGV[i]]]), redis.call('SADD', KEYS[2], ARGV[i]))
  end
end
local pos, size = 1, #blob
while pos <= size do
  local stop = string.find(blob, '\n', pos, true) or (size + 1)
  local t1 = string.find(blob, '\t', pos, true)
  local t2 = string.find(blob, '\t', t1 + 1, true)
  local t3 = string.find(blob, '\t', t2 + 1, true)
  local t4 = string.find(blob, '\t', t3 + 1, true)
  local k = of[string.sub(blob, pos, t1 - 1)]
  push(KEYS[k], KEYS[k + 1], string.sub(blob, t1 + 1, t2 - 1), string.sub(blob, t2 + 1, t3 - 1),
       string.sub(blob, t3 + 1, t4 - 1), string.sub(blob, t4 + 1, stop - 1), now, seen)
  pos = stop + 1
end
wake(KEYS[1], ARGV[2])
index_flush()
return 1
