-- shutdown(run, grace, phase):
--   1: refuse new jobs (dispatch answers SHUTDOWN); queued jobs still start
--   2: every worker stops its jobs and leaves
--   0: status after reaping dead members
--   3: delete every key of the pool, and leave the tombstone `closed`:
--      no later join re-creates the pool unless it reopens it on purpose
-- -> {queued, members}
if ARGV[3] == '3' then
  redis.call('SET', P .. 'closed', fmt(NOW))
end
if redis.call('EXISTS', META) == 0 then return {0, 0} end
local grace, phase = tonumber(ARGV[2]), ARGV[3]
local members = redis.call('ZRANGE', P .. 'members', 0, -1)
if phase == '1' then
  redis.call('HSET', META, 'shut', '1')
  for _, w in ipairs(members) do send(w, {'t', 'q'}) end
elseif phase == '2' then
  redis.call('HSET', META, 'shut', '2')
  for _, w in ipairs(members) do send(w, {'t', 'X'}) end
elseif phase == '0' then
  reap(grace)
elseif phase == '3' then
  for _, w in ipairs(members) do redis.call('DEL', P .. 'wk:' .. w, P .. 's:' .. w) end
  for _, w in ipairs(slots()) do
    if w ~= '' then redis.call('DEL', P .. 'wk:' .. w, P .. 's:' .. w) end
  end
  redis.call('DEL', META, P .. 'slots', P .. 'members', P .. 'jobs', P .. 'own', P .. 'tok', P .. 'st', P .. 'pending', P .. 'again')
  return {0, 0}
end
return {queued(), redis.call('ZCARD', P .. 'members')}
