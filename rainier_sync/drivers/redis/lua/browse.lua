-- KEYS: the queue's bands, delayed and reserved keys.
-- ARGV: group, state, now, skip, want, needle, needle2, budget, promote, seg, band, pos
-- Walks one state's jobs in order, from the cursor (seg, band, pos; all '' to
-- start) on, looking at no more than ``budget`` of them: ``ready`` band by band,
-- lowest first, each band's entries not yet delivered to the group ('stream')
-- and then the due delayed jobs the next reserve moves onto it ('due': the first
-- ``promote`` due, by due time), then any more due ones ('tail'); ``delayed`` by
-- due time and ``reserved`` by deadline ('z'). Skips ``skip`` jobs, then takes
-- up to ``want``. ``needle`` (lowered, as JSON text; '' for none; ``needle2`` the
-- same escaped as ASCII, or '') keeps only the jobs whose envelope NAME contains it.
-- Returns {looked at, skip left, seg, band, pos, items...}, seg 'end' once the
-- state has no more; an item is {'s', band, id, fields} (a stream entry),
-- {'d', member, due} (a delayed job) or {'r', band, id, deadline, fields or false}.
-- needs: stream envelope
local group, state = ARGV[1], ARGV[2]
local now, skip, want = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local needle, needle2, budget, promote = ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local seg, band, pos = ARGV[10], ARGV[11], ARGV[12]
local bands_key, delayed_key, reserved_key = KEYS[1], KEYS[2], KEYS[3]
local filtered = needle ~= ''
local out, looked, stop = {}, 0, false

local function name_of(body)
  local s = string.find(body, '"name":"', 1, true)
  if not s then
    return nil
  end
  local k = string_end(body, s + 8)
  return k and string.lower(string.sub(body, s + 8, k - 1))
end

