-- Deletes a consumer only if it holds no pending entries (deleting drops them).
-- KEYS[1] stream; ARGV[1] group, ARGV[2] consumer. Returns 1 when deleted.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
