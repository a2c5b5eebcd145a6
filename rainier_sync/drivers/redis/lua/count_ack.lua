-- Count a round's finished jobs of batches in their tallies, then acknowledge the
-- round (as ack.lua), in one script: counted before acknowledged, so a script cut
-- short leaves a job counted but held, which its tally's members then keep from
-- counting twice when it comes again.
-- KEYS: per tally, its hash and its members' set; then per stream, the stream and
-- its queue's reserved key.
-- ARGV: group, the number of tallies, the number of streams, each stream's band;
-- then per tally: keep (ms), m, and m quadruples (member, field, stream number,
-- entry id); then per stream: n, the n entry ids of the round's other jobs and their n job ids.
-- A tally this round could finish (its pending would reach 0) is left alone, its
-- jobs neither counted nor acknowledged: returns the numbers of those tallies, for
-- the careful way, which queues the batch's callbacks.
-- needs: held ids
local group, tallies, streams = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local bands, acked, jobs, left = {}, {}, {}, {}
for s = 1, streams do
  bands[s] = ARGV[3 + s]
  acked[s] = {}
  jobs[s] = {}
end
local a = 4 + streams
for t = 1, tallies do
  local tally, set = KEYS[2 * t - 1], KEYS[2 * t]
  local keep, m = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local members = {}
  for j = 1, m do
    members[j] = ARGV[a + 4 * (j - 1)]
  end
  local seen = redis.call('SMISMEMBER', set, unpack(members))
  local fresh, added, deltas = {}, {}, {}
  for j = 1, m do
    local member = members[j]
    if seen[j] == 0 and not added[member] then
      added[member] = true
      fresh[#fresh + 1] = member
      local field = ARGV[a + 4 * (j - 1) + 1]
      deltas[field] = (deltas[field] or 0) + 1
    end
  end
  local pending = tonumber(redis.call('HGET', tally, 'pending') or '0') or 0
  if pending - #fresh > 0 then
    if #fresh > 0 then
      redis.call('SADD', set, unpack(fresh))
      for field, d in pairs(deltas) do
        redis.call('HINCRBY', tally, field, d)
      end
      redis.call('HINCRBY', tally, 'pending', -#fresh)
    end
    redis.call('PEXPIRE', tally, keep)
    redis.call('PEXPIRE', set, keep)
    for j = 1, m do
      local s = tonumber(ARGV[a + 4 * (j - 1) + 2])
      local list = acked[s]
      list[#list + 1] = ARGV[a + 4 * (j - 1) + 3]
      jobs[s][#list] = members[j]
    end
  else
    left[#left + 1] = t
  end
  a = a + 4 * m
end
local k = 2 * tallies
for s = 1, streams do
  local n, ids, of = tonumber(ARGV[a]), acked[s], jobs[s]
  for j = 1, n do
    ids[#ids + 1] = ARGV[a + j]
    of[#ids] = ARGV[a + n + j]
  end
  a = a + 1 + 2 * n
  if #ids > 0 then
    local members = {}
    local base = base_of_reserved(KEYS[k + 2 * s])
    for j = 1, #ids do
      members[j] = held(bands[s], ids[j])
    end
    unindex(base, of, bands[s], ids)
    redis.call('XACK', KEYS[k + 2 * s - 1], group, unpack(ids))
    redis.call('XDEL', KEYS[k + 2 * s - 1], unpack(ids))
    redis.call('ZREM', KEYS[k + 2 * s], unpack(members))
  end
end
return left
