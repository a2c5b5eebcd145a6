-- Settle several members of one tally, each once. KEYS: the tally's hash, its members' set.
-- ARGV: keep (ms), then member, field pairs. Returns {n, new (0/1) for each pair..., HGETALL...}.
-- One SMISMEMBER and one SADD for all the members, one HINCRBY per count changed.
local n = (#ARGV - 1) / 2
local members = {}
for i = 1, n do
  members[i] = ARGV[2 * i]
end
local seen = redis.call('SMISMEMBER', KEYS[2], unpack(members))
local out = {n}
local fresh = {}
local added = {}
local deltas = {}
for i = 1, n do
  local member = members[i]
  local new = 0
  if seen[i] == 0 and not added[member] then
    added[member] = true
    fresh[#fresh + 1] = member
    local field = ARGV[2 * i + 1]
    deltas[field] = (deltas[field] or 0) + 1
    new = 1
  end
  out[#out + 1] = new
end
if #fresh > 0 then
  redis.call('SADD', KEYS[2], unpack(fresh))
  for field, d in pairs(deltas) do
    redis.call('HINCRBY', KEYS[1], field, d)
  end
  redis.call('HINCRBY', KEYS[1], 'pending', -#fresh)
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = v
end
return out
