-- ARGV: prefix, group, consumer, deadline, then (queue, band, id) per job.
-- Only a reservation still on record is renewed: a lapsed, reclaimed one is not revived.
-- needs: held
local P, group, consumer, deadline = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local renewed = 0
for i = 5, #ARGV, 3 do
  local q, band, id = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local reserved = P .. q .. ':reserved'
  local m = held(band, id)
  if redis.call('ZSCORE', reserved, m) then
    redis.call('ZADD', reserved, deadline, m)
    redis.call('XCLAIM', P .. q .. ':ready:' .. band, group, consumer, 0, id, 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
