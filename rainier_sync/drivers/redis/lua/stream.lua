-- A queue's keys reach a script in KEYS; a band's stream is the queue's key base
-- (its ``bands`` key less "bands") followed by "ready:<band>", so it shares the
-- queue's hash tag on Redis Cluster: every key a script touches is in one slot.
local function base_of_bands(bands)
  return string.sub(bands, 1, -6)
end
local function stream_of(bands, band)
  return base_of_bands(bands) .. 'ready:' .. band
end
