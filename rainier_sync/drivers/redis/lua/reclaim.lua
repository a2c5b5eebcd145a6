-- ARGV: prefix, group, consumer, now, min_idle_ms, batch, forget_consumer_ms
-- Lapsed reservations (by the client's clock) go back on their stream with one
-- more attempt counted. Then XAUTOCLAIM sweeps for pending entries with no
-- reservation on record that Redis has seen idle for longer than a reservation.
-- needs: push_lib held
local P, group, consumer, now_s = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local min_idle, batch, forget = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local n = 0
for _, q in ipairs(redis.call('SMEMBERS', P .. 'queues')) do
  local base = P .. q .. ':'
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', base .. 'reserved', '-inf', now_s, 'LIMIT', 0, batch)) do
    redis.call('ZREM', base .. 'reserved', m)
    local band, id = string.match(m, '^(-?%d+)|(%S+)')
    if band then
      n = n + requeue(P, group, q, band, id)
    end
  end
  for _, band in ipairs(redis.call('ZRANGE', base .. 'bands', 0, -1)) do
    local stream = base .. 'ready:' .. band
    local cursor = '0-0'
    for _ = 1, 10 do
      local claimed = redis.pcall('XAUTOCLAIM', stream, group, consumer, min_idle, cursor, 'COUNT', batch, 'JUSTID')
      if type(claimed) ~= 'table' or claimed.err then
        break
      end
      for _, id in ipairs(claimed[2]) do
        if not redis.call('ZSCORE', base .. 'reserved', held(band, id)) then
          n = n + requeue(P, group, q, band, id)
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
        for k = 1, #c, 2 do
          info[c[k]] = c[k + 1]
        end
        if info['name'] ~= consumer and info['pending'] == 0 and (info['idle'] or 0) > forget then
          redis.call('XGROUP', 'DELCONSUMER', stream, group, info['name'])
        end
      end
    end
  end
end
if n > 0 then
  wake(P)
end
return n
