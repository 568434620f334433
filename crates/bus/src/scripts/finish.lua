-- Ends one delivered entry: dead letter, answer (once per request), answered mark, ack.
-- KEYS[1] requests stream, KEYS[2] answered mark, KEYS[3] call record,
-- KEYS[4] answer topic, KEYS[5] dead-letter topic, KEYS[6] second answer topic
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] maxlen, ARGV[4] retention ms,
-- ARGV[5] answer id, ARGV[6] answer payload ('' for none),
-- ARGV[7] dead-letter id, ARGV[8] dead-letter payload ('' for none),
-- ARGV[9] '1' when the request is identified (KEYS[2] and KEYS[3] are real)
-- ARGV[10] '1' when the answer also goes to KEYS[6]
-- Returns 1 when the answer was published now, 0 otherwise.
local identified = ARGV[9] == '1'
local answered = identified and redis.call('EXISTS', KEYS[2]) == 1
if ARGV[8] ~= '' then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[7], 'payload', ARGV[8])
end
local published = 0
if not answered and ARGV[6] ~= '' then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[5], 'payload', ARGV[6])
  if ARGV[10] == '1' then
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[3], '*', 'id', ARGV[5], 'payload', ARGV[6])
  end
  published = 1
end
if identified then
  if ARGV[6] ~= '' then
    redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
  end
  redis.call('DEL', KEYS[3])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return published
