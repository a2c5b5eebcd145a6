-- KEYS: the entry's stream, its queue's reserved key, the failed store's records and index.
-- ARGV: group, band, id, failed_id, record, failed_at, held.
-- With ``held`` = '1', only a reservation still on record is failed: one that lapsed
-- and was put back is the requeued job's to decide, and a failed copy beside it
-- would let a retry queue the job twice.
-- needs: held ids
local stream, reserved = KEYS[1], KEYS[2]
local group, band, id = ARGV[1], ARGV[2], ARGV[3]
if redis.call('ZREM', reserved, held(band, id)) == 0 and ARGV[7] == '1' then
  return 0
end
local found = redis.call('XRANGE', stream, id, id)
local job = found[1] and id_of(body_of(found[1][2]))
if job then
  unindex(base_of_reserved(reserved), {job}, band, {id})
end
redis.call('XACK', stream, group, id)
redis.call('XDEL', stream, id)
redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[4])
return 1
