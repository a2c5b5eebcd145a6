-- Undo the settle of one member of a tally. KEYS: the tally's hash, its members' set.
-- ARGV: member, field, keep (ms). Returns {there (0/1), HGETALL...}.
local there = redis.call('SREM', KEYS[2], ARGV[1])
if there == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], -1)
  redis.call('HINCRBY', KEYS[1], 'pending', 1)
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
local out = {there}
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = v
end
return out
