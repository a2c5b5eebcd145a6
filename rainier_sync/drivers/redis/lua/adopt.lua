-- KEYS: per entry an idle loop's blocking read took, its stream and its queue's
-- reserved key. ARGV: group, consumer, deadline, then (band, id) per entry: each
-- still pending to this consumer gets its reservation on record. One that is not
-- (the net put it back, a release already ran) is left alone, so sending this
-- again, late, is harmless. Returns the ids taken.
-- needs: held
local group, consumer, deadline = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV, 2 do
  local band, id = ARGV[i], ARGV[i + 1]
  local k = i - 3
  local held_by = redis.call('XPENDING', KEYS[k], group, id, id, 1, consumer)
  if held_by[1] then
    redis.call('ZADD', KEYS[k + 1], deadline, held(band, id))
    out[#out + 1] = id
  end
end
return out
