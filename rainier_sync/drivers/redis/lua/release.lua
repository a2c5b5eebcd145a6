-- ARGV: prefix, group, queue, band, id, now, due, attempts, json
-- needs: push_lib held
local P, group, q, band, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local base = P .. q .. ':'
if redis.call('ZREM', base .. 'reserved', held(band, id)) == 0 then
  return 0
end
redis.call('XACK', base .. 'ready:' .. band, group, id)
redis.call('XDEL', base .. 'ready:' .. band, id)
push(P, q, band, ARGV[8], ARGV[7], ARGV[9], tonumber(ARGV[6]), {})
wake(P)
return 1
