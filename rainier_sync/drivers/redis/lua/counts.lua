-- ARGV: prefix, now, queue -> {ready, delayed, reserved}
local base = ARGV[1] .. ARGV[3] .. ':'
local in_streams = 0
for _, band in ipairs(redis.call('ZRANGE', base .. 'bands', 0, -1)) do
  in_streams = in_streams + redis.call('XLEN', base .. 'ready:' .. band)
end
local reserved = redis.call('ZCARD', base .. 'reserved')
local due = redis.call('ZCOUNT', base .. 'delayed', '-inf', ARGV[2])
local delayed = redis.call('ZCARD', base .. 'delayed') - due
return {in_streams - reserved + due, delayed, reserved}
