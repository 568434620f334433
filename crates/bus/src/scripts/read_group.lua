-- Reads new entries for a consumer without blocking, cutting every field value longer than the
-- reader's limit down to its head (cut_fields.lua, prepended), so one read never ships a large
-- entry whole.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3] count, ARGV[4] limit (bytes),
-- ARGV[5] head (bytes kept of a value over the limit)
-- Returns {{entry_id, {field, value, ...}[, {{field, full size, sha1 of the whole}, ...}]}, ...}: the
-- third element only on an entry a value of which was cut.
--
-- No shebang on purpose: a script without flags is refused under OOM only when it first calls a
-- command that may grow memory (XREADGROUP does not), so reads go on while Redis is out of
-- memory, and Redis 6.2 runs it too.
local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
if not res or not res[1] then
  return {}
end
-- The entries go back as XREADGROUP gave them, each with a third element only when a value of
-- it was cut: building a new table per entry costs Redis about a microsecond an entry.
local entries = res[1][2]
local limit, head = tonumber(ARGV[4]), tonumber(ARGV[5])
for _, entry in ipairs(entries) do
  local fields = entry[2]
  if type(fields) == 'table' then
    local cut = cut_fields(fields, limit, head)
    if cut[1] then
      entry[3] = cut
    end
  end
end
return entries
