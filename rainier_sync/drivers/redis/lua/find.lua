-- KEYS: the queue's bands, delayed and reserved keys.
-- ARGV: needle, phase, band, pos, budget, needle2, id
-- Look for the job ``id``. Where the queue's id index holds every job of it
-- (lua/ids.lua), one look there answers. Otherwise at most ``budget`` jobs per
-- call: the reservations, then the delayed set, then each band's entries
-- (``phase`` and ``band``, ``pos`` say where the last call stopped),
-- each recorded in the index on the way; a call that reaches the end marks the
-- index whole. ``needle`` is how an envelope of that id starts ('{"id":"...'',
-- as the driver writes them; ``needle2`` as ASCII JSON spells it, or ''); a hit
-- is a candidate the client reads.
-- Returns {'found', phase, band, pos, item} (item as browse.lua gives it, pos
-- past it), {'more', phase, band, pos}, or {'end'}.
-- needs: held ids
local needle, id = ARGV[1], ARGV[7]
local phase, band, pos, budget, needle2 = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local keys = {bands = KEYS[1], delayed = KEYS[2], reserved = KEYS[3]}
local chunk = 500
local looked = 0
local base = base_of_bands(keys.bands)
local index = ids_key(base)

if phase == 'done' then
  return {'end'}
end
local whole = redis.call('EXISTS', base .. 'ids:whole') == 1
if phase == 'reserved' and pos == '0' and whole then
  local at = redis.call('HGET', index, id)
  if at then
    local kind, b, where = string.match(at, '^(%a)|([^|]*)|?(.*)$')
    if kind == 's' then
      local found = redis.call('XRANGE', stream_of(keys.bands, b), where, where)
      if found[1] and id_of(body_of(found[1][2])) == id then
        local deadline = redis.call('ZSCORE', keys.reserved, held(b, where))
        if deadline then
          return {'found', 'done', '', '0', {'r', b, where, deadline, found[1][2]}}
        end
        return {'found', 'done', '', '0', {'s', b, where, found[1][2]}}
      end
    elseif kind == 'd' then
      -- the members due at that score: rarely more than one
      local first = 0
      while true do
        local got = redis.call('ZRANGEBYSCORE', keys.delayed, b, b, 'WITHSCORES', 'LIMIT', first, chunk)
        for k = 1, #got, 2 do
          local member = got[k]
          if id_of(envelope_of(member)) == id then
            return {'found', 'done', '', '0', {'d', member, got[k + 1]}}
          end
        end
        if #got / 2 < chunk then
          break
        end
        first = first + chunk
      end
    end
  end
  if redis.call('SISMEMBER', base .. 'ids:dup', id) == 1 then
    -- a second job of this id may be queued where the index does not point: read
    -- the queue (from position '00', which is 0 but does not look in the index)
    return {'more', 'reserved', '', '00'}
  end
  return {'end'}
end
if phase == 'reserved' and pos == '0' then
  redis.call('SET', base .. 'ids:scan', '1')
end

-- Whether ``text`` is an envelope of that id.
local function has(text)
  if string.sub(text, 1, #needle) == needle then
    return true
  end
  return needle2 ~= '' and string.sub(text, 1, #needle2) == needle2
end

-- Record a job this call passes in the index, unless the index knows that id
-- (a later job of it put it there); true, for use in a condition.
local function backfill(body, at)
  local job = id_of(body)
  if job then
    redis.call('HSETNX', index, job, at)
  end
  return true
end

-- The last call of a search that read every job: the index now holds each.
-- (unless a delayed job moved or a second job of an id came meanwhile, which
-- took ``ids:scan`` away); a search for a second job of an id that found none
-- leaves the id no longer marked.
local function finished()
  if whole then
    redis.call('SREM', base .. 'ids:dup', id)
  elseif redis.call('DEL', base .. 'ids:scan') == 1 then
    redis.call('SET', base .. 'ids:whole', '1')
  end
  return {'end'}
end

if phase == 'reserved' or phase == 'delayed' then
  local key = keys[phase]
  local first = tonumber(pos)
  while looked < budget do
    local got = redis.call('ZRANGE', key, first, first + chunk - 1, 'WITHSCORES')
    for k = 1, #got, 2 do
      looked = looked + 1
      first = first + 1
      local member, score = got[k], got[k + 1]
      if phase == 'reserved' then
        local b, entry = string.match(member, '^(-?%d+)|(%S+)')
        local found = b and redis.call('XRANGE', stream_of(keys.bands, b), entry, entry) or {}
        if found[1] then
          backfill(body_of(found[1][2]), 's|' .. b .. '|' .. entry)
        end
        if found[1] and has(body_of(found[1][2])) then
          return {'found', phase, '', tostring(first), {'r', b, entry, score, found[1][2]}}
        end
      elseif backfill(envelope_of(member), 'd|' .. score) and has(envelope_of(member)) then
        return {'found', phase, '', tostring(first), {'d', member, score}}
      end
    end
    if #got / 2 < chunk then
      if phase == 'delayed' then
        phase, band, pos = 'stream', '', ''
        break
      end
      phase, first = 'delayed', 0
      key = keys[phase]
    end
  end
  if phase ~= 'stream' then
    return {'more', phase, '', tostring(first)}
  end
end

-- the bands from ``band`` on (the first when '')
while true do
  if band == '' then
    local first = redis.call('ZRANGE', keys.bands, 0, 0)
    if not first[1] then
      return finished()
    end
    band, pos = first[1], ''
  end
  local stream = stream_of(keys.bands, band)
  if pos == '' then
    pos = '-'
  end
  while true do
    if looked >= budget then
      return {'more', 'stream', band, pos}
    end
    local want = math.min(chunk, budget - looked)
    local got = redis.call('XRANGE', stream, pos, '+', 'COUNT', want)
    for _, e in ipairs(got) do
      looked = looked + 1
      pos = '(' .. e[1]
      backfill(body_of(e[2]), 's|' .. band .. '|' .. e[1])
      if has(body_of(e[2])) then
        local deadline = redis.call('ZSCORE', keys.reserved, held(band, e[1]))
        if deadline then
          return {'found', 'stream', band, pos, {'r', band, e[1], deadline, e[2]}}
        end
        return {'found', 'stream', band, pos, {'s', band, e[1], e[2]}}
      end
    end
    if #got < want then
      break
    end
  end
  local after = redis.call('ZRANGEBYSCORE', keys.bands, '(' .. band, '+inf', 'LIMIT', 0, 1)
  if not after[1] then
    return finished()
  end
  band, pos = after[1], ''
end
