-- ARGV: prefix, failed_id
if redis.call('HDEL', ARGV[1] .. 'failed', ARGV[2]) == 0 then
  return 0
end
redis.call('ZREM', ARGV[1] .. 'failed:index', ARGV[2])
return 1
