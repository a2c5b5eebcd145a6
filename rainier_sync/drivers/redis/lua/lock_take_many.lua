-- Up to n starts from a sliding window at once. KEYS: the window's sorted set,
-- whose members are batches of starts: "<unique>:<count>" ("<unique>" alone is one
-- start), scored by the time they count from.
-- ARGV: now, per (seconds), limit, n, the batch's stamp, a unique member, keep (ms), rooms.
-- Returns {taken, room, room, ...}: when the window is left full, the seconds until
-- each of its next rooms (at most `rooms` of them).
local now, per, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n, most = tonumber(ARGV[4]), tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - per)
local function count(member)
  return tonumber(string.match(member, ':(%d+)$')) or 1
end
local batches = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local held = 0
for i = 1, #batches, 2 do
  held = held + count(batches[i])
end
local taken = math.max(0, math.min(n, limit - held))
if taken > 0 then
  redis.call('ZADD', KEYS[1], ARGV[5], ARGV[6] .. ':' .. taken)
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  held = held + taken
  batches = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
end
local reply = {taken}
local skip = held - limit
if skip < 0 then
  return reply
end
for i = 1, #batches, 2 do
  local c = count(batches[i])
  if skip >= c then
    skip = skip - c
  else
    c = c - skip
    skip = 0
    local room = tostring(math.max(0, tonumber(batches[i + 1]) + per - now))
    for _ = 1, c do
      if #reply > most then
        return reply
      end
      reply[#reply + 1] = room
    end
  end
end
return reply
