-- One job (a single dispatch). KEYS: the queue's bands and delayed keys, wake:sent,
-- then on one server the queues set (on Redis Cluster the client adds the queue to it).
-- ARGV: now, queue, band, attempts, due, json, wake channel.
-- needs: push_lib
if KEYS[4] then
  index_whole(base_of_bands(KEYS[1]), redis.call('SADD', KEYS[4], ARGV[2]))
end
push(KEYS[1], KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[1]), {})
wake(KEYS[3], ARGV[7])
index_flush()
return 1
