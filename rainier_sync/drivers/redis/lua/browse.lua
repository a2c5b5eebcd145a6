-- ARGV: prefix, group, queue, state, now, offset, limit, needle, bound, promote, needle2
-- A page of one state's jobs, read in the server so that only the page crosses
-- the wire: ``ready`` band by band, lowest first, each band's entries not yet
-- delivered to the group and then the due delayed jobs the next reserve moves
-- onto it (the first ``promote`` by due time; any more after every band);
-- ``delayed`` by due time; ``reserved`` by deadline. ``needle`` (lowered, as
-- JSON text; '' for none; ``needle2`` the same escaped as ASCII, or '') keeps
-- the jobs whose envelope NAME contains it, and then at most ``bound`` jobs are
-- looked at.
-- Returns {looked at, 1 when the bound stopped the walk, items...}, an item being
-- {'s', band, id, fields} (a stream entry), {'d', member, due} (a delayed job) or
-- {'r', band, id, deadline, fields or false} (a reservation).
local P, group, q, state = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, skip, limit = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local needle, bound, promote, needle2 = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11]
local base = P .. q .. ':'
local filtered = needle ~= ''
local chunk = 500
local out, looked, stopped = {}, 0, 0

local function name_of(body)
  local s = string.find(body, '"name":"', 1, true)
  if not s then
    return nil
  end
  local i = s + 8
  local j = i
  while true do
    local k = string.find(body, '"', j, true)
    if not k then
      return nil
    end
    local b = k - 1
    while b >= i and string.byte(body, b) == 92 do
      b = b - 1
    end
    if (k - 1 - b) % 2 == 0 then
      return string.lower(string.sub(body, i, k - 1))
    end
    j = k + 1
  end
end

local function body_of(fields)
  for k = 1, #fields, 2 do
    if fields[k] == 'j' then
      return fields[k + 1]
    end
  end
  return ''
end

-- Offer one job to the page; true once the walk is over (page full, or the bound met).
local function offer(item, body)
  looked = looked + 1
  if filtered then
    local name = name_of(body)
    local hit = name and (string.find(name, needle, 1, true) or (needle2 ~= '' and string.find(name, needle2, 1, true)))
    if not hit then
      if looked >= bound then
        stopped = 1
        return true
      end
      return false
    end
  end
  if skip > 0 then
    skip = skip - 1
  else
    out[#out + 1] = item
  end
  if #out >= limit then
    return true
  end
  if filtered and looked >= bound then
    stopped = 1
    return true
  end
  return false
end

-- How many to fetch next: the rest of the page (and what is skipped) unfiltered, a chunk filtered.
local function wanted()
  if filtered then
    return math.min(chunk, bound - looked)
  end
  return skip + limit - #out
end

local function walk_stream(band, count)
  local stream = base .. 'ready:' .. band
  local from = '-'
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) == 'table' and not groups.err then
    for _, g in ipairs(groups) do
      local info = {}
      for k = 1, #g, 2 do
        info[g[k]] = g[k + 1]
      end
      if info['name'] == group then
        from = '(' .. info['last-delivered-id']
        count = count - info['pending']
      end
    end
  end
  if not filtered and skip >= count then
    skip = skip - math.max(0, count)
    return false
  end
  while true do
    local want = wanted()
    local got = redis.call('XRANGE', stream, from, '+', 'COUNT', want)
    for _, e in ipairs(got) do
      if offer({'s', band, e[1], e[2]}, filtered and body_of(e[2]) or '') then
        return true
      end
    end
    if #got < want then
      return false
    end
    from = '(' .. got[#got][1]
  end
end

local function walk_list(members)
  for _, m in ipairs(members) do
    if offer({'d', m[1], m[2]}, filtered and string.match(m[1], '^-?%d+|%d+|(.*)$') or m[1]) then
      return true
    end
  end
  return false
end

-- The members of ``key`` scored from ``min`` to ``max``, from the ``first``'th on;
-- ``each(member, score)`` offers one and says whether the walk is over.
local function walk_zset(key, min, max, first, each)
  if not filtered then
    local count = redis.call('ZCOUNT', key, min, max) - first
    if skip >= count then
      skip = skip - math.max(0, count)
      return false
    end
    first = first + skip
    skip = 0
  end
  while true do
    local want = wanted()
    local got = redis.call('ZRANGEBYSCORE', key, min, max, 'WITHSCORES', 'LIMIT', first, want)
    for k = 1, #got, 2 do
      if each(got[k], got[k + 1]) then
        return true
      end
    end
    if #got / 2 < want then
      return false
    end
    first = first + want
  end
end

local function delayed_job(member, due)
  return offer({'d', member, due}, filtered and string.match(member, '^-?%d+|%d+|(.*)$') or member)
end

if limit <= 0 then
  return {0, 0}
end

if state == 'ready' then
  local due = redis.call('ZRANGEBYSCORE', base .. 'delayed', '-inf', now, 'WITHSCORES', 'LIMIT', 0, promote)
  local by_band, bands, numbers = {}, {}, {}
  for _, band in ipairs(redis.call('ZRANGE', base .. 'bands', 0, -1)) do
    by_band[band] = {}
    bands[#bands + 1] = band
  end
  for k = 1, #due, 2 do
    local band = string.match(due[k], '^(-?%d+)|%d+|') or '0'
    if not by_band[band] then
      by_band[band] = {}
      bands[#bands + 1] = band
    end
    local list = by_band[band]
    list[#list + 1] = {due[k], due[k + 1]}
  end
  for _, band in ipairs(bands) do
    numbers[band] = tonumber(band)
  end
  table.sort(bands, function(a, b) return numbers[a] < numbers[b] end)
  local over = false
  for _, band in ipairs(bands) do
    local list = by_band[band]
    over = walk_stream(band, redis.call('XLEN', base .. 'ready:' .. band))
    if over then
      break
    end
    if not filtered and skip >= #list then
      skip = skip - #list
    else
      over = walk_list(list)
      if over then
        break
      end
    end
  end
  if not over and #due / 2 >= promote then
    walk_zset(base .. 'delayed', '-inf', now, promote, delayed_job)
  end
elseif state == 'delayed' then
  walk_zset(base .. 'delayed', '(' .. now, '+inf', 0, delayed_job)
else
  walk_zset(base .. 'reserved', '-inf', '+inf', 0, function(member, deadline)
    local band, id = string.match(member, '^(-?%d+)|(%S+)')
    local found = band and redis.call('XRANGE', base .. 'ready:' .. band, id, id) or {}
    local fields = found[1] and found[1][2] or false
    return offer({'r', band or '0', id or member, deadline, fields}, filtered and fields and body_of(fields) or '')
  end)
end
local reply = {looked, stopped}
for _, item in ipairs(out) do
  reply[#reply + 1] = item
end
return reply
