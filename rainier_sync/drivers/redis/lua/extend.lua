-- KEYS: per job, its stream and its queue's reserved key.
-- ARGV: group, consumer, deadline, then (band, id) per job.
-- Only a reservation still on record is renewed: a lapsed, reclaimed one is not revived.
-- needs: held
local group, consumer, deadline = ARGV[1], ARGV[2], ARGV[3]
local renewed = 0
for i = 4, #ARGV, 2 do
  local band, id = ARGV[i], ARGV[i + 1]
  local k = i - 3
  local m = held(band, id)
  if redis.call('ZSCORE', KEYS[k + 1], m) then
    redis.call('ZADD', KEYS[k + 1], deadline, m)
    redis.call('XCLAIM', KEYS[k], group, consumer, 0, id, 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
