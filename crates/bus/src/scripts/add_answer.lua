-- Prepended to the scripts that publish an answer to a topic the caller names (answer_batch.lua,
-- finish.lua, cluster/publish.lua, cluster/answer_local.lua): appends it under `redis.pcall`,
-- trimmed to about `maxlen` entries. Returns nil when it was added, -1 when the topic holds a key
-- that is not a stream (nothing written); any other error is raised, or, with `keep_errors`,
-- returned as {0, error}.
local function add_answer(topic, maxlen, id, payload, keep_errors)
  local added = redis.pcall('XADD', topic, 'MAXLEN', '~', maxlen, '*', 'id', id, 'payload', payload)
  if type(added) == 'table' and added.err then
    if string.sub(added.err, 1, 9) == 'WRONGTYPE' then
      return -1
    end
    if keep_errors then
      return {0, added.err}
    end
    error(added)
  end
  return nil
end
