-- KEYS: the failed store's records and index, the queue's bands and delayed keys,
-- wake:sent, then on one server the queues set.
-- ARGV: failed_id, now, queue, band, attempts, due, json, wake channel.
-- needs: push_lib
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
if KEYS[6] then
  index_whole(base_of_bands(KEYS[3]), redis.call('SADD', KEYS[6], ARGV[3]))
end
push(KEYS[3], KEYS[4], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[2]), {})
wake(KEYS[5], ARGV[8])
index_flush()
return 1
