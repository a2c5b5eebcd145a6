-- ARGV: prefix, group, then per stream: queue, band, n, id1..idn
-- needs: held
local P, group = ARGV[1], ARGV[2]
local i = 3
while i <= #ARGV do
  local q, band, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local stream = P .. q .. ':ready:' .. band
  local ids, members = {}, {}
  for k = 1, n do
    ids[k] = ARGV[i + 2 + k]
    members[k] = held(band, ids[k])
  end
  redis.call('XACK', stream, group, unpack(ids))
  redis.call('XDEL', stream, unpack(ids))
  redis.call('ZREM', P .. q .. ':reserved', unpack(members))
  i = i + 3 + n
end
return 1
