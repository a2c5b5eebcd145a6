-- ARGV: prefix, now, failed_id, queue, band, attempts, due, json
-- needs: push_lib
local P = ARGV[1]
if redis.call('HDEL', P .. 'failed', ARGV[3]) == 0 then
  return 0
end
redis.call('ZREM', P .. 'failed:index', ARGV[3])
push(P, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[2]), {})
wake(P)
return 1
