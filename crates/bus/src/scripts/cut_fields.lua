-- Prepended to the scripts that read entries (read_group.lua, reclaim.lua): cuts every field
-- value of an entry longer than `limit` bytes down to its first `head` bytes, in place, and
-- returns {{field, full size, sha1 of the whole}, ...} for the values it cut (one shared empty
-- table when it cut none: most entries, and no table is made for them).
local none = {}
local function cut_fields(fields, limit, head)
  local cut = none
  for i = 2, #fields, 2 do
    local value = fields[i]
    if #value > limit then
      if cut == none then
        cut = {}
      end
      cut[#cut + 1] = {fields[i - 1], #value, redis.sha1hex(value)}
      fields[i] = string.sub(value, 1, head)
    end
  end
  return cut
end
