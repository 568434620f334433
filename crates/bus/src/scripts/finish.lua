-- Ends one delivered entry: answer (once per request), dead letter, answered mark, ack.
-- KEYS[1] requests stream, KEYS[2] answered mark, KEYS[3] call record,
-- KEYS[4] answer topic, KEYS[5] dead-letter topic, KEYS[6] second answer topic
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] maxlen, ARGV[4] retention ms,
-- ARGV[5] answer id, ARGV[6] answer payload ('' for none),
-- ARGV[7] dead-letter id, ARGV[8] dead-letter payload ('' for none),
-- ARGV[9] '1' when the request is identified (KEYS[2] and KEYS[3] are real)
-- ARGV[10] '1' when the answer also goes to KEYS[6]
-- ARGV[11] '1' when the answer is final (sets the answered mark)
-- Returns 1 when the answer is the one published for the request (now, or by an earlier run of
-- this same finish whose reply was lost), 0 otherwise, and -1 when an answer topic holds a key
-- that is not a stream: then nothing at all was written and the entry is still pending.
--
-- Running it twice publishes nothing twice. A final answer is guarded by the answered mark
-- (which holds the answer's id); an answer that is not final (a refusal that ran nothing) sets no
-- mark, so a caller may retry with the same request id, and is guarded by its entry still being
-- pending instead, as the dead letter is (the ack is part of the same script). When the group
-- itself is gone (Redis lost its data), the answer is still published so a waiting caller gets it.
local identified = ARGV[9] == '1'
local final = ARGV[11] == '1'
local has_answer = ARGV[6] ~= ''
local has_letter = ARGV[8] ~= ''
-- Only a dead letter or an answer that is not final needs to know whether the entry is still
-- pending; skip the lookup otherwise.
local group_missing, still_pending = false, false
if has_letter or (has_answer and not final) then
  local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
  group_missing = type(pending) == 'table' and pending.err ~= nil
  still_pending = (not group_missing) and #pending > 0
end
local mark = false
if identified then
  mark = redis.call('GET', KEYS[2])
end
local answered = mark ~= false
local published = 0
if has_answer then
  if not answered and (final or still_pending or group_missing) then
    -- Scripts are not transactions: check every answer topic before the first write, so a topic
    -- holding another type of key leaves nothing half done.
    if ARGV[10] == '1' then
      local kind = redis.call('TYPE', KEYS[6])['ok']
      if kind ~= 'stream' and kind ~= 'none' then
        return -1
      end
    end
    local added = redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[5], 'payload', ARGV[6])
    if type(added) == 'table' and added.err then
      if string.sub(added.err, 1, 9) == 'WRONGTYPE' then
        return -1
      end
      error(added)
    end
    if ARGV[10] == '1' then
      redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[5], 'payload', ARGV[6])
    end
    if identified and final then
      redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[4])
    end
    published = 1
  elseif mark == ARGV[5] then
    published = 1
  end
end
if has_letter and (still_pending or (group_missing and not answered)) then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[7], 'payload', ARGV[8])
end
if identified then
  redis.call('DEL', KEYS[3])
end
-- A missing group (Redis lost its data) fails the ack; the answer above still stands.
redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
return published
