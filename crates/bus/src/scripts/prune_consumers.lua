-- Deletes the consumers of a group that hold no pending entries and have been idle long enough
-- (replicas killed before they could delete themselves). Checked and deleted in one step, so a
-- consumer that takes an entry meanwhile is never deleted with it.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer to keep, ARGV[3] min idle ms.
-- Returns the names deleted.
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local min_idle = tonumber(ARGV[3])
local deleted = {}
for _, consumer in ipairs(consumers) do
  local fields = {}
  for i = 1, #consumer, 2 do
    fields[consumer[i]] = consumer[i + 1]
  end
  local name = fields['name']
  if name and name ~= ARGV[2] and tonumber(fields['pending']) == 0 and tonumber(fields['idle']) >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    deleted[#deleted + 1] = name
  end
end
return deleted
