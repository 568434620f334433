-- Adds an entry to a stream once: the move of a request that reached the wrong shard of a
-- sharded requests stream to its home shard. Run again (the source entry was reclaimed before
-- its ack), it adds nothing.
-- KEYS[1] the home shard's stream, KEYS[2] the move's mark (in KEYS[1]'s slot)
-- ARGV[1] retention ms of the mark, ARGV[2..] field, value, ... of the entry
-- Returns 1 when the entry was added now, 0 when it had been.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local added = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[2], added, 'PX', ARGV[1])
return 1
