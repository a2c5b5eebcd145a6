-- Settle several members of one tally, each once. KEYS: the tally's hash, its members' set.
-- ARGV: keep (ms), then member, field pairs. Returns {n, new (0/1) for each pair..., HGETALL...}.
local out = {(#ARGV - 1) / 2}
for i = 2, #ARGV, 2 do
  local new = redis.call('SADD', KEYS[2], ARGV[i])
  if new == 1 then
    redis.call('HINCRBY', KEYS[1], ARGV[i + 1], 1)
    redis.call('HINCRBY', KEYS[1], 'pending', -1)
  end
  out[#out + 1] = new
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = v
end
return out