-- One job of the walk (``body`` read only when filtered); true once the walk stops here.
local function offer(item, body)
  looked = looked + 1
  local keep = true
  if filtered then
    local name = name_of(body())
    keep = name and (string.find(name, needle, 1, true) or (needle2 ~= '' and string.find(name, needle2, 1, true)))
  end
  if keep then
    if skip > 0 then
      skip = skip - 1
    else
      out[#out + 1] = item
    end
  end
  stop = #out >= want or looked >= budget
  return stop
end

-- How many to fetch next.
local function size()
  local n = math.min(500, budget - looked)
  if not filtered then
    n = math.min(n, skip + want - #out)
  end
  return n
end

local function id_before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if tonumber(am) ~= tonumber(bm) then
    return tonumber(am) < tonumber(bm)
  end
  return tonumber(as) < tonumber(bs)
end

-- A band's entries not yet delivered, after ``after`` (an entry id) when given.
local function walk_stream(b, after)
  seg, band, pos = 'stream', b, after
  local stream = stream_of(bands_key, b)
  local delivered, pending = nil, 0
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) == 'table' and not groups.err then
    for _, g in ipairs(groups) do
      local info = {}
      for k = 1, #g, 2 do
        info[g[k]] = g[k + 1]
      end
      if info['name'] == group then
        delivered, pending = info['last-delivered-id'], info['pending']
      end
    end
  end
  local from = delivered and ('(' .. delivered) or '-'
  if after ~= '' and (not delivered or id_before(delivered, after)) then
    from = '(' .. after
  end
  if after == '' and not filtered then
    local count = redis.call('XLEN', stream) - pending
    if skip >= count then
      skip = skip - math.max(0, count)
      return
    end
  end
  while true do
    local n = size()
    local got = redis.call('XRANGE', stream, from, '+', 'COUNT', n)
    for _, e in ipairs(got) do
      pos = e[1]
      if offer({'s', b, e[1], e[2]}, function() return body_of(e[2]) end) then
        return
      end
    end
    if #got < n then
      return
    end
    from = '(' .. got[#got][1]
  end
end

-- The due delayed jobs of a band, from the ``first``'th on.
local function walk_due(b, list, first)
  seg, band, pos = 'due', b, tostring(first)
  if not filtered and skip >= #list - first then
    skip = skip - math.max(0, #list - first)
    pos = tostring(#list)
    return
  end
  for i = first + 1, #list do
    pos = tostring(i)
    local member = list[i][1]
    if offer({'d', member, list[i][2]}, function() return envelope_of(member) end) then
      return
    end
  end
end

-- The members of ``key`` scored from ``min`` to ``max``, from the ``first``'th on.
local function walk_zset(name, key, min, max, first, item)
  seg, band, pos = name, '', tostring(first)
  if not filtered then
    local count = redis.call('ZCOUNT', key, min, max) - first
    if skip >= count then
      skip = skip - math.max(0, count)
      pos = tostring(first + math.max(0, count))
      return
    end
    first = first + skip
    skip = 0
  end
  while true do
    local n = size()
    local got = redis.call('ZRANGEBYSCORE', key, min, max, 'WITHSCORES', 'LIMIT', first, n)
    for k = 1, #got, 2 do
      first = first + 1
      pos = tostring(first)
      if item(got[k], got[k + 1]) then
        return
      end
    end
    if #got / 2 < n then
      return
    end
  end
end

local function delayed_job(member, due)
  return offer({'d', member, due}, function() return envelope_of(member) end)
end

local function reservation(member, deadline)
  local b, id = string.match(member, '^(-?%d+)|(%S+)')
  local found = b and redis.call('XRANGE', stream_of(bands_key, b), id, id) or {}
  local fields = found[1] and found[1][2] or false
  return offer({'r', b or '0', id or member, deadline, fields}, function() return fields and body_of(fields) or '' end)
end

if want > 0 and budget > 0 then
  if state == 'ready' then
    local due = redis.call('ZRANGEBYSCORE', delayed_key, '-inf', now, 'WITHSCORES', 'LIMIT', 0, promote)
    local by_band, bands, numbers = {}, {}, {}
    for _, b in ipairs(redis.call('ZRANGE', bands_key, 0, -1)) do
      by_band[b] = {}
      bands[#bands + 1] = b
    end
    for k = 1, #due, 2 do
      local b = string.match(due[k], '^(-?%d+)|%d+|') or '0'
      if not by_band[b] then
        by_band[b] = {}
        bands[#bands + 1] = b
      end
      local list = by_band[b]
      list[#list + 1] = {due[k], due[k + 1]}
    end
    for _, b in ipairs(bands) do
      numbers[b] = tonumber(b)
    end
    table.sort(bands, function(x, y) return numbers[x] < numbers[y] end)
    local from_seg, from_band, from_pos = seg, tonumber(band), pos
    for _, b in ipairs(bands) do
      if stop or from_seg == 'tail' then
        break
      end
      if from_seg == '' or numbers[b] > from_band then
        walk_stream(b, '')
        if not stop then
          walk_due(b, by_band[b], 0)
        end
      elseif numbers[b] == from_band then
        if from_seg == 'stream' then
          walk_stream(b, from_pos)
          if not stop then
            walk_due(b, by_band[b], 0)
          end
        else
          walk_due(b, by_band[b], tonumber(from_pos))
        end
      end
    end
    if not stop and #due / 2 >= promote then
      walk_zset('tail', delayed_key, '-inf', now, from_seg == 'tail' and tonumber(from_pos) or promote, delayed_job)
    end
  elseif state == 'delayed' then
    walk_zset('z', delayed_key, '(' .. now, '+inf', seg == 'z' and tonumber(pos) or 0, delayed_job)
  else
    walk_zset('z', reserved_key, '-inf', '+inf', seg == 'z' and tonumber(pos) or 0, reservation)
  end
  if not stop then
    seg, band, pos = 'end', '', ''
  end
end
local reply = {looked, skip, seg, band, pos}
for _, item in ipairs(out) do
  reply[#reply + 1] = item
end
return reply
