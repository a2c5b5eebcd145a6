-- Count a round's finished jobs of batches in their tallies, then acknowledge the
-- round (as ack.lua), in one script: counted before acknowledged, so a script cut
-- short leaves a job counted but held, which its tally's members then keep from
-- counting twice when it comes again.
-- KEYS: per tally, its hash and its members' set; then per stream, the stream and
-- its queue's reserved key.
-- ARGV: group, the number of tallies, then per tally: keep (ms), m, and m triples
-- (member, field, job index); then per stream: band, n, and n pairs (id, job index).
-- A tally this round could finish (its pending would reach 0) is left alone, its
-- jobs neither counted nor acknowledged: returns their job indexes, for the
-- careful way, which queues the batch's callbacks.
-- needs: held
local group, tallies = ARGV[1], tonumber(ARGV[2])
local left, held_jobs = {}, {}
local a = 3
for t = 1, tallies do
  local tally, set = KEYS[2 * t - 1], KEYS[2 * t]
  local keep, m = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local members = {}
  for j = 1, m do
    members[j] = ARGV[a + 3 * (j - 1)]
  end
  local seen = redis.call('SMISMEMBER', set, unpack(members))
  local fresh, added, deltas = {}, {}, {}
  for j = 1, m do
    local member = members[j]
    if seen[j] == 0 and not added[member] then
      added[member] = true
      fresh[#fresh + 1] = member
      local field = ARGV[a + 3 * (j - 1) + 1]
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
  else
    for j = 1, m do
      local index = ARGV[a + 3 * (j - 1) + 2]
      held_jobs[index] = true
      left[#left + 1] = tonumber(index)
    end
  end
  a = a + 3 * m
end
local k = 2 * tallies + 1
while a <= #ARGV do
  local band, n = ARGV[a], tonumber(ARGV[a + 1])
  local stream, reserved = KEYS[k], KEYS[k + 1]
  local ids, members = {}, {}
  for j = 1, n do
    local id = ARGV[a + 2 * j]
    if not held_jobs[ARGV[a + 2 * j + 1]] then
      ids[#ids + 1] = id
      members[#members + 1] = held(band, id)
    end
  end
  if #ids > 0 then
    redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
    redis.call('ZREM', reserved, unpack(members))
  end
  a = a + 2 + 2 * n
  k = k + 2
end
return left
