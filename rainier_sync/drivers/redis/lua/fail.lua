-- ARGV: prefix, group, queue, band, id, failed_id, record, failed_at, held
-- With ``held`` = '1', only a reservation still on record is failed: one that lapsed
-- and was put back is the requeued job's to decide, and a failed copy beside it
-- would let a retry queue the job twice.
-- needs: held
local P, group, q, band, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local base = P .. q .. ':'
if redis.call('ZREM', base .. 'reserved', held(band, id)) == 0 and ARGV[9] == '1' then
  return 0
end
redis.call('XACK', base .. 'ready:' .. band, group, id)
redis.call('XDEL', base .. 'ready:' .. band, id)
redis.call('HSET', P .. 'failed', ARGV[6], ARGV[7])
redis.call('ZADD', P .. 'failed:index', ARGV[8], ARGV[6])
return 1
