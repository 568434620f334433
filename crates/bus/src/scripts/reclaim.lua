-- Claims idle pending entries and returns them with their delivery counts.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer, ARGV[3] min idle ms, ARGV[4] start, ARGV[5] count
-- Returns {next_start, {{entry_id, deliveries, {field, value, ...}}, ...}}.
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
for _, entry in ipairs(res[2]) do
  if entry and entry[2] then
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1], entry[1], entry[1], 1)
    local deliveries = 1
    if pending[1] then deliveries = pending[1][4] end
    out[#out + 1] = {entry[1], deliveries, entry[2]}
  end
end
return {res[1], out}
