-- Cluster finish, publishing once, in the slot of the topic written: the answer (its mark next to
-- the response topic), the answer's copy, or a dead letter.
-- KEYS[1] topic, KEYS[2] mark set by a final answer, KEYS[3] mark set by an answer that is not
-- final (both in the topic's slot; the same key for copies and dead letters)
-- ARGV[1] maxlen, ARGV[2] retention ms, ARGV[3] message id, ARGV[4] payload,
-- ARGV[5] '1' when guarded by the marks, ARGV[6] '1' when final (sets KEYS[2], else KEYS[3])
-- Returns {published, final}: published 1 when this message is the one on the topic (now, or by
-- an earlier run of the same finish), 0 when another is, -1 when the topic holds a key that is
-- not a stream (nothing written); final 1 when a final answer is on the topic.
local guarded, final = ARGV[5] == '1', ARGV[6] == '1'
if guarded then
  local marks = redis.call('MGET', KEYS[2], KEYS[3])
  if marks[1] then
    return {marks[1] == ARGV[3] and 1 or 0, 1}
  end
  if marks[2] then
    return {marks[2] == ARGV[3] and 1 or 0, 0}
  end
end
if add_answer(KEYS[1], ARGV[1], ARGV[3], ARGV[4]) == -1 then
  return {-1, 0}
end
if guarded and final then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
elseif guarded then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[2])
end
return {1, final and 1 or 0}
