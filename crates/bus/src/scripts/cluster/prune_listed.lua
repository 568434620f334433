-- The cluster form of ../prune_consumers.lua: the heartbeats live in other slots, so the caller
-- looks them up and names the consumers that have none; this deletes those that still hold no
-- pending entries and have still been idle long enough, checked and deleted in one step.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] min idle ms, ARGV[3...] consumer names.
-- Returns the names deleted.
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local listed = {}
for i = 3, #ARGV do
  listed[ARGV[i]] = true
end
local min_idle = tonumber(ARGV[2])
local deleted = {}
for _, consumer in ipairs(consumers) do
  local fields = {}
  for i = 1, #consumer, 2 do
    fields[consumer[i]] = consumer[i + 1]
  end
  local name = fields['name']
  if name and listed[name] and tonumber(fields['pending']) == 0 and tonumber(fields['idle']) >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    deleted[#deleted + 1] = name
  end
end
return deleted
