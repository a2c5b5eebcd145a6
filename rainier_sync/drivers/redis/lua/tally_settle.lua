-- Settle one member of a tally, once. KEYS: the tally's hash, its members' set.
-- ARGV: member, field, keep (ms). Returns {new (0/1), HGETALL...}.
local new = redis.call('SADD', KEYS[2], ARGV[1])
if new == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  redis.call('HINCRBY', KEYS[1], 'pending', -1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local out = {new}
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = v
end
return out
