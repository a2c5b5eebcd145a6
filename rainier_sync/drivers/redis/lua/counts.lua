-- KEYS: the queue's bands, delayed and reserved keys. ARGV: now -> {ready, delayed, reserved}
-- needs: stream
local in_streams = 0
for _, band in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  in_streams = in_streams + redis.call('XLEN', stream_of(KEYS[1], band))
end
local reserved = redis.call('ZCARD', KEYS[3])
local due = redis.call('ZCOUNT', KEYS[2], '-inf', ARGV[1])
local delayed = redis.call('ZCARD', KEYS[2]) - due
return {in_streams - reserved + due, delayed, reserved}
