-- KEYS: the failed store's records and index. ARGV: failed_id.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
