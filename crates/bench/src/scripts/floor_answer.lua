-- The exactly-once floor (`toolhost-refworker --exactly-once`): one call answers and acks a
-- whole read batch, atomically.
-- For every entry: when it carries a request id, `SET <answered mark> <answer id> NX PX
-- <retention>`, and only if that set the mark, `XADD` the answer; without a request id the
-- answer is published unguarded. Then one `XACK` for every entry of the batch. Nothing else.
-- KEYS[1] requests stream; for entry i (from 0): KEYS[2 + 2i] its answered mark,
-- KEYS[3 + 2i] its answer topic.
-- ARGV[1] group, ARGV[2] retention ms, ARGV[3] maxlen; for entry i: ARGV[4 + 4i] entry id,
-- ARGV[5 + 4i] answer id, ARGV[6 + 4i] answer payload ('' for none: ack only),
-- ARGV[7 + 4i] '1' when the entry carries a request id (KEYS[2 + 2i] is real).
-- Returns how many answers were published.
--
-- The mark comes before the answer, and the ack after both, in one script: a worker that dies
-- before the call leaves its entries pending for a reclaim, one that dies after it leaves them
-- answered and acked, and a second delivery of a request id (a copy, or a reclaimed entry) finds
-- the mark and is acked without an answer.
local group, retention, maxlen = ARGV[1], ARGV[2], ARGV[3]
local n = (#ARGV - 3) / 4
local ids = {}
local published = 0
for i = 0, n - 1 do
  local a = 4 + 4 * i
  local entry_id, answer_id, payload, marked = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  ids[#ids + 1] = entry_id
  if payload ~= '' then
    local fresh = marked ~= '1' or redis.call('SET', KEYS[2 + 2 * i], answer_id, 'NX', 'PX', retention)
    if fresh then
      redis.call('XADD', KEYS[3 + 2 * i], 'MAXLEN', '~', maxlen, '*', 'id', answer_id, 'payload', payload)
      published = published + 1
    end
  end
end
if #ids > 0 then
  redis.call('XACK', KEYS[1], group, unpack(ids))
end
return published
