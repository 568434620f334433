-- Reads new entries for a consumer without blocking, cutting every field value longer than the
-- reader's limit down to its head, so one read never ships a large entry whole.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3] count, ARGV[4] limit (bytes),
-- ARGV[5] head (bytes kept of a value over the limit)
-- Returns {{entry_id, {field, value, ...}, {{field, full size, sha1 of the whole}, ...}}, ...}.
--
-- No shebang on purpose: a script without flags is refused under OOM only when it first calls a
-- command that may grow memory (XREADGROUP does not), so reads go on while Redis is out of
-- memory, and Redis 6.2 runs it too.
local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
local out = {}
if not res or not res[1] then
  return out
end
local limit, head = tonumber(ARGV[4]), tonumber(ARGV[5])
for _, entry in ipairs(res[1][2]) do
  local fields, cut = entry[2], {}
  if type(fields) == 'table' then
    for i = 2, #fields, 2 do
      local value = fields[i]
      if #value > limit then
        cut[#cut + 1] = {fields[i - 1], #value, redis.sha1hex(value)}
        fields[i] = string.sub(value, 1, head)
      end
    end
  else
    fields = {}
  end
  out[#out + 1] = {entry[1], fields, cut}
end
return out
