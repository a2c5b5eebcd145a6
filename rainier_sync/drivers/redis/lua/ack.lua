-- KEYS: per stream, the stream and its queue's reserved key.
-- ARGV: group, then per stream: band, n, id1..idn, then the n entries' job ids.
-- needs: held ids
local group = ARGV[1]
local i, k = 2, 1
while i <= #ARGV do
  local band, n = ARGV[i], tonumber(ARGV[i + 1])
  local stream, reserved = KEYS[k], KEYS[k + 1]
  local ids, members, jobs = {}, {}, {}
  local base = base_of_reserved(reserved)
  for j = 1, n do
    ids[j] = ARGV[i + 1 + j]
    members[j] = held(band, ids[j])
    jobs[j] = ARGV[i + 1 + n + j]
  end
  unindex(base, jobs, band, ids)
  redis.call('XACK', stream, group, unpack(ids))
  redis.call('XDEL', stream, unpack(ids))
  redis.call('ZREM', reserved, unpack(members))
  i = i + 2 + 2 * n
  k = k + 2
end
return 1
