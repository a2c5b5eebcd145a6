-- Count one event. KEYS: the count's hash. ARGV: now, window (seconds), keep (ms).
-- The count lapses `window` seconds after its latest event (the library's clock).
local now = tonumber(ARGV[1])
local held = redis.call('HMGET', KEYS[1], 'n', 'until')
local n = 1
if held[1] and tonumber(held[2]) > now then
  n = tonumber(held[1]) + 1
end
redis.call('HSET', KEYS[1], 'n', n, 'until', tostring(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return n
