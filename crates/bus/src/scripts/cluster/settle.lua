-- Cluster finish, last step, in the requests stream's slot: record how the request ended, drop the
-- call record, ack the entry.
-- KEYS[1] requests stream, KEYS[2] claim, KEYS[3] call record, KEYS[4] the entry's refusal mark
-- (copy in this slot)
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] retention ms, ARGV[4] '1' when identified,
-- ARGV[5] '1' when a final answer is on the response topic (the claim becomes 'answered'),
-- ARGV[6] '1' when this entry's refusal is on the topic (the refusal mark's copy is set here),
-- ARGV[7] '1' to give the claim back (it was taken for an answer that was not published),
-- ARGV[8] the answer's topic, ARGV[9] the answer's id when this finish published it (else ''),
-- ARGV[10] '1' to delete the call record, ARGV[11] '1' to ack the entry,
-- ARGV[12] what to keep of the final answer this finish published, for retries ('' for
-- nothing): the claim then holds it with the entry it answered (fields `entry`, `kept`), which
-- cluster/begin_call.lua hands to a retry as one server's mark does,
-- ARGV[13] '1' when the ledger writes format 2: setting the refusal mark's copy also sets the
-- claim's field `refused` and keeps the claim alive at least as long as the copy, so a claim
-- without it means no entry of the request was refused (claim.lua, begin_call.lua)
local identified = ARGV[4] == '1'
if identified then
  if ARGV[5] == '1' then
    -- One HSET of every field this finish records.
    local fields = {'topic', ARGV[8], 'state', 'answered'}
    if ARGV[9] ~= '' then
      fields[5], fields[6], fields[7], fields[8] = 'answer', ARGV[9], 'entry', ARGV[2]
      if ARGV[12] ~= '' then
        fields[9], fields[10] = 'kept', ARGV[12]
      end
    end
    redis.call('HSET', KEYS[2], unpack(fields))
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  elseif ARGV[7] == '1' then
    local held = redis.call('HMGET', KEYS[2], 'topic', 'state')
    if held[1] == ARGV[8] and held[2] == 'claimed' then
      -- Only the claim's own fields: a `refused` field stays (the hash goes when it was alone).
      redis.call('HDEL', KEYS[2], 'topic', 'state')
    end
  end
  if ARGV[6] == '1' then
    redis.call('SET', KEYS[4], ARGV[9], 'PX', ARGV[3])
    if ARGV[13] == '1' then
      redis.call('HSET', KEYS[2], 'refused', '1')
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
  end
  if ARGV[10] == '1' then
    redis.call('DEL', KEYS[3])
  end
end
if ARGV[11] == '1' then
  -- A missing group (Redis lost its data) fails the ack; what was published still stands.
  redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
end
return 1
