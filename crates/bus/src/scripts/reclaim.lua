-- Claims idle pending entries and returns them with their delivery counts, cutting every field
-- value longer than the reader's limit down to its head (as read_group.lua does).
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3] min idle ms, ARGV[4] start, ARGV[5] count,
-- ARGV[6] limit (bytes), ARGV[7] head (bytes kept of a value over the limit)
-- Returns {next_start, {{entry_id, deliveries, {field, value, ...}, {{field, size, sha1}, ...}}, ...},
-- {deleted_id, ...}}.
--
-- Pending entries deleted from the stream (trimmed before anyone handled them) cannot be
-- answered. Redis 7 drops them from the group and lists them in its third reply element; Redis
-- 6.2 returns them with no fields and keeps them pending forever, so they are acked here.
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local limit, head = tonumber(ARGV[6]), tonumber(ARGV[7])
local out = {}
local deleted = {}
for _, entry in ipairs(res[2]) do
  if type(entry) == 'table' and entry[2] then
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1], entry[1], entry[1], 1)
    local deliveries = 1
    if pending[1] then deliveries = pending[1][4] end
    local fields, cut = entry[2], {}
    for i = 2, #fields, 2 do
      local value = fields[i]
      if #value > limit then
        cut[#cut + 1] = {fields[i - 1], #value, redis.sha1hex(value)}
        fields[i] = string.sub(value, 1, head)
      end
    end
    out[#out + 1] = {entry[1], deliveries, fields, cut}
  elseif type(entry) == 'table' and entry[1] then
    redis.call('XACK', KEYS[1], ARGV[1], entry[1])
    deleted[#deleted + 1] = entry[1]
  end
end
if type(res[3]) == 'table' then
  for _, entry_id in ipairs(res[3]) do
    deleted[#deleted + 1] = entry_id
  end
end
return {res[1], out, deleted}
