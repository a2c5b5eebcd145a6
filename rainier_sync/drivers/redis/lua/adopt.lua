-- ARGV: prefix, group, consumer, deadline, then (queue, band, id) per entry an idle
-- loop's blocking read took: each still pending to this consumer gets its
-- reservation on record. One that is not (the net put it back, a release already
-- ran) is left alone, so sending this again, late, is harmless. Returns the ids taken.
-- needs: held
local P, group, consumer, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local out = {}
for i = 5, #ARGV, 3 do
  local q, band, id = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local held_by = redis.call('XPENDING', P .. q .. ':ready:' .. band, group, id, id, 1, consumer)
  if held_by[1] then
    redis.call('ZADD', P .. q .. ':reserved', deadline, held(band, id))
    out[#out + 1] = id
  end
end
return out
