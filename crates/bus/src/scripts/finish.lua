-- Ends one delivered entry: answer (once per request), dead letter, answered mark, ack.
-- KEYS[1] requests stream, KEYS[2] answered mark, KEYS[3] call record,
-- KEYS[4] answer topic, KEYS[5] dead-letter topic, KEYS[6] second answer topic,
-- KEYS[7] the entry's refusal mark
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] maxlen, ARGV[4] retention ms,
-- ARGV[5] answer id, ARGV[6] answer payload ('' for none),
-- ARGV[7] dead-letter id, ARGV[8] dead-letter payload ('' for none),
-- ARGV[9] '1' when the request is identified (KEYS[2] and KEYS[3] are real)
-- ARGV[10] '1' when the answer also goes to KEYS[6]
-- ARGV[11] '1' when the answer is final (sets the answered mark)
-- ARGV[12] what to keep of a final answer for retries ('' for nothing): its mark is then
--   `<answer id>\n<entry id>\n<kept>`, and a final answer that keeps something and finds the
--   request answered by another entry, with that answer kept, writes nothing and returns
--   {2, mark}: the entry stays pending for the caller to answer with the original answer
-- ARGV[13] '1' when this answer replays a kept answer for a retry: it is guarded by the entry's
--   refusal mark alone (the request's answered mark is the original's) and sets it, like a
--   refusal, so the retry's entry is answered once
-- ARGV[14] '1' when the ledger writes format 2: an entry's refusal mark set here also sets the
--   request's answered mark to the placeholder `refused` when it has none, and keeps the mark
--   alive at least as long as the refusal mark, so a mark that is not there means no entry of the
--   request was answered (answer_batch.lua and begin_call.lua then skip the refusal mark)
-- Returns 1 when the answer is the one published for the request (now, or by an earlier run of
-- this same finish whose reply was lost), 0 otherwise, and -1 when an answer topic holds a key
-- that is not a stream: then nothing at all was written and the entry is still pending.
--
-- Running it twice publishes nothing twice. A final answer is guarded by the answered mark
-- (which holds the answer's id). An answer that is not final (a refusal that ran nothing) sets
-- no answered mark, so a caller may retry with the same request id; it sets the entry's refusal
-- mark instead (also holding the answer's id), so neither a retry of this finish nor another
-- toolbox reading the same stream answers this entry again. The dead letter is guarded by the
-- entry still being pending (the ack is part of the same script). When the group itself is gone
-- (Redis lost its data), the answer is still published so a waiting caller gets it.
local identified = ARGV[9] == '1'
local final = ARGV[11] == '1'
local keep, replay = ARGV[12] ~= '', ARGV[13] == '1'
local has_answer = ARGV[6] ~= ''
local has_letter = ARGV[8] ~= ''
-- Only a dead letter needs to know whether the entry is still pending; skip the lookup otherwise.
local group_missing, still_pending = false, false
if has_letter then
  local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
  group_missing = type(pending) == 'table' and pending.err ~= nil
  still_pending = (not group_missing) and #pending > 0
end
local mark, entry_mark = false, false
if identified then
  local marks = redis.call('MGET', KEYS[2], KEYS[7])
  mark, entry_mark = marks[1], marks[2]
  -- The placeholder of format 2 is no answer.
  if mark == 'refused' then
    mark = false
  end
end
-- The answer ids are UUIDs: a mark that begins with this answer's id is this answer's.
local function own(value)
  return value ~= false and string.sub(value, 1, #ARGV[5]) == ARGV[5]
end
if keep and final and has_answer and mark and not entry_mark and not own(mark) then
  local at = string.find(mark, '\n', 1, true)
  if at and string.sub(mark, at + 1, at + #ARGV[2] + 1) ~= ARGV[2] .. '\n' then
    return {2, mark}
  end
end
local answered = entry_mark ~= false or (mark ~= false and not replay)
local published = 0
if has_answer then
  if not answered then
    -- Scripts are not transactions: check every answer topic before the first write, so a topic
    -- holding another type of key leaves nothing half done.
    if ARGV[10] == '1' then
      local kind = redis.call('TYPE', KEYS[6])['ok']
      if kind ~= 'stream' and kind ~= 'none' then
        return -1
      end
    end
    if add_answer(KEYS[4], ARGV[3], ARGV[5], ARGV[6]) == -1 then
      return -1
    end
    if ARGV[10] == '1' then
      redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[5], 'payload', ARGV[6])
    end
    if identified and final and keep then
      redis.call('SET', KEYS[2], ARGV[5] .. '\n' .. ARGV[2] .. '\n' .. ARGV[12], 'PX', ARGV[4])
    elseif identified and final then
      redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[4])
    elseif identified then
      redis.call('SET', KEYS[7], ARGV[5], 'PX', ARGV[4])
      if ARGV[14] == '1' and redis.call('SET', KEYS[2], 'refused', 'NX', 'GET', 'PX', ARGV[4]) then
        redis.call('PEXPIRE', KEYS[2], ARGV[4])
      end
    end
    published = 1
  elseif own(mark) or own(entry_mark) then
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
