-- KEYS: wake:sent, then per queue its bands and reserved keys.
-- ARGV: group, consumer, now, min_idle_ms, batch, forget_consumer_ms, wake channel.
-- Lapsed reservations (by the client's clock) go back on their stream with one
-- more attempt counted. Then XAUTOCLAIM sweeps for pending entries with no
-- reservation on record that Redis has seen idle for longer than a reservation.
-- needs: push_lib held
local group, consumer, now_s = ARGV[1], ARGV[2], ARGV[3]
local min_idle, batch, forget = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local n = 0
for k = 2, #KEYS, 2 do
  local bands, reserved = KEYS[k], KEYS[k + 1]
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', reserved, '-inf', now_s, 'LIMIT', 0, batch)) do
    redis.call('ZREM', reserved, m)
    local band, id = string.match(m, '^(-?%d+)|(%S+)')
    if band then
      n = n + requeue(bands, band, group, id)
    end
  end
  for _, band in ipairs(redis.call('ZRANGE', bands, 0, -1)) do
    local stream = stream_of(bands, band)
    local cursor = '0-0'
    for _ = 1, 10 do
      local claimed = redis.pcall('XAUTOCLAIM', stream, group, consumer, min_idle, cursor, 'COUNT', batch, 'JUSTID')
      if type(claimed) ~= 'table' or claimed.err then
        break
      end
      for _, id in ipairs(claimed[2]) do
        if not redis.call('ZSCORE', reserved, held(band, id)) then
          n = n + requeue(bands, band, group, id)
        end
      end
      cursor = claimed[1]
      if cursor == '0-0' then
        break
      end
    end
    -- consumers of dead worker processes: nothing pending, silent for ten reservations
    local consumers = redis.pcall('XINFO', 'CONSUMERS', stream, group)
    if type(consumers) == 'table' and not consumers.err then
      for _, c in ipairs(consumers) do
        local info = {}
        for j = 1, #c, 2 do
          info[c[j]] = c[j + 1]
        end
        if info['name'] ~= consumer and info['pending'] == 0 and (info['idle'] or 0) > forget then
          redis.call('XGROUP', 'DELCONSUMER', stream, group, info['name'])
        end
      end
    end
  end
end
if n > 0 then
  wake(KEYS[1], ARGV[7])
end
index_flush()
return n
