-- The id index, ``P<queue>:ids``: each queued job's id -> where it is, "s|band|entry"
-- (a band's stream entry, ready or reserved) or "d|due" (the delayed set, at that
-- score). Every script that puts a job somewhere records it; the ones that take an
-- entry away forget it only where it still points there (another job of the same
-- id may have been queued since). ``P<queue>:ids:whole`` says the index holds every
-- job of the queue: set by the push that brings the queue into being, or by a
-- ``find`` that has read every job of it once while nothing moved a delayed job
-- (``P<queue>:ids:scan``, set when the search began, still there at its end).
-- needs: stream envelope
local function ids_key(base)
  return base .. 'ids'
end
-- The key base of a queue from its ``reserved`` key (lua/stream.lua: from its ``bands`` key).
local function base_of_reserved(reserved)
  return string.sub(reserved, 1, -9)
end
-- The id of an envelope as the driver writes it ('{"id":"...'), or nil.
local function id_of(body)
  local plain = string.match(body, '^{"id":"([^"\\]*)"')
  if plain then
    return plain
  end
  if string.sub(body, 1, 7) ~= '{"id":"' then
    return nil
  end
  -- the id holds a JSON escape: find its closing quote, then let cjson read it
  local q = string_end(body, 8)
  if not q then
    return nil
  end
  local ok, id = pcall(cjson.decode, string.sub(body, 7, q))
  if ok and type(id) == 'string' then
    return id
  end
  return nil
end
-- The queue's first job (``added``: SADD of its name to the queues set answered 1):
-- there is nothing of it the index could lack.
local function index_whole(base, added)
  if added == 1 then
    redis.call('SET', base .. 'ids:whole', '1')
  end
end
-- What this script recorded, written by ``index_flush`` in one HSET per queue:
-- every script that indexes calls it before it returns. ``fresh`` holds jobs
-- placed anew (pushed, released, retried), ``moved`` jobs that changed place
-- (promoted, requeued), whose ids the index already holds.
local index_pending = {fresh = {}, moved = {}}
local function index_at(base, body, at, how)
  local id = id_of(body)
  if id then
    local of = index_pending[how]
    local list = of[base]
    if not list then
      list = {}
      of[base] = list
    end
    list[#list + 1] = id
    list[#list + 1] = at
  end
end
local function index_entry(base, body, band, entry, how)
  index_at(base, body, 's|' .. band .. '|' .. entry, how or 'fresh')
end
local function index_delayed(base, body, due)
  index_at(base, body, 'd|' .. due, 'fresh')
end
-- A job placed anew whose id the index already held is a second job of that id
-- (a dispatch sent again): the index points at the new one only, so the ids of
-- that HSET go in ``P<queue>:ids:dup``, and a look that misses one of them reads
-- the queue instead (lua/find.lua). A search in progress cannot mark the index
-- whole either: it may have passed the other job already.
local function index_flush()
  for how, of in pairs(index_pending) do
    for base, list in pairs(of) do
      local key = ids_key(base)
      for i = 1, #list, 2000 do
        local last = math.min(i + 1999, #list)
        local added = redis.call('HSET', key, unpack(list, i, last))
        if how == 'fresh' and added < (last - i + 1) / 2 then
          local ids = {}
          for j = i, last, 2 do
            ids[#ids + 1] = list[j]
          end
          redis.call('SADD', base .. 'ids:dup', unpack(ids))
          redis.call('DEL', base .. 'ids:scan')
        end
      end
    end
  end
  index_pending = {fresh = {}, moved = {}}
end
-- Forget each ``ids[j]`` where it still points at ``band``'s ``entries[j]``.
local function unindex(base, ids, band, entries)
  local key = ids_key(base)
  local at = redis.call('HMGET', key, unpack(ids))
  local gone = {}
  for j = 1, #ids do
    if at[j] == 's|' .. band .. '|' .. entries[j] then
      gone[#gone + 1] = ids[j]
    end
  end
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
end
