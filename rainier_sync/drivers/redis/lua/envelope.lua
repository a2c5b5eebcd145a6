-- Reading what the driver stores, in a script: a stream entry's envelope (its
-- field ``j``), a delayed member's ("band|attempts|envelope"), and where a JSON
-- string of an envelope ends.
local function body_of(fields)
  if fields[1] == 'j' then
    return fields[2]
  end
  for k = 1, #fields, 2 do
    if fields[k] == 'j' then
      return fields[k + 1]
    end
  end
  return ''
end

local function envelope_of(member)
  return string.match(member, '^-?%d+|%d+|(.*)$') or member
end

-- The position of the quote that closes the JSON string whose text starts at
-- ``i`` of ``text`` (one not escaped by an odd run of backslashes), or nil.
local function string_end(text, i)
  local j = i
  while true do
    local k = string.find(text, '"', j, true)
    if not k then
      return nil
    end
    local b = k - 1
    while b >= i and string.byte(text, b) == 92 do
      b = b - 1
    end
    if (k - 1 - b) % 2 == 0 then
      return k
    end
    j = k + 1
  end
end
