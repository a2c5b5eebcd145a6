-- Shared by the scripts that put a job (back) on a queue. A job due later than
-- ``now`` waits in the delayed set as "band|attempts|json"; a due one is added
-- to its band's stream. ``wake`` publishes once until some worker reserves
-- again, so a burst of pushes costs idle workers one wake-up, not thousands.
-- needs: ids
local function push(bands, delayed, band, att, due, body, now, seen)
  if tonumber(due) > now then
    redis.call('ZADD', delayed, due, band .. '|' .. att .. '|' .. body)
    index_delayed(base_of_bands(bands), body, due)
  else
    if not seen[bands .. '|' .. band] then
      redis.call('ZADD', bands, band, band)
      seen[bands .. '|' .. band] = true
    end
    index_entry(base_of_bands(bands), body, band, redis.call('XADD', stream_of(bands, band), '*', 'j', body, 'a', att))
  end
end
local function wake(sent, channel)
  if redis.call('SET', sent, '1', 'NX') then
    redis.call('PUBLISH', channel, '1')
  end
end
local function requeue(bands, band, group, id)
  local stream = stream_of(bands, band)
  local found = redis.call('XRANGE', stream, id, id)
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  if not found[1] then
    return 0
  end
  local fields, bumped, body = {}, false, ''
  local old = found[1][2]
  for k = 1, #old, 2 do
    fields[#fields + 1] = old[k]
    if old[k] == 'a' then
      -- a count this driver did not write stays as it is, for the reserve to turn down
      local counted = string.match(old[k + 1], '^%d+$') and #old[k + 1] <= 9
      fields[#fields + 1] = counted and tostring(tonumber(old[k + 1]) + 1) or old[k + 1]
      bumped = true
    else
      fields[#fields + 1] = old[k + 1]
      if old[k] == 'j' then
        body = old[k + 1]
      end
    end
  end
  if not bumped then
    fields[#fields + 1] = 'a'
    fields[#fields + 1] = '1'
  end
  index_entry(base_of_bands(bands), body, band, redis.call('XADD', stream, '*', unpack(fields)), 'moved')
  return 1
end
