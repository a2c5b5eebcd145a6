-- KEYS: wake:sent, then per queue its bands, delayed and reserved keys.
-- ARGV: group, consumer, now, deadline, limit, promote_batch, then the queues' names.
-- Promotes due delayed jobs, then reads up to ``limit`` entries, queues in the
-- order given and bands lowest first, recording each reservation's deadline.
-- needs: held ids
local group, consumer = ARGV[1], ARGV[2]
local now_s, deadline = ARGV[3], ARGV[4]
local left, promote = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('DEL', KEYS[1])
local out = {}
for i = 7, #ARGV do
  local q = ARGV[i]
  local k = 2 + 3 * (i - 7)
  local bands, delayed, reserved = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now_s, 'LIMIT', 0, promote)
  local seen = {}
  for _, m in ipairs(due) do
    redis.call('ZREM', delayed, m)
    local band, att, body = string.match(m, '^(-?%d+)|(%d+)|(.*)$')
    if not band then
      -- not written by this driver: surface it as an unreadable entry rather than drop it
      band, att, body = '0', '0', m
    end
    if not seen[band] then
      redis.call('ZADD', bands, band, band)
      seen[band] = true
    end
    index_entry(base_of_bands(bands), body, band, redis.call('XADD', stream_of(bands, band), '*', 'j', body, 'a', att), 'moved')
  end
  if due[1] then
    -- a search reading the delayed set by position would skip as many as left it;
    -- written now, before a read below can fail
    redis.call('DEL', base_of_bands(bands) .. 'ids:scan')
    index_flush()
  end
  if left > 0 then
    for _, band in ipairs(redis.call('ZRANGE', bands, 0, -1)) do
      local stream = stream_of(bands, band)
      local got = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', left, 'STREAMS', stream, '>')
      if type(got) == 'table' and got.err then
        if not string.find(got.err, 'NOGROUP') then
          return redis.error_reply(got.err)
        end
        redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
        got = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', left, 'STREAMS', stream, '>')
      end
      if got then
        local entries = got[1][2]
        local deadlines = {}
        for _, e in ipairs(entries) do
          deadlines[#deadlines + 1] = deadline
          deadlines[#deadlines + 1] = held(band, e[1])
          -- in slices: unpack() stops near 8000 values, and an error here would leave
          -- the entries just read pending with no reservation on record
          if #deadlines >= 1000 then
            redis.call('ZADD', reserved, unpack(deadlines))
            deadlines = {}
          end
        end
        if #deadlines > 0 then
          redis.call('ZADD', reserved, unpack(deadlines))
        end
        -- the entries as XREADGROUP gave them: the client's parser takes them apart
        out[#out + 1] = {q, band, entries}
        left = left - #entries
        if left <= 0 then
          break
        end
      end
    end
  end
end
return out
