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
-- ARGV[13] '1' when the ledger writes format 2, '3' when it writes format 3: setting the
-- refusal mark's copy also sets the claim's field `refused` and keeps the claim alive at least as
-- long as the copy, so a claim without it means no entry of the request was refused (claim.lua,
-- begin_call.lua)
-- The claim is a hash (formats 1 and 2) or a string (format 3, claim_value.lua, prepended); one
-- already there keeps its shape, one written here takes the writer's. A hash is written without
-- being read (HSET merges fields), as before format 3; a string is read, merged and written
-- whole. In format 2 the first hash command runs under `redis.pcall`, and WRONGTYPE (a string
-- left by format 3) turns this settle to the string's way; in format 3 the claim is read first.
local identified = ARGV[4] == '1'
-- Settles the claim as a string: `held` its fields (claim_value.lua's parse_claim).
local function settle_string(held)
  local ttl = nil
  if ARGV[5] == '1' then
    held[1], held[2] = ARGV[8], 'answered'
    if ARGV[9] ~= '' then
      held[3], held[4] = ARGV[9], ARGV[2]
      if ARGV[12] ~= '' then
        held[5] = ARGV[12]
      end
    end
    ttl = 'PX'
  elseif ARGV[7] == '1' and held[1] == ARGV[8] and held[2] == 'claimed' then
    -- Only the claim's own fields: a note of a refusal stays.
    held[1], held[2] = false, false
    ttl = 'KEEPTTL'
  end
  if ARGV[6] == '1' and ARGV[13] ~= '0' then
    held[6] = '1'
    ttl = 'PX'
  end
  if not ttl then
    return
  end
  if not (held[1] or held[2] or held[3] or held[6]) then
    redis.call('DEL', KEYS[2])
  elseif ttl == 'PX' then
    redis.call('SET', KEYS[2], claim_value(held[1], held[2], held[3], held[4], held[5], held[6]), 'PX', ARGV[3])
  else
    redis.call('SET', KEYS[2], claim_value(held[1], held[2], held[3], held[4], held[5], held[6]), 'KEEPTTL')
  end
end
if identified then
  local touches = ARGV[5] == '1' or ARGV[7] == '1' or (ARGV[6] == '1' and ARGV[13] ~= '0')
  local settled = not touches
  if touches and ARGV[13] == '3' then
    local value = redis.pcall('GET', KEYS[2])
    if type(value) ~= 'table' then
      settle_string(value and parse_claim(value) or {false, false, false, false, false, false})
      settled = true
    end
  end
  if not settled and ARGV[5] == '1' then
    -- One HSET of every field this finish records.
    local fields = {'topic', ARGV[8], 'state', 'answered'}
    if ARGV[9] ~= '' then
      fields[5], fields[6], fields[7], fields[8] = 'answer', ARGV[9], 'entry', ARGV[2]
      if ARGV[12] ~= '' then
        fields[9], fields[10] = 'kept', ARGV[12]
      end
    end
    local done = redis.pcall('HSET', KEYS[2], unpack(fields))
    if type(done) == 'table' then
      settle_string(parse_claim(redis.call('GET', KEYS[2])))
      settled = true
    else
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
  elseif not settled and ARGV[7] == '1' then
    local held = redis.pcall('HMGET', KEYS[2], 'topic', 'state')
    if held.err then
      settle_string(parse_claim(redis.call('GET', KEYS[2])))
      settled = true
    elseif held[1] == ARGV[8] and held[2] == 'claimed' then
      -- Only the claim's own fields: a `refused` field stays (the hash goes when it was alone).
      redis.call('HDEL', KEYS[2], 'topic', 'state')
    end
  end
  if ARGV[6] == '1' then
    redis.call('SET', KEYS[4], ARGV[9], 'PX', ARGV[3])
    if not settled and ARGV[13] ~= '0' then
      local done = redis.pcall('HSET', KEYS[2], 'refused', '1')
      if type(done) == 'table' then
        settle_string(parse_claim(redis.call('GET', KEYS[2])))
      else
        redis.call('PEXPIRE', KEYS[2], ARGV[3])
      end
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
