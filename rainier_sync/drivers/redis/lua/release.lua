-- KEYS: the entry's stream, then its queue's reserved, bands and delayed keys, wake:sent.
-- ARGV: group, band, id, now, due, attempts, json, wake channel.
-- needs: push_lib held
local stream, reserved = KEYS[1], KEYS[2]
local group, band, id = ARGV[1], ARGV[2], ARGV[3]
if redis.call('ZREM', reserved, held(band, id)) == 0 then
  return 0
end
redis.call('XACK', stream, group, id)
redis.call('XDEL', stream, id)
local job = id_of(ARGV[7])
if job then
  unindex(base_of_reserved(reserved), {job}, band, {id})
end
push(KEYS[3], KEYS[4], band, ARGV[6], ARGV[5], ARGV[7], tonumber(ARGV[4]), {})
wake(KEYS[5], ARGV[8])
index_flush()
return 1
