-- A sliding window of starts. KEYS: the window's sorted set.
-- ARGV: now, per (seconds), limit, a unique member for this start, keep (ms).
-- Returns '0' when a start was counted, else the seconds until the oldest
-- start inside the window leaves it.
local now, per, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - per)
local held = redis.call('ZCARD', KEYS[1])
if held < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return '0'
end
local oldest = redis.call('ZRANGE', KEYS[1], held - limit, held - limit, 'WITHSCORES')
return tostring(math.max(0, tonumber(oldest[2]) + per - now))
