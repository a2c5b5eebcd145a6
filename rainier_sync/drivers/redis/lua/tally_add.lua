-- Add to a tally's counts. KEYS: the tally's hash, its members' set.
-- ARGV: keep (ms), then field, n pairs. Returns every count (HGETALL).
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return redis.call('HGETALL', KEYS[1])
