-- Deletes the consumers of a group that hold no pending entries, have been idle long enough and
-- have no heartbeat (replicas killed before they could delete themselves). Checked and deleted in
-- one step, so a consumer that takes an entry meanwhile is never deleted with it.
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer to keep, ARGV[3] min idle ms,
-- ARGV[4] heartbeat key prefix (the consumer's name completes the key).
-- Returns the names deleted.
--
-- The heartbeat is the liveness signal: before Redis 7.2 a consumer's idle time is reset only by
-- deliveries and claims, not by empty reads, so a live consumer of a quiet stream looks idle.
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local min_idle = tonumber(ARGV[3])
local deleted = {}
for _, consumer in ipairs(consumers) do
  local fields = {}
  for i = 1, #consumer, 2 do
    fields[consumer[i]] = consumer[i + 1]
  end
  local name = fields['name']
  if name and name ~= ARGV[2] and tonumber(fields['pending']) == 0 and tonumber(fields['idle']) >= min_idle
      and redis.call('EXISTS', ARGV[4] .. name) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    deleted[#deleted + 1] = name
  end
end
return deleted
