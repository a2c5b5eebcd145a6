-- ARGV: prefix, group, consumer, now, deadline, limit, promote_batch, queues...
-- Promotes due delayed jobs, then reads up to ``limit`` entries, queues in the
-- order given and bands lowest first, recording each reservation's deadline.
-- needs: held
local P, group, consumer = ARGV[1], ARGV[2], ARGV[3]
local now_s, deadline = ARGV[4], ARGV[5]
local left, promote = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('DEL', P .. 'wake:sent')
local out = {}
for i = 8, #ARGV do
  local q = ARGV[i]
  local base = P .. q .. ':'
  local due = redis.call('ZRANGEBYSCORE', base .. 'delayed', '-inf', now_s, 'LIMIT', 0, promote)
  local seen = {}
  for _, m in ipairs(due) do
    redis.call('ZREM', base .. 'delayed', m)
    local band, att, body = string.match(m, '^(-?%d+)|(%d+)|(.*)$')
    if not band then
      -- not written by this driver: surface it as an unreadable entry rather than drop it
      band, att, body = '0', '0', m
    end
    if not seen[band] then
      redis.call('ZADD', base .. 'bands', band, band)
      seen[band] = true
    end
    redis.call('XADD', base .. 'ready:' .. band, '*', 'j', body, 'a', att)
  end
  if left > 0 then
    for _, band in ipairs(redis.call('ZRANGE', base .. 'bands', 0, -1)) do
      local stream = base .. 'ready:' .. band
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
            redis.call('ZADD', base .. 'reserved', unpack(deadlines))
            deadlines = {}
          end
        end
        if #deadlines > 0 then
          redis.call('ZADD', base .. 'reserved', unpack(deadlines))
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
